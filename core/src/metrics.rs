//! Prometheus metrics of the core, served on their own listener (`http.metrics_listen`).
//!
//! Each application instance has its own registry, so several instances in one test
//! process do not mix their counts.

use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts, Registry, TextEncoder,
};

use crate::error::ErrorCode;

/// Latency buckets in seconds: fine below 10 ms, where the reservation path lives.
const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5,
];

pub struct Metrics {
    registry: Registry,
    /// Requests answered, by method, route template, status and error code (`OK` on success).
    pub http_requests: IntCounterVec,
    pub http_duration: HistogramVec,
    /// Reservation decisions by voucher mode and outcome (reserved, retried, or an error code).
    pub reservations: IntCounterVec,
    /// Reservations released by the expiry job.
    pub expired_releases: IntCounter,
    /// Expiry job runs by result (ok, error).
    pub expiry_runs: IntCounterVec,
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let http_requests = IntCounterVec::new(
            Opts::new("http_requests_total", "HTTP requests answered by the core"),
            &["method", "route", "status", "code"],
        )
        .expect("static metric definition is valid");
        let http_duration = HistogramVec::new(
            HistogramOpts::new(
                "http_request_duration_seconds",
                "Time from request received to response ready",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["method", "route"],
        )
        .expect("static metric definition is valid");
        let reservations = IntCounterVec::new(
            Opts::new(
                "voucher_reservations_total",
                "Reservation decisions by mode and outcome",
            ),
            &["mode", "outcome"],
        )
        .expect("static metric definition is valid");
        let expired_releases = IntCounter::new(
            "voucher_expired_releases_total",
            "Reservations released by the expiry job",
        )
        .expect("static metric definition is valid");
        let expiry_runs = IntCounterVec::new(
            Opts::new("voucher_expiry_runs_total", "Expiry job runs by result"),
            &["result"],
        )
        .expect("static metric definition is valid");
        for collector in [
            Box::new(http_requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(http_duration.clone()),
            Box::new(reservations.clone()),
            Box::new(expired_releases.clone()),
            Box::new(expiry_runs.clone()),
        ] {
            registry
                .register(collector)
                .expect("each metric is registered once");
        }
        Self {
            registry,
            http_requests,
            http_duration,
            reservations,
            expired_releases,
            expiry_runs,
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

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Middleware: counts and times every request by its route *template*, never the raw path
/// (raw paths carry codes and order ids, which would make the label set unbounded).
pub async fn track(
    State(metrics): State<std::sync::Arc<Metrics>>,
    request: Request,
    next: Next,
) -> Response {
    let started = Instant::now();
    let method = request.method().as_str().to_owned();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".to_owned());
    let response = next.run(request).await;
    let code = response
        .extensions()
        .get::<ErrorCode>()
        .map(|c| c.0)
        .unwrap_or("OK");
    metrics
        .http_requests
        .with_label_values(&[&method, &route, response.status().as_str(), code])
        .inc();
    metrics
        .http_duration
        .with_label_values(&[&method, &route])
        .observe(started.elapsed().as_secs_f64());
    response
}

/// `GET /metrics` on the metrics listener.
pub async fn serve(State(metrics): State<std::sync::Arc<Metrics>>) -> impl IntoResponse {
    (
        [(CONTENT_TYPE, "text/plain; version=0.0.4")],
        metrics.render(),
    )
}
