//! The `[tracing]` settings, the same section in the core's file and the edge's.

use std::time::Duration;

use serde::Deserialize;

/// Where spans go and how many. Off unless `otlp_endpoint` is set.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TraceSettings {
    /// Base URL of an OTLP/HTTP receiver (a collector's `http://collector:4318`); spans are
    /// posted to `{otlp_endpoint}/v1/traces` as protobuf. Unset: no spans are exported,
    /// and no trace context is read or written.
    pub otlp_endpoint: Option<String>,
    /// Share of new traces kept, 0 to 1. A request that arrives with a `traceparent` keeps
    /// its caller's decision (parent-based sampling), so a trace is whole or absent.
    pub sample_ratio: f64,
    /// Spans waiting for export, at most; past it new spans are dropped (never waited
    /// for, never grown without bound).
    pub queue_size: usize,
    /// How often queued spans are sent (also when a batch of 512 fills).
    #[serde(with = "humantime_serde")]
    pub export_interval: Duration,
    /// One export's deadline; the spans of a batch that misses it are dropped.
    #[serde(with = "humantime_serde")]
    pub export_timeout: Duration,
}

impl Default for TraceSettings {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            sample_ratio: 1.0,
            queue_size: 8192,
            export_interval: Duration::from_secs(2),
            export_timeout: Duration::from_secs(5),
        }
    }
}

impl TraceSettings {
    /// What is wrong with the settings, if anything.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            (0.0..=1.0).contains(&self.sample_ratio),
            "tracing.sample_ratio must be between 0 and 1"
        );
        anyhow::ensure!(self.queue_size > 0, "tracing.queue_size must be positive");
        if let Some(endpoint) = &self.otlp_endpoint {
            anyhow::ensure!(
                endpoint.starts_with("http://") || endpoint.starts_with("https://"),
                "tracing.otlp_endpoint must be an http:// or https:// URL"
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracing_is_off_by_default_and_bad_settings_are_refused() {
        let default = TraceSettings::default();
        assert!(default.otlp_endpoint.is_none());
        assert!(default.validate().is_ok());
        for bad in [
            TraceSettings {
                sample_ratio: 1.5,
                ..TraceSettings::default()
            },
            TraceSettings {
                queue_size: 0,
                ..TraceSettings::default()
            },
            TraceSettings {
                otlp_endpoint: Some("collector:4318".into()),
                ..TraceSettings::default()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }
}
