//! The calls of the API as the edge tells them apart, from the method and the raw path.
//! The core serves the same templates (its tests check each one against its OpenAPI
//! document), so the two cannot disagree on what a path means.

/// One call of the API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// `POST /vouchers` (admin).
    CreateVoucher,
    /// `GET /vouchers`, `PATCH /vouchers/{code}`, `POST /vouchers/{code}/pause`, `/resume`,
    /// `/archive`, `GET /vouchers/{code}/audit` (admin): the lifecycle calls; and the
    /// ledger's reads: `GET /vouchers/{code}/reservations`, `.../reservations/{orderId}`,
    /// `GET /vouchers/{code}/export`.
    ManageVoucher,
    /// `GET /vouchers/{code}`.
    GetVoucher,
    /// `POST /vouchers/{code}/gate/reload` (admin).
    ReloadGate,
    /// `GET /vouchers/{code}/orders` (admin, or the orders token).
    OrderIds,
    /// `GET /vouchers/{code}/orders/filter` (admin, or the orders token): the edge's own
    /// fetch of a sold-out voucher's orders, as a compact filter.
    OrderFilter,
    /// `POST /vouchers/{code}/reservations`: the one a sold-out flag answers. `code` is the
    /// path segment percent-decoded as the core decodes it (`None` when that is not UTF-8),
    /// so every spelling of a code meets the same flag.
    Reserve { code: Option<String> },
    /// `POST /vouchers/{code}/reservations/{orderId}/confirm`.
    Confirm,
    /// `DELETE /vouchers/{code}/reservations/{orderId}`.
    Release,
    /// Anything else (health, the OpenAPI document, unknown paths): the core decides.
    Other,
}

impl Route {
    pub fn classify(method: &str, path: &str) -> Self {
        // A reservation first, as its own pattern below would take it: the edge sees
        // little else at a sale's peak, and this spares it the segments and the table.
        if method == "POST" {
            let code = path
                .strip_prefix("/vouchers/")
                .and_then(|rest| rest.strip_suffix("/reservations"));
            if let Some(code) = code.filter(|c| !c.is_empty() && !c.contains('/')) {
                return Self::Reserve {
                    code: crate::request::decode_segment(code),
                };
            }
        }
        Self::by_segments(method, path)
    }

    /// Every call, from the path's segments.
    fn by_segments(method: &str, path: &str) -> Self {
        // The segments, without a heap allocation (this runs for every request the edge
        // sees). Six places are enough: every exact pattern below has at most five
        // segments, so a longer path keeps six and matches only the `..` patterns, as it
        // would whole.
        let mut parts = [""; 6];
        let mut n = 0;
        for (place, segment) in parts
            .iter_mut()
            .zip(path.trim_end_matches('/').split('/').skip(1))
        {
            *place = segment;
            n += 1;
        }
        match (method, &parts[..n]) {
            ("POST", ["vouchers"]) => Self::CreateVoucher,
            (_, ["vouchers"]) => Self::ManageVoucher,
            ("PATCH", ["vouchers", _]) => Self::ManageVoucher,
            (_, ["vouchers", _, "pause" | "resume" | "archive" | "audit" | "export"]) => {
                Self::ManageVoucher
            }
            ("GET", ["vouchers", _, "reservations", ..]) => Self::ManageVoucher,
            (_, ["vouchers", _, "gate", ..]) => Self::ReloadGate,
            (_, ["vouchers", _, "orders"]) => Self::OrderIds,
            (_, ["vouchers", _, "orders", "filter"]) => Self::OrderFilter,
            ("POST", ["vouchers", code, "reservations"]) => Self::Reserve {
                code: crate::request::decode_segment(code),
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
            Self::CreateVoucher
                | Self::ManageVoucher
                | Self::ReloadGate
                | Self::OrderIds
                | Self::OrderFilter
        )
    }

    /// Label for metrics: a closed set, never a code or an orderId.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Reserve { .. } => "reserve",
            Self::Confirm => "confirm",
            Self::Release => "release",
            Self::GetVoucher => "get_voucher",
            Self::CreateVoucher
            | Self::ManageVoucher
            | Self::ReloadGate
            | Self::OrderIds
            | Self::OrderFilter => "admin",
            Self::Other => "other",
        }
    }

    /// The method and path template of each call the edge treats on its own, as the
    /// core's OpenAPI document writes them.
    pub const TEMPLATES: [(&'static str, &'static str); 17] = [
        ("post", "/vouchers"),
        ("get", "/vouchers"),
        ("patch", "/vouchers/{code}"),
        ("post", "/vouchers/{code}/pause"),
        ("post", "/vouchers/{code}/resume"),
        ("post", "/vouchers/{code}/archive"),
        ("get", "/vouchers/{code}/audit"),
        ("get", "/vouchers/{code}/reservations"),
        ("get", "/vouchers/{code}/reservations/{orderId}"),
        ("get", "/vouchers/{code}/export"),
        ("get", "/vouchers/{code}"),
        ("post", "/vouchers/{code}/gate/reload"),
        ("get", "/vouchers/{code}/orders"),
        ("get", "/vouchers/{code}/orders/filter"),
        ("post", "/vouchers/{code}/reservations"),
        ("post", "/vouchers/{code}/reservations/{orderId}/confirm"),
        ("delete", "/vouchers/{code}/reservations/{orderId}"),
    ];

    /// Where a core says whether it can serve: the edge balances on it.
    pub const READINESS_PATH: &'static str = "/readyz";

    /// The order-list path (admin).
    pub fn order_ids_path(code: &str) -> String {
        format!("/vouchers/{code}/orders")
    }

    /// The order-filter path the edge fetches for a sold-out voucher.
    pub fn order_filter_path(code: &str) -> String {
        format!("/vouchers/{code}/orders/filter")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reservations_shortcut_agrees_with_the_table() {
        let paths = [
            "/vouchers/F1/reservations",
            "/vouchers/F1/reservations/",
            "/vouchers//reservations",
            "/vouchers/%46%31/reservations",
            "/vouchers/%ff/reservations",
            "/vouchers/F1/x/reservations",
            "//vouchers/F1/reservations",
            "/vouchers/reservations",
            "/vouchers/F1/reservationsx",
            "/vouchers/F1/reservations/o1",
            "/vouchersF1/reservations",
            "/vouchers/F1",
            "/",
            "",
        ];
        for method in ["POST", "GET", "post"] {
            for path in paths {
                assert_eq!(
                    Route::classify(method, path),
                    Route::by_segments(method, path),
                    "{method} {path}"
                );
            }
        }
    }

    #[test]
    fn classifies_the_api() {
        assert_eq!(
            Route::classify("POST", "/vouchers/F1/reservations"),
            Route::Reserve {
                code: Some("F1".into())
            }
        );
        assert_eq!(
            Route::classify("POST", "/vouchers/%46%31/reservations"),
            Route::Reserve {
                code: Some("F1".into())
            },
            "one voucher, however its code is spelt"
        );
        assert_eq!(
            Route::classify("POST", "/vouchers/%ff/reservations"),
            Route::Reserve { code: None }
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
        assert!(Route::classify("GET", "/vouchers").is_admin());
        assert!(Route::classify("PATCH", "/vouchers/F1").is_admin());
        assert!(Route::classify("POST", "/vouchers/F1/pause").is_admin());
        assert!(Route::classify("POST", "/vouchers/F1/resume/").is_admin());
        assert!(Route::classify("POST", "/vouchers/F1/archive").is_admin());
        assert!(Route::classify("GET", "/vouchers/F1/audit").is_admin());
        assert_eq!(Route::classify("DELETE", "/vouchers/F1"), Route::Other);
        assert!(Route::classify("GET", "/vouchers/F1/reservations").is_admin());
        assert!(Route::classify("GET", "/vouchers/F1/reservations/o1").is_admin());
        assert!(Route::classify("GET", "/vouchers/F1/export").is_admin());
        assert_eq!(
            Route::classify("DELETE", "/vouchers/F1/reservations/o1"),
            Route::Release
        );
        assert_eq!(Route::classify("GET", "/healthz"), Route::Other);
        // Paths longer than any exact pattern: only the prefix patterns take them.
        assert!(Route::classify("GET", "/vouchers/F1/reservations/o1/a/b/c").is_admin());
        assert!(Route::classify("POST", "/vouchers/F1/gate/a/b/c/d").is_admin());
        assert_eq!(
            Route::classify("POST", "/vouchers/F1/reservations/o1/confirm/x"),
            Route::Other
        );
        assert_eq!(
            Route::classify("DELETE", "/vouchers/F1/reservations/o1/x/y/z"),
            Route::Other
        );
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
        assert_eq!(
            Route::classify("GET", &Route::order_filter_path("C1")),
            Route::OrderFilter
        );
    }
}
