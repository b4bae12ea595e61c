//! The admin API as `voucherctl` speaks it, and its one error type: every failure is told
//! in words a person running a sale understands, with what to do next.

use reqwest::{Method, StatusCode};
use serde_json::Value;

/// What went wrong, for a person.
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    #[error(
        "cannot reach the voucher service at {url} ({cause}); is it running, and is --url right?"
    )]
    Unreachable { url: String, cause: String },
    #[error("the service wants a token for this: pass --token or set VOUCHERCTL_TOKEN")]
    NoToken,
    #[error("the token was refused: {0}")]
    Forbidden(String),
    #[error("there is no voucher {0}")]
    NoVoucher(String),
    #[error("there is no reservation for that order on {0}")]
    NoReservation(String),
    #[error("someone changed {0} since it was read; run the command again to apply your change to its new version")]
    Stale(String),
    #[error("{code} cannot be changed that way: {message}")]
    NotAllowed { code: String, message: String },
    #[error("the service refused the request: {0}")]
    Invalid(String),
    #[error("the service cannot answer right now ({0}); a change may have been made all the same: check with `voucherctl show`")]
    Unavailable(String),
    #[error("the service answered {status} {code}: {message}")]
    Other {
        status: u16,
        code: String,
        message: String,
    },
    #[error("{0}")]
    Usage(String),
}

pub type Result<T> = std::result::Result<T, CtlError>;

/// A client of one core's (or an edge's public) API.
#[derive(Clone)]
pub struct Api {
    base: String,
    token: Option<String>,
    http: reqwest::Client,
}

/// An answer: its status, its `ETag` (a voucher's version), and its body.
pub struct Answer {
    pub etag: Option<String>,
    pub body: Value,
}

impl Api {
    pub fn new(base: &str, token: Option<String>) -> Self {
        Self {
            base: base.trim_end_matches('/').to_owned(),
            token,
            http: reqwest::Client::builder()
                .connect_timeout(std::time::Duration::from_secs(3))
                .build()
                .unwrap_or_default(),
        }
    }

    fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        request
    }

    /// Sends `request` about voucher `code`; a non-2xx answer becomes its error.
    pub async fn send(
        &self,
        code: &str,
        request: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response> {
        let resp = request.send().await.map_err(|e| CtlError::Unreachable {
            url: self.base.clone(),
            cause: cause_chain(&e),
        })?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        Err(self.refusal(code, resp).await)
    }

    async fn refusal(&self, code: &str, resp: reqwest::Response) -> CtlError {
        let status = resp.status();
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        let error = body["error"].as_str().unwrap_or("").to_owned();
        let message = body["message"].as_str().unwrap_or("").to_owned();
        match (status, error.as_str()) {
            (StatusCode::UNAUTHORIZED, _) => CtlError::NoToken,
            (StatusCode::FORBIDDEN, _) => CtlError::Forbidden(message),
            (_, "VOUCHER_NOT_FOUND") => CtlError::NoVoucher(code.to_owned()),
            (_, "RESERVATION_NOT_FOUND") => CtlError::NoReservation(code.to_owned()),
            (_, "PRECONDITION_FAILED") => CtlError::Stale(code.to_owned()),
            (_, "CHANGE_NOT_ALLOWED") => CtlError::NotAllowed {
                code: code.to_owned(),
                message,
            },
            (_, "INVALID_REQUEST" | "MALFORMED_JSON") => CtlError::Invalid(message),
            (StatusCode::SERVICE_UNAVAILABLE, _) => CtlError::Unavailable(message),
            _ => CtlError::Other {
                status: status.as_u16(),
                code: error,
                message,
            },
        }
    }

    /// `method path` with an optional JSON body and `If-Match`, read as JSON.
    pub async fn call(
        &self,
        code: &str,
        method: Method,
        path: &str,
        body: Option<&Value>,
        if_match: Option<&str>,
    ) -> Result<Answer> {
        let mut request = self.request(method, path);
        if let Some(body) = body {
            request = request.json(body);
        }
        if let Some(tag) = if_match {
            request = request.header("if-match", tag);
        }
        let resp = self.send(code, request).await?;
        let etag = resp
            .headers()
            .get("etag")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = resp.json().await.map_err(|e| CtlError::Other {
            status: 200,
            code: "NOT_JSON".into(),
            message: cause_chain(&e),
        })?;
        Ok(Answer { etag, body })
    }

    pub async fn get(&self, code: &str, path: &str) -> Result<Answer> {
        self.call(code, Method::GET, path, None, None).await
    }

    /// A raw GET (the export), for streaming.
    pub async fn stream(&self, code: &str, path: &str) -> Result<reqwest::Response> {
        self.send(code, self.request(Method::GET, path)).await
    }

    /// The text of a metrics endpoint (no token: metrics listen apart).
    pub async fn metrics_text(&self, url: &str) -> Result<String> {
        let resp = self
            .http
            .get(url)
            .timeout(std::time::Duration::from_secs(2))
            .send()
            .await
            .map_err(|e| CtlError::Unreachable {
                url: url.to_owned(),
                cause: cause_chain(&e),
            })?;
        resp.text().await.map_err(|e| CtlError::Unreachable {
            url: url.to_owned(),
            cause: cause_chain(&e),
        })
    }
}

/// An error with its causes (reqwest's own message says "error sending request" only).
fn cause_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
