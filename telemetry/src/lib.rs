//! Logs and traces of the voucher edge and core. [`init`] is the front door, called once by
//! each binary before its runtime starts; [`trace`] is what code on a request's path calls
//! to continue a trace that arrived and to pass it on.
//!
//! - `logs`: `tracing` events as text or JSON, written by a thread of their own;
//! - [`access`]: a request's access line, formatted by its caller and queued for that
//!   same thread (the edge writes one per forwarded request: through `tracing` it was half
//!   of the edge's own cost of forwarding);
//! - `export` (feature `otlp`, on by default): the spans of the `voucher_*` crates sent by
//!   OTLP/HTTP in batches, when `[tracing] otlp_endpoint` is set, and never otherwise;
//! - [`trace`]: W3C trace context (`traceparent`, `tracestate`) read from and written to
//!   headers of any kind (HTTP requests, Kafka records), and links between spans;
//! - [`settings`]: the `[tracing]` section both binaries read.
//!
//! With tracing off (no endpoint, the default) the subscriber is the logs alone, as it was
//! before traces existed, and every function of [`trace`] returns at its first line.

pub mod access;
mod logs;
pub mod settings;
pub mod trace;

#[cfg(feature = "otlp")]
mod export;

#[cfg(feature = "otlp")]
use std::sync::atomic::{AtomicBool, Ordering};

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;
#[cfg(feature = "otlp")]
use tracing_subscriber::Layer;

pub use logs::QUEUED_LINES;
pub use settings::TraceSettings;

/// Which program is speaking: the `service.name` and `service.version` of its spans
/// (`OTEL_SERVICE_NAME`, when set, names it instead, as OpenTelemetry's SDKs do).
#[derive(Debug, Clone, Copy)]
pub struct Service {
    pub name: &'static str,
    pub version: &'static str,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy)]
pub struct Logs<'a> {
    /// A `tracing_subscriber` filter (`info,voucher_core=debug`); `RUST_LOG` wins over it.
    pub filter: &'a str,
    /// JSON lines for log shippers, or text for people (colours only on a terminal).
    pub json: bool,
}

/// Set once an exporter runs: until then every function of [`trace`] does nothing.
#[cfg(feature = "otlp")]
static TRACING: AtomicBool = AtomicBool::new(false);

/// Whether spans are being exported (`[tracing] otlp_endpoint` set and the exporter built).
#[cfg(feature = "otlp")]
#[inline]
pub fn tracing_enabled() -> bool {
    TRACING.load(Ordering::Relaxed)
}

/// Never, in a build without the exporter: a constant, so that every branch on it is
/// compiled away.
#[cfg(not(feature = "otlp"))]
#[inline(always)]
pub const fn tracing_enabled() -> bool {
    false
}

/// What keeps logs and traces going; hold it for the life of the process. Dropping it (or
/// [`Telemetry::shutdown`]) sends the spans still queued and the lines still queued, in
/// that order.
#[must_use = "dropping it stops the log writer and the span exporter"]
pub struct Telemetry {
    #[cfg(feature = "otlp")]
    traces: Option<export::Exporter>,
    _logs: logs::Writer,
}

impl Telemetry {
    /// Flushes and stops the exporter (bounded by its export timeout), then the log writer.
    pub fn shutdown(self) {
        drop(self);
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        #[cfg(feature = "otlp")]
        if let Some(traces) = self.traces.take() {
            TRACING.store(false, Ordering::Relaxed);
            traces.shutdown();
        }
    }
}

/// The log filter: `RUST_LOG` when it parses, else `configured`, else `info`.
fn log_filter(configured: &str) -> EnvFilter {
    EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(configured))
        .unwrap_or_else(|_| EnvFilter::new("info"))
}

/// Whether `filter` lets an event of target `access` at `info` through: asked once, of a
/// subscriber made for the question, since access lines bypass the subscriber
/// ([`access`]). Asking the process's own subscriber on every request would leave a
/// per-layer filter's answer behind for the thread's next span (see `export`).
fn access_lines_pass(filter: EnvFilter) -> bool {
    let probe = tracing_subscriber::registry().with(filter);
    tracing::subscriber::with_default(
        probe,
        || tracing::enabled!(target: access::TARGET, tracing::Level::INFO),
    )
}

/// Installs the process's subscriber: the logs, and the span exporter when `traces` names
/// an endpoint. Call it before a Tokio runtime starts (the exporter's HTTP client has a
/// runtime of its own, which may not be made or dropped inside another). Fails when the
/// settings are invalid, the exporter cannot be built, or a subscriber is installed
/// already.
pub fn init(service: Service, logs: Logs<'_>, traces: &TraceSettings) -> anyhow::Result<Telemetry> {
    traces.validate()?;
    let filter = log_filter(logs.filter);
    let access = access_lines_pass(log_filter(logs.filter));
    #[cfg(feature = "otlp")]
    if let Some(endpoint) = &traces.otlp_endpoint {
        let exporter = export::Exporter::start(service, endpoint, traces)?;
        let (lines, guard) = logs::layer(logs.json, access)?;
        tracing_subscriber::registry()
            .with(lines.with_filter(filter))
            .with(exporter.layer())
            .try_init()?;
        TRACING.store(true, Ordering::Relaxed);
        return Ok(Telemetry {
            traces: Some(exporter),
            _logs: guard,
        });
    }
    if traces.otlp_endpoint.is_some() {
        anyhow::bail!(
            "tracing.otlp_endpoint is set but this build has no OTLP exporter (feature `otlp`)"
        );
    }
    let _ = service;
    // Tracing off: the logs alone, their filter global, as before traces existed.
    let (lines, guard) = logs::layer(logs.json, access)?;
    tracing_subscriber::registry()
        .with(filter)
        .with(lines)
        .try_init()?;
    Ok(Telemetry {
        #[cfg(feature = "otlp")]
        traces: None,
        _logs: guard,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_lines_are_written_when_the_filter_lets_target_access_through_at_info() {
        for (filter, passes) in [
            ("info", true),
            ("debug", true),
            ("warn", false),
            ("info,access=warn", false),
            ("warn,access=info", true),
            ("access=off", false),
            ("voucher_edge=debug", false),
        ] {
            let parsed = EnvFilter::try_new(filter).expect("a valid filter");
            assert_eq!(access_lines_pass(parsed), passes, "{filter}");
        }
    }
}
