//! Extractors whose rejections speak the API's error format instead of axum's plain text.

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE, IF_MATCH};
use axum::http::request::Parts;
use http_body_util::{BodyExt, LengthLimitError};
use serde::de::DeserializeOwned;

use voucher_contract::headers::REQUEST_ID;

use super::AppState;
use crate::auth::Scope;
use crate::domain::FieldError;
use crate::store::Actor;
use crate::Error;

/// A JSON body. Refuses a missing or wrong Content-Type (415), a body over the limit
/// (413), broken JSON (400 MALFORMED_JSON) and a wrong, missing or unknown field
/// (400 INVALID_REQUEST naming the field).
pub struct ApiJson<T>(pub T);

/// axum's default body limit, for a request that reaches the extractor without one set.
const DEFAULT_BODY_LIMIT: usize = 2 * 1024 * 1024;

impl<S, T> FromRequest<S> for ApiJson<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = Error;

    async fn from_request(req: Request, _state: &S) -> Result<Self, Self::Rejection> {
        let is_json = req
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(voucher_contract::request::is_json);
        if !is_json {
            return Err(Error::UnsupportedMediaType);
        }
        // The API's middleware leaves the limit in force here; without it (a router built
        // without the middleware) axum's own default applies.
        let limit = req
            .extensions()
            .get::<BodyLimit>()
            .map_or(DEFAULT_BODY_LIMIT, |l| l.0);
        let body = http_body_util::Limited::new(req.into_body(), limit);
        let bytes = match body.collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
                return Err(Error::PayloadTooLarge { limit })
            }
            Err(_) => return Err(Error::MalformedJson("the body could not be read".into())),
        };
        parse_json(&bytes).map(ApiJson)
    }
}

/// The body limit in force, left in the request extensions by the API's middleware: the
/// JSON extractor reads no more than it, and a 413 says it. Only [`ApiJson`] enforces it
/// (the router has no `DefaultBodyLimit`): a handler that took axum's own body extractors
/// would get axum's default of 2 MiB instead.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimit(pub usize);

fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Error> {
    // serde would also build a struct from a JSON array of its fields in order; the API
    // takes objects only.
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    if first != Some(&b'{') {
        return Err(
            match serde_json::from_slice::<serde::de::IgnoredAny>(bytes) {
                Ok(_) => Error::InvalidRequest(FieldError::new("body", "must be a JSON object")),
                Err(e) => Error::MalformedJson(e.to_string()),
            },
        );
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        match inner.classify() {
            serde_json::error::Category::Data => {
                Error::InvalidRequest(field_error(&path, &inner.to_string()))
            }
            _ => Error::MalformedJson(inner.to_string()),
        }
    })?;
    // Trailing data after the JSON value is as malformed as a missing brace.
    de.end().map_err(|e| Error::MalformedJson(e.to_string()))?;
    Ok(value)
}

/// Names the field of a data error. serde reports missing and unknown fields at their
/// parent's path, with the name only in the message, so it is taken from there.
fn field_error(path: &str, message: &str) -> FieldError {
    let reason = message
        .split(" at line ")
        .next()
        .unwrap_or(message)
        .to_owned();
    let quoted = || message.split('`').nth(1).map(str::to_owned);
    let field = if message.starts_with("missing field") || message.starts_with("unknown field") {
        quoted().unwrap_or_else(|| path.to_owned())
    } else if path == "." {
        "body".to_owned()
    } else {
        path.to_owned()
    };
    FieldError::new(field, reason)
}

/// Query parameters, with the API's error format on rejection (an unknown one included).
#[derive(FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(Error))]
pub struct ApiQuery<T>(pub T);

impl From<QueryRejection> for Error {
    fn from(rejection: QueryRejection) -> Self {
        let text = rejection.body_text();
        let reason = text
            .strip_prefix("Failed to deserialize query string: ")
            .unwrap_or(&text)
            .to_owned();
        let field = reason.split('`').nth(1).unwrap_or("query").to_owned();
        Error::InvalidRequest(FieldError::new(field, reason))
    }
}

/// Path parameters, with the API's error format on rejection.
#[derive(FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(Error))]
pub struct ApiPath<T>(pub T);

impl From<PathRejection> for Error {
    fn from(rejection: PathRejection) -> Self {
        Error::InvalidRequest(FieldError::new("path", rejection.body_text()))
    }
}

/// The bearer token a request presents, if any.
fn presented(parts: &Parts) -> Result<&str, Error> {
    parts
        .headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or(Error::Unauthorized)
}

/// The credential the request's token is, if it grants `scope`: 401 without a token,
/// 403 for a token not accepted or without the scope. The actor of the audit trail: the
/// credential's name and the request's id.
fn authorize(parts: &Parts, state: &AppState, scopes: &[Scope]) -> Result<Actor, Error> {
    let presented = presented(parts)?;
    let credential = state.credentials.authorize(presented, scopes)?;
    // Set by the access middleware on every request (the edge's, a client's, or made).
    let request_id = parts
        .headers
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    Ok(Actor {
        name: credential.name,
        request_id,
    })
}

/// An extractor proving that the request's token holds its scopes, with who it is.
macro_rules! scoped {
    ($(#[$doc:meta])* $name:ident, $($scope:expr),+) => {
        $(#[$doc])*
        pub struct $name(pub Actor);

        impl FromRequestParts<AppState> for $name {
            type Rejection = Error;

            async fn from_request_parts(
                parts: &mut Parts,
                state: &AppState,
            ) -> Result<Self, Self::Rejection> {
                authorize(parts, state, &[$($scope),+]).map($name)
            }
        }
    };
}

scoped!(
    /// `vouchers:write`: create, change, pause, resume, archive, reload a gate.
    VoucherWriter,
    Scope::VouchersWrite
);
scoped!(
    /// `vouchers:read`: list vouchers.
    VoucherReader,
    Scope::VouchersRead
);
scoped!(
    /// `orders:read`: a voucher's order list and filter (the edge's token holds this one
    /// only).
    OrdersReader,
    Scope::OrdersRead
);
scoped!(
    /// `vouchers:read` and `orders:read`: a voucher's reservations with their customers
    /// and amounts (pages, one order, the export). Two scopes, so that the edge's token,
    /// which holds `orders:read` alone, reads order filters and nothing else.
    LedgerReader,
    Scope::VouchersRead,
    Scope::OrdersRead
);
scoped!(
    /// `audit:read`: the audit trail.
    AuditReader,
    Scope::AuditRead
);

/// The version a change names (`If-Match: "7"`, the voucher's `ETag`); `None` without the
/// header or with `*` (any version).
pub struct IfMatch(pub Option<i64>);

impl<S: Send + Sync> FromRequestParts<S> for IfMatch {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let Some(value) = parts.headers.get(IF_MATCH) else {
            return Ok(IfMatch(None));
        };
        let invalid = || {
            Error::InvalidRequest(FieldError::new(
                "If-Match",
                "must be the voucher's ETag, as GET returned it (\"7\")",
            ))
        };
        let raw = value.to_str().map_err(|_| invalid())?.trim();
        if raw == "*" {
            return Ok(IfMatch(None));
        }
        let tag = raw.strip_prefix("W/").unwrap_or(raw);
        let version = tag
            .strip_prefix('"')
            .and_then(|t| t.strip_suffix('"'))
            .and_then(|t| t.parse::<i64>().ok())
            .filter(|v| *v > 0)
            .ok_or_else(invalid)?;
        Ok(IfMatch(Some(version)))
    }
}

/// A voucher's `ETag` for `version`.
pub fn etag(version: i64) -> String {
    format!("\"{version}\"")
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    #[allow(dead_code)]
    struct Body {
        order_amount: i64,
    }

    fn field_of(json: &str) -> String {
        match parse_json::<Body>(json.as_bytes()) {
            Err(Error::InvalidRequest(e)) => e.field.into_owned(),
            other => panic!("expected INVALID_REQUEST, got {other:?}"),
        }
    }

    #[test]
    fn names_the_field_at_fault() {
        assert_eq!(field_of(r#"{"orderAmount": "ten"}"#), "orderAmount");
        assert_eq!(field_of(r#"{}"#), "orderAmount");
        assert_eq!(field_of(r#"{"orderAmount": 1, "coupon": 2}"#), "coupon");
        assert_eq!(field_of(r#"[1]"#), "body");
    }

    #[test]
    fn broken_json_is_malformed() {
        assert!(matches!(
            parse_json::<Body>(b"{\"orderAmount\": "),
            Err(Error::MalformedJson(_))
        ));
        assert!(matches!(
            parse_json::<Body>(b"{\"orderAmount\": 1} x"),
            Err(Error::MalformedJson(_))
        ));
    }
}
