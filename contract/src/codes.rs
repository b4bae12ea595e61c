//! The stable error codes. Clients switch on these; the message beside them may change.

/// The `error` of every error answer (`{"error": CODE, "message": ...}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    InvalidRequest,
    MalformedJson,
    UnsupportedMediaType,
    PayloadTooLarge,
    Unauthorized,
    Forbidden,
    RouteNotFound,
    MethodNotAllowed,
    VoucherNotFound,
    ReservationNotFound,
    VoucherExists,
    OutOfStock,
    AlreadyUsed,
    NotEligible,
    OrderIdConflict,
    AlreadyReleased,
    AlreadyConfirmed,
    /// The voucher is paused by an operator (the kill switch): no new reservation until it
    /// is resumed; holders' retries, confirms and releases still work (409).
    VoucherPaused,
    /// The voucher is archived: it takes no reservation ever again (409).
    VoucherArchived,
    /// An admin change the voucher's state or counts do not allow now (409, with `field`).
    ChangeNotAllowed,
    /// A change named a version (`If-Match`) that is no longer the voucher's (412).
    PreconditionFailed,
    /// A change of a voucher's definition must name the version it read (428).
    PreconditionRequired,
    ServiceUnavailable,
    Internal,
    /// The edge could not read the request.
    BadRequest,
    /// The edge refused a client sending faster than its configured rate (429, with
    /// Retry-After).
    RateLimited,
    /// The edge refused a request whose headers are larger than it takes (431).
    HeadersTooLarge,
    /// The edge or core was at its admission limit and refused the request before doing
    /// anything for it (503, with Retry-After).
    Overloaded,
}

impl ErrorCode {
    /// Every code, for documents and tests.
    pub const ALL: [ErrorCode; 28] = [
        Self::InvalidRequest,
        Self::MalformedJson,
        Self::UnsupportedMediaType,
        Self::PayloadTooLarge,
        Self::Unauthorized,
        Self::Forbidden,
        Self::RouteNotFound,
        Self::MethodNotAllowed,
        Self::VoucherNotFound,
        Self::ReservationNotFound,
        Self::VoucherExists,
        Self::OutOfStock,
        Self::AlreadyUsed,
        Self::NotEligible,
        Self::OrderIdConflict,
        Self::AlreadyReleased,
        Self::AlreadyConfirmed,
        Self::VoucherPaused,
        Self::VoucherArchived,
        Self::ChangeNotAllowed,
        Self::PreconditionFailed,
        Self::PreconditionRequired,
        Self::ServiceUnavailable,
        Self::Internal,
        Self::BadRequest,
        Self::RateLimited,
        Self::HeadersTooLarge,
        Self::Overloaded,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::InvalidRequest => "INVALID_REQUEST",
            Self::MalformedJson => "MALFORMED_JSON",
            Self::UnsupportedMediaType => "UNSUPPORTED_MEDIA_TYPE",
            Self::PayloadTooLarge => "PAYLOAD_TOO_LARGE",
            Self::Unauthorized => "UNAUTHORIZED",
            Self::Forbidden => "FORBIDDEN",
            Self::RouteNotFound => "ROUTE_NOT_FOUND",
            Self::MethodNotAllowed => "METHOD_NOT_ALLOWED",
            Self::VoucherNotFound => "VOUCHER_NOT_FOUND",
            Self::ReservationNotFound => "RESERVATION_NOT_FOUND",
            Self::VoucherExists => "VOUCHER_EXISTS",
            Self::OutOfStock => "OUT_OF_STOCK",
            Self::AlreadyUsed => "ALREADY_USED",
            Self::NotEligible => "NOT_ELIGIBLE",
            Self::OrderIdConflict => "ORDER_ID_CONFLICT",
            Self::AlreadyReleased => "ALREADY_RELEASED",
            Self::AlreadyConfirmed => "ALREADY_CONFIRMED",
            Self::VoucherPaused => "VOUCHER_PAUSED",
            Self::VoucherArchived => "VOUCHER_ARCHIVED",
            Self::ChangeNotAllowed => "CHANGE_NOT_ALLOWED",
            Self::PreconditionFailed => "PRECONDITION_FAILED",
            Self::PreconditionRequired => "PRECONDITION_REQUIRED",
            Self::ServiceUnavailable => "SERVICE_UNAVAILABLE",
            Self::Internal => "INTERNAL",
            Self::BadRequest => "BAD_REQUEST",
            Self::RateLimited => "RATE_LIMITED",
            Self::HeadersTooLarge => "HEADERS_TOO_LARGE",
            Self::Overloaded => "OVERLOADED",
        }
    }

    /// The code a header or body carries, if it is one of ours.
    pub fn parse(raw: &[u8]) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str().as_bytes() == raw)
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips_and_is_distinct() {
        let mut seen = std::collections::HashSet::new();
        for code in ErrorCode::ALL {
            assert_eq!(ErrorCode::parse(code.as_str().as_bytes()), Some(code));
            assert!(seen.insert(code.as_str()), "{code} twice");
        }
        assert_eq!(ErrorCode::parse(b"out_of_stock"), None);
    }
}
