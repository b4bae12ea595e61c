//! The `ProxyHttp` implementation: what the edge does in each phase of a request.

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;
use http::{HeaderName, HeaderValue};
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::lb::LoadBalancer;
use pingora::prelude::{HttpPeer, ProxyHttp, Session};
use pingora::protocols::l4::socket::SocketAddr;
use pingora::proxy::FailToProxy;
use pingora::{Error, ErrorType, Result};
use voucher_contract::request;
use voucher_contract::{headers, ErrorCode, Route};
use voucher_telemetry::access::AccessLine;

use crate::config::EdgeSettings;
use crate::flagging::Flagger;
use crate::metrics::EdgeMetrics;
use crate::rate_limit::RateLimits;
use crate::routing::{self, CoreChoice};
use crate::sold_out::SoldOutCache;
use crate::traces;

pub struct Edge {
    pub upstreams: Arc<LoadBalancer<CoreChoice>>,
    pub sold_out: SoldOutCache,
    pub rate_limits: RateLimits,
    pub metrics: Arc<EdgeMetrics>,
    pub settings: Arc<EdgeSettings>,
    /// Starts and renews sold-out flags, fetching their order filters from the cores.
    pub flagger: Flagger,
    /// Ids of requests that came without a valid one.
    pub request_ids: request::RequestIds,
    /// Each voucher's places at the cores (`voucher_in_flight`).
    pub places: crate::places::VoucherPlaces,
    /// Places for reservations waiting on a new flag's filter (`sold_out_max_waiting`).
    pub flag_waiters: Arc<tokio::sync::Semaphore>,
    /// Bounds the reservations the edge has at the cores at once (`admission`).
    pub admission: voucher_admission::Limiter,
    /// Set on SIGTERM: the edge's `readyz` answers 503 while it drains (`server::Drain`).
    pub draining: Arc<std::sync::atomic::AtomicBool>,
}

/// The edge's own health endpoint (answered by the edge, never forwarded).
pub const EDGE_HEALTH_PATH: &str = "/healthz";
/// The edge's own readiness (answered by the edge, never forwarded): 200 while it has a
/// ready core and is not draining, 503 otherwise.
pub const EDGE_READINESS_PATH: &str = "/readyz";

/// Per-request state carried between the phases, boxed: pingora keeps the context in each
/// request's future, which it moves as a whole (`memcpy`), so a context of a few hundred
/// bytes cost more in copies than its one allocation (`reports/callgrind/EDGE.md`).
pub struct Ctx(Box<RequestState>);

impl std::ops::Deref for Ctx {
    type Target = RequestState;
    fn deref(&self) -> &RequestState {
        &self.0
    }
}

impl std::ops::DerefMut for Ctx {
    fn deref_mut(&mut self) -> &mut RequestState {
        &mut self.0
    }
}

/// What [`Ctx`] holds.
pub struct RequestState {
    pub(crate) route: Route,
    /// A reservation's voucher code as the core reads it, when its request is one a core
    /// would take past its checks: the key of the voucher's one sold-out flag.
    pub(crate) code: Option<String>,
    /// When pingora handed the request over, its header read: the start of its duration
    /// and of its body's `client_timeout`.
    pub(crate) started: Instant,
    /// What happened, for metrics: `forwarded` or why the edge answered.
    outcome: &'static str,
    /// Upstreams this request failed to reach, skipped when it is retried.
    failed: Vec<SocketAddr>,
    /// The client went (or could not be read) while the request was at a core.
    left_at_core: bool,
    /// The `x-request-id` this request goes on with (the client's valid one, or a new one),
    /// kept as the header value every answer carries: made a value once, not in each answer.
    pub(crate) request_id: HeaderValue,
    /// A reservation's place within the admission limit, from its screening until it is
    /// logged (answered or given up).
    pub(crate) admitted: Option<voucher_admission::Permit>,
    /// A reservation's place among its voucher's at the cores (`places`), held as long.
    pub(crate) voucher_place: Option<tokio::sync::OwnedSemaphorePermit>,
    /// The request's span (`traces`); disabled while tracing is off, and for probes.
    pub(crate) span: tracing::Span,
}

/// The headers of the edge's own answers, parsed once: pingora's `insert_header` parses a
/// name on every call and keeps a second map of its spelling, which cost the reject path
/// about 1,200 instructions a header (`reports/callgrind/EDGE.md`).
static CONTENT_TYPE_JSON: HeaderValue = HeaderValue::from_static("application/json");
static SERVED_BY: HeaderName = HeaderName::from_static(headers::SERVED_BY);
static SERVED_BY_EDGE: HeaderValue = HeaderValue::from_static("edge");
pub(crate) static REQUEST_ID: HeaderName = HeaderName::from_static(headers::REQUEST_ID);

/// Writes a complete JSON answer of the edge's own (`x-served-by: edge`, the request's
/// `x-request-id`), keeping the connection alive (a Content-Length is what allows
/// keep-alive). The header is built as `http`'s parts, names lower case, without pingora's
/// map of header spellings: the edge's own answers have no client spelling to keep.
pub(crate) async fn write_json(
    session: &mut Session,
    status: u16,
    body: JsonBody,
    request_id: &HeaderValue,
    extra: &[(&HeaderName, HeaderValue)],
) -> Result<()> {
    let (mut parts, ()) = http::Response::new(()).into_parts();
    parts.status = http::StatusCode::from_u16(status)
        .map_err(|e| Error::because(ErrorType::InternalError, "the edge's answer", e))?;
    let headers = &mut parts.headers;
    // The edge's four below, the extras, and pingora's two (`Date`, `Connection`,
    // inserted as the header is written): sized without pingora's, the map grew and
    // rehashed in every answer, about 720 instructions (`reports/callgrind/EDGE.md`).
    headers.reserve(4 + extra.len() + 2);
    headers.insert(http::header::CONTENT_TYPE, CONTENT_TYPE_JSON.clone());
    headers.insert(http::header::CONTENT_LENGTH, body.length);
    headers.insert(SERVED_BY.clone(), SERVED_BY_EDGE.clone());
    // Set (checked, or made) by request_filter before any answer; empty only for an error
    // pingora met before it.
    if !request_id.is_empty() {
        headers.insert(REQUEST_ID.clone(), request_id.clone());
    }
    for (name, value) in extra {
        headers.insert((*name).clone(), value.clone());
    }
    session.set_keepalive(Some(60));
    session
        .write_response_header(Box::new(ResponseHeader::from(parts)), false)
        .await?;
    session.write_response_body(Some(body.bytes), true).await?;
    Ok(())
}

/// A JSON body of the edge's own with its `content-length` value, made together: a body
/// the edge keeps (a flag's refusal) keeps its length too, where making the value from the
/// number was an allocation in every answer.
#[derive(Clone)]
pub(crate) struct JsonBody {
    bytes: Bytes,
    length: HeaderValue,
}

impl JsonBody {
    /// The same body in memory never freed, for a body kept as long as the process (a
    /// flag's refusal): a clone of a static `Bytes` touches no reference count, where
    /// every answer from a kept body had both request workers add to and take from the
    /// same count, a cache line passed between the cores (`reports/callgrind/EDGE.md`).
    pub(crate) fn kept_forever(self) -> JsonBody {
        let bytes: &'static [u8] = Box::leak(self.bytes.to_vec().into_boxed_slice());
        let length: &'static [u8] = Box::leak(self.length.as_bytes().to_vec().into_boxed_slice());
        JsonBody {
            bytes: Bytes::from_static(bytes),
            length: HeaderValue::from_maybe_shared(Bytes::from_static(length))
                .unwrap_or(self.length),
        }
    }
}

/// A JSON body of the edge's own.
pub(crate) fn json_body(body: &impl serde::Serialize) -> Result<JsonBody> {
    let bytes = serde_json::to_vec(body)
        .map(Bytes::from)
        .map_err(|e| Error::because(ErrorType::InternalError, "the edge's answer", e))?;
    Ok(JsonBody {
        length: HeaderValue::from(bytes.len()),
        bytes,
    })
}

/// The status class label of the edge's answers (`2xx` ... `5xx`; `none` when nothing
/// was answered): bounded, whatever a core sends.
fn status_class(status: u16) -> &'static str {
    match status {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        500..=599 => "5xx",
        _ => "none",
    }
}

#[async_trait]
impl ProxyHttp for Edge {
    type CTX = Ctx;

    fn new_ctx(&self) -> Ctx {
        Ctx(Box::new(RequestState {
            route: Route::Other,
            code: None,
            started: Instant::now(),
            outcome: "forwarded",
            failed: Vec::new(),
            left_at_core: false,
            request_id: HeaderValue::from_static(""),
            admitted: None,
            voucher_place: None,
            span: tracing::Span::none(),
        }))
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut Ctx) -> Result<bool> {
        // Slow or stalled clients are cut off; the core never waits on them.
        let timeout = Some(self.settings.client_timeout);
        session.as_mut().set_read_timeout(timeout);
        let Some(answer) = self.screen(session, ctx).await? else {
            return Ok(false);
        };
        ctx.outcome = answer.outcome();
        self.give(session, ctx, answer).await?;
        Ok(true)
    }

    async fn upstream_peer(&self, _session: &mut Session, ctx: &mut Ctx) -> Result<Box<HttpPeer>> {
        // A reservation to its voucher's core, anything else round-robin (`routing`); a
        // core not ready, or one this request failed on, is passed over for the next.
        let key = routing::key(ctx.code.as_deref());
        let failed = &ctx.failed;
        let backend = self
            .upstreams
            .select_with(key, 256, |b, healthy| {
                // Compared as addresses: written as text for each candidate, this was
                // the larger part of choosing a core (`reports/callgrind/EDGE.md`).
                healthy && !failed.contains(&b.addr)
            })
            .ok_or_else(|| Error::explain(ErrorType::HTTPStatus(503), "no healthy core"))?;
        let mut peer = HttpPeer::new(backend.addr.clone(), false, String::new());
        peer.options.connection_timeout = Some(self.settings.upstream_connect_timeout);
        peer.options.read_timeout = Some(self.settings.upstream_read_timeout);
        Ok(Box::new(peer))
    }

    async fn upstream_request_filter(
        &self,
        _session: &mut Session,
        upstream_request: &mut RequestHeader,
        ctx: &mut Ctx,
    ) -> Result<()> {
        // The client's valid id is in the request already (an invalid one was removed); a
        // new one is put there only now, when the request goes to a core (the edge's own
        // answers take it from `ctx`).
        if upstream_request.headers.get(&REQUEST_ID).is_none() && !ctx.request_id.is_empty() {
            upstream_request.insert_header(headers::REQUEST_ID, ctx.request_id.clone())?;
        }
        traces::pass_on(&ctx.span, upstream_request)
    }

    fn fail_to_connect(
        &self,
        _session: &mut Session,
        peer: &HttpPeer,
        ctx: &mut Ctx,
        mut e: Box<Error>,
    ) -> Box<Error> {
        // Connecting failed, so nothing was sent: another core may take it. (Reservations
        // are idempotent by orderId anyway.)
        self.metrics
            .upstream_errors
            .with_label_values(&["connect"])
            .inc();
        ctx.failed.push(peer._address.clone());
        if ctx.failed.len() < self.settings.upstreams.len() {
            e.set_retry(true);
        }
        e
    }

    fn error_while_proxy(
        &self,
        peer: &HttpPeer,
        session: &mut Session,
        e: Box<Error>,
        ctx: &mut Ctx,
        _client_reused: bool,
    ) -> Box<Error> {
        // The client went away (or could not be read) while its request was at a core:
        // nothing the core did wrong, and nobody left to answer. Sent on to another core,
        // every client that gives up at a sale's peak would cost the cores its request
        // twice, and count as a core's failure.
        if e.esource() == &pingora::ErrorSource::Downstream {
            ctx.left_at_core = true;
            let mut e = e.more_context(format!("peer: {peer}"));
            e.set_retry(false);
            return e;
        }
        // A core failed mid-request (killed, restarting). Every call of this API is
        // idempotent (reservations by orderId; confirm and release by state; GET), so the
        // request may go to another core even if the first one acted on it: the retry
        // gets the same answer the lost one would have had.
        self.metrics
            .upstream_errors
            .with_label_values(&["proxy"])
            .inc();
        let mut e = e.more_context(format!("peer: {peer}"));
        ctx.failed.push(peer._address.clone());
        let body_kept = !session.as_ref().retry_buffer_truncated();
        e.set_retry(body_kept && ctx.failed.len() < self.settings.upstreams.len() + 1);
        e
    }

    async fn upstream_response_filter(
        &self,
        _session: &mut Session,
        response: &mut ResponseHeader,
        ctx: &mut Ctx,
    ) -> Result<()> {
        // The core echoes it already; a core that did not still gets the client its id.
        if response.headers.get(&REQUEST_ID).is_none() {
            response.insert_header(headers::REQUEST_ID, ctx.request_id.clone())?;
        }
        if let (Some(code), true) = (&ctx.code, self.settings.sold_out_answers) {
            let refusing = response.status.as_u16() == 409
                && matches!(
                    response
                        .headers
                        .get(headers::ERROR_CODE)
                        .and_then(|v| ErrorCode::parse(v.as_bytes())),
                    Some(
                        ErrorCode::OutOfStock
                            | ErrorCode::VoucherPaused
                            | ErrorCode::VoucherArchived
                    )
                );
            if refusing {
                self.flagger.flag(code);
            }
        }
        Ok(())
    }

    async fn fail_to_proxy(&self, session: &mut Session, e: &Error, ctx: &mut Ctx) -> FailToProxy {
        let downstream = e.esource() == &pingora::ErrorSource::Downstream;
        let (outcome, status, code, message) = match e.etype() {
            ErrorType::HTTPStatus(503) => {
                self.metrics
                    .upstream_errors
                    .with_label_values(&["no_upstream"])
                    .inc();
                (
                    "upstream_error",
                    503,
                    ErrorCode::ServiceUnavailable,
                    "no core is available",
                )
            }
            // A client that only half-closed its connection while its request was at a core
            // (pingora takes that for a close) still reads: it did nothing wrong, and the
            // same request again is its remedy, as when no core answers.
            _ if downstream && ctx.left_at_core => (
                "client_error",
                503,
                ErrorCode::ServiceUnavailable,
                "the connection closed before the core answered; retry the same request",
            ),
            _ if downstream => (
                "client_error",
                400,
                ErrorCode::BadRequest,
                "the request could not be read",
            ),
            // Every core failed this request. Not a 502: the client did nothing wrong and
            // every call is idempotent, so the answer is "try again", as for no core at all.
            _ => {
                self.metrics
                    .upstream_errors
                    .with_label_values(&["proxy"])
                    .inc();
                (
                    "upstream_error",
                    503,
                    ErrorCode::ServiceUnavailable,
                    "no core answered; retry the same request",
                )
            }
        };
        ctx.outcome = outcome;
        if self
            .answer(session, &ctx.request_id, status, code, message)
            .await
            .is_err()
        {
            return FailToProxy {
                error_code: 0,
                can_reuse_downstream: false,
            };
        }
        FailToProxy {
            error_code: status,
            can_reuse_downstream: false,
        }
    }

    async fn logging(&self, session: &mut Session, error: Option<&Error>, ctx: &mut Ctx) {
        if let Some(permit) = ctx.admitted.take() {
            permit.complete();
        }
        ctx.voucher_place = None;
        let elapsed = ctx.started.elapsed();
        // Status 0: nothing was answered (the client went away first).
        let status = session.response_written().map_or(0, |r| r.status.as_u16());
        traces::finish(&ctx.span, status, ctx.outcome);
        self.metrics.answered(
            ctx.route.label(),
            ctx.outcome,
            status_class(status),
            elapsed,
        );
        if self.settings.access_log.logs(ctx.outcome) && voucher_telemetry::access::enabled() {
            let header = session.req_header();
            AccessLine {
                request_id: ctx.request_id.to_str().unwrap_or_default(),
                method: header.method.as_str(),
                path: request::logged_path(header.uri.path()),
                route: ctx.route.label(),
                status,
                outcome: ctx.outcome,
                duration: elapsed,
                client: session.client_addr().and_then(|a| a.as_inet()).copied(),
                error: error.map(|e| e as &dyn std::fmt::Display),
            }
            .write();
        }
    }
}
