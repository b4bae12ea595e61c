//! The one error type of the core, and the one place where errors become HTTP answers.
//!
//! Every variant knows its status and its stable `error` code. Bodies of 5xx answers say
//! nothing about internals; the detail goes to the log.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::domain::{FieldError, Ineligibility};

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
    #[error("this call needs an admin bearer token")]
    Unauthorized,
    #[error("the admin bearer token is not accepted")]
    Forbidden,
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
    #[error("{0} is not available as a voucher mode yet")]
    ModeUnavailable(&'static str),
    /// A dependency cannot be reached or is overloaded: the client may retry later.
    #[error("{0} is unavailable")]
    Unavailable(&'static str),
    #[error("internal error: {0}")]
    Internal(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Response header carrying the error code of every error answer.
pub const ERROR_CODE_HEADER: axum::http::HeaderName =
    axum::http::HeaderName::from_static("x-error-code");

/// Seconds a client should wait before retrying a 503.
const RETRY_AFTER_SECS: &str = "1";

impl Error {
    pub fn status(&self) -> StatusCode {
        match self {
            Self::InvalidRequest(_) | Self::MalformedJson(_) | Self::ModeUnavailable(_) => {
                StatusCode::BAD_REQUEST
            }
            Self::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::Forbidden => StatusCode::FORBIDDEN,
            Self::RouteNotFound | Self::VoucherNotFound | Self::ReservationNotFound => {
                StatusCode::NOT_FOUND
            }
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::VoucherExists
            | Self::OutOfStock
            | Self::AlreadyUsed
            | Self::OrderIdConflict
            | Self::AlreadyReleased
            | Self::AlreadyConfirmed => StatusCode::CONFLICT,
            Self::NotEligible(_) => StatusCode::UNPROCESSABLE_ENTITY,
            Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The stable code clients switch on.
    pub fn code(&self) -> &'static str {
        match self {
            Self::InvalidRequest(_) | Self::ModeUnavailable(_) => "INVALID_REQUEST",
            Self::MalformedJson(_) => "MALFORMED_JSON",
            Self::UnsupportedMediaType => "UNSUPPORTED_MEDIA_TYPE",
            Self::PayloadTooLarge { .. } => "PAYLOAD_TOO_LARGE",
            Self::Unauthorized => "UNAUTHORIZED",
            Self::Forbidden => "FORBIDDEN",
            Self::RouteNotFound => "ROUTE_NOT_FOUND",
            Self::MethodNotAllowed => "METHOD_NOT_ALLOWED",
            Self::VoucherNotFound => "VOUCHER_NOT_FOUND",
            Self::ReservationNotFound => "RESERVATION_NOT_FOUND",
            Self::VoucherExists => "VOUCHER_EXISTS",
            Self::OutOfStock => "OUT_OF_STOCK",
            Self::AlreadyUsed => "ALREADY_USED",
            Self::NotEligible(_) => "NOT_ELIGIBLE",
            Self::OrderIdConflict => "ORDER_ID_CONFLICT",
            Self::AlreadyReleased => "ALREADY_RELEASED",
            Self::AlreadyConfirmed => "ALREADY_CONFIRMED",
            Self::Unavailable(_) => "SERVICE_UNAVAILABLE",
            Self::Internal(_) => "INTERNAL",
        }
    }

    fn body(&self) -> serde_json::Value {
        match self {
            Self::InvalidRequest(e) => json!({
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
            // Nothing about internals leaves the process; the log has the detail.
            Self::Internal(_) => json!({
                "error": self.code(),
                "message": "internal error",
            }),
            _ => json!({ "error": self.code(), "message": self.to_string() }),
        }
    }
}

/// The error code of an answer, left on the response for the metrics layer to read.
#[derive(Debug, Clone, Copy)]
pub struct ErrorCode(pub &'static str);

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing::error!(error = %self, code = self.code(), "request failed");
        }
        let mut response = (status, Json(self.body())).into_response();
        if status == StatusCode::SERVICE_UNAVAILABLE {
            response.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from_static(RETRY_AFTER_SECS),
            );
        }
        // The code as a header too, so a proxy can act on it without parsing the body.
        response
            .headers_mut()
            .insert(ERROR_CODE_HEADER, HeaderValue::from_static(self.code()));
        response.extensions_mut().insert(ErrorCode(self.code()));
        response
    }
}

impl From<FieldError> for Error {
    fn from(e: FieldError) -> Self {
        Self::InvalidRequest(e)
    }
}

/// Database errors: constraint violations become client errors *by constraint name*;
/// connection trouble becomes a 503 the client may retry; the rest is internal.
impl From<sqlx::Error> for Error {
    fn from(e: sqlx::Error) -> Self {
        match &e {
            sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::WorkerCrashed => {
                tracing::warn!(error = %e, "database unavailable");
                Self::Unavailable("database")
            }
            sqlx::Error::Database(db) => {
                if let Some(known) = db.constraint().and_then(constraint_error) {
                    return known;
                }
                match db.code().as_deref() {
                    // serialization failure, deadlock, too many connections, shutting down,
                    // connection exceptions: transient, the client may retry.
                    Some("40001" | "40P01" | "53300" | "57P01" | "57P02" | "57P03") => {
                        tracing::warn!(error = %e, "database transiently refused");
                        Self::Unavailable("database")
                    }
                    Some(code) if code.starts_with("08") => Self::Unavailable("database"),
                    _ => Self::Internal(e.to_string()),
                }
            }
            _ => Self::Internal(e.to_string()),
        }
    }
}

fn constraint_error(name: &str) -> Option<Error> {
    Some(match name {
        "vouchers_pkey" => Error::VoucherExists,
        "vouchers_used_within_limit" => Error::OutOfStock,
        "customer_usage_within_limit" => Error::AlreadyUsed,
        "redemptions_order_id_key" => Error::OrderIdConflict,
        _ => return None,
    })
}
