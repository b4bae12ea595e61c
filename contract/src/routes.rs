//! The calls of the API as the edge tells them apart, from the method and the raw path.
//! The core serves the same templates (its tests check each one against its OpenAPI
//! document), so the two cannot disagree on what a path means.

/// One call of the API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// `POST /vouchers` (admin).
    CreateVoucher,
    /// `GET /vouchers/{code}`.
    GetVoucher,
    /// `POST /vouchers/{code}/gate/reload` (admin).
    ReloadGate,
    /// `GET /vouchers/{code}/orders` (admin; the edge's own order-list fetch).
    OrderIds,
    /// `POST /vouchers/{code}/reservations`: the one a sold-out flag answers.
    Reserve { code: String },
    /// `POST /vouchers/{code}/reservations/{orderId}/confirm`.
    Confirm,
    /// `DELETE /vouchers/{code}/reservations/{orderId}`.
    Release,
    /// Anything else (health, the OpenAPI document, unknown paths): the core decides.
    Other,
}

impl Route {
    pub fn classify(method: &str, path: &str) -> Self {
        let parts: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
        match (method, parts.as_slice()) {
            ("POST", ["vouchers"]) => Self::CreateVoucher,
            (_, ["vouchers", _, "gate", ..]) => Self::ReloadGate,
            (_, ["vouchers", _, "orders"]) => Self::OrderIds,
            ("POST", ["vouchers", code, "reservations"]) => Self::Reserve {
                code: (*code).to_owned(),
            },
            ("POST", ["vouchers", _, "reservations", _, "confirm"]) => Self::Confirm,
            ("DELETE", ["vouchers", _, "reservations", _]) => Self::Release,
            ("GET", ["vouchers", _]) => Self::GetVoucher,
            _ => Self::Other,
        }
    }

    /// Admin calls: never served on a public listener.
    pub fn is_admin(&self) -> bool {
        matches!(
            self,
            Self::CreateVoucher | Self::ReloadGate | Self::OrderIds
        )
    }

    /// Label for metrics: a closed set, never a code or an orderId.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Reserve { .. } => "reserve",
            Self::Confirm => "confirm",
            Self::Release => "release",
            Self::GetVoucher => "get_voucher",
            Self::CreateVoucher | Self::ReloadGate | Self::OrderIds => "admin",
            Self::Other => "other",
        }
    }

    /// The method and path template of each call the edge treats on its own, as the
    /// core's OpenAPI document writes them.
    pub const TEMPLATES: [(&'static str, &'static str); 7] = [
        ("post", "/vouchers"),
        ("get", "/vouchers/{code}"),
        ("post", "/vouchers/{code}/gate/reload"),
        ("get", "/vouchers/{code}/orders"),
        ("post", "/vouchers/{code}/reservations"),
        ("post", "/vouchers/{code}/reservations/{orderId}/confirm"),
        ("delete", "/vouchers/{code}/reservations/{orderId}"),
    ];

    /// Where a core says whether it can serve: the edge balances on it.
    pub const READINESS_PATH: &'static str = "/readyz";

    /// The order-list path the edge fetches for a sold-out voucher.
    pub fn order_ids_path(code: &str) -> String {
        format!("/vouchers/{code}/orders")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_the_api() {
        assert_eq!(
            Route::classify("POST", "/vouchers/F1/reservations"),
            Route::Reserve { code: "F1".into() }
        );
        assert_eq!(
            Route::classify("POST", "/vouchers/F1/reservations/o1/confirm"),
            Route::Confirm
        );
        assert_eq!(
            Route::classify("DELETE", "/vouchers/F1/reservations/o1"),
            Route::Release
        );
        assert_eq!(Route::classify("GET", "/vouchers/F1"), Route::GetVoucher);
        assert!(Route::classify("POST", "/vouchers").is_admin());
        assert!(Route::classify("POST", "/vouchers/").is_admin());
        assert!(Route::classify("POST", "/vouchers/F1/gate/reload").is_admin());
        assert!(Route::classify("GET", "/vouchers/F1/orders").is_admin());
        assert_eq!(Route::classify("GET", "/healthz"), Route::Other);
    }

    #[test]
    fn every_template_classifies_as_its_call() {
        let filled = |t: &str| t.replace("{code}", "C1").replace("{orderId}", "o1");
        let routes: Vec<Route> = Route::TEMPLATES
            .iter()
            .map(|(m, t)| Route::classify(&m.to_uppercase(), &filled(t)))
            .collect();
        assert!(routes.iter().all(|r| *r != Route::Other), "{routes:?}");
        assert_eq!(
            Route::classify("GET", &Route::order_ids_path("C1")),
            Route::OrderIds
        );
    }
}
