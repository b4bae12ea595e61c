//! The request id and the access log: one middleware, outermost, so that every log line of
//! a request (its failure included) carries the id the edge passed on, and one line per
//! request says what was answered and how long it took.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;
use voucher_contract::headers::REQUEST_ID;
use voucher_contract::request::{logged_path, valid_request_id, RequestIds};

/// What the middleware needs: whether each request gets an access log line (at `info`,
/// target `access`), and the ids of requests that came without one.
#[derive(Clone)]
pub struct Access {
    pub log: bool,
    pub ids: Arc<RequestIds>,
}

/// Middleware: takes the request's id (the edge's, or a client's valid one) or makes one,
/// runs the request in a span that carries it, echoes it on the answer and writes the
/// access log line.
pub async fn track(access: Access, mut request: Request, next: Next) -> Response {
    let started = Instant::now();
    let id = match request.headers().get(REQUEST_ID) {
        Some(value) if valid_request_id(value.as_bytes()) => value.clone(),
        // Hexadecimal digits: always a valid header value.
        _ => {
            HeaderValue::from_str(&access.ids.next()).unwrap_or(HeaderValue::from_static("unknown"))
        }
    };
    // The handlers see the id the request is known by (the audit trail keeps it).
    request.headers_mut().insert(REQUEST_ID, id.clone());
    // The route's template (bounded; shared, not copied).
    let route = request.extensions().get::<MatchedPath>().cloned();
    let span = tracing::info_span!(
        "request",
        request_id = id.to_str().unwrap_or_default(),
        method = %request.method(),
        path = logged_path(request.uri().path()),
    );
    let mut response = next.run(request).instrument(span.clone()).await;
    if access.log {
        let _entered = span.enter();
        tracing::info!(
            target: "access",
            status = response.status().as_u16(),
            route = route.as_ref().map_or("unmatched", MatchedPath::as_str),
            duration_ms = started.elapsed().as_secs_f64() * 1000.0,
            "answered"
        );
    }
    response.headers_mut().insert(REQUEST_ID, id);
    response
}
