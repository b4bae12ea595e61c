//! Which call a request is, from its method and path alone.

/// The calls the edge treats differently.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// `POST /vouchers/{code}/reservations`: the one the sold-out flag answers.
    Reserve {
        code: String,
    },
    Confirm,
    Release,
    GetVoucher,
    /// Admin calls: never served on the public listener.
    Admin,
    Other,
}

impl Route {
    pub fn classify(method: &str, path: &str) -> Self {
        let parts: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
        match (method, parts.as_slice()) {
            ("POST", ["vouchers"]) => Self::Admin,
            (_, ["vouchers", _, "gate", ..]) | (_, ["vouchers", _, "orders"]) => Self::Admin,
            ("POST", ["vouchers", code, "reservations"]) => Self::Reserve {
                code: (*code).to_owned(),
            },
            ("POST", ["vouchers", _, "reservations", _, "confirm"]) => Self::Confirm,
            ("DELETE", ["vouchers", _, "reservations", _]) => Self::Release,
            ("GET", ["vouchers", _]) => Self::GetVoucher,
            _ => Self::Other,
        }
    }

    /// Label for metrics (bounded: never the code).
    pub fn label(&self) -> &'static str {
        match self {
            Self::Reserve { .. } => "reserve",
            Self::Confirm => "confirm",
            Self::Release => "release",
            Self::GetVoucher => "get_voucher",
            Self::Admin => "admin",
            Self::Other => "other",
        }
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
        assert_eq!(Route::classify("POST", "/vouchers"), Route::Admin);
        assert_eq!(Route::classify("POST", "/vouchers/"), Route::Admin);
        assert_eq!(
            Route::classify("POST", "/vouchers/F1/gate/reload"),
            Route::Admin
        );
        assert_eq!(Route::classify("GET", "/vouchers/F1/orders"), Route::Admin);
        assert_eq!(Route::classify("GET", "/healthz"), Route::Other);
    }
}
