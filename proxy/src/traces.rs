//! The edge's span of each request, with tracing on (`tracing.otlp_endpoint`): it
//! continues the client's `traceparent` (or starts a trace), replaces the client's trace
//! context on the request a core receives, so the core's spans are its children, and ends
//! when the request is logged, with the status and what the edge did (`outcome`).
//! Probes (`/healthz`, `/readyz`) have none. With tracing off, every function here returns
//! at once and the client's headers reach the core untouched.

use http::HeaderValue;
use pingora::http::RequestHeader;
use pingora::Result;
use tracing::field::Empty;
use tracing::Span;
use voucher_contract::Route;
use voucher_telemetry::trace;

/// The span of a request just classified as `route`.
pub(crate) fn start(header: &RequestHeader, route: &Route, request_id: &HeaderValue) -> Span {
    if !voucher_telemetry::tracing_enabled() {
        return Span::none();
    }
    let request_id = request_id.to_str().unwrap_or_default();
    let span = tracing::info_span!(
        "edge.request",
        otel.kind = "server",
        route = route.label(),
        http.request.method = %header.method,
        request_id,
        http.response.status_code = Empty,
        outcome = Empty,
        otel.status_code = Empty,
    );
    trace::continue_from(&span, |name| {
        header.headers.get(name).and_then(|v| v.to_str().ok())
    });
    span
}

/// Puts `span`'s context on the request to a core, in place of the client's.
pub(crate) fn pass_on(span: &Span, upstream: &mut RequestHeader) -> Result<()> {
    for (name, value) in trace::outgoing(span) {
        upstream.insert_header(name, value)?;
    }
    Ok(())
}

/// Records how the request ended; the span itself ends with the request's context.
pub(crate) fn finish(span: &Span, status: u16, outcome: &'static str) {
    if span.is_disabled() {
        return;
    }
    span.record("http.response.status_code", status);
    span.record("outcome", outcome);
    if status >= 500 || status == 0 {
        span.record("otel.status_code", "ERROR");
    }
}
