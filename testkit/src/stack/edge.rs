//! The real edge binary as a process of its own, configured the way an operator would,
//! so that tests go through what customers go through.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::json;

use super::REDIS_URL;
use crate::helpers::{metrics_text, ApiClient, ORDERS_TOKEN};
use crate::metrics::Metrics;
use crate::process::{listening, Process};
use crate::{free_port, TempDir};

/// The edge binary, configured by a YAML file of the test's own. Killed when dropped.
pub struct EdgeProcess {
    process: Process,
    binary: std::path::PathBuf,
    config: std::path::PathBuf,
    /// `EDGE__*` variables on top of the file (rate limits, for one).
    env: Vec<(String, String)>,
    port: u16,
    pub api: ApiClient,
    pub metrics_base: String,
    /// Its log: warnings, and the access log (one JSON line per request).
    pub log: std::path::PathBuf,
    _dir: TempDir,
}

impl EdgeProcess {
    /// Starts `binary` in front of `upstreams`, listening for availability on the channel
    /// of `key_prefix` on the tests' Redis, with sold-out flags that live `sold_out_ttl`.
    pub async fn start(
        binary: &Path,
        upstreams: &[&str],
        key_prefix: &str,
        sold_out_ttl: Duration,
    ) -> Self {
        Self::start_on(binary, upstreams, REDIS_URL, key_prefix, sold_out_ttl).await
    }

    /// [`EdgeProcess::start`] with the Redis at `redis_url`.
    pub async fn start_on(
        binary: &Path,
        upstreams: &[&str],
        redis_url: &str,
        key_prefix: &str,
        sold_out_ttl: Duration,
    ) -> Self {
        Self::start_with_env(binary, upstreams, redis_url, key_prefix, sold_out_ttl, &[]).await
    }

    /// [`EdgeProcess::start_on`] with `env` (`EDGE__*` variables) on top of its file.
    pub async fn start_with_env(
        binary: &Path,
        upstreams: &[&str],
        redis_url: &str,
        key_prefix: &str,
        sold_out_ttl: Duration,
        env: &[(&str, &str)],
    ) -> Self {
        // A listener the test sets itself (`EDGE__LISTEN`, all interfaces, say) is the one
        // waited for.
        let port = env
            .iter()
            .find(|(k, _)| *k == "EDGE__LISTEN")
            .and_then(|(_, v)| v.rsplit(':').next()?.parse().ok())
            .unwrap_or_else(free_port);
        let metrics_port = free_port();
        let dir = TempDir::new("edge");
        let config = json!({
            "listen": format!("127.0.0.1:{port}"),
            "metrics_listen": format!("127.0.0.1:{metrics_port}"),
            "upstreams": upstreams,
            "orders_token": ORDERS_TOKEN,
            "sold_out_ttl": format!("{}ms", sold_out_ttl.as_millis()),
            "max_body_bytes": 4096,
            "health_check_interval": "100ms",
            "upstream_connect_timeout": "300ms",
            "client_timeout": "1s",
            "redis_url": redis_url,
            "key_prefix": key_prefix,
            "threads": 2,
            // Off as for the test cores (`settings_for`): a slow shared machine must not
            // turn into 503 OVERLOADED. The tests of admission turn it on.
            "admission": { "enabled": false },
        });
        // JSON is YAML.
        let path = dir.0.join("edge.yaml");
        std::fs::write(&path, config.to_string()).expect("config written");
        let mut edge = Self {
            process: Process::default(),
            binary: binary.to_owned(),
            config: path,
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            port,
            api: ApiClient::new(format!("http://127.0.0.1:{port}")),
            metrics_base: format!("http://127.0.0.1:{metrics_port}"),
            log: dir.0.join("edge.log"),
            _dir: dir,
        };
        edge.restart().await;
        edge
    }

    /// Starts the process (again, after [`EdgeProcess::kill`]) with the same configuration.
    pub async fn restart(&mut self) {
        self.kill();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("edge log file");
        let child = Command::new(&self.binary)
            .env("EDGE_CONFIG", &self.config)
            .env("RUST_LOG", "warn,access=info")
            .env("EDGE__LOG_FORMAT", "json")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            // tracing writes to stdout; pingora's own messages go to stderr.
            .stdout(log.try_clone().expect("edge log file"))
            .stderr(log)
            .spawn()
            .expect("edge starts");
        // Owned at once, so that a failed start still kills and reaps the process.
        self.process.set(child);
        assert!(
            listening(self.port, Duration::from_secs(10)).await,
            "the edge did not listen within 10 s"
        );
        // Let the first health check mark the cores up.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    /// Kills the process at once (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// SIGTERM: what an orchestrator sends before it removes the edge.
    pub fn terminate(&self) {
        self.process.terminate();
    }

    /// Whether the process has exited (reaped if so).
    pub fn exited(&mut self) -> bool {
        self.process.exited()
    }

    pub async fn metrics_text(&self) -> String {
        metrics_text(&self.api.client, &self.metrics_base).await
    }

    pub async fn metrics(&self) -> Metrics {
        Metrics::parse(&self.metrics_text().await)
    }
}
