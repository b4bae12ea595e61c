//! The flash-mode stack for tests: a Kafka-protocol broker of the test's own (tansu, on a
//! free port, its data in a temporary SQLite file), the shared local Redis under a key
//! prefix of the test's own, and a topic and consumer group of the test's own.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use voucher_core::config::{FlashSettings, KafkaSettings, RedisSettings, Settings};
use voucher_core::events::progress::Progress;
use voucher_core::gate::Gate;
use voucher_core::invariants::{self, Accepted};

use crate::helpers::{settings_for, TestDb, TestEnv};

pub const REDIS_URL: &str = "redis://127.0.0.1:6379/";

/// A tansu broker owned by one test. Stopped (killed) when dropped.
pub struct Broker {
    pub port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

impl Broker {
    pub async fn start() -> Self {
        let dir = std::env::temp_dir().join(format!("vt-broker-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("broker dir");
        let mut broker = Self {
            port: free_port(),
            dir,
            child: None,
        };
        broker.resume().await;
        broker
    }

    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Starts the broker process (again, after `kill`) on the same port and data file.
    pub async fn resume(&mut self) {
        let url = format!("tcp://127.0.0.1:{}", self.port);
        let child = Command::new(std::env::var("TANSU").unwrap_or_else(|_| "tansu".into()))
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &url,
            ])
            .args(["--storage-engine", "sqlite://broker.db"])
            .current_dir(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("tansu must be installed (scripts/test.sh installs it)");
        self.child = Some(child);
        for _ in 0..200 {
            if tokio::net::TcpStream::connect(self.address()).await.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("tansu did not start on {}", self.address());
    }

    /// Kills the broker at once, as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Settings of one flash-mode test: its database, broker, Redis prefix, topic and group.
pub fn flash_settings(db_url: &str, broker: &Broker, tag: &str) -> Settings {
    let mut s = settings_for(db_url);
    s.redis = Some(RedisSettings {
        url: REDIS_URL.into(),
        key_prefix: format!("vt:{tag}:"),
        timeout_ms: 2000,
    });
    s.kafka = Some(KafkaSettings {
        brokers: broker.address(),
        topic: format!("events-{tag}"),
        dlq_topic: None,
        group: format!("writer-{tag}"),
        partitions: 3,
        message_timeout_ms: 2000,
        consume: true,
        batch_max: 500,
        batch_wait_ms: 20,
    });
    s.flash = FlashSettings {
        // Reconciliation is run by hand in tests that need it, at a known moment.
        reconcile_enabled: false,
        reconcile_interval_ms: 60_000,
        reconcile_grace_ms: 2500,
        row_wait_ms: 5000,
        catch_up_timeout_ms: 20_000,
    };
    s
}

/// A database, a broker and one app in flash mode; derefs to its [`TestEnv`].
pub struct FlashEnv {
    pub env: TestEnv,
    pub broker: Broker,
    pub settings: Settings,
    pub gate: Gate,
    pub progress: Progress,
}

impl std::ops::Deref for FlashEnv {
    type Target = TestEnv;

    fn deref(&self) -> &TestEnv {
        &self.env
    }
}

impl FlashEnv {
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    pub async fn start_with(tweak: impl FnOnce(&mut Settings)) -> Self {
        let db = TestDb::create().await;
        let broker = Broker::start().await;
        let tag = uuid::Uuid::new_v4().simple().to_string();
        let mut settings = flash_settings(&db.url, &broker, &tag);
        tweak(&mut settings);
        let env = TestEnv::start_on(db, &settings).await;
        let redis = settings.redis.clone().expect("flash settings");
        let gate = Gate::connect(&redis.url, &redis.key_prefix, Duration::from_secs(2))
            .await
            .expect("redis");
        let progress =
            Progress::new(settings.kafka.as_ref().expect("flash settings")).expect("progress");
        Self {
            env,
            broker,
            settings,
            gate,
            progress,
        }
    }

    pub fn kafka(&self) -> &KafkaSettings {
        self.settings.kafka.as_ref().expect("flash settings")
    }

    /// Waits until the consumer group has written everything published so far.
    pub async fn caught_up(&self) {
        let ok = self
            .progress
            .wait_caught_up(Duration::from_secs(60))
            .await
            .expect("progress readable");
        assert!(ok, "the consumer did not catch up within 60 s");
    }

    /// Waits for the consumer, checks invariants 1 to 5, cleans up.
    pub async fn finish(self, accepted: &[Accepted]) {
        self.caught_up().await;
        let report = invariants::check_with_gate(&self.pool, &self.gate, accepted)
            .await
            .expect("invariant queries run");
        self.env.assert_and_tear_down(report).await;
        let prefix = self
            .settings
            .redis
            .as_ref()
            .map(|r| r.key_prefix.clone())
            .unwrap_or_default();
        delete_keys(&prefix).await;
    }
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
