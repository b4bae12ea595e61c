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
    /// Flash mode needs all three of these; without them, flash vouchers are refused.
    #[serde(default)]
    pub redis: Option<RedisSettings>,
    #[serde(default)]
    pub kafka: Option<KafkaSettings>,
    #[serde(default)]
    pub flash: FlashSettings,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSettings {
    pub url: String,
    /// Put before every key, so several deployments (or tests) can share one Redis.
    #[serde(default = "default_key_prefix")]
    pub key_prefix: String,
    /// Connect and response timeout of one Redis call.
    #[serde(default = "default_redis_timeout_ms")]
    pub timeout_ms: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSettings {
    /// `bootstrap.servers`.
    pub brokers: String,
    /// Reservation events, keyed by voucher code.
    #[serde(default = "default_topic")]
    pub topic: String,
    /// Where events the database refuses go. Default: `<topic>.dlq`.
    #[serde(default)]
    pub dlq_topic: Option<String>,
    /// Consumer group of the writers into PostgreSQL.
    #[serde(default = "default_group")]
    pub group: String,
    /// Partitions to create the topic with, when it does not exist.
    #[serde(default = "default_partitions")]
    pub partitions: i32,
    /// How long the producer keeps trying one event; past it the send fails as ambiguous.
    #[serde(default = "default_message_timeout_ms")]
    pub message_timeout_ms: u64,
    /// Run the consumer that writes events into PostgreSQL in this instance.
    #[serde(default = "default_true")]
    pub consume: bool,
    /// Events written per database transaction, at most.
    #[serde(default = "default_batch_max")]
    pub batch_max: usize,
    /// How long the consumer waits to fill a batch once it has one event.
    #[serde(default = "default_batch_wait_ms")]
    pub batch_wait_ms: u64,
}

impl KafkaSettings {
    pub fn dlq_topic(&self) -> String {
        self.dlq_topic
            .clone()
            .unwrap_or_else(|| format!("{}.dlq", self.topic))
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlashSettings {
    /// How often the reconciliation job compares Redis with PostgreSQL.
    #[serde(default = "default_reconcile_interval_ms")]
    pub reconcile_interval_ms: u64,
    /// A gate record this old without its row is given back (once the consumer has caught
    /// up). Must exceed `kafka.message_timeout_ms`, after which no late write can land.
    #[serde(default = "default_reconcile_grace_ms")]
    pub reconcile_grace_ms: u64,
    #[serde(default = "default_true")]
    pub reconcile_enabled: bool,
    /// Confirm and release wait this long for the consumer to write a fresh reservation.
    #[serde(default = "default_row_wait_ms")]
    pub row_wait_ms: u64,
    /// How long a rebuild waits for the consumer to catch up before trying again.
    #[serde(default = "default_catch_up_timeout_ms")]
    pub catch_up_timeout_ms: u64,
}

impl Default for FlashSettings {
    fn default() -> Self {
        Self {
            reconcile_interval_ms: default_reconcile_interval_ms(),
            reconcile_grace_ms: default_reconcile_grace_ms(),
            reconcile_enabled: true,
            row_wait_ms: default_row_wait_ms(),
            catch_up_timeout_ms: default_catch_up_timeout_ms(),
        }
    }
}

fn default_key_prefix() -> String {
    "vg:".into()
}
fn default_redis_timeout_ms() -> u64 {
    1000
}
fn default_topic() -> String {
    "voucher-events".into()
}
fn default_group() -> String {
    "voucher-writer".into()
}
fn default_partitions() -> i32 {
    3
}
fn default_message_timeout_ms() -> u64 {
    5000
}
fn default_batch_max() -> usize {
    500
}
fn default_batch_wait_ms() -> u64 {
    20
}
fn default_reconcile_interval_ms() -> u64 {
    5000
}
fn default_reconcile_grace_ms() -> u64 {
    30_000
}
fn default_row_wait_ms() -> u64 {
    3000
}
fn default_catch_up_timeout_ms() -> u64 {
    10_000
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

    /// Refuses settings that would break a guarantee rather than a preference.
    pub fn validate(&self) -> anyhow::Result<()> {
        if let Some(kafka) = &self.kafka {
            anyhow::ensure!(
                self.flash.reconcile_grace_ms > kafka.message_timeout_ms,
                "flash.reconcile_grace_ms must exceed kafka.message_timeout_ms: a record \
                 younger than that may still have its event written late"
            );
        }
        anyhow::ensure!(
            self.redis.is_some() == self.kafka.is_some(),
            "flash mode needs both [redis] and [kafka]; configure both or neither"
        );
        Ok(())
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
            .try_deserialize::<Self>()?;
        settings.validate()?;
        Ok(settings)
    }
}
