//! The core binary as a process of its own, for tests that kill, freeze or restart it, or
//! run it with a wrong clock (a core in-process, [`crate::helpers::TestApp`], cannot be).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use voucher_core::config::Settings;

use crate::helpers::{metrics_text, ApiClient, ADMIN_TOKEN, ORDERS_TOKEN};
use crate::metrics::Metrics;
use crate::process::{listening, Process};
use crate::{free_port, TempDir};

/// Debian's libfaketime (package `faketime`), to preload into a process whose wall clock
/// must be wrong: `FAKETIME=-60s` with `FAKETIME_DONT_FAKE_MONOTONIC=1` is a machine whose
/// clock is a minute behind (monotonic time stays real, as on such a machine).
pub const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

/// The wall clock a minute behind, monotonic time real.
pub const CLOCK_MINUTE_BEHIND: [(&str, &str); 3] = [
    ("LD_PRELOAD", LIBFAKETIME),
    ("FAKETIME", "-60s"),
    ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
];

/// The wall clock stepped back a minute 1 s after start (as a time daemon stepping a
/// wrong clock would), monotonic time real. For processes with Kafka clients: librdkafka's
/// start-up wait (`rd_kafka_init_wait`, a condition wait against the wall clock) hung now
/// and then (3 in 30 starts here) when the clock was wrong from the first instant.
pub const CLOCK_STEPPED_BACK: [(&str, &str); 4] = [
    ("LD_PRELOAD", LIBFAKETIME),
    ("FAKETIME", "-60s"),
    ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
    ("FAKETIME_START_AFTER_SECONDS", "1"),
];

/// The core binary as a process of its own (configured by environment variables alone, as a
/// container would be), with extra environment (e.g. libfaketime preloaded). Killed when
/// dropped; restarted on the same ports, so an edge in front finds it again.
pub struct CoreProcess {
    process: Process,
    binary: std::path::PathBuf,
    env: Vec<(String, String)>,
    port: u16,
    pub api: ApiClient,
    /// Where its metrics are served.
    pub metrics_base: String,
    /// Its log, to read when it misbehaves (appended to across restarts).
    pub log: std::path::PathBuf,
    _dir: TempDir,
}

impl CoreProcess {
    /// Starts `binary` with `settings` (its listeners on fresh ports) and `extra_env`.
    pub async fn start(binary: &Path, settings: &Settings, extra_env: &[(&str, &str)]) -> Self {
        let (port, metrics_port) = (free_port(), free_port());
        let mut env = core_env(settings);
        env.push(("VOUCHER__HTTP__LISTEN".into(), format!("127.0.0.1:{port}")));
        env.push((
            "VOUCHER__HTTP__METRICS_LISTEN".into(),
            format!("127.0.0.1:{metrics_port}"),
        ));
        env.extend(
            extra_env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        );
        let dir = TempDir::new("core");
        let mut core = Self {
            process: Process::default(),
            binary: binary.to_owned(),
            env,
            port,
            api: ApiClient::new(format!("http://127.0.0.1:{port}")),
            metrics_base: format!("http://127.0.0.1:{metrics_port}"),
            log: dir.0.join("core.log"),
            _dir: dir,
        };
        core.restart().await;
        core
    }

    /// `host:port` of its API.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Starts the process (again, after [`CoreProcess::kill`]) with the same settings and
    /// ports, and waits until it listens.
    pub async fn restart(&mut self) {
        self.restart_with(&[]).await;
    }

    /// Like [`CoreProcess::restart`], with `extra_env` for this run only (e.g. a clock
    /// made wrong with [`LIBFAKETIME`]).
    pub async fn restart_with(&mut self, extra_env: &[(&str, &str)]) {
        self.kill();
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("log file");
        let child = Command::new(&self.binary)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("RUST_LOG", "info")
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .envs(extra_env.iter().copied())
            .stdout(file.try_clone().expect("log file"))
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("{} starts: {e}", self.binary.display()));
        self.process.set(child);
        if !listening(self.port, Duration::from_secs(30)).await {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            panic!("the core process did not listen within 30 s; its log:\n{text}");
        }
    }

    /// Kills the process at once (SIGKILL), as a crash or an OOM kill would.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Freezes the process (SIGSTOP), as a long pause of its VM or container would.
    pub fn pause(&self) {
        self.process.pause();
    }

    /// Asks it to stop (SIGTERM).
    pub fn terminate(&self) {
        self.process.terminate();
    }

    /// Whether it has exited.
    pub fn exited(&mut self) -> bool {
        self.process.exited()
    }

    /// Lets a paused process go on (SIGCONT).
    pub fn unpause(&self) {
        self.process.unpause();
    }

    pub async fn metrics(&self) -> Metrics {
        Metrics::parse(&metrics_text(&self.api.client, &self.metrics_base).await)
    }
}

/// The environment that configures a core process like `settings` (listeners excepted).
fn core_env(settings: &Settings) -> Vec<(String, String)> {
    use secrecy::ExposeSecret;
    let ms = |d: Duration| format!("{}ms", d.as_millis());
    let mut env: Vec<(String, String)> = vec![
        (
            "DATABASE__URL".into(),
            settings.database.url.expose_secret().to_owned(),
        ),
        ("ADMIN__TOKEN".into(), ADMIN_TOKEN.into()),
        ("ADMIN__ORDERS_TOKEN".into(), ORDERS_TOKEN.into()),
        (
            "RESERVATIONS__EXPIRY_ENABLED".into(),
            settings.reservations.expiry_enabled.to_string(),
        ),
        (
            "FLASH__RECONCILE_ENABLED".into(),
            settings.flash.reconcile_enabled.to_string(),
        ),
        (
            "FLASH__RECONCILE_INTERVAL".into(),
            ms(settings.flash.reconcile_interval),
        ),
        (
            "FLASH__RECONCILE_GRACE".into(),
            ms(settings.flash.reconcile_grace),
        ),
        (
            "FLASH__DECISION".into(),
            settings.flash.decision.as_str().into(),
        ),
    ];
    if let Some(redis) = &settings.redis {
        env.push(("REDIS__URL".into(), redis.url.expose_secret().to_owned()));
        env.push(("REDIS__KEY_PREFIX".into(), redis.key_prefix.clone()));
        let topology = match redis.topology {
            voucher_core::flash::gate::Topology::Single => "single",
            voucher_core::flash::gate::Topology::Cluster => "cluster",
        };
        env.push(("REDIS__TOPOLOGY".into(), topology.into()));
        let files = [
            ("CA_FILE", &redis.tls.ca_file),
            ("CERT_FILE", &redis.tls.cert_file),
            ("KEY_FILE", &redis.tls.key_file),
        ];
        for (key, file) in files {
            if let Some(path) = file {
                env.push((format!("REDIS__TLS__{key}"), path.display().to_string()));
            }
        }
    }
    if let Some(kafka) = &settings.kafka {
        env.push(("KAFKA__BROKERS".into(), kafka.brokers.clone()));
        env.push(("KAFKA__TOPIC".into(), kafka.topic.clone()));
        env.push(("KAFKA__GROUP".into(), kafka.group.clone()));
        env.push(("KAFKA__PARTITIONS".into(), kafka.partitions.to_string()));
        if let Some(consume) = kafka.consume {
            env.push(("KAFKA__CONSUME".into(), consume.to_string()));
        }
        env.push(("KAFKA__MESSAGE_TIMEOUT".into(), ms(kafka.message_timeout)));
        env.push((
            "KAFKA__REPLICATION_FACTOR".into(),
            kafka.replication_factor.to_string(),
        ));
        env.push((
            "KAFKA__MIN_INSYNC_REPLICAS".into(),
            kafka.min_insync_replicas.to_string(),
        ));
        for (name, value) in kafka.properties.iter() {
            let key = name.replace('.', "_").to_ascii_uppercase();
            env.push((format!("KAFKA__PROPERTIES__{key}"), value.to_owned()));
        }
    }
    if let Some(endpoint) = &settings.tracing.otlp_endpoint {
        env.push(("TRACING__OTLP_ENDPOINT".into(), endpoint.clone()));
        env.push((
            "TRACING__EXPORT_INTERVAL".into(),
            ms(settings.tracing.export_interval),
        ));
    }
    env.into_iter()
        .map(|(k, v)| (format!("VOUCHER__{k}"), v))
        .collect()
}
