//! The one error type of the core, and the one place where errors become HTTP answers.
//!
//! Every variant knows its status and its stable `error` code (the codes are the wire
//! contract's, shared with the edge). Errors keep their cause as their `source`; they are
//! logged once, with that chain, by the HTTP layer (`http::log_failure`) or by the
//! background job that met them, never where they are made. Bodies of 5xx answers say
//! nothing about internals.

use std::sync::Arc;

use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use voucher_contract::{headers, ErrorCode, RETRY_AFTER_SECS};

use crate::domain::{FieldError, Ineligibility};

/// The cause of an unavailable dependency, kept for the log.
pub type Cause = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{}: {}", .0.field, .0.reason)]
    InvalidRequest(FieldError),
    #[error("the request body is not valid JSON: {0}")]
    MalformedJson(String),
    #[error("the request body must be JSON (Content-Type: application/json)")]
    UnsupportedMediaType,
    #[error("the request body is larger than {limit} bytes")]
    PayloadTooLarge { limit: usize },
    #[error("this call needs a bearer token")]
    Unauthorized,
    #[error("the bearer token is not accepted")]
    Forbidden,
    /// A valid token without the scope the call needs.
    #[error("the bearer token lacks the scope {0}")]
    MissingScope(&'static str),
    #[error("no such route")]
    RouteNotFound,
    #[error("method not allowed on this route")]
    MethodNotAllowed,
    #[error("voucher not found")]
    VoucherNotFound,
    #[error("no reservation for this order on this voucher")]
    ReservationNotFound,
    #[error("a voucher with this code already exists")]
    VoucherExists,
    #[error("the voucher has no uses left")]
    OutOfStock,
    #[error("the customer already holds as many uses of this voucher as it allows")]
    AlreadyUsed,
    #[error("the order is not eligible for this voucher")]
    NotEligible(Ineligibility),
    #[error("this orderId is already used by a different reservation request")]
    OrderIdConflict,
    #[error("the reservation was already released")]
    AlreadyReleased,
    #[error("the reservation was already confirmed")]
    AlreadyConfirmed,
    #[error("the voucher is paused: it takes no new reservation until it is resumed")]
    VoucherPaused,
    #[error("the voucher is archived: it takes no reservation")]
    VoucherArchived,
    #[error("{}: {}", .0.field, .0.reason)]
    ChangeNotAllowed(FieldError),
    #[error("the voucher changed since the version named in If-Match; read it again")]
    PreconditionFailed,
    #[error("a change must name the version it read (If-Match with the voucher's ETag)")]
    PreconditionRequired,
    #[error("{0} is not available as a voucher mode yet")]
    ModeUnavailable(&'static str),
    /// A dependency cannot be reached or is overloaded: the client may retry later.
    #[error("{dependency} is unavailable")]
    Unavailable {
        dependency: &'static str,
        #[source]
        cause: Option<Cause>,
    },
    /// At the admission limit: refused before anything was done, so a retry is safe.
    #[error("the service is at its admission limit; retry after the Retry-After seconds")]
    Overloaded,
    /// A bug or corrupt data: never the client's fault, never shown to it.
    #[error("internal error")]
    Internal(#[source] anyhow::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An error and every cause under it, `outer: inner: ...`: what a log line needs to say
/// why (a bare `%e` prints the outermost message only).
pub fn cause_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

impl Error {
    /// `dependency` cannot serve now, for a reason of our own (a gate rebuilding).
    pub fn unavailable(dependency: &'static str) -> Self {
        Self::Unavailable {
            dependency,
            cause: None,
        }
    }

    /// `dependency` failed with `cause`.
    pub fn unavailable_because(dependency: &'static str, cause: impl Into<Cause>) -> Self {
        Self::Unavailable {
            dependency,
            cause: Some(cause.into()),
        }
    }

    /// Something that cannot happen unless the code or the stored data is wrong.
    pub fn internal(cause: impl Into<anyhow::Error>) -> Self {
        Self::Internal(cause.into())
    }

    /// Data we wrote ourselves that does not parse back: `what` says which.
    pub fn corrupt(what: impl std::fmt::Display) -> Self {
        Self::Internal(anyhow::anyhow!("corrupt data: {what}"))
    }

    pub fn status(&self) -> StatusCode {
        match self {
            Self::InvalidRequest(_) | Self::MalformedJson(_) | Self::ModeUnavailable(_) => {
                StatusCode::BAD_REQUEST
            }
            Self::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::Forbidden | Self::MissingScope(_) => StatusCode::FORBIDDEN,
            Self::RouteNotFound | Self::VoucherNotFound | Self::ReservationNotFound => {
                StatusCode::NOT_FOUND
            }
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::VoucherExists
            | Self::OutOfStock
            | Self::AlreadyUsed
            | Self::OrderIdConflict
            | Self::AlreadyReleased
            | Self::AlreadyConfirmed
            | Self::VoucherPaused
            | Self::VoucherArchived
            | Self::ChangeNotAllowed(_) => StatusCode::CONFLICT,
            Self::PreconditionFailed => StatusCode::PRECONDITION_FAILED,
            Self::PreconditionRequired => StatusCode::PRECONDITION_REQUIRED,
            Self::NotEligible(_) => StatusCode::UNPROCESSABLE_ENTITY,
            Self::Unavailable { .. } | Self::Overloaded => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The stable code clients switch on.
    pub fn error_code(&self) -> ErrorCode {
        match self {
            Self::InvalidRequest(_) | Self::ModeUnavailable(_) => ErrorCode::InvalidRequest,
            Self::MalformedJson(_) => ErrorCode::MalformedJson,
            Self::UnsupportedMediaType => ErrorCode::UnsupportedMediaType,
            Self::PayloadTooLarge { .. } => ErrorCode::PayloadTooLarge,
            Self::Unauthorized => ErrorCode::Unauthorized,
            Self::Forbidden | Self::MissingScope(_) => ErrorCode::Forbidden,
            Self::RouteNotFound => ErrorCode::RouteNotFound,
            Self::MethodNotAllowed => ErrorCode::MethodNotAllowed,
            Self::VoucherNotFound => ErrorCode::VoucherNotFound,
            Self::ReservationNotFound => ErrorCode::ReservationNotFound,
            Self::VoucherExists => ErrorCode::VoucherExists,
            Self::OutOfStock => ErrorCode::OutOfStock,
            Self::AlreadyUsed => ErrorCode::AlreadyUsed,
            Self::NotEligible(_) => ErrorCode::NotEligible,
            Self::OrderIdConflict => ErrorCode::OrderIdConflict,
            Self::AlreadyReleased => ErrorCode::AlreadyReleased,
            Self::AlreadyConfirmed => ErrorCode::AlreadyConfirmed,
            Self::VoucherPaused => ErrorCode::VoucherPaused,
            Self::VoucherArchived => ErrorCode::VoucherArchived,
            Self::ChangeNotAllowed(_) => ErrorCode::ChangeNotAllowed,
            Self::PreconditionFailed => ErrorCode::PreconditionFailed,
            Self::PreconditionRequired => ErrorCode::PreconditionRequired,
            Self::Unavailable { .. } => ErrorCode::ServiceUnavailable,
            Self::Overloaded => ErrorCode::Overloaded,
            Self::Internal(_) => ErrorCode::Internal,
        }
    }

    pub fn code(&self) -> &'static str {
        self.error_code().as_str()
    }

    /// The error and every cause under it, `: `-separated, for the log.
    pub fn chain(&self) -> String {
        cause_chain(self)
    }

    fn body(&self) -> serde_json::Value {
        match self {
            Self::InvalidRequest(e) | Self::ChangeNotAllowed(e) => json!({
                "error": self.code(),
                "message": format!("{}: {}", e.field, e.reason),
                "field": e.field,
            }),
            Self::ModeUnavailable(_) => json!({
                "error": self.code(),
                "message": self.to_string(),
                "field": "mode",
            }),
            Self::NotEligible(reason) => json!({
                "error": self.code(),
                "message": self.to_string(),
                "reason": reason.code(),
            }),
            // Only the top line: causes name internals, and those stay in the log.
            _ => json!({ "error": self.code(), "message": self.to_string() }),
        }
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let status = self.status();
        let mut response = (status, Json(self.body())).into_response();
        let headers = response.headers_mut();
        if status == StatusCode::SERVICE_UNAVAILABLE {
            headers.insert(
                HeaderName::from_static(headers::RETRY_AFTER),
                HeaderValue::from(RETRY_AFTER_SECS),
            );
        }
        // The code as a header too, so a proxy can act on it without parsing the body.
        headers.insert(
            HeaderName::from_static(headers::ERROR_CODE),
            HeaderValue::from_static(self.code()),
        );
        // The error itself rides along for the layers that log and count it.
        response.extensions_mut().insert(Arc::new(self));
        response
    }
}

impl From<FieldError> for Error {
    fn from(e: FieldError) -> Self {
        Self::InvalidRequest(e)
    }
}

/// Database errors: constraint violations become client errors *by constraint name*;
/// connection trouble becomes a 503 the client may retry; the rest is internal. The
/// original error stays as the cause.
impl From<sqlx::Error> for Error {
    fn from(e: sqlx::Error) -> Self {
        let transient = match &e {
            sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::WorkerCrashed => true,
            sqlx::Error::Database(db) => {
                if let Some(known) = db.constraint().and_then(constraint_error) {
                    return known;
                }
                db.code().is_some_and(|c| transient_sqlstate(&c))
            }
            _ => false,
        };
        if transient {
            Self::unavailable_because("database", e)
        } else {
            Self::internal(e)
        }
    }
}

/// SQLSTATEs that say "not now" rather than "never": serialization failure, deadlock, too
/// many connections, shutting down or starting up, connection exceptions, and a database
/// that is not accepting connections (55000, as while an operator has closed it) or whose
/// lock is not available (55P03), and a write that met a standby (25006, the moment a
/// primary is demoted before the core follows the new one). The client may retry them: 503.
fn transient_sqlstate(code: &str) -> bool {
    matches!(
        code,
        "25006" | "40001" | "40P01" | "53300" | "55000" | "55P03" | "57P01" | "57P02" | "57P03"
    ) || code.starts_with("08")
}

/// The error a named constraint's refusal means to the client.
pub(crate) fn constraint_error(name: &str) -> Option<Error> {
    Some(match name {
        "vouchers_pkey" => Error::VoucherExists,
        "vouchers_used_within_limit" => Error::OutOfStock,
        "customer_usage_within_limit" => Error::AlreadyUsed,
        "redemptions_order_id_key" => Error::OrderIdConflict,
        // Not constraints: the names the statements that take a use give a voucher whose
        // row is not active (`store::batch`).
        "voucher_paused" => Error::VoucherPaused,
        "voucher_archived" => Error::VoucherArchived,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unavailable_dependency_keeps_its_cause_for_the_log_only() {
        let cause = std::io::Error::new(std::io::ErrorKind::TimedOut, "redis timed out");
        let error = Error::unavailable_because("redis", cause);
        assert_eq!(error.chain(), "redis is unavailable: redis timed out");
        assert_eq!(error.body()["message"], "redis is unavailable");
        let response = error.into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[headers::RETRY_AFTER], "1");
        assert_eq!(
            response.headers()[headers::ERROR_CODE],
            "SERVICE_UNAVAILABLE"
        );
        assert!(
            response.extensions().get::<Arc<Error>>().is_some(),
            "for the log layer"
        );
    }

    #[test]
    fn an_internal_error_says_nothing_of_its_cause_to_the_client() {
        let error = Error::corrupt("gate record \"X|...\"");
        assert!(error.chain().contains("gate record"));
        assert_eq!(
            error.body(),
            json!({"error": "INTERNAL", "message": "internal error"})
        );
    }

    #[test]
    fn a_database_that_says_not_now_is_unavailable_not_broken() {
        // 55000: "database ... is not currently accepting connections" (the fault
        // campaign's database outage answered 500 before this was transient).
        for code in ["55000", "57P01", "57P03", "08006", "40001", "53300"] {
            assert!(transient_sqlstate(code), "{code}");
        }
        // A missing table or a syntax error is ours to fix, not the client's to retry.
        for code in ["42P01", "42601", "23505"] {
            assert!(!transient_sqlstate(code), "{code}");
        }
    }

    #[test]
    fn every_code_is_one_of_the_contract() {
        let errors = [
            Error::OutOfStock,
            Error::ModeUnavailable("flash"),
            Error::unavailable("voucher gate"),
            Error::internal(anyhow::anyhow!("x")),
        ];
        for e in errors {
            assert!(ErrorCode::ALL.contains(&e.error_code()), "{}", e.code());
        }
    }
}
