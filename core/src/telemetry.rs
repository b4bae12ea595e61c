//! Logging set-up: `tracing` spans and events, as text or JSON.

use tracing_subscriber::EnvFilter;

use crate::config::LogSettings;

/// Installs the global subscriber. `RUST_LOG`, when set, wins over the configured filter.
pub fn init(settings: &LogSettings) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&settings.filter))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let result = if settings.format == "json" {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
    // Already installed (several apps in one test process): keep the first.
    let _ = result;
}
