//! The request id and the access log: one middleware, outermost, so that every log line of
//! a request (its failure included) carries the id the edge passed on, and one line per
//! request says what was answered and how long it took.

use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;
use voucher_contract::headers::REQUEST_ID;
use voucher_contract::request::valid_request_id;

/// Whether each request gets an access log line (at `info`, target `access`).
#[derive(Clone, Copy)]
pub struct AccessLog(pub bool);

/// Middleware: takes the request's id (the edge's, or a client's valid one) or makes one,
/// runs the request in a span that carries it, echoes it on the answer and writes the
/// access log line.
pub async fn track(access: AccessLog, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let id = match request.headers().get(REQUEST_ID) {
        Some(value) if valid_request_id(value.as_bytes()) => value.clone(),
        _ => new_id(),
    };
    let method = request.method().clone();
    // The route's template (bounded), and the path as sent, capped.
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned());
    let path: String = request.uri().path().chars().take(256).collect();
    let span = tracing::info_span!(
        "request",
        request_id = id.to_str().unwrap_or_default(),
        %method,
        path,
    );
    let mut response = next.run(request).instrument(span.clone()).await;
    if access.0 {
        let _entered = span.enter();
        tracing::info!(
            target: "access",
            status = response.status().as_u16(),
            route = route.as_deref().unwrap_or("unmatched"),
            duration_ms = started.elapsed().as_secs_f64() * 1000.0,
            "answered"
        );
    }
    response.headers_mut().insert(REQUEST_ID, id);
    response
}

fn new_id() -> HeaderValue {
    let id = uuid::Uuid::new_v4().simple().to_string();
    // 32 hexadecimal digits: always a valid header value.
    HeaderValue::from_str(&id).unwrap_or(HeaderValue::from_static("unknown"))
}
