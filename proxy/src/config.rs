//! Edge configuration: defaults here, then a YAML file, then `EDGE__<KEY>` environment
//! variables on top. Durations are written with their unit (`"500ms"`, `"2s"`).

use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

use crate::rate_limit::RateLimitSettings;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EdgeSettings {
    /// Public listener.
    pub listen: String,
    /// Prometheus metrics listener, off the public one.
    pub metrics_listen: String,
    /// Core instances (`host:port`): a reservation goes to its voucher's ready core, the
    /// rest round-robin among the ready ones (`routing`). A host may
    /// be a DNS name: every address it resolves to is a core (a Kubernetes headless
    /// Service), resolved again every `upstream_resolve_interval`, so cores that come are
    /// found and cores that go are forgotten.
    pub upstreams: Vec<String>,
    /// How often the upstreams' names are resolved again.
    #[serde(with = "humantime_serde")]
    pub upstream_resolve_interval: Duration,
    /// After SIGTERM, `GET /readyz` answers 503 this long while every request is still
    /// served (the balancer in front stops sending), then the listener closes.
    #[serde(with = "humantime_serde")]
    pub drain_delay: Duration,
    /// Then requests in flight get this long before the process exits (whole seconds,
    /// rounded up: pingora's grace period).
    #[serde(with = "humantime_serde")]
    pub shutdown_deadline: Duration,
    /// The cores' `admin.orders_token`: the edge reads the order list of a sold-out voucher
    /// with it, and it can do nothing else. Never forwarded from clients: admin calls are
    /// refused at the edge. (`admin_token`, its former name, is still read.)
    #[serde(alias = "admin_token")]
    pub orders_token: SecretString,
    /// Whether the edge answers OUT_OF_STOCK for sold-out vouchers itself. It needs
    /// `orders_token` to do so safely: the edge refuses to start without one unless this is
    /// turned off (then every reservation goes to a core).
    pub sold_out_answers: bool,
    /// How long a sold-out flag answers for the core.
    #[serde(with = "humantime_serde")]
    pub sold_out_ttl: Duration,
    /// How long a reservation that meets a new flag waits for its order filter before it
    /// goes on to a core. Waiting is what keeps a sell-out's refusals off the cores while
    /// the filter is fetched (`edge_order_fetch_seconds`); past this, the request goes on,
    /// as every one did before the wait existed.
    #[serde(with = "humantime_serde")]
    pub sold_out_wait: Duration,
    /// Reservations waiting for order filters at once, at most; the rest go on at once.
    pub sold_out_max_waiting: usize,
    /// One voucher's reservations this edge has at the cores at once, at most (0: no
    /// bound); the next wait up to `admission.queue_timeout` for a place, asking the
    /// voucher's flag again once they have it, then get `503 OVERLOADED` (`places`).
    pub voucher_in_flight: usize,
    /// A voucher's order filter is fetched from a core at most once per this interval,
    /// whatever clients send (give-backs drop flags; each new flag would fetch again).
    #[serde(with = "humantime_serde")]
    pub order_fetch_interval: Duration,
    /// Per-client rates (0 = off): `rate_limit.per_ip`, `rate_limit.per_customer`.
    pub rate_limit: RateLimitSettings,
    /// Vouchers with a flag at once, at most.
    pub cache_capacity: u64,
    /// Request bodies above this get 413 at the edge.
    pub max_body_bytes: usize,
    /// Request line and headers above this, together, get 431 at the edge (pingora itself
    /// takes up to 1 MiB and 256 headers).
    pub max_header_bytes: usize,
    #[serde(with = "humantime_serde")]
    pub health_check_interval: Duration,
    #[serde(with = "humantime_serde")]
    pub upstream_connect_timeout: Duration,
    #[serde(with = "humantime_serde")]
    pub upstream_read_timeout: Duration,
    /// A client that sends nothing for this long (headers or body) is cut off, and a
    /// reservation's whole body must arrive within it (a dribbled body gets 400).
    #[serde(with = "humantime_serde")]
    pub client_timeout: Duration,
    /// Redis whose Pub/Sub channel announces uses given back: flags drop at once. For a
    /// Redis Cluster, several of its nodes, comma-separated: a cluster delivers every
    /// message published on any node to subscribers of every node, so the edge listens on
    /// one node at a time and moves to the next when it loses it. May carry a password:
    /// kept as a secret, never printed.
    pub redis_url: Option<SecretString>,
    /// Certificates of a Redis reached over TLS (`rediss://`): `redis_tls.ca_file`,
    /// `cert_file`, `key_file` (`EDGE__REDIS_TLS__CA_FILE`...), as the cores read theirs.
    pub redis_tls: voucher_contract::redis_tls::RedisTls,
    /// The cores' Redis key prefix: the availability channel is derived from it, as the
    /// cores derive it (see `voucher_contract::availability_channel`).
    pub key_prefix: String,
    /// Worker threads of the proxy service.
    pub threads: usize,
    /// Bytes of each client connection's read buffer (pingora's L4 buffer, allocated and
    /// zeroed per connection while it is open; pingora's default is 64 KiB). A
    /// reservation's request is a few hundred bytes, and a longer one is read in several
    /// reads: the headers' own buffer grows up to `max_header_bytes`. Measured with 1,024
    /// keep-alive connections (`BENCH_ONLY=memory ./loadtest/bench.sh`): 90 KiB per
    /// connection with 64 KiB, 28 KiB with 4 KiB.
    pub read_buffer_bytes: usize,
    /// `text` for people, `json` for log shippers (`EDGE__LOG_FORMAT=json`).
    pub log_format: String,
    /// One `info` line per request (target `access`): request id, method, path, route,
    /// status, outcome, duration, client address. `all` (default), `forwarded` (requests
    /// sent to a core only; the edge's own answers, the sold-out 409s above all, are
    /// counted in metrics but not logged: at a sale's peak they are most of the traffic,
    /// and a line each cost 18% to 25% of the reject path's throughput, measured by
    /// `BENCH_ONLY=rate-limits ./loadtest/bench.sh`), or `off`.
    pub access_log: AccessLog,
    /// OpenTelemetry traces (`tracing.otlp_endpoint`, `EDGE__TRACING__OTLP_ENDPOINT`), off
    /// by default; the same settings as the core's `[tracing]`.
    pub tracing: voucher_telemetry::TraceSettings,
    /// How many reservations the edge has at the cores at once; the rest get
    /// `503 OVERLOADED` from the edge itself (`admission.enabled`, `initial_limit`,
    /// `min_limit`, `max_limit`, `latency_target`). Looser than a core's by default: the
    /// cores bound their own work, and this bounds what the edge holds when they answer late.
    pub admission: voucher_admission::AdmissionSettings,
}

/// Which requests the edge writes an access line for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AccessLog {
    All,
    Forwarded,
    Off,
}

impl AccessLog {
    /// Whether a request with this `outcome` (`forwarded`, or why the edge answered) is
    /// logged.
    pub fn logs(self, outcome: &str) -> bool {
        match self {
            Self::All => true,
            Self::Forwarded => outcome == "forwarded",
            Self::Off => false,
        }
    }
}

impl Default for EdgeSettings {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".into(),
            metrics_listen: "127.0.0.1:9180".into(),
            upstreams: vec!["127.0.0.1:8081".into()],
            upstream_resolve_interval: Duration::from_secs(5),
            drain_delay: Duration::from_secs(5),
            shutdown_deadline: Duration::from_secs(5),
            orders_token: SecretString::default(),
            sold_out_answers: true,
            sold_out_ttl: Duration::from_secs(2),
            sold_out_wait: Duration::from_millis(50),
            sold_out_max_waiting: 4096,
            voucher_in_flight: 256,
            order_fetch_interval: Duration::from_secs(1),
            rate_limit: RateLimitSettings::default(),
            cache_capacity: 100_000,
            max_body_bytes: 4096,
            max_header_bytes: 16 * 1024,
            health_check_interval: Duration::from_millis(500),
            upstream_connect_timeout: Duration::from_millis(500),
            upstream_read_timeout: Duration::from_secs(10),
            client_timeout: Duration::from_secs(5),
            redis_url: None,
            redis_tls: Default::default(),
            key_prefix: voucher_contract::DEFAULT_KEY_PREFIX.into(),
            threads: 2,
            read_buffer_bytes: 4096,
            log_format: "text".into(),
            access_log: AccessLog::All,
            tracing: Default::default(),
            admission: voucher_admission::AdmissionSettings {
                initial_limit: 4096,
                min_limit: 64,
                max_limit: 16384,
                latency_target: Duration::from_millis(80),
                ..Default::default()
            },
        }
    }
}

impl EdgeSettings {
    /// Reads `EDGE_CONFIG` (or `config/edge.yaml` if it exists) and `EDGE__*` variables;
    /// lists are comma-separated there (`EDGE__UPSTREAMS=127.0.0.1:8081,127.0.0.1:8082`).
    pub fn load() -> anyhow::Result<Self> {
        let file = match std::env::var("EDGE_CONFIG") {
            Ok(path) => config::File::with_name(&path).required(true),
            Err(_) => config::File::with_name("config/edge.yaml").required(false),
        };
        let settings: Self = config::Config::builder()
            .add_source(file)
            .add_source(
                config::Environment::with_prefix("EDGE")
                    .prefix_separator("__")
                    .separator("__")
                    .list_separator(",")
                    .with_list_parse_key("upstreams")
                    .try_parsing(true),
            )
            .build()?
            .try_deserialize()?;
        settings.check()?;
        Ok(settings)
    }

    /// What no edge may start with.
    pub fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            matches!(self.log_format.as_str(), "text" | "json"),
            "log_format must be text or json"
        );
        if let Some(problem) = self.admission.problem() {
            anyhow::bail!(problem);
        }
        self.tracing.validate()?;
        anyhow::ensure!(
            !self.upstreams.is_empty(),
            "at least one upstream is needed"
        );
        for upstream in &self.upstreams {
            anyhow::ensure!(
                upstream
                    .rsplit_once(':')
                    .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok()),
                "upstream {upstream:?} is not host:port (the host an address or a DNS name)"
            );
        }
        anyhow::ensure!(
            !self.upstream_resolve_interval.is_zero(),
            "upstream_resolve_interval must be more than zero"
        );
        anyhow::ensure!(
            !self.sold_out_answers || self.redis_url.is_some(),
            "redis_url is not set, so the edge would not hear of uses given back and a flag \
             could hide an order that took one: set redis_url (EDGE__REDIS_URL, the cores' \
             Redis), or sold_out_answers: false"
        );
        anyhow::ensure!(
            !self.sold_out_answers || !self.orders_token.expose_secret().is_empty(),
            "orders_token is empty, so the edge could not tell a holder's retry from a new \
             order on a sold-out voucher: set orders_token (EDGE__ORDERS_TOKEN, the cores' \
             admin.orders_token), or sold_out_answers: false to send every reservation to a core"
        );
        Ok(())
    }

    pub fn availability_channel(&self) -> String {
        voucher_contract::availability_channel(&self.key_prefix)
    }

    pub fn sold_out_channel(&self) -> String {
        voucher_contract::sold_out_channel(&self.key_prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_the_channel_come_from_the_file() {
        let s: EdgeSettings = config::Config::builder()
            .add_source(config::File::from_str(
                "sold_out_ttl: 250ms\nkey_prefix: \"shop:\"\norders_token: t0k3n",
                config::FileFormat::Yaml,
            ))
            .build()
            .and_then(|c| c.try_deserialize())
            .expect("valid");
        assert_eq!(s.sold_out_ttl, Duration::from_millis(250));
        assert_eq!(s.availability_channel(), "shop:available");
        assert!(
            !format!("{s:?}").contains("t0k3n"),
            "the token never prints"
        );
    }

    #[test]
    fn the_access_log_can_leave_out_the_edges_own_answers() {
        let s: EdgeSettings = config::Config::builder()
            .add_source(config::File::from_str(
                "access_log: forwarded",
                config::FileFormat::Yaml,
            ))
            .build()
            .and_then(|c| c.try_deserialize())
            .expect("valid");
        assert_eq!(s.access_log, AccessLog::Forwarded);
        assert!(s.access_log.logs("forwarded"));
        assert!(!s.access_log.logs("sold_out"));
        assert!(AccessLog::All.logs("sold_out") && !AccessLog::Off.logs("forwarded"));
    }

    #[test]
    fn an_edge_without_its_token_starts_only_without_sold_out_answers() {
        let mut s = EdgeSettings {
            redis_url: Some("redis://127.0.0.1:6379/".to_owned().into()),
            ..EdgeSettings::default()
        };
        assert!(s.check().is_err(), "no token, sold-out answers on");
        s.sold_out_answers = false;
        assert!(s.check().is_ok());
        s.sold_out_answers = true;
        s.orders_token = "t".to_owned().into();
        assert!(s.check().is_ok());
        s.redis_url = None;
        assert!(s.check().is_err(), "no announcements, sold-out answers on");
    }
}
