//! Prometheus metrics of the core, served on their own listener (`http.metrics_listen`).
//!
//! Each application instance has its own registry, so several instances in one test
//! process do not mix their counts.

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use prometheus::{
    Encoder, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::Error;

/// Latency buckets in seconds: fine below 10 ms, where the reservation path lives, and up
/// to 30 s, beyond every timeout a request can wait out (`kafka.message_timeout` 5 s,
/// `flash.row_wait` 3 s, the database's `acquire_timeout` 2 s, a drain's 10 s deadline), so
/// that a request stuck on one lands in a bucket of its own, not in `+Inf`.
const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

pub struct Metrics {
    registry: Registry,
    /// Requests answered, by method, route template, status and error code (`OK` on success).
    pub http_requests: IntCounterVec,
    pub http_duration: HistogramVec,
    /// Reservation decisions by voucher mode and outcome (reserved, retried, or an error code).
    pub reservations: IntCounterVec,
    /// Operators' changes of vouchers in force, by action (create, change, pause, resume,
    /// archive), counted where they were made.
    pub voucher_changes: IntCounterVec,
    /// Reservations released by the expiry job.
    pub expired_releases: IntCounter,
    /// Expiry job runs by result (ok, error).
    pub expiry_runs: IntCounterVec,
    /// Time spent in the Redis gate script, per reservation.
    pub gate_duration: Histogram,
    /// Time from publish to broker acknowledgement, by result (ok, not_written, ambiguous).
    pub publish_duration: HistogramVec,
    /// Time until PostgreSQL's answer on a flash reservation (`flash.decision = "database"`).
    pub record_duration: Histogram,
    /// Reservations per grouped statement, by mode (standard: the grouper; flash: the
    /// recorder, PostgreSQL deciding; lookup: orders looked up together for the gate's
    /// refusals and retries).
    pub group_size: HistogramVec,
    /// Transactions the grouped writers spent, by mode: one per group, more when a group
    /// was decided again or, as a last resort, one by one.
    pub group_transactions: IntCounterVec,
    /// Reservations (or lookups) queued for a group, not yet taken into one, by mode.
    pub group_queued: IntGaugeVec,
    /// Events per consumer batch.
    pub consumer_batch_size: Histogram,
    /// Events the consumer handled, by result (inserted, duplicate, dead_lettered).
    pub consumer_events: IntCounterVec,
    /// PostgreSQL transactions the consumer spent.
    pub consumer_transactions: IntCounter,
    /// Events published but not yet written, per partition (the consumer monitor's loop).
    pub consumer_lag: IntGaugeVec,
    /// Seconds the oldest unwritten event of a partition has waited, to within the monitor's
    /// interval; 0 when the partition is written up to date.
    pub consumer_unwritten_age: GaugeVec,
    /// 1 for each partition this instance writes now.
    pub partitions_owned: IntGaugeVec,
    /// Uses Redis holds minus uses PostgreSQL holds, per flash voucher, once the consumer caught up.
    pub gate_drift: IntGaugeVec,
    /// Uses left at the gate, per flash voucher (sampled by reconciliation).
    pub gate_remaining: IntGaugeVec,
    /// Vouchers by state (active, paused, archived), read from PostgreSQL at each scrape.
    pub vouchers: IntGaugeVec,
    /// When each live flash voucher's sale starts (Unix seconds): the dashboard's
    /// "sale start" annotation.
    pub sale_start: IntGaugeVec,
    /// Uses reconciliation gave back, by reason (never_recorded, released_in_db), and uses it
    /// took off a gate that counted too few (repaired).
    pub reconciled: IntCounterVec,
    /// Gate rebuilds by result (loaded, already_loaded, superseded, not_caught_up, error), and
    /// stranded gates handed the latest generation (raised).
    pub gate_rebuilds: IntCounterVec,
    /// Time of one reconciliation round over every live flash voucher.
    pub reconcile_duration: Histogram,
    /// What reconciliation looked at, by kind (unsettled orders, released rows, customers):
    /// it follows what changed, not the vouchers' sizes.
    pub reconcile_checked: IntCounterVec,
    /// When this core last finished a reconciliation round (Unix seconds): an alert fires
    /// when the newest across the cores grows old.
    pub reconcile_last_success: IntGauge,
    /// 503s by the dependency that could not serve (database, event_broker, redis,
    /// voucher_gate).
    pub unavailable: IntCounterVec,
    /// Requests that found no free database connection within `database.acquire_timeout`
    /// (a 503 each): the pool is the bottleneck.
    pub db_pool_timeouts: IntCounter,
    /// Database connections by state (`idle`, `in_use`) and the pool's maximum, sampled
    /// at each scrape.
    pub db_pool_connections: IntGaugeVec,
    pub db_pool_max: IntGauge,
    /// The async runtime: worker threads, tasks alive, tasks waiting in the global queue
    /// (sampled at each scrape): a queue that grows means the workers cannot keep up.
    pub runtime: IntGaugeVec,
}

impl Metrics {
    /// Every metric registered in a registry of its own, and the series that must exist
    /// from the start set to 0.
    pub fn new() -> Self {
        let r = Registry::new();
        let latency = || LATENCY_BUCKETS.to_vec();
        let metrics = Self {
            http_requests: counter_vec(
                &r,
                "http_requests_total",
                "HTTP requests answered by the core",
                &["method", "route", "status", "code"],
            ),
            http_duration: histogram_vec(
                &r,
                "http_request_duration_seconds",
                "Time from request received to response ready",
                &["method", "route"],
                latency(),
            ),
            reservations: counter_vec(
                &r,
                "voucher_reservations_total",
                "Reservation decisions by mode and outcome",
                &["mode", "outcome"],
            ),
            voucher_changes: counter_vec(
                &r,
                "voucher_admin_changes_total",
                "Operators' changes of vouchers (create, change, pause, resume, archive)",
                &["action"],
            ),
            expired_releases: register(
                &r,
                IntCounter::new(
                    "voucher_expired_releases_total",
                    "Reservations released by the expiry job",
                ),
            ),
            expiry_runs: counter_vec(
                &r,
                "voucher_expiry_runs_total",
                "Expiry job runs by result",
                &["result"],
            ),
            gate_duration: register(
                &r,
                Histogram::with_opts(
                    HistogramOpts::new(
                        "voucher_gate_duration_seconds",
                        "Time in the Redis gate script",
                    )
                    .buckets(latency()),
                ),
            ),
            publish_duration: histogram_vec(
                &r,
                "voucher_publish_duration_seconds",
                "Time to a Kafka acknowledgement",
                &["result"],
                latency(),
            ),
            record_duration: register(
                &r,
                Histogram::with_opts(
                    HistogramOpts::new(
                        "voucher_record_duration_seconds",
                        "Time to PostgreSQL's answer on a flash reservation, in a grouped transaction",
                    )
                    .buckets(latency()),
                ),
            ),
            group_size: histogram_vec(
                &r,
                "voucher_group_size",
                "Reservations (or lookups) per grouped statement, by mode",
                &["mode"],
                vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0],
            ),
            group_transactions: counter_vec(
                &r,
                "voucher_group_transactions_total",
                "Transactions the grouped writers spent, by mode",
                &["mode"],
            ),
            group_queued: gauge_vec(
                &r,
                "voucher_group_queued",
                "Reservations (or lookups) queued for a group, not yet taken into one, by mode",
                &["mode"],
            ),
            consumer_batch_size: register(
                &r,
                Histogram::with_opts(
                    HistogramOpts::new("voucher_consumer_batch_size", "Events per consumer batch")
                        .buckets(vec![
                            1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0,
                        ]),
                ),
            ),
            consumer_events: counter_vec(
                &r,
                "voucher_consumer_events_total",
                "Events handled by the consumer",
                &["result"],
            ),
            consumer_transactions: register(
                &r,
                IntCounter::new(
                    "voucher_consumer_transactions_total",
                    "PostgreSQL transactions spent by the consumer",
                ),
            ),
            consumer_lag: gauge_vec(
                &r,
                "voucher_consumer_lag_messages",
                "Events published but not yet written to PostgreSQL, per partition",
                &["partition"],
            ),
            consumer_unwritten_age: register(
                &r,
                GaugeVec::new(
                    Opts::new(
                        "voucher_consumer_unwritten_age_seconds",
                        "How long the oldest event not yet written has waited, per partition",
                    ),
                    &["partition"],
                ),
            ),
            partitions_owned: gauge_vec(
                &r,
                "voucher_consumer_partitions_owned",
                "Partitions of the events topic this instance writes (1 each)",
                &["partition"],
            ),
            gate_drift: gauge_vec(
                &r,
                "voucher_gate_drift",
                "Uses held in Redis minus uses held in PostgreSQL",
                &["voucher"],
            ),
            gate_remaining: gauge_vec(
                &r,
                "voucher_gate_remaining",
                "Uses left at the Redis gate",
                &["voucher"],
            ),
            vouchers: gauge_vec(
                &r,
                "voucher_vouchers",
                "Vouchers by state (active, paused, archived), as PostgreSQL holds them",
                &["state"],
            ),
            sale_start: gauge_vec(
                &r,
                "voucher_sale_start_timestamp_seconds",
                "When each live flash voucher's sale starts (Unix seconds)",
                &["voucher"],
            ),
            reconciled: counter_vec(
                &r,
                "voucher_reconciled_uses_total",
                "Uses given back by reconciliation",
                &["reason"],
            ),
            gate_rebuilds: counter_vec(
                &r,
                "voucher_gate_rebuilds_total",
                "Gate rebuild attempts by result",
                &["result"],
            ),
            reconcile_duration: register(
                &r,
                Histogram::with_opts(
                    HistogramOpts::new(
                        "voucher_reconcile_duration_seconds",
                        "Time of one reconciliation round over every live flash voucher",
                    )
                    .buckets(latency()),
                ),
            ),
            reconcile_checked: counter_vec(
                &r,
                "voucher_reconcile_checked_total",
                "Entries reconciliation looked at, by kind",
                &["kind"],
            ),
            reconcile_last_success: register(
                &r,
                IntGauge::new(
                    "voucher_reconcile_last_success_timestamp_seconds",
                    "When this core last finished a reconciliation round (Unix seconds)",
                ),
            ),
            unavailable: counter_vec(
                &r,
                "voucher_unavailable_total",
                "503 answers by the dependency that could not serve",
                &["dependency"],
            ),
            db_pool_timeouts: register(
                &r,
                IntCounter::new(
                    "voucher_db_pool_timeouts_total",
                    "Requests that found no free database connection in time (503)",
                ),
            ),
            db_pool_connections: gauge_vec(
                &r,
                "voucher_db_pool_connections",
                "Database connections of the pool by state",
                &["state"],
            ),
            db_pool_max: register(
                &r,
                IntGauge::new(
                    "voucher_db_pool_max_connections",
                    "The pool's maximum number of database connections",
                ),
            ),
            runtime: gauge_vec(
                &r,
                "voucher_runtime_tasks",
                "Async runtime: workers, tasks alive, tasks in the global queue",
                &["kind"],
            ),
            registry: r,
        };
        // CPU, memory, open files and threads of this process (process_*; Linux).
        let process = prometheus::process_collector::ProcessCollector::for_self();
        metrics
            .registry
            .register(Box::new(process))
            .expect("the process collector is registered once");
        metrics.start_series_at_zero();
        metrics
    }

    /// Series that exist from the start (at 0), so dashboards and alerts see them before
    /// the first event of their kind.
    fn start_series_at_zero(&self) {
        for mode in ["standard", "flash"] {
            for outcome in [
                "reserved",
                "retried",
                "OUT_OF_STOCK",
                "ALREADY_USED",
                "NOT_ELIGIBLE",
            ] {
                self.reservations.with_label_values(&[mode, outcome]);
            }
        }
        let labelled: [(&IntCounterVec, &[&str]); 5] = [
            (&self.expiry_runs, &["ok", "error"]),
            (
                &self.consumer_events,
                &["inserted", "duplicate", "dead_lettered"],
            ),
            (
                &self.reconciled,
                &["never_recorded", "released_in_db", "repaired"],
            ),
            (
                &self.gate_rebuilds,
                &[
                    "loaded",
                    "already_loaded",
                    "superseded",
                    "not_caught_up",
                    "raised",
                    "error",
                ],
            ),
            (
                &self.reconcile_checked,
                &["unsettled", "released", "customers"],
            ),
        ];
        for (counter, labels) in labelled {
            for label in labels {
                counter.with_label_values(&[label]);
            }
        }
        for result in ["ok", "not_written", "ambiguous"] {
            self.publish_duration.with_label_values(&[result]);
        }
        for dependency in ["database", "event_broker", "redis", "voucher_gate"] {
            self.unavailable.with_label_values(&[dependency]);
        }
    }

    /// Samples the database pool and the async runtime (called at each scrape).
    pub fn sample(&self, pool: &sqlx::PgPool) {
        let size = i64::from(pool.size());
        let idle = i64::try_from(pool.num_idle()).unwrap_or(i64::MAX);
        self.db_pool_connections
            .with_label_values(&["idle"])
            .set(idle);
        self.db_pool_connections
            .with_label_values(&["in_use"])
            .set((size - idle).max(0));
        self.db_pool_max
            .set(i64::from(pool.options().get_max_connections()));
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let runtime = handle.metrics();
            let as_i64 = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
            for (kind, value) in [
                ("workers", runtime.num_workers()),
                ("alive", runtime.num_alive_tasks()),
                ("global_queue", runtime.global_queue_depth()),
            ] {
                self.runtime.with_label_values(&[kind]).set(as_i64(value));
            }
        }
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let encoder = TextEncoder::new();
        if let Err(e) = encoder.encode(&self.registry.gather(), &mut buf) {
            tracing::error!(error = %e, "cannot encode metrics");
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}

impl Metrics {
    /// The admission limiter's `voucher_admission_limit`, `voucher_admission_in_flight`
    /// and `voucher_admission_refused_total`, read from it at each scrape.
    pub fn watch_admission(&self, limiter: &voucher_admission::Limiter) -> anyhow::Result<()> {
        self.registry
            .register(Box::new(limiter.collector("voucher")?))?;
        Ok(())
    }
}

/// Registers `metric` in `registry` and hands it back. The definitions are static, so a
/// failure here is a bug caught by the first test that builds the metrics.
fn register<M>(registry: &Registry, metric: prometheus::Result<M>) -> M
where
    M: prometheus::core::Collector + Clone + 'static,
{
    let metric = metric.expect("static metric definition is valid");
    registry
        .register(Box::new(metric.clone()))
        .expect("each metric is registered once");
    metric
}

fn counter_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    register(registry, IntCounterVec::new(Opts::new(name, help), labels))
}

fn gauge_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    register(registry, IntGaugeVec::new(Opts::new(name, help), labels))
}

fn histogram_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
    buckets: Vec<f64>,
) -> HistogramVec {
    register(
        registry,
        HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), labels),
    )
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Counts and times one answered request by its route *template*, never the raw path (raw
/// paths carry codes and order ids, which would make the label set unbounded). Called by
/// the API's one middleware (`http::access`) with the route it matched.
pub fn count_request(
    metrics: &Metrics,
    method: &axum::http::Method,
    route: &str,
    response: &Response,
    elapsed: std::time::Duration,
) {
    let method = method_label(method);
    let error = response.extensions().get::<std::sync::Arc<Error>>();
    let code = error.map_or("OK", |e| e.code());
    if let Some(Error::Unavailable { dependency, cause }) = error.map(|e| &**e) {
        let label = dependency.replace(' ', "_");
        metrics.unavailable.with_label_values(&[&label]).inc();
        let pool_timeout = cause
            .as_ref()
            .and_then(|c| c.downcast_ref::<sqlx::Error>())
            .is_some_and(|e| matches!(e, sqlx::Error::PoolTimedOut));
        if pool_timeout {
            metrics.db_pool_timeouts.inc();
        }
    }
    metrics
        .http_requests
        .with_label_values(&[method, route, response.status().as_str(), code])
        .inc();
    metrics
        .http_duration
        .with_label_values(&[method, route])
        .observe(elapsed.as_secs_f64());
}

/// The method as a label from a closed set: a client can send any token as a method, and
/// each new one would be a new series for ever.
fn method_label(method: &axum::http::Method) -> &'static str {
    use axum::http::Method;
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "OTHER",
    }
}

/// What the metrics listener reads: the metrics, and the pool it samples at each scrape.
#[derive(Clone)]
pub struct Scrape {
    pub metrics: std::sync::Arc<Metrics>,
    pub pool: sqlx::PgPool,
}

/// How long a scrape waits for the vouchers' count by state; past it (or on an error) the
/// gauge keeps its last value, and the scrape is answered anyway.
const CENSUS_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(300);

/// `GET /metrics` on the metrics listener.
pub async fn serve(State(scrape): State<Scrape>) -> impl IntoResponse {
    scrape.metrics.sample(&scrape.pool);
    let store = crate::store::Store::new(scrape.pool.clone());
    if let Ok(Ok(counts)) = tokio::time::timeout(CENSUS_TIMEOUT, store.vouchers_by_state()).await {
        for state in crate::domain::VoucherState::ALL {
            let n = counts
                .iter()
                .find(|(s, _)| s == state.as_str())
                .map_or(0, |(_, n)| *n);
            scrape
                .metrics
                .vouchers
                .with_label_values(&[state.as_str()])
                .set(n);
        }
    }
    (
        [(CONTENT_TYPE, "text/plain; version=0.0.4")],
        scrape.metrics.render(),
    )
}
