//! The edge's Prometheus metrics. The server registers them in the process's default
//! registry, which pingora's own Prometheus service serves on `metrics_listen`.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
};

/// Up to 30 s: beyond every timeout of the edge (`upstream_read_timeout` 10 s by default),
/// so a request that waits for one lands in a bucket, not only in `+Inf`.
const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0,
    10.0, 30.0,
];

pub struct EdgeMetrics {
    /// Requests by route and by what the edge did (`forwarded`, or the reason it answered).
    pub requests: IntCounterVec,
    pub duration: HistogramVec,
    /// Answers by route and status class (`2xx`...`5xx`, `none`): the edge's own and the
    /// cores' alike, for error ratios.
    pub responses: IntCounterVec,
    /// Failures talking to a core, by kind (connect, proxy, no_upstream).
    pub upstream_errors: IntCounterVec,
    /// Sold-out flags set from core answers.
    pub flags_set: IntCounter,
    /// Flags dropped early by an availability announcement.
    pub availability_signals: IntCounter,
    /// Announcements that a gate took a voucher's last use (each starts a flag, unless
    /// one is set or being fetched already).
    pub sold_out_signals: IntCounter,
    /// Vouchers currently flagged (sold out, paused or archived).
    pub flags: IntGauge,
    /// Order-filter fetches by outcome: stored, dropped (a give-back came first),
    /// not_sold_out (read while uses were left), failed.
    pub order_fetches: IntCounterVec,
    /// How long order-filter fetches took, whatever their outcome: how long a new flag's
    /// reservations wait.
    pub order_fetch_seconds: Histogram,
    /// Reservations that met a flag whose filter was being fetched, by what came of it:
    /// `answered` (waited, then refused here), `forwarded` (waited, then sent on: a holder,
    /// or no flag after all), `timed_out` (waited `sold_out_wait`, then sent on), `full`
    /// (`sold_out_max_waiting` were waiting already: sent on at once).
    pub flag_waits: IntCounterVec,
    /// Reservations that waited for a place among their voucher's at the cores
    /// (`voucher_in_flight`), by what came of it: `placed` (went on), `answered` (the flag
    /// refused it once it had its place), `timed_out` (503 OVERLOADED).
    pub voucher_place_waits: IntCounterVec,
    /// Reservations waiting for an order filter now.
    pub flag_waiting: IntGauge,
    /// Reservations waiting for a place among their voucher's at the cores now.
    pub voucher_place_waiting: IntGauge,
    /// Requests refused for a client over its rate, by what was counted (ip, customer).
    pub rate_limited: IntCounterVec,
    /// Handles of the series every answer counts in (see [`EdgeMetrics::answered`]).
    answers: AnswerSeries,
}

/// Route labels (`voucher_contract::routes::Route::label`) whose series have a handle slot.
const ROUTES: [&str; 6] = [
    "reserve",
    "confirm",
    "release",
    "get_voucher",
    "admin",
    "other",
];
/// The edge's outcomes (`forwarded`, `upstream_error`, `client_error`, and
/// `OwnAnswer::outcome`).
const OUTCOMES: [&str; 13] = [
    "forwarded",
    "upstream_error",
    "client_error",
    "health",
    "readiness",
    "rate_limited",
    "headers_too_large",
    "admin_refused",
    "too_large",
    "sold_out",
    "paused",
    "archived",
    "overloaded",
];
/// Status classes of `edge_responses_total`.
const CLASSES: [&str; 6] = ["1xx", "2xx", "3xx", "4xx", "5xx", "none"];

/// The series of each answer, looked up in their vectors once and kept: on the reject
/// path every answer counted in three series, and each `with_label_values` hashed its
/// labels, took its vector's lock and cloned the series (1.6% of the edge's samples
/// there, in an earlier run of `reports/perf/EDGE.md`, kept in its git history). A slot
/// is filled by the first answer that needs it, so only series in use are exported, as
/// before; a label outside the lists above falls back to the vector.
#[derive(Default)]
struct AnswerSeries {
    by_outcome: [[OnceLock<(IntCounter, Histogram)>; OUTCOMES.len()]; ROUTES.len()],
    by_class: [[OnceLock<IntCounter>; CLASSES.len()]; ROUTES.len()],
}

fn slot(list: &[&str], label: &str) -> Option<usize> {
    list.iter().position(|l| *l == label)
}

impl EdgeMetrics {
    /// The metrics, registered in `registry` (the default one in the server; a fresh one
    /// in unit tests, which may build several).
    pub fn new(registry: &Registry) -> anyhow::Result<Arc<Self>> {
        let requests = IntCounterVec::new(
            Opts::new("edge_requests_total", "Requests by route and edge outcome"),
            &["route", "outcome"],
        )
        .expect("static metric definition is valid");
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "edge_request_duration_seconds",
                "Time at the edge, by route and outcome",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["route", "outcome"],
        )
        .expect("static metric definition is valid");
        let responses = IntCounterVec::new(
            Opts::new(
                "edge_responses_total",
                "Answers by route and status class, the edge's own and the cores'",
            ),
            &["route", "code"],
        )
        .expect("static metric definition is valid");
        let upstream_errors = IntCounterVec::new(
            Opts::new(
                "edge_upstream_errors_total",
                "Failures talking to the cores",
            ),
            &["kind"],
        )
        .expect("static metric definition is valid");
        let flags_set = IntCounter::new("edge_sold_out_flags_set_total", "Sold-out flags set")
            .expect("static metric definition is valid");
        let availability_signals = IntCounter::new(
            "edge_availability_signals_total",
            "Sold-out flags dropped by an availability announcement",
        )
        .expect("static metric definition is valid");
        let sold_out_signals = IntCounter::new(
            "edge_sold_out_signals_total",
            "Announcements that a gate took a voucher's last use",
        )
        .expect("static metric definition is valid");
        let flags = IntGauge::new("edge_sold_out_flags", "Vouchers flagged sold out")
            .expect("static metric definition is valid");
        let order_fetches = IntCounterVec::new(
            Opts::new(
                "edge_order_filter_fetches_total",
                "Order-filter fetches of sold-out vouchers, by outcome",
            ),
            &["outcome"],
        )
        .expect("static metric definition is valid");
        let order_fetch_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "edge_order_fetch_seconds",
                "Time to fetch a flagged voucher's order filter from a core",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
        )
        .expect("static metric definition is valid");
        let flag_waits = IntCounterVec::new(
            Opts::new(
                "edge_flag_waits_total",
                "Reservations that met a flag whose filter was being fetched, by what came of it",
            ),
            &["outcome"],
        )
        .expect("static metric definition is valid");
        let voucher_place_waits = IntCounterVec::new(
            Opts::new(
                "edge_voucher_place_waits_total",
                "Reservations that waited for a place among their voucher's at the cores, by what came of it",
            ),
            &["outcome"],
        )
        .expect("static metric definition is valid");
        let voucher_place_waiting = IntGauge::new(
            "edge_voucher_place_waiting",
            "Reservations waiting for a place among their voucher's at the cores",
        )
        .expect("static metric definition is valid");
        let flag_waiting = IntGauge::new(
            "edge_flag_waiting",
            "Reservations waiting for a flagged voucher's order filter",
        )
        .expect("static metric definition is valid");
        let rate_limited = IntCounterVec::new(
            Opts::new(
                "edge_rate_limited_total",
                "Requests answered 429 for a client over its rate, by what was counted",
            ),
            &["by"],
        )
        .expect("static metric definition is valid");
        for c in [
            Box::new(requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(duration.clone()),
            Box::new(responses.clone()),
            Box::new(upstream_errors.clone()),
            Box::new(flags_set.clone()),
            Box::new(availability_signals.clone()),
            Box::new(sold_out_signals.clone()),
            Box::new(flags.clone()),
            Box::new(order_fetches.clone()),
            Box::new(order_fetch_seconds.clone()),
            Box::new(flag_waits.clone()),
            Box::new(flag_waiting.clone()),
            Box::new(voucher_place_waits.clone()),
            Box::new(voucher_place_waiting.clone()),
            Box::new(rate_limited.clone()),
        ] {
            registry.register(c)?;
        }
        // Series that exist from the start (at 0), for dashboards and alerts.
        for outcome in [
            "forwarded",
            "sold_out",
            "too_large",
            "upstream_error",
            "client_error",
            "rate_limited",
            "overloaded",
        ] {
            requests.with_label_values(&["reserve", outcome]);
        }
        for code in ["2xx", "4xx", "5xx"] {
            responses.with_label_values(&["reserve", code]);
        }
        for outcome in ["stored", "dropped", "not_sold_out", "failed"] {
            order_fetches.with_label_values(&[outcome]);
        }
        for outcome in ["answered", "forwarded", "timed_out", "full"] {
            flag_waits.with_label_values(&[outcome]);
        }
        for outcome in ["placed", "answered", "timed_out"] {
            voucher_place_waits.with_label_values(&[outcome]);
        }
        for by in ["ip", "customer"] {
            rate_limited.with_label_values(&[by]);
        }
        for kind in ["connect", "proxy", "no_upstream"] {
            upstream_errors.with_label_values(&[kind]);
        }
        Ok(Arc::new(Self {
            requests,
            duration,
            responses,
            upstream_errors,
            flags_set,
            availability_signals,
            sold_out_signals,
            flags,
            order_fetches,
            order_fetch_seconds,
            flag_waits,
            flag_waiting,
            voucher_place_waits,
            voucher_place_waiting,
            rate_limited,
            answers: AnswerSeries::default(),
        }))
    }

    /// Counts one answer: `edge_requests_total` and `edge_request_duration_seconds` by
    /// route and outcome, `edge_responses_total` by route and status class.
    pub fn answered(
        &self,
        route: &'static str,
        outcome: &'static str,
        class: &'static str,
        elapsed: Duration,
    ) {
        let seconds = elapsed.as_secs_f64();
        let r = slot(&ROUTES, route);
        match r.zip(slot(&OUTCOMES, outcome)) {
            Some((r, o)) => {
                let (requests, duration) = self.answers.by_outcome[r][o].get_or_init(|| {
                    (
                        self.requests.with_label_values(&[route, outcome]),
                        self.duration.with_label_values(&[route, outcome]),
                    )
                });
                requests.inc();
                duration.observe(seconds);
            }
            None => {
                self.requests.with_label_values(&[route, outcome]).inc();
                self.duration
                    .with_label_values(&[route, outcome])
                    .observe(seconds);
            }
        }
        match r.zip(slot(&CLASSES, class)) {
            Some((r, c)) => self.answers.by_class[r][c]
                .get_or_init(|| self.responses.with_label_values(&[route, class]))
                .inc(),
            None => self.responses.with_label_values(&[route, class]).inc(),
        }
    }
}

/// One more in a gauge while it lives: a wait counted until it ends, however it ends (the
/// answer came, or the client went away and the request's future was dropped mid-wait).
pub struct Counted<'a>(&'a IntGauge);

impl<'a> Counted<'a> {
    pub fn new(gauge: &'a IntGauge) -> Self {
        gauge.inc();
        Self(gauge)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}
