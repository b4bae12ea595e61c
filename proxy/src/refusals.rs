//! The edge's own answers: every refusal `request_filter` can give, each a named step, run
//! in the order of the README's precedence (health, per-address rate, header size, admin
//! calls, declared body size, then a reservation's body, per-customer rate, sold-out flag,
//! its voucher's place at the cores and the admission limit). A step returns the answer it gives, or `None` to let the next one look; the
//! first answer is written and the request goes no further.

use std::net::IpAddr;
use std::sync::LazyLock;
use std::time::Instant;

use bytes::Bytes;
use http::{HeaderName, HeaderValue};
use pingora::prelude::Session;
use pingora::{Error, ErrorType, Result};
use voucher_contract::request::{self, ReserveBody, VOUCHER_CODE};
use voucher_contract::{headers, ErrorCode, Route, RETRY_AFTER_SECS};

use crate::edge::{
    json_body, write_json, Ctx, Edge, JsonBody, EDGE_HEALTH_PATH, EDGE_READINESS_PATH, REQUEST_ID,
};
use crate::metrics::Counted;
use crate::places::Place;
use crate::rate_limit::Limited;
use crate::sold_out::{Refusal, Verdict};

/// An answer the edge gives without a core.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OwnAnswer {
    /// `GET /healthz`: the edge's own liveness.
    Health,
    /// `GET /readyz`: the edge's own readiness (see [`Edge::readiness`]).
    Readiness,
    /// 429: over the per-address or per-customer rate.
    RateLimited(Limited),
    /// 431: request line and headers over `max_header_bytes`.
    HeadersTooLarge,
    /// 403: admin calls are not served on the public listener.
    AdminRefused,
    /// 413: a declared or streamed body over `max_body_bytes`.
    TooLarge,
    /// 409 `OUT_OF_STOCK`, `VOUCHER_PAUSED` or `VOUCHER_ARCHIVED`: a new order for a
    /// flagged voucher.
    Refused(Refusal),
    /// 503 `OVERLOADED`: a reservation for a core while the edge has its admission limit
    /// of them at the cores already.
    Overloaded,
}

impl OwnAnswer {
    /// The metrics' and access log's outcome.
    pub(crate) fn outcome(self) -> &'static str {
        match self {
            Self::Health => "health",
            Self::Readiness => "readiness",
            Self::RateLimited(_) => "rate_limited",
            Self::HeadersTooLarge => "headers_too_large",
            Self::AdminRefused => "admin_refused",
            Self::TooLarge => "too_large",
            Self::Refused(Refusal::SoldOut) => "sold_out",
            Self::Refused(Refusal::Paused) => "paused",
            Self::Refused(Refusal::Archived) => "archived",
            Self::Overloaded => "overloaded",
        }
    }
}

impl Edge {
    /// Runs the steps in order: `Some` when the edge answers the request itself.
    pub(crate) async fn screen(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
    ) -> Result<Option<OwnAnswer>> {
        let head = Head::read(session.req_header());
        self.assign_request_id(session, ctx, head.request_id);
        if is_probe(session, EDGE_HEALTH_PATH) {
            return Ok(Some(OwnAnswer::Health));
        }
        if is_probe(session, EDGE_READINESS_PATH) {
            return Ok(Some(OwnAnswer::Readiness));
        }
        let header = session.req_header();
        ctx.route = Route::classify(header.method.as_str(), header.uri.path());
        ctx.span = crate::traces::start(header, &ctx.route, &ctx.request_id);
        let early = self
            .over_address_rate(session)
            .or_else(|| self.headers_too_large(head.bytes))
            .or_else(|| admin_refused(&ctx.route))
            .or_else(|| self.declared_too_large(head.declared));
        if early.is_some() {
            return Ok(early);
        }
        self.screen_reservation(session, ctx, head.json).await
    }

    /// Writes `answer`, with the request's `x-request-id`.
    pub(crate) async fn give(
        &self,
        session: &mut Session,
        ctx: &Ctx,
        answer: OwnAnswer,
    ) -> Result<()> {
        let id = &ctx.request_id;
        match answer {
            OwnAnswer::Health => {
                let body = json_body(&serde_json::json!({ "status": "ok" }))?;
                write_json(session, 200, body, id, &[]).await
            }
            OwnAnswer::Readiness => match self.readiness() {
                Ok(()) => {
                    let body = json_body(&serde_json::json!({ "status": "ready" }))?;
                    write_json(session, 200, body, id, &[]).await
                }
                Err(why) => {
                    self.answer(session, id, 503, ErrorCode::ServiceUnavailable, why)
                        .await
                }
            },
            OwnAnswer::RateLimited(by) => self.rate_limited(session, ctx, by).await,
            OwnAnswer::HeadersTooLarge => {
                let message = format!(
                    "the request line and headers are larger than {} bytes",
                    self.settings.max_header_bytes
                );
                self.answer(session, id, 431, ErrorCode::HeadersTooLarge, &message)
                    .await
            }
            OwnAnswer::AdminRefused => {
                self.answer(
                    session,
                    id,
                    403,
                    ErrorCode::Forbidden,
                    "admin calls are not served on the public listener",
                )
                .await
            }
            OwnAnswer::TooLarge => self.too_large(session, id).await,
            OwnAnswer::Refused(refusal) => {
                let (code, body) = refusal_answer(refusal);
                let code_header = HeaderValue::from_static(code.as_str());
                write_json(session, 409, body, id, &[(&ERROR_CODE, code_header)]).await
            }
            OwnAnswer::Overloaded => {
                self.answer(
                    session,
                    id,
                    503,
                    ErrorCode::Overloaded,
                    "the service is at its admission limit; retry after the Retry-After seconds",
                )
                .await
            }
        }
    }

    /// Keeps the client's valid `x-request-id` or makes a new one, in `ctx`: the edge's own
    /// answers carry it, and a forwarded request takes a new one into its headers in
    /// `upstream_request_filter` (written into the request here, it cost every answer of
    /// the edge a header insert it never needed). An invalid one the client sent is
    /// removed, so it cannot reach a core.
    fn assign_request_id(&self, session: &mut Session, ctx: &mut Ctx, given: Option<HeaderValue>) {
        ctx.request_id = match given {
            Some(v) if request::valid_request_id(v.as_bytes()) => v,
            given => {
                if given.is_some() {
                    session.req_header_mut().remove_header(headers::REQUEST_ID);
                }
                // Hexadecimal digits: always a valid value (the empty one is never taken).
                HeaderValue::from_maybe_shared(Bytes::copy_from_slice(&self.request_ids.next()))
                    .unwrap_or_else(|_| HeaderValue::from_static(""))
            }
        };
    }

    fn over_address_rate(&self, session: &Session) -> Option<OwnAnswer> {
        let ip: Option<IpAddr> = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map(|a| a.ip());
        self.rate_limits
            .check_ip(ip)
            .err()
            .map(OwnAnswer::RateLimited)
    }

    fn headers_too_large(&self, header_bytes: usize) -> Option<OwnAnswer> {
        (header_bytes > self.settings.max_header_bytes).then_some(OwnAnswer::HeadersTooLarge)
    }

    fn declared_too_large(&self, declared: Option<usize>) -> Option<OwnAnswer> {
        declared
            .is_some_and(|n| n > self.settings.max_body_bytes)
            .then_some(OwnAnswer::TooLarge)
    }

    /// A reservation's own steps: its body is read (bounded), then the per-customer rate
    /// and the voucher's steps ([`Edge::screen_voucher`]). Only a request a core would take past its checks is
    /// answered here; anything a core refuses (415, 400) goes to it, so the answer keeps
    /// the API's precedence.
    async fn screen_reservation(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        json: bool,
    ) -> Result<Option<OwnAnswer>> {
        let Route::Reserve { code } = &mut ctx.route else {
            return Ok(None);
        };
        // The route table forgives a trailing '/', the core's router does not (404): such a
        // path is the core's to answer.
        if session.req_header().uri.path().ends_with('/') {
            return Ok(None);
        }
        // The code as the core reads it (percent-decoded, then checked): every spelling of
        // a voucher meets its one flag, and one the core refuses never meets a flag. Taken
        // from the route (which nothing reads it from again) rather than copied.
        let code = code.take().filter(|c| VOUCHER_CODE.check(c).is_ok());
        let Some(body) = self.read_body(session, ctx.started).await? else {
            return Ok(Some(OwnAnswer::TooLarge));
        };
        let (Some(code), true, Some(reserve)) = (code, json, ReserveBody::read_checked(&body))
        else {
            return Ok(None);
        };
        if let Err(by) = self.rate_limits.check_customer(&reserve.customer_id) {
            return Ok(Some(OwnAnswer::RateLimited(by)));
        }
        let answer = self.screen_voucher(ctx, &code, &reserve.order_id).await;
        // Kept for the response filter, which flags the voucher from a core's refusal.
        ctx.code = Some(code);
        Ok(answer)
    }

    /// A reservation's voucher steps: its flag, then a place among the voucher's own at the
    /// cores (`places`), then one within the edge's admission limit. One that had to wait
    /// for its voucher's place asks the flag again, since the gate may have sold out
    /// meanwhile.
    async fn screen_voucher(&self, ctx: &mut Ctx, code: &str, order_id: &str) -> Option<OwnAnswer> {
        if let Some(refusal) = self.flag_refusal(code, order_id).await {
            return Some(OwnAnswer::Refused(refusal));
        }
        match self
            .places
            .take(code, &self.metrics.voucher_place_waiting)
            .await
        {
            Place::Free(place) => ctx.voucher_place = place,
            Place::Waited(place) => {
                ctx.voucher_place = Some(place);
                let refusal = self.flag_refusal(code, order_id).await;
                let outcome = if refusal.is_some() {
                    "answered"
                } else {
                    "placed"
                };
                self.metrics
                    .voucher_place_waits
                    .with_label_values(&[outcome])
                    .inc();
                if let Some(refusal) = refusal {
                    return Some(OwnAnswer::Refused(refusal));
                }
            }
            Place::Full => {
                self.metrics
                    .voucher_place_waits
                    .with_label_values(&["timed_out"])
                    .inc();
                return Some(OwnAnswer::Overloaded);
            }
        }
        // Last: only a reservation that goes to a core takes a place (the edge's own
        // answers cost the cores nothing), and one refused here has not reached a core.
        ctx.admitted = self.admission.acquire().await;
        ctx.admitted.is_none().then_some(OwnAnswer::Overloaded)
    }

    /// What the voucher's flag answers `order_id`, if it refuses it: a flag whose filter is
    /// being fetched is waited for first; an answer that claims the flag's renewal starts it.
    async fn flag_refusal(&self, code: &str, order_id: &str) -> Option<Refusal> {
        let mut verdict = self.sold_out.verdict(code, Some(order_id));
        if let Verdict::Wait(settled) = verdict {
            verdict = self.wait_for_filter(code, order_id, settled).await;
        }
        match verdict {
            Verdict::Refuse { refusal, renew } => {
                if let Some(id) = renew {
                    self.flagger.renew(code, id);
                }
                Some(refusal)
            }
            Verdict::Forward | Verdict::Wait(_) => None,
        }
    }

    /// A reservation that met a new flag whose filter is being fetched waits for it, then
    /// is decided by it: at most `sold_out_wait`, and at most `sold_out_max_waiting` at a
    /// time (the rest go on at once, as before the wait existed). What waits is a request
    /// the edge holds already (its body read, bounded); waiting holds nothing at a core.
    async fn wait_for_filter(
        &self,
        code: &str,
        order_id: &str,
        mut settled: tokio::sync::watch::Receiver<()>,
    ) -> Verdict {
        let Ok(place) = self.flag_waiters.try_acquire() else {
            self.metrics.flag_waits.with_label_values(&["full"]).inc();
            return Verdict::Forward;
        };
        let _waiting = (place, Counted::new(&self.metrics.flag_waiting));
        // Nothing is ever sent: `changed` ends when the fetch drops its end (at once if it
        // already has).
        let waited = tokio::time::timeout(self.settings.sold_out_wait, settled.changed()).await;
        let verdict = match (waited, self.sold_out.verdict(code, Some(order_id))) {
            (Err(_), _) => {
                self.metrics
                    .flag_waits
                    .with_label_values(&["timed_out"])
                    .inc();
                return Verdict::Forward;
            }
            // A newer flag's fetch began meanwhile: no second wait.
            (Ok(_), Verdict::Wait(_)) => Verdict::Forward,
            (Ok(_), verdict) => verdict,
        };
        let outcome = match verdict {
            Verdict::Refuse { .. } => "answered",
            _ => "forwarded",
        };
        self.metrics.flag_waits.with_label_values(&[outcome]).inc();
        verdict
    }

    /// Writes a complete JSON error answer from the edge, keeping the connection alive
    /// (a Content-Length is what allows keep-alive).
    pub(crate) async fn answer(
        &self,
        session: &mut Session,
        id: &HeaderValue,
        status: u16,
        code: ErrorCode,
        message: &str,
    ) -> Result<()> {
        let body = error_body(code, message)?;
        let code_header = HeaderValue::from_static(code.as_str());
        if status == 503 || status == 429 {
            let extra = [
                (&ERROR_CODE, code_header),
                (&RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS)),
            ];
            write_json(session, status, body, id, &extra).await
        } else {
            write_json(session, status, body, id, &[(&ERROR_CODE, code_header)]).await
        }
    }

    async fn too_large(&self, session: &mut Session, id: &HeaderValue) -> Result<()> {
        let limit = self.settings.max_body_bytes;
        let message = format!("the request body is larger than {limit} bytes");
        self.answer(session, id, 413, ErrorCode::PayloadTooLarge, &message)
            .await
    }

    /// Reads the whole request body (bounded in size, and in time: all of it within
    /// `client_timeout` of `started`, so a body dribbled a byte at a time cannot hold a
    /// connection for long) into pingora's retry buffer, from which it is sent upstream if
    /// the request is forwarded. `None` when it is over the limit.
    ///
    /// The time bound is the session's own read timeout, which pingora puts on every read
    /// anyway: the first read has the whole `client_timeout` (set by `request_filter`),
    /// and a read after it only what is left of it. A timer of the edge's own around the
    /// loop (tokio's) read the clock for every reservation, and registered a timer for
    /// every body not there yet (`reports/callgrind/EDGE.md`). A reservation's body comes
    /// with its headers: one read, no clock.
    pub(crate) async fn read_body(
        &self,
        session: &mut Session,
        started: Instant,
    ) -> Result<Option<Bytes>> {
        session.as_mut().enable_retry_buffering();
        let limit = self.settings.max_body_bytes;
        // Kept as pingora gave it (a shared buffer), and copied into one only when a second
        // chunk follows.
        let mut first: Option<Bytes> = None;
        let mut joined = Vec::new();
        // Every error reading the body is the client's (a timeout, a connection closed,
        // a malformed chunk): answered 400 by fail_to_proxy, and the connection closed.
        while let Some(chunk) = session
            .read_request_body()
            .await
            .map_err(|e| e.into_down())?
        {
            let read = first.as_ref().map_or(0, Bytes::len) + joined.len() + chunk.len();
            if read > limit {
                return Ok(None);
            }
            match first.take() {
                None if joined.is_empty() => first = Some(chunk),
                earlier => {
                    if let Some(earlier) = earlier {
                        joined.extend_from_slice(&earlier);
                    }
                    joined.extend_from_slice(&chunk);
                }
            }
            if !session.is_body_done() {
                let left = self
                    .settings
                    .client_timeout
                    .saturating_sub(started.elapsed());
                if left.is_zero() {
                    return Err(Error::explain(
                        ErrorType::ReadTimedout,
                        "request body not received within client_timeout",
                    )
                    .into_down());
                }
                session.as_mut().set_read_timeout(Some(left));
            }
        }
        Ok(Some(first.unwrap_or_else(|| Bytes::from(joined))))
    }

    async fn rate_limited(&self, session: &mut Session, ctx: &Ctx, by: Limited) -> Result<()> {
        let id = &ctx.request_id;
        self.metrics
            .rate_limited
            .with_label_values(&[by.label()])
            .inc();
        // An unread body would cost the client its connection (it cannot be reused), and
        // reconnecting costs the edge more than reading a few bytes: read what is left,
        // bounded as every body is. (`read_body` has read the body of a reservation already.)
        if by == Limited::Ip {
            self.read_body(session, ctx.started).await?;
        }
        let message = match by {
            Limited::Ip => {
                "too many requests from this address; retry after the Retry-After seconds"
            }
            Limited::Customer => {
                "too many reservations for this customer; retry after the Retry-After seconds"
            }
        };
        self.answer(session, id, 429, ErrorCode::RateLimited, message)
            .await
    }
}

/// The edge's own liveness, whatever the cores do: a probe of the edge must not fail
/// because every core is down (that is what /readyz of the cores is for).
fn is_probe(session: &Session, path: &str) -> bool {
    let header = session.req_header();
    header.method == "GET" && header.uri.path() == path
}

impl Edge {
    /// Whether a balancer should send this edge traffic: not while it drains, and not
    /// while no core it knows passes its readiness check (it would answer 502s).
    pub(crate) fn readiness(&self) -> std::result::Result<(), &'static str> {
        if self.draining.load(std::sync::atomic::Ordering::Relaxed) {
            return Err("the edge is draining before it stops");
        }
        let backends = self.upstreams.backends();
        if backends.get_backend().iter().any(|b| backends.ready(b)) {
            Ok(())
        } else {
            Err("no core is ready")
        }
    }
}

static ERROR_CODE: HeaderName = HeaderName::from_static(headers::ERROR_CODE);
static RETRY_AFTER: HeaderName = HeaderName::from_static(headers::RETRY_AFTER);

/// An error answer's body, `{"error": CODE, "message": ...}`.
fn error_body(code: ErrorCode, message: &str) -> Result<JsonBody> {
    // Serialized from borrowed fields: a `serde_json::Value` built per answer cost the
    // reject path allocations of its own (an earlier run of `reports/perf/EDGE.md`, in its
    // git history).
    #[derive(serde::Serialize)]
    struct ErrorBody<'a> {
        error: &'a str,
        message: &'a str,
    }
    json_body(&ErrorBody {
        error: code.as_str(),
        message,
    })
}

/// A flag's refusal: its code and body, the same for every answer, so serialized once.
fn refusal_answer(refusal: Refusal) -> (ErrorCode, JsonBody) {
    // The cores' messages for the same codes.
    fn body(code: ErrorCode, message: &str) -> JsonBody {
        error_body(code, message)
            .expect("two strings serialize")
            .kept_forever()
    }
    static SOLD_OUT: LazyLock<JsonBody> =
        LazyLock::new(|| body(ErrorCode::OutOfStock, "the voucher has no uses left"));
    static PAUSED: LazyLock<JsonBody> = LazyLock::new(|| {
        body(
            ErrorCode::VoucherPaused,
            "the voucher is paused: it takes no new reservation until it is resumed",
        )
    });
    static ARCHIVED: LazyLock<JsonBody> = LazyLock::new(|| {
        body(
            ErrorCode::VoucherArchived,
            "the voucher is archived: it takes no reservation",
        )
    });
    match refusal {
        Refusal::SoldOut => (ErrorCode::OutOfStock, SOLD_OUT.clone()),
        Refusal::Paused => (ErrorCode::VoucherPaused, PAUSED.clone()),
        Refusal::Archived => (ErrorCode::VoucherArchived, ARCHIVED.clone()),
    }
}

/// What the steps read from the request's head, taken in one pass over its headers (the
/// pass the header-size step makes anyway): looked up by name one at a time, each of the
/// three hashed its name and probed the map (`reports/callgrind/EDGE.md`). The first value
/// of each header is the one read, as `HeaderMap::get` reads it.
struct Head {
    /// The request's target and headers, as `max_header_bytes` counts them.
    bytes: usize,
    /// `Content-Length`, when it is a number ([`declared_length`]).
    declared: Option<usize>,
    /// Whether `Content-Type` names JSON, the only body type the API takes.
    json: bool,
    /// The client's `x-request-id`, valid or not.
    request_id: Option<HeaderValue>,
}

impl Head {
    fn read(header: &pingora::http::RequestHeader) -> Self {
        let mut head = Head {
            bytes: header.uri.path_and_query().map_or(0, |p| p.as_str().len()),
            declared: None,
            json: false,
            request_id: None,
        };
        let (mut length_read, mut type_read) = (false, false);
        for (name, value) in &header.headers {
            head.bytes += name.as_str().len() + value.len() + 4;
            if *name == http::header::CONTENT_LENGTH && !length_read {
                length_read = true;
                head.declared = declared_length(value.as_bytes());
            } else if *name == http::header::CONTENT_TYPE && !type_read {
                type_read = true;
                head.json = value.to_str().is_ok_and(request::is_json);
            } else if *name == REQUEST_ID && head.request_id.is_none() {
                head.request_id = Some(value.clone());
            }
        }
        head
    }
}

/// A `Content-Length` value as HTTP writes it, digits only (`None` for anything else: the
/// body is then bounded as it is read). Read digit by digit from the bytes: checking the
/// value as text and parsing it with `str::parse` cost every reservation about 250
/// instructions (`reports/callgrind/EDGE.md`). A number past `usize` is too large
/// whatever the limit, so it saturates.
fn declared_length(value: &[u8]) -> Option<usize> {
    if value.is_empty() {
        return None;
    }
    value.iter().try_fold(0usize, |n, &byte| {
        let digit = byte.wrapping_sub(b'0');
        (digit < 10).then(|| n.saturating_mul(10).saturating_add(usize::from(digit)))
    })
}

fn admin_refused(route: &Route) -> Option<OwnAnswer> {
    route.is_admin().then_some(OwnAnswer::AdminRefused)
}

#[cfg(test)]
mod tests {
    use super::declared_length;

    #[test]
    fn a_declared_length_is_its_digits_and_nothing_else() {
        assert_eq!(declared_length(b"0"), Some(0));
        assert_eq!(declared_length(b"4096"), Some(4096));
        assert_eq!(declared_length(b"004097"), Some(4097));
        for not_a_length in [
            &b""[..],
            b"+5",
            b"-1",
            b" 5",
            b"5 ",
            b"1e3",
            b"0x10",
            b"4,096",
        ] {
            assert_eq!(declared_length(not_a_length), None, "{not_a_length:?}");
        }
        // Past usize: too large for any limit, never a small number by wrapping.
        assert_eq!(
            declared_length(b"99999999999999999999999999999999"),
            Some(usize::MAX)
        );
        for n in [1usize, 9, 10, 4095, 123_456_789, usize::MAX] {
            assert_eq!(declared_length(n.to_string().as_bytes()), Some(n));
        }
    }
}
