//! The flash-mode stack for tests, the one every flash and edge test runs on: a
//! Kafka-protocol broker of the test's own (tansu, on a free port, its data in a temporary
//! SQLite file), the shared local Redis under a key prefix of the test's own, a topic and a
//! consumer group of the test's own, one or more cores, and optionally the real edge binary
//! in front of them.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::json;
use sqlx::PgPool;
use voucher_contract::redis_tls::RedisTls;
use voucher_core::config::{KafkaSettings, RedisSettings, Settings};
use voucher_core::flash::events::progress::Progress;
use voucher_core::flash::gate::Gate;

use crate::helpers::{
    metrics_text, settings_for, ApiClient, TestApp, TestDb, ADMIN_TOKEN, ORDERS_TOKEN,
};
use crate::invariants::{self, Accepted};
use crate::metrics::Metrics;
use crate::process::{listening, Process};
use crate::tls::{Certificates, TlsFront};
use crate::wait::eventually;
use crate::{free_port, TempDir};

pub const REDIS_URL: &str = "redis://127.0.0.1:6379/";

/// A tansu broker owned by one test. Stopped (killed) when dropped.
pub struct Broker {
    // First, so it is dropped (killed) before its directory is removed.
    process: Process,
    pub port: u16,
    dir: TempDir,
    /// A secured broker: clients reach it through this TLS front and log in with SCRAM.
    front: Option<TlsFront>,
}

/// The broker program (`TANSU`, or `tansu` on the PATH).
fn tansu() -> Command {
    Command::new(std::env::var("TANSU").unwrap_or_else(|_| "tansu".into()))
}

impl Broker {
    pub async fn start() -> Self {
        let mut broker = Self {
            port: free_port(),
            dir: TempDir::new("broker"),
            process: Process::default(),
            front: None,
        };
        broker.resume().await;
        broker
    }

    /// A broker as a managed Kafka with `SASL_SSL` is: TLS with client certificates (a
    /// [`TlsFront`] of `certs`, which the broker advertises) and SASL SCRAM-SHA-512 login
    /// (tansu's `--authentication`) with `user` and `password`, made before
    /// authentication is turned on (tansu creates users through its own API).
    pub async fn start_secured(certs: &Certificates, user: &str, password: &str) -> Self {
        let mut broker = Self::start().await;
        let output = tansu()
            .args([
                "user",
                "create",
                "--broker",
                &format!("tcp://{}", broker.address()),
            ])
            .args(["--mechanism", "scram512", user, password])
            .output()
            .expect("tansu user create");
        assert!(
            output.status.success(),
            "tansu user create: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        broker.kill();
        broker.front = Some(
            TlsFront::start(certs, broker.port)
                .await
                .expect("a TLS front for the broker"),
        );
        broker.resume().await;
        broker
    }

    /// What clients connect to: the TLS front of a secured broker, else the broker.
    pub fn address(&self) -> String {
        let port = self.front.as_ref().map_or(self.port, |f| f.port);
        format!("127.0.0.1:{port}")
    }

    /// Starts the broker process (again, after `kill`) on the same port and data file.
    pub async fn resume(&mut self) {
        let url = format!("tcp://127.0.0.1:{}", self.port);
        let advertised = format!("tcp://{}", self.address());
        let child = tansu()
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &advertised,
            ])
            .args(self.front.as_ref().map(|_| "--authentication"))
            .args(["--storage-engine", "sqlite://broker.db"])
            .current_dir(&self.dir.0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("tansu must be installed (scripts/test.sh installs it)");
        self.process.set(child);
        assert!(
            listening(self.port, Duration::from_secs(10)).await,
            "tansu did not listen within 10 s"
        );
    }

    /// Freezes the broker (SIGSTOP): connections stay open and nothing answers, as in a
    /// long garbage-collection pause or a stalled disk.
    pub fn pause(&self) {
        self.process.pause();
    }

    /// Lets a paused broker go on (SIGCONT).
    pub fn unpause(&self) {
        self.process.unpause();
    }

    /// Kills the broker at once, as a crash would.
    pub fn kill(&mut self) {
        self.process.kill();
    }
}

/// Settings of one flash-mode test: its database, broker, Redis prefix, topic and group.
pub fn flash_settings(db_url: &str, broker: &Broker, tag: &str) -> Settings {
    let mut s = settings_for(db_url);
    s.redis = Some(RedisSettings {
        url: REDIS_URL.into(),
        key_prefix: format!("vt:{tag}:"),
        timeout: Duration::from_secs(2),
        ..RedisSettings::default()
    });
    s.kafka = Some(KafkaSettings {
        brokers: broker.address(),
        topic: format!("events-{tag}"),
        group: format!("writer-{tag}"),
        message_timeout: Duration::from_secs(2),
        // One tansu: one copy is all there is.
        replication_factor: 1,
        min_insync_replicas: 1,
        ..KafkaSettings::default()
    });
    // Reconciliation is run by hand in tests that need it, at a known moment.
    s.flash.reconcile_enabled = false;
    s.flash.reconcile_interval = Duration::from_secs(60);
    s.flash.reconcile_grace = Duration::from_millis(2500);
    s.flash.row_wait = Duration::from_secs(5);
    s.flash.catch_up_timeout = Duration::from_secs(20);
    s
}

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
        let (port, metrics_port) = (free_port(), free_port());
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

    pub async fn metrics_text(&self) -> String {
        metrics_text(&self.api.client, &self.metrics_base).await
    }

    pub async fn metrics(&self) -> Metrics {
        Metrics::parse(&self.metrics_text().await)
    }
}

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
        env.push(("KAFKA__CONSUME".into(), kafka.consume.to_string()));
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
    env.into_iter()
        .map(|(k, v)| (format!("VOUCHER__{k}"), v))
        .collect()
}

/// A Redis server of its own (on a free port, its snapshot in a temporary directory), for
/// faults the shared Redis must not suffer: restarts, snapshots restored, FLUSHALL.
pub struct RedisServer {
    // First, so it is dropped (killed) before its directory is removed.
    process: Process,
    pub port: u16,
    dir: TempDir,
    /// With TLS: the client's certificates, and the server's for its command line.
    tls: Option<(RedisTls, Vec<String>)>,
}

impl RedisServer {
    pub async fn start() -> Self {
        let mut server = Self {
            port: free_port(),
            dir: TempDir::new("redis"),
            process: Process::default(),
            tls: None,
        };
        server.restart().await;
        server
    }

    /// A server that speaks TLS only (`--port 0 --tls-port`) and wants a client certificate
    /// of `certs`' authority (`--tls-auth-clients yes`).
    pub async fn start_tls(certs: &Certificates) -> Self {
        let path = |p: std::path::PathBuf| p.display().to_string();
        let server_args = vec![
            "--tls-cert-file".into(),
            path(certs.server_cert()),
            "--tls-key-file".into(),
            path(certs.server_key()),
            "--tls-ca-cert-file".into(),
            path(certs.ca()),
            "--tls-auth-clients".into(),
            "yes".into(),
        ];
        let client = RedisTls {
            ca_file: Some(certs.ca()),
            cert_file: Some(certs.client_cert()),
            key_file: Some(certs.client_key()),
        };
        let mut server = Self {
            port: free_port(),
            dir: TempDir::new("redis"),
            process: Process::default(),
            tls: Some((client, server_args)),
        };
        server.restart().await;
        server
    }

    /// `rediss://` with TLS.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}/", self.port)
    }

    /// The client certificates this server wants (none without TLS).
    pub fn client_tls(&self) -> RedisTls {
        self.tls
            .as_ref()
            .map(|(c, _)| c.clone())
            .unwrap_or_default()
    }

    fn client(&self) -> anyhow::Result<redis::Client> {
        voucher_contract::redis_tls::redis_client(&self.url(), &self.client_tls())
    }

    /// Starts the server (again), loading `dump.rdb` if a snapshot was taken. Nothing is
    /// saved on its own: only [`RedisServer::snapshot`] writes one.
    pub async fn restart(&mut self) {
        self.kill();
        let port = self.port.to_string();
        let listen: Vec<&str> = match &self.tls {
            Some((_, server_args)) => ["--port", "0", "--tls-port", &port]
                .into_iter()
                .chain(server_args.iter().map(String::as_str))
                .collect(),
            None => vec!["--port", &port],
        };
        let child = Command::new("redis-server")
            .args(listen)
            .args(["--bind", "127.0.0.1"])
            .args([
                "--save",
                "",
                "--appendonly",
                "no",
                "--dbfilename",
                "dump.rdb",
            ])
            .arg("--dir")
            .arg(&self.dir.0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is installed");
        self.process.set(child);
        let client = self.client().expect("a client of the test's Redis");
        eventually(Duration::from_secs(10), "redis-server to answer", || {
            let client = client.clone();
            async move {
                let mut conn = client.get_multiplexed_async_connection().await.ok()?;
                redis::cmd("PING")
                    .query_async::<String>(&mut conn)
                    .await
                    .ok()
            }
        })
        .await;
    }

    /// Writes a snapshot now (SAVE): what a restart loads until the next one.
    pub async fn snapshot(&self) -> anyhow::Result<()> {
        let mut conn = self.client()?.get_multiplexed_async_connection().await?;
        redis::cmd("SAVE").query_async::<()>(&mut conn).await?;
        Ok(())
    }

    /// Deletes the snapshot, so the next restart starts empty.
    pub fn forget_snapshot(&self) {
        let _ = std::fs::remove_file(self.dir.0.join("dump.rdb"));
    }

    /// Kills the server at once (SIGKILL): whatever it held in memory is gone.
    pub fn kill(&mut self) {
        self.process.kill();
    }
}

/// How to build a [`FlashStack`].
pub struct FlashStackBuilder {
    cores: usize,
    edge: Option<(std::path::PathBuf, Duration)>,
    edge_env: Vec<(&'static str, &'static str)>,
}

impl FlashStackBuilder {
    /// An `EDGE__*` variable for the edge (its rate limits, say).
    pub fn edge_env(mut self, key: &'static str, value: &'static str) -> Self {
        self.edge_env.push((key, value));
        self
    }

    /// How many cores (default one).
    pub fn cores(mut self, n: usize) -> Self {
        self.cores = n.max(1);
        self
    }

    /// Puts the edge `binary` in front of the cores, with flags that live `sold_out_ttl`.
    pub fn edge(mut self, binary: impl AsRef<Path>, sold_out_ttl: Duration) -> Self {
        self.edge = Some((binary.as_ref().to_owned(), sold_out_ttl));
        self
    }

    pub async fn start(self) -> FlashStack {
        self.start_with(|_| {}).await
    }

    /// Starts the stack with the cores' settings changed by `tweak`.
    pub async fn start_with(self, tweak: impl FnOnce(&mut Settings)) -> FlashStack {
        let db = TestDb::create().await;
        let broker = Broker::start().await;
        let tag = uuid::Uuid::new_v4().simple().to_string();
        let mut settings = flash_settings(&db.url, &broker, &tag);
        tweak(&mut settings);
        let mut cores = Vec::with_capacity(self.cores);
        for _ in 0..self.cores {
            cores.push(TestApp::start(&settings).await);
        }
        let redis = settings.redis.clone().expect("flash settings have redis");
        let edge = match self.edge {
            Some((binary, ttl)) => {
                let addrs: Vec<&str> = cores.iter().map(|c| c.address()).collect();
                Some(
                    EdgeProcess::start_with_env(
                        &binary,
                        &addrs,
                        REDIS_URL,
                        &redis.key_prefix,
                        ttl,
                        &self.edge_env,
                    )
                    .await,
                )
            }
            None => None,
        };
        FlashStack::assemble(db, broker, settings, cores, edge).await
    }
}

/// A database, a broker, Redis keys and topics of the test's own, the cores, maybe an edge.
pub struct FlashStack {
    pub db: TestDb,
    pub pool: PgPool,
    pub broker: Broker,
    pub settings: Settings,
    pub cores: Vec<TestApp>,
    pub edge: Option<EdgeProcess>,
    /// The gate as the cores see it, for tests that inspect or damage it.
    pub gate: Gate,
    pub progress: Progress,
}

impl FlashStack {
    /// A stack of parts started elsewhere (a test with dependencies of its own), with the
    /// test's own views of them: a pool, the gate as the cores see it, the writers' progress.
    pub async fn assemble(
        db: TestDb,
        broker: Broker,
        settings: Settings,
        cores: Vec<TestApp>,
        edge: Option<EdgeProcess>,
    ) -> Self {
        let pool = PgPool::connect(&db.url).await.expect("test pool");
        let redis = settings.redis.as_ref().expect("flash settings have redis");
        let gate = Gate::connect(redis).await.expect("redis");
        let progress = Progress::new(
            settings.kafka.as_ref().expect("flash settings have kafka"),
            voucher_core::store::Store::new(pool.clone()),
        )
        .expect("progress");
        FlashStack {
            db,
            pool,
            broker,
            settings,
            cores,
            edge,
            gate,
            progress,
        }
    }

    pub fn builder() -> FlashStackBuilder {
        FlashStackBuilder {
            cores: 1,
            edge: None,
            edge_env: Vec::new(),
        }
    }

    /// One core, no edge.
    pub async fn start() -> Self {
        Self::builder().start().await
    }

    /// The first core.
    pub fn app(&self) -> &TestApp {
        &self.cores[0]
    }

    /// The edge; panics when the stack was built without one.
    pub fn edge(&self) -> &EdgeProcess {
        self.edge.as_ref().expect("a stack with an edge")
    }

    pub fn kafka(&self) -> &KafkaSettings {
        self.settings.kafka.as_ref().expect("flash settings")
    }

    pub fn key_prefix(&self) -> &str {
        self.settings
            .redis
            .as_ref()
            .map_or("", |r| r.key_prefix.as_str())
    }

    /// Waits until the consumer group has written everything published so far (a group
    /// that just formed may take seconds to get its partitions).
    pub async fn caught_up(&self) {
        let ok = self
            .progress
            .wait_caught_up(Duration::from_secs(60))
            .await
            .expect("progress readable");
        assert!(ok, "the consumer did not catch up within 60 s");
    }

    /// Rows the database holds for `code`, whatever their status.
    pub async fn rows(&self, code: &str) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM redemptions WHERE voucher_code = $1")
            .bind(code)
            .fetch_one(&self.pool)
            .await
            .expect("count")
    }

    /// Waits for the consumer, checks invariants 1 to 5 (retrying for a while: the last
    /// batch or give-back may still be on its way), then stops everything and cleans up.
    pub async fn finish(self, accepted: &[Accepted]) {
        self.caught_up().await;
        let settled = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                let report = invariants::check_with_gate(&self.pool, &self.gate, accepted)
                    .await
                    .expect("invariant queries run");
                if report.holds() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await;
        if settled.is_err() {
            let report = invariants::check_with_gate(&self.pool, &self.gate, accepted)
                .await
                .expect("invariant queries run");
            panic!("invariants violated: {:#?}", report.violations);
        }
        self.tear_down().await;
    }

    /// Stops the edge and the cores, drops the database and the Redis keys.
    pub async fn tear_down(self) {
        let prefix = self.key_prefix().to_owned();
        drop(self.edge);
        for core in self.cores {
            core.stop().await;
        }
        self.pool.close().await;
        self.db.drop_db().await;
        delete_keys(&prefix).await;
    }
}

/// A connection to the tests' Redis, for tests that inspect or damage the gate by hand.
pub async fn redis_connection() -> redis::aio::MultiplexedConnection {
    redis::Client::open(REDIS_URL)
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .expect("redis reachable")
}

/// Deletes every Redis key under `prefix` (each test's own).
pub async fn delete_keys(prefix: &str) {
    let Ok(client) = redis::Client::open(REDIS_URL) else {
        return;
    };
    let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
        return;
    };
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut conn)
        .await
        .unwrap_or_default();
    if !keys.is_empty() {
        let _: redis::RedisResult<()> = redis::cmd("DEL").arg(keys).query_async(&mut conn).await;
    }
}

/// A flash voucher body valid now.
pub fn flash_voucher(code: &str, total_limit: i64, per_user_limit: i64) -> serde_json::Value {
    let mut body = crate::helpers::voucher_body(code, total_limit, per_user_limit);
    body["mode"] = serde_json::json!("flash");
    body
}
