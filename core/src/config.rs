//! Configuration: defaults in this file, then a TOML file, then environment variables.
//!
//! Every setting has its default here, in the `Default` impl of its section: that is the one
//! place defaults live (the `[tracing]` section's, shared with the edge, live in
//! `voucher_telemetry::TraceSettings`). The file is `config/core.toml` unless `VOUCHER_CONFIG` names another
//! one; it is optional, so a container can run from environment variables alone. Any setting
//! can be set as `VOUCHER__<SECTION>__<KEY>`, e.g. `VOUCHER__DATABASE__URL` or
//! `VOUCHER__ADMIN__TOKEN` (secrets belong in the environment, not in the file).
//!
//! Durations are written as humans write them: `"500ms"`, `"5s"`, `"15m"`.

use std::net::SocketAddr;
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    pub http: HttpSettings,
    pub runtime: RuntimeSettings,
    pub database: DatabaseSettings,
    pub admin: AdminSettings,
    pub reservations: ReservationSettings,
    pub log: LogSettings,
    /// OpenTelemetry traces, off by default (its defaults are in `voucher_telemetry`,
    /// shared with the edge).
    pub tracing: voucher_telemetry::TraceSettings,
    /// Flash mode needs both `redis` and `kafka`; without them, flash vouchers are refused.
    pub redis: Option<RedisSettings>,
    pub kafka: Option<KafkaSettings>,
    pub flash: FlashSettings,
    /// How standard mode's reservations are grouped into statements.
    pub standard: StandardSettings,
    /// How many reservations the core works on at once; the rest get `503 OVERLOADED`.
    pub admission: voucher_admission::AdmissionSettings,
}

/// The async runtime the process runs on.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeSettings {
    /// Worker threads of tokio's runtime; 0 (the default) is tokio's own choice: one per
    /// CPU, or `TOKIO_WORKER_THREADS` when that is set.
    pub worker_threads: usize,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpSettings {
    /// The public API.
    pub listen: SocketAddr,
    /// Prometheus metrics, kept off the public listener.
    pub metrics_listen: SocketAddr,
    /// Request bodies above this many bytes get 413.
    pub max_body_bytes: usize,
    /// On SIGTERM, `readyz` answers 503 for this long while requests are still served, so
    /// that load balancers (the edge checks every 500 ms) stop sending before the listener
    /// closes.
    #[serde(with = "humantime_serde")]
    pub drain_delay: Duration,
    /// After the drain delay, requests in flight get this long to finish; then the process
    /// exits anyway.
    #[serde(with = "humantime_serde")]
    pub shutdown_deadline: Duration,
}

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8081)),
            metrics_listen: SocketAddr::from(([127, 0, 0, 1], 9181)),
            max_body_bytes: 4096,
            drain_delay: Duration::from_secs(5),
            shutdown_deadline: Duration::from_secs(10),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DatabaseSettings {
    /// May carry a password: kept as a secret, never printed.
    pub url: SecretString,
    pub max_connections: u32,
    /// How long a request waits for a connection before it answers 503.
    #[serde(with = "humantime_serde")]
    pub acquire_timeout: Duration,
    /// Apply the migrations at start-up.
    pub migrate: bool,
    /// How long a session of this core may sit idle inside a transaction before
    /// PostgreSQL ends it (`idle_in_transaction_session_timeout`): a core paused or stuck
    /// mid-transaction holds a hot voucher's row no longer than this. A gate load's read
    /// (long on a big voucher, and holding no row lock) is exempt.
    #[serde(with = "humantime_serde")]
    pub idle_in_transaction_timeout: Duration,
    /// With several hosts in `url` (a primary and its standbys): how often the core asks
    /// its server whether it is still the primary, and looks for the new one when not.
    #[serde(with = "humantime_serde")]
    pub primary_check_interval: Duration,
}

impl Default for DatabaseSettings {
    fn default() -> Self {
        Self {
            url: "postgres://postgres@127.0.0.1:5432/vouchers?sslmode=disable".into(),
            max_connections: 20,
            acquire_timeout: Duration::from_secs(2),
            migrate: true,
            idle_in_transaction_timeout: Duration::from_secs(5),
            primary_check_interval: Duration::from_millis(500),
        }
    }
}

/// Bearer tokens. Named tokens with scopes live in PostgreSQL (`voucher-core tokens`,
/// see `auth`); these two are configured, for bootstrapping and development.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminSettings {
    /// The token named `admin`, with every scope. Empty: none.
    pub token: SecretString,
    /// The token named `edge`, with `orders:read` only (the edge's order filters). Empty:
    /// none.
    pub orders_token: SecretString,
    /// Allows the development tokens published in this repository (`config/core.toml`).
    /// Without it the core refuses to start with one of them.
    pub development: bool,
    /// How often the stored tokens are re-read: a token made or revoked takes effect on
    /// every core within this long.
    #[serde(with = "humantime_serde")]
    pub token_refresh: Duration,
}

impl Default for AdminSettings {
    fn default() -> Self {
        Self {
            token: SecretString::default(),
            orders_token: SecretString::default(),
            development: false,
            token_refresh: Duration::from_secs(5),
        }
    }
}

/// The tokens `config/core.toml` publishes for development stacks.
pub const DEVELOPMENT_TOKENS: [&str; 2] = ["dev-admin-token", "dev-orders-token"];

/// Standard mode decides concurrent reservations in groups: one statement per group, one
/// more for a group that crosses a limit (see `standard.rs`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StandardSettings {
    /// Statements in flight per core, and the most reservations one of them decides.
    pub group_workers: usize,
    pub group_batch_max: usize,
    /// How long a group waits for more reservations once it has one (and fewer than
    /// `group_batch_max`): what a reservation may wait for company, at most.
    #[serde(with = "humantime_serde")]
    pub group_linger: Duration,
}

impl Default for StandardSettings {
    fn default() -> Self {
        Self {
            // As flash mode's recorder: one statement at a time per core, since concurrent
            // ones on a hot voucher only queue on its row.
            group_workers: 1,
            group_batch_max: 200,
            group_linger: Duration::from_millis(1),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReservationSettings {
    /// A reservation neither confirmed nor released within this is released by the expiry job.
    #[serde(with = "humantime_serde")]
    pub ttl: Duration,
    /// How often the expiry job looks for due reservations.
    #[serde(with = "humantime_serde")]
    pub expiry_interval: Duration,
    /// Reservations released per expiry transaction.
    pub expiry_batch: i64,
    /// Run the expiry job in this instance. Safe on every instance at once.
    pub expiry_enabled: bool,
}

impl Default for ReservationSettings {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(15 * 60),
            expiry_interval: Duration::from_secs(5),
            expiry_batch: 500,
            expiry_enabled: true,
        }
    }
}

impl ReservationSettings {
    pub fn ttl(&self) -> chrono::Duration {
        chrono::Duration::from_std(self.ttl).unwrap_or(chrono::Duration::MAX)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogSettings {
    /// `tracing_subscriber` filter, e.g. `info,voucher_core=debug`. `RUST_LOG` wins over it.
    pub filter: String,
    /// `text` for people, `json` for log shippers.
    pub format: String,
    /// One `info` line per request (target `access`): method, path, route, status,
    /// duration and the request id. Off by default: behind an edge, the edge writes the
    /// line of every request it forwards, with the same request id, and a second line at
    /// the core cost an accepted reservation 8 µs of the core's CPU, 12% of it (README,
    /// "Logs and request ids"). On for a core that clients reach without an edge.
    pub access: bool,
}

impl Default for LogSettings {
    fn default() -> Self {
        Self {
            filter: "info".into(),
            format: "text".into(),
            access: false,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RedisSettings {
    /// A single Redis (`single`, the default) or a Redis Cluster (`cluster`).
    pub topology: crate::flash::gate::Topology,
    /// The server's URL; with `topology = "cluster"`, one or more of the cluster's nodes,
    /// comma-separated (`redis://10.0.0.1:7000,redis://10.0.0.2:7000`). May carry a
    /// password: kept as a secret, never printed.
    pub url: SecretString,
    /// Put before every key, so several deployments (or tests) can share one Redis. The
    /// availability channel the edges listen on is derived from it.
    pub key_prefix: String,
    /// Connect and response timeout of one Redis call.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Certificates of a Redis reached over TLS (`rediss://` URL): `[redis.tls]` with
    /// `ca_file`, `cert_file`, `key_file`, or `VOUCHER__REDIS__TLS__CA_FILE` and so on.
    pub tls: voucher_contract::redis_tls::RedisTls,
}

impl Default for RedisSettings {
    fn default() -> Self {
        Self {
            topology: Default::default(),
            url: "redis://127.0.0.1:6379/".into(),
            key_prefix: voucher_contract::DEFAULT_KEY_PREFIX.into(),
            timeout: Duration::from_secs(1),
            tls: Default::default(),
        }
    }
}

impl RedisSettings {
    /// The client of a single server (`topology = "single"`).
    pub fn client(&self) -> anyhow::Result<redis::Client> {
        voucher_contract::redis_tls::redis_client(self.url.expose_secret(), &self.tls)
    }

    pub fn availability_channel(&self) -> String {
        voucher_contract::availability_channel(&self.key_prefix)
    }

    pub fn sold_out_channel(&self) -> String {
        voucher_contract::sold_out_channel(&self.key_prefix)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaSettings {
    /// `bootstrap.servers`.
    pub brokers: String,
    /// Reservation events, keyed by voucher code.
    pub topic: String,
    /// Where events the database refuses go. Default: `<topic>.dlq`.
    pub dlq_topic: Option<String>,
    /// Consumer group of the writers into PostgreSQL.
    pub group: String,
    /// Partitions to create the topic with, when it does not exist.
    pub partitions: i32,
    /// Copies of each partition when the core creates the topics. With `acks=all` (what
    /// every producer here uses) an event is acknowledged once every in-sync replica has it:
    /// with one replica that is one disk. 3 with `min_insync_replicas = 2` survives a broker.
    pub replication_factor: i32,
    /// `min.insync.replicas` of the topics the core creates: below it, the broker refuses
    /// writes (the core answers 503) instead of acknowledging a single copy.
    pub min_insync_replicas: i32,
    /// librdkafka properties given to every client (producer, consumer, admin) as written,
    /// for TLS and SASL above all: `security.protocol`, `ssl.ca.location`,
    /// `sasl.mechanism`, `sasl.username`, `sasl.password`... In the environment, write the
    /// dots as `_`: `VOUCHER__KAFKA__PROPERTIES__SASL_PASSWORD`. The properties the core
    /// sets itself for its guarantees are refused here (see `RESERVED_KAFKA_PROPERTIES`).
    pub properties: KafkaProperties,
    /// How long the producer keeps trying one event; past it the send fails as ambiguous.
    #[serde(with = "humantime_serde")]
    pub message_timeout: Duration,
    /// Events waiting in a producer for the broker, at most, in KiB
    /// (`queue.buffering.max.kbytes`; librdkafka's own default is 1 GiB). It bounds the
    /// core's memory while the broker is slow or stopped: past it a new event is refused at
    /// once (`not_written`), which with the broker deciding is a 503 whose use is given
    /// back, and with PostgreSQL deciding an announcement dropped (its row is committed).
    /// Events also leave the queue after `message_timeout`: measured with the broker
    /// stopped for 10 s while a core accepted 1,000/s (`BENCH_ONLY=memory`), the core grew
    /// 3.4 MiB, so 16 MiB is several seconds of a core's peak rate.
    pub queue_max_kbytes: u64,
    /// How long the producer waits to group events into one request (`linger.ms`). Unset:
    /// 2 ms with the broker deciding (the client waits for the acknowledgement) and
    /// 20 ms with PostgreSQL deciding (the event is published after the 201; fewer, larger
    /// requests cost the broker and the core less per event). See [`KafkaSettings::linger_for`].
    #[serde(default, with = "humantime_serde")]
    pub linger: Option<Duration>,
    /// Run the writers that write events into PostgreSQL in this instance. Unset: only
    /// with the broker deciding (`flash.decision = "broker"`); with PostgreSQL deciding
    /// every event's row was committed before its 201, and writing it again is all they
    /// would do. Set it to `true` on a core of a fleet moving from `broker` to `database`
    /// until the events published before the move are written (lag 0).
    pub consume: Option<bool>,
    /// Events written per database transaction, at most.
    pub batch_max: usize,
    /// How long the consumer waits to fill a batch once it has one event.
    #[serde(with = "humantime_serde")]
    pub batch_wait: Duration,
    /// How often a core's standby writer tries to take a partition nobody writes: the bound
    /// on how long a dead core's partitions wait.
    #[serde(with = "humantime_serde")]
    pub takeover_interval: Duration,
    /// A writer's database session ends after this long without a statement, releasing its
    /// partitions: a stalled (not dead) core cannot hold them longer.
    #[serde(with = "humantime_serde")]
    pub owner_timeout: Duration,
    /// How often every core compares the topic with what is written (lag metrics, readiness).
    #[serde(with = "humantime_serde")]
    pub monitor_interval: Duration,
    /// How long a writer's fetch waits at the broker for new events (`fetch.wait.max.ms`):
    /// shorter writes a fresh reservation sooner (confirm waits for its row), longer costs
    /// the broker less while partitions are idle.
    #[serde(with = "humantime_serde")]
    pub fetch_wait: Duration,
}

impl Default for KafkaSettings {
    fn default() -> Self {
        Self {
            brokers: "127.0.0.1:9092".into(),
            topic: "voucher-events".into(),
            dlq_topic: None,
            group: "voucher-writer".into(),
            partitions: 3,
            replication_factor: 3,
            min_insync_replicas: 2,
            properties: KafkaProperties::default(),
            message_timeout: Duration::from_secs(5),
            queue_max_kbytes: 16 * 1024,
            consume: None,
            batch_max: 500,
            batch_wait: Duration::from_millis(20),
            takeover_interval: Duration::from_secs(1),
            owner_timeout: Duration::from_secs(10),
            monitor_interval: Duration::from_secs(1),
            fetch_wait: Duration::from_millis(10),
            linger: None,
        }
    }
}

/// librdkafka properties the core sets itself, because a guarantee rests on them (acks and
/// idempotence of the producers, the consumer's own offset handling, the group and servers
/// that have their own settings). Configuring one of them is refused, not ignored.
pub const RESERVED_KAFKA_PROPERTIES: [&str; 10] = [
    "bootstrap.servers",
    "group.id",
    "acks",
    "enable.idempotence",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "message.timeout.ms",
    "fetch.wait.max.ms",
    "linger.ms",
    "queue.buffering.max.kbytes",
];

/// Extra librdkafka properties. Their values may be secrets (`sasl.password`,
/// `ssl.key.password`): they never print, only their names do.
#[derive(Clone, Default, Deserialize)]
#[serde(transparent)]
pub struct KafkaProperties(std::collections::BTreeMap<String, String>);

impl KafkaProperties {
    /// `(property, value)` with `_` read as `.` in names: environment variables have no
    /// dots, and of librdkafka's properties set as text only `log_level` has an underscore.
    pub fn iter(&self) -> impl Iterator<Item = (String, &str)> {
        self.0.iter().map(|(name, value)| {
            let name = name.to_ascii_lowercase();
            let name = if name == "log_level" {
                name
            } else {
                name.replace('_', ".")
            };
            (name, value.as_str())
        })
    }
}

impl std::fmt::Debug for KafkaProperties {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set()
            .entries(self.iter().map(|(name, _)| name))
            .finish()
    }
}

impl KafkaSettings {
    /// The producer's `linger.ms` when `decision` has the last word: `linger` if set.
    pub fn linger_for(&self, decision: Decision) -> Duration {
        self.linger.unwrap_or(match decision {
            Decision::Broker => Duration::from_millis(2),
            Decision::Database => Duration::from_millis(20),
        })
    }

    /// A librdkafka configuration with the brokers and the configured properties; each
    /// client adds what it needs on top.
    pub fn client_config(&self) -> rdkafka::ClientConfig {
        let mut config = rdkafka::ClientConfig::new();
        for (name, value) in self.properties.iter() {
            config.set(name, value);
        }
        config.set("bootstrap.servers", &self.brokers);
        config
    }

    pub fn dlq_topic(&self) -> String {
        self.dlq_topic
            .clone()
            .unwrap_or_else(|| format!("{}.dlq", self.topic))
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FlashSettings {
    /// How often the reconciliation job compares Redis with PostgreSQL.
    #[serde(with = "humantime_serde")]
    pub reconcile_interval: Duration,
    /// A gate record this old without its row is given back (once the consumer has caught
    /// up). Must exceed `kafka.message_timeout`, after which no late write can land.
    #[serde(with = "humantime_serde")]
    pub reconcile_grace: Duration,
    pub reconcile_enabled: bool,
    /// Confirm and release wait this long for the consumer to write a fresh reservation.
    #[serde(with = "humantime_serde")]
    pub row_wait: Duration,
    /// How long a rebuild waits for the consumer to catch up before trying again.
    #[serde(with = "humantime_serde")]
    pub catch_up_timeout: Duration,
    /// What turns a use the gate took into a 201: the broker's acknowledgement of its
    /// event (`broker`), or its row committed in PostgreSQL, in grouped transactions
    /// (`database`; the event is then published after the answer). See ARCHITECTURE.md.
    pub decision: Decision,
    /// With `decision = "database"`: transactions in flight per core, and the most
    /// reservations one of them takes.
    pub record_workers: usize,
    pub record_batch_max: usize,
    /// How long a batch waits for more reservations once it has one (and fewer than
    /// `record_batch_max`): what a reservation may wait for company, at most.
    #[serde(with = "humantime_serde")]
    pub record_linger: Duration,
}

/// Who has the last word on a flash reservation before its 201.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    /// The broker's acknowledgement (acks=all); the consumer writes the row afterwards.
    /// "Never beyond the limit" then rests on the gate never going back in time.
    Broker,
    /// PostgreSQL's commit of the row, whatever the gate said: a gate that went back in
    /// time (a Redis restored from an older snapshot) cannot oversell a 201. The default.
    #[default]
    Database,
}

impl Decision {
    /// As written in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Broker => "broker",
            Decision::Database => "database",
        }
    }
}

impl Default for FlashSettings {
    fn default() -> Self {
        Self {
            reconcile_interval: Duration::from_secs(5),
            reconcile_grace: Duration::from_secs(30),
            reconcile_enabled: true,
            row_wait: Duration::from_secs(3),
            catch_up_timeout: Duration::from_secs(10),
            decision: Decision::Database,
            // Measured: 4 workers made batches of 1.5 reservations contending for the
            // voucher's row (flash sale sustained 1,000/s); 1 made batches of 11 (2,000/s).
            record_workers: 1,
            record_batch_max: 200,
            record_linger: Duration::from_millis(1),
        }
    }
}

impl Settings {
    /// Reads the configuration file (`VOUCHER_CONFIG`, or `config/core.toml` if it exists)
    /// and the `VOUCHER__` environment variables over the defaults.
    pub fn load() -> anyhow::Result<Self> {
        match std::env::var("VOUCHER_CONFIG") {
            Ok(path) => Self::load_from(Some(&path)),
            Err(_) => Self::load_from(None),
        }
    }

    /// Refuses settings that would break a guarantee rather than a preference.
    pub fn validate(&self) -> anyhow::Result<()> {
        if let Some(problem) = self.admission.problem() {
            anyhow::bail!(problem);
        }
        if let Some(kafka) = &self.kafka {
            for (name, _) in kafka.properties.iter() {
                anyhow::ensure!(
                    !RESERVED_KAFKA_PROPERTIES.contains(&name.as_str()),
                    "kafka.properties may not set {name}: the core sets it itself (see \
                     RESERVED_KAFKA_PROPERTIES) or it has its own setting"
                );
            }
            anyhow::ensure!(
                kafka.replication_factor >= 1
                    && (1..=kafka.replication_factor).contains(&kafka.min_insync_replicas),
                "kafka.min_insync_replicas must lie between 1 and kafka.replication_factor"
            );
            anyhow::ensure!(
                self.flash.reconcile_grace > kafka.message_timeout,
                "flash.reconcile_grace must exceed kafka.message_timeout: a record younger \
                 than that may still have its event written late"
            );
        }
        anyhow::ensure!(
            self.redis.is_some() == self.kafka.is_some(),
            "flash mode needs both [redis] and [kafka]; configure both or neither"
        );
        anyhow::ensure!(
            !self.admin.token_refresh.is_zero(),
            "admin.token_refresh must be more than zero"
        );
        for (key, token) in [
            ("admin.token", &self.admin.token),
            ("admin.orders_token", &self.admin.orders_token),
        ] {
            anyhow::ensure!(
                self.admin.development || !DEVELOPMENT_TOKENS.contains(&token.expose_secret()),
                "{key} is a development token published in this repository; set a secret one \
                 (VOUCHER__ADMIN__TOKEN, VOUCHER__ADMIN__ORDERS_TOKEN), or admin.development = \
                 true for a development stack"
            );
        }
        Ok(())
    }

    /// `path` must exist when given; without it `config/core.toml` is read if present.
    pub fn load_from(path: Option<&str>) -> anyhow::Result<Self> {
        let file = match path {
            Some(path) => config::File::with_name(path).required(true),
            None => config::File::with_name("config/core.toml").required(false),
        };
        Self::from_sources(file, environment())
    }

    fn from_sources(
        file: impl config::Source + Send + Sync + 'static,
        environment: config::Environment,
    ) -> anyhow::Result<Self> {
        let settings = config::Config::builder()
            .add_source(file)
            .add_source(environment)
            .build()?
            .try_deserialize::<Self>()?;
        settings.validate()?;
        Ok(settings)
    }
}

/// `VOUCHER__<SECTION>__<KEY>` variables.
fn environment() -> config::Environment {
    config::Environment::with_prefix("VOUCHER")
        .prefix_separator("__")
        .separator("__")
        .try_parsing(true)
}

#[cfg(test)]
mod tests {
    use secrecy::ExposeSecret;

    use super::*;

    fn parse(toml: &str) -> anyhow::Result<Settings> {
        let settings = config::Config::builder()
            .add_source(config::File::from_str(toml, config::FileFormat::Toml))
            .build()?
            .try_deserialize::<Settings>()?;
        settings.validate()?;
        Ok(settings)
    }

    #[test]
    fn an_empty_file_is_the_defaults() {
        let s = parse("").expect("defaults are valid");
        assert_eq!(s.database.acquire_timeout, Duration::from_secs(2));
        assert!(s.redis.is_none() && s.kafka.is_none());
    }

    #[test]
    fn durations_are_written_with_their_unit() {
        let s = parse(
            "[redis]\ntimeout = \"250ms\"\n[kafka]\nmessage_timeout = \"2s\"\n\
             [flash]\nreconcile_grace = \"1m\"\n[reservations]\nttl = \"15m\"",
        )
        .expect("valid");
        assert_eq!(s.redis.expect("redis").timeout, Duration::from_millis(250));
        assert_eq!(
            s.kafka.expect("kafka").message_timeout,
            Duration::from_secs(2)
        );
        assert_eq!(s.reservations.ttl(), chrono::Duration::minutes(15));
        assert!(
            parse("[redis]\ntimeout = 250").is_err(),
            "a bare number has no unit"
        );
    }

    #[test]
    fn a_grace_within_the_message_timeout_is_refused() {
        let err =
            parse("[redis]\n[kafka]\nmessage_timeout = \"5s\"\n[flash]\nreconcile_grace = \"5s\"")
                .expect_err("refused");
        assert!(err.to_string().contains("reconcile_grace"), "{err}");
    }

    #[test]
    fn the_published_development_tokens_need_the_development_flag() {
        for file in [
            "[admin]\ntoken = \"dev-admin-token\"",
            "[admin]\norders_token = \"dev-orders-token\"",
        ] {
            let err = parse(file).expect_err("refused");
            assert!(err.to_string().contains("development token"), "{err}");
        }
        assert!(parse("[admin]\ntoken = \"dev-admin-token\"\ndevelopment = true").is_ok());
    }

    fn from_env(file: &str, vars: &[(&str, &str)]) -> anyhow::Result<Settings> {
        let vars = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Settings::from_sources(
            config::File::from_str(file, config::FileFormat::Toml),
            environment().source(Some(vars)),
        )
    }

    #[test]
    fn the_environment_alone_configures_everything() {
        let s = from_env(
            "",
            &[
                (
                    "VOUCHER__DATABASE__URL",
                    "postgres://db.internal/v?sslmode=verify-full",
                ),
                ("VOUCHER__REDIS__URL", "rediss://cache.internal:6380/"),
                ("VOUCHER__REDIS__TLS__CA_FILE", "/etc/tls/ca.pem"),
                ("VOUCHER__KAFKA__BROKERS", "k1:9093,k2:9093"),
                ("VOUCHER__KAFKA__REPLICATION_FACTOR", "3"),
                ("VOUCHER__KAFKA__PROPERTIES__SECURITY_PROTOCOL", "SASL_SSL"),
                (
                    "VOUCHER__KAFKA__PROPERTIES__SASL_MECHANISM",
                    "SCRAM-SHA-512",
                ),
                ("VOUCHER__KAFKA__PROPERTIES__SASL_PASSWORD", "hunter2"),
                ("VOUCHER__FLASH__ROW_WAIT", "2s"),
                ("VOUCHER__RUNTIME__WORKER_THREADS", "1"),
            ],
        )
        .expect("valid");
        let redis = s.redis.as_ref().expect("redis from the environment");
        assert_eq!(
            redis.tls.ca_file.as_deref(),
            Some("/etc/tls/ca.pem".as_ref())
        );
        let kafka = s.kafka.as_ref().expect("kafka from the environment");
        assert_eq!(kafka.brokers, "k1:9093,k2:9093");
        assert_eq!(kafka.replication_factor, 3);
        let config = kafka.client_config();
        assert_eq!(config.get("security.protocol"), Some("SASL_SSL"));
        assert_eq!(config.get("sasl.mechanism"), Some("SCRAM-SHA-512"));
        assert_eq!(config.get("sasl.password"), Some("hunter2"));
        assert_eq!(config.get("bootstrap.servers"), Some("k1:9093,k2:9093"));
        assert_eq!(s.flash.row_wait, Duration::from_secs(2));
        assert_eq!(s.runtime.worker_threads, 1);
        let printed = format!("{s:?}");
        assert!(printed.contains("sasl.password") && !printed.contains("hunter2"));
        assert!(
            !printed.contains("db.internal"),
            "the database URL is a secret"
        );
    }

    #[test]
    fn kafka_properties_from_the_file_keep_their_dots_and_the_environment_wins() {
        let s = from_env(
            "[redis]\n[kafka]\n[kafka.properties]\n\"security.protocol\" = \"SSL\"\n\
             \"ssl.ca.location\" = \"/file/ca.pem\"",
            &[("VOUCHER__KAFKA__PROPERTIES__SSL_CA_LOCATION", "/env/ca.pem")],
        )
        .expect("valid");
        let config = s.kafka.expect("kafka").client_config();
        assert_eq!(config.get("security.protocol"), Some("SSL"));
        assert_eq!(config.get("ssl.ca.location"), Some("/env/ca.pem"));
    }

    #[test]
    fn properties_the_guarantees_rest_on_are_refused() {
        for name in ["acks", "enable.auto.commit", "enable_idempotence"] {
            let err = parse(&format!(
                "[redis]\n[kafka]\n[kafka.properties]\n\"{name}\" = \"1\""
            ))
            .expect_err("refused");
            assert!(err.to_string().contains("may not set"), "{err}");
        }
        let err = parse("[redis]\n[kafka]\nreplication_factor = 1\nmin_insync_replicas = 2")
            .expect_err("more in-sync replicas than replicas");
        assert!(err.to_string().contains("min_insync_replicas"), "{err}");
    }

    #[test]
    fn secrets_never_print() {
        let s = parse("[admin]\ntoken = \"s3cr3t\"").expect("valid");
        assert_eq!(s.admin.token.expose_secret(), "s3cr3t");
        assert!(!format!("{s:?}").contains("s3cr3t"));
    }
}
