//! Edge configuration: a YAML file, then `EDGE__<KEY>` environment variables on top.

use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EdgeSettings {
    /// Public listener.
    pub listen: String,
    /// Prometheus metrics listener, off the public one.
    pub metrics_listen: String,
    /// Core instances (`host:port`), balanced round-robin among the healthy ones.
    pub upstreams: Vec<String>,
    /// Bearer token for the core's admin calls the edge makes (the order list of a
    /// sold-out voucher). Never forwarded from clients: admin calls are refused at the edge.
    #[serde(default)]
    pub admin_token: String,
    /// How long a sold-out flag answers for the core.
    #[serde(default = "default_sold_out_ttl_ms")]
    pub sold_out_ttl_ms: u64,
    /// Vouchers with a flag at once, at most.
    #[serde(default = "default_cache_capacity")]
    pub cache_capacity: u64,
    /// Request bodies above this get 413 at the edge.
    #[serde(default = "default_max_body_bytes")]
    pub max_body_bytes: usize,
    #[serde(default = "default_health_check_interval_ms")]
    pub health_check_interval_ms: u64,
    #[serde(default = "default_connect_timeout_ms")]
    pub upstream_connect_timeout_ms: u64,
    #[serde(default = "default_upstream_read_timeout_ms")]
    pub upstream_read_timeout_ms: u64,
    /// A client that sends nothing for this long (headers or body) is cut off.
    #[serde(default = "default_client_timeout_ms")]
    pub client_timeout_ms: u64,
    /// Redis whose Pub/Sub channel announces uses given back (optional): flags drop at once.
    #[serde(default)]
    pub redis_url: Option<String>,
    #[serde(default = "default_channel")]
    pub availability_channel: String,
    /// Worker threads of the proxy service.
    #[serde(default = "default_threads")]
    pub threads: usize,
}

fn default_sold_out_ttl_ms() -> u64 {
    2000
}
fn default_cache_capacity() -> u64 {
    100_000
}
fn default_max_body_bytes() -> usize {
    4096
}
fn default_health_check_interval_ms() -> u64 {
    500
}
fn default_connect_timeout_ms() -> u64 {
    500
}
fn default_upstream_read_timeout_ms() -> u64 {
    10_000
}
fn default_client_timeout_ms() -> u64 {
    5000
}
fn default_channel() -> String {
    "vg:available".into()
}
fn default_threads() -> usize {
    2
}

impl EdgeSettings {
    /// Reads `EDGE_CONFIG` (default `config/edge.yaml`) and `EDGE__*` variables;
    /// lists are comma-separated there (`EDGE__UPSTREAMS=127.0.0.1:8081,127.0.0.1:8082`).
    pub fn load() -> anyhow::Result<Self> {
        let path = std::env::var("EDGE_CONFIG").unwrap_or_else(|_| "config/edge.yaml".into());
        let settings: Self = config::Config::builder()
            .add_source(config::File::with_name(&path).required(true))
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
        anyhow::ensure!(
            !settings.upstreams.is_empty(),
            "at least one upstream is needed"
        );
        Ok(settings)
    }
}
