//! The assertion every error answer gets: its status, its stable code in the body, and the
//! same code in the `x-error-code` header.

use reqwest::{Response, StatusCode};
use serde_json::Value;
use voucher_contract::headers;

/// Asserts `response` is the error `code` with `status`; returns its body.
pub async fn assert_error(response: Response, status: StatusCode, code: &str) -> Value {
    assert_eq!(response.status(), status, "status of {code}");
    let header = response
        .headers()
        .get(headers::ERROR_CODE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body: Value = response.json().await.expect("every error answer is JSON");
    assert_eq!(body["error"], code, "{body}");
    assert_eq!(
        header.as_deref(),
        Some(code),
        "{} header",
        headers::ERROR_CODE
    );
    body
}
