//! The one middleware around every request of the API: the request id, the request's
//! span, the body limit, the metrics, the failure log and the access log. Outermost, so
//! that every log line of a request (its failure included) carries the id the edge passed
//! on, one line per request says what was answered and how long it took, and, with tracing
//! on, the request's span continues the trace of the edge's `traceparent` (or a client's).
//!
//! One middleware rather than one per concern: axum boxes the future of every layer of a
//! router, per request. With three `from_fn` middlewares (this one, the failure log, the
//! metrics) and two layers (the body limit, its extension), a request's boxed handler and
//! middleware futures held 11.4 KiB per busy connection in `loadtest/heap-core.sh`'s heap
//! profile (`reports/heap/BEFORE-middleware.md`).

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;
use voucher_contract::headers::REQUEST_ID;
use voucher_contract::request::{logged_path, valid_request_id, RequestIds};

use super::extract::BodyLimit;
use crate::metrics::{self, Metrics};

/// What the middleware needs: whether each request gets an access log line (at `info`,
/// target `access`), the ids of requests that came without one, the metrics it counts
/// requests in and the body limit the JSON extractor enforces.
pub struct Access {
    pub log: bool,
    pub ids: RequestIds,
    pub metrics: Arc<Metrics>,
    pub body_limit: BodyLimit,
}

/// Middleware: takes the request's id (the edge's, or a client's valid one) or makes one,
/// runs the request in a span that carries it, counts and times it, logs it if it failed,
/// echoes the id on the answer and writes the access log line.
pub async fn track(access: Arc<Access>, mut request: Request, next: Next) -> Response {
    let started = Instant::now();
    let id = match request.headers().get(REQUEST_ID) {
        Some(value) if valid_request_id(value.as_bytes()) => value.clone(),
        // Hexadecimal digits: always a valid header value.
        _ => HeaderValue::from_bytes(&access.ids.next())
            .unwrap_or(HeaderValue::from_static("unknown")),
    };
    // The handlers see the id the request is known by (the audit trail keeps it).
    request.headers_mut().insert(REQUEST_ID, id.clone());
    // The route's template (bounded; shared, not copied).
    let route = request.extensions().get::<MatchedPath>().cloned();
    let (request_id, method) = (id.to_str().unwrap_or_default(), request.method());
    let path = logged_path(request.uri().path());
    let template = route.as_ref().map_or("unmatched", MatchedPath::as_str);
    let traced = voucher_telemetry::tracing_enabled();
    let span = if !traced {
        tracing::info_span!("request", request_id, %method, path)
    } else if matches!(template, "/healthz" | "/readyz") {
        // Probes (every 500 ms from each edge) are not traced: a target outside
        // `voucher_*` keeps the span from the exporter, not from the logs.
        tracing::info_span!(target: "access", "request", request_id, %method, path)
    } else {
        // Named `POST /vouchers/{code}/reservations` (method and route template, bounded),
        // a server span, with its status: the fields exporters read; log lines go without
        // them while tracing is off.
        tracing::info_span!(
            "request",
            request_id,
            %method,
            path,
            otel.name = format!("{method} {template}"),
            otel.kind = "server",
            http.response.status_code = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
        )
    };
    let headers = request.headers();
    voucher_telemetry::trace::continue_from(&span, |name| {
        headers.get(name).and_then(|v| v.to_str().ok())
    });
    // Cheap clones (a small enum, a shared buffer) for the failure log and the metrics.
    let (method, uri) = (request.method().clone(), request.uri().clone());
    request.extensions_mut().insert(access.body_limit);
    let mut response = next.run(request).instrument(span.clone()).await;
    let elapsed = started.elapsed();
    metrics::count_request(&access.metrics, &method, template, &response, elapsed);
    {
        let _entered = span.enter();
        super::log_failure(&method, uri.path(), &response);
    }
    if traced {
        span.record("http.response.status_code", response.status().as_u16());
        if response.status().is_server_error() {
            span.record("otel.status_code", "ERROR");
        }
    }
    if access.log {
        let _entered = span.enter();
        tracing::info!(
            target: "access",
            status = response.status().as_u16(),
            route = template,
            duration_ms = elapsed.as_secs_f64() * 1000.0,
            "answered"
        );
    }
    response.headers_mut().insert(REQUEST_ID, id);
    response
}
