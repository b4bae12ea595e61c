//! Configuration: a TOML file, then environment variables on top.
//!
//! The file is `config/core.toml` unless `VOUCHER_CONFIG` names another one. Any setting
//! can be overridden as `VOUCHER__<SECTION>__<KEY>`, e.g. `VOUCHER__DATABASE__URL` or
//! `VOUCHER__ADMIN__TOKEN` (secrets belong in the environment, not in the file).

use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub http: HttpSettings,
    pub database: DatabaseSettings,
    pub admin: AdminSettings,
    pub reservations: ReservationSettings,
    #[serde(default)]
    pub log: LogSettings,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSettings {
    /// The public API.
    pub listen: SocketAddr,
    /// Prometheus metrics, kept off the public listener.
    pub metrics_listen: SocketAddr,
    /// Request bodies above this many bytes get 413.
    #[serde(default = "default_max_body_bytes")]
    pub max_body_bytes: usize,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseSettings {
    pub url: String,
    #[serde(default = "default_max_connections")]
    pub max_connections: u32,
    /// How long a request waits for a connection before it answers 503.
    #[serde(default = "default_acquire_timeout_ms")]
    pub acquire_timeout_ms: u64,
    /// Apply `migrations/` at start-up.
    #[serde(default = "default_true")]
    pub migrate: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminSettings {
    /// Bearer token of the admin calls. Empty disables them (every admin call gets 401).
    #[serde(default)]
    pub token: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReservationSettings {
    /// A reservation neither confirmed nor released within this is released by the expiry job.
    #[serde(default = "default_ttl_secs")]
    pub ttl_secs: u64,
    /// How often the expiry job looks for due reservations.
    #[serde(default = "default_expiry_interval_ms")]
    pub expiry_interval_ms: u64,
    /// Reservations released per expiry transaction.
    #[serde(default = "default_expiry_batch")]
    pub expiry_batch: i64,
    /// Run the expiry job in this instance. Safe on every instance at once.
    #[serde(default = "default_true")]
    pub expiry_enabled: bool,
}

impl ReservationSettings {
    pub fn ttl(&self) -> chrono::Duration {
        chrono::Duration::seconds(i64::try_from(self.ttl_secs).unwrap_or(i64::MAX / 1000))
    }

    pub fn expiry_interval(&self) -> Duration {
        Duration::from_millis(self.expiry_interval_ms)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSettings {
    /// `tracing_subscriber` filter, e.g. `info,voucher_core=debug`. `RUST_LOG` wins over it.
    #[serde(default = "default_log_filter")]
    pub filter: String,
    /// `text` for people, `json` for log shippers.
    #[serde(default = "default_log_format")]
    pub format: String,
}

impl Default for LogSettings {
    fn default() -> Self {
        Self {
            filter: default_log_filter(),
            format: default_log_format(),
        }
    }
}

fn default_max_body_bytes() -> usize {
    4096
}
fn default_max_connections() -> u32 {
    20
}
fn default_acquire_timeout_ms() -> u64 {
    2000
}
fn default_true() -> bool {
    true
}
fn default_ttl_secs() -> u64 {
    15 * 60
}
fn default_expiry_interval_ms() -> u64 {
    5000
}
fn default_expiry_batch() -> i64 {
    500
}
fn default_log_filter() -> String {
    "info".into()
}
fn default_log_format() -> String {
    "text".into()
}

impl Settings {
    /// Reads the configuration file (`VOUCHER_CONFIG` or `config/core.toml`) and the
    /// `VOUCHER__` environment variables.
    pub fn load() -> anyhow::Result<Self> {
        let path = std::env::var("VOUCHER_CONFIG").unwrap_or_else(|_| "config/core.toml".into());
        Self::load_from(&path)
    }

    pub fn load_from(path: &str) -> anyhow::Result<Self> {
        let settings = config::Config::builder()
            .add_source(config::File::with_name(path).required(true))
            .add_source(
                config::Environment::with_prefix("VOUCHER")
                    .prefix_separator("__")
                    .separator("__")
                    .try_parsing(true),
            )
            .build()?
            .try_deserialize()?;
        Ok(settings)
    }
}
