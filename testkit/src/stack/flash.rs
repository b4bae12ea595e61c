//! The pieces assembled: one way to start a flash stack (database, broker, Redis prefix,
//! cores, maybe an edge), its settings, and the checks and clean-up every flash test ends with.

use std::path::Path;
use std::time::Duration;

use sqlx::PgPool;
use voucher_core::config::{Decision, KafkaSettings, RedisSettings, Settings};
use voucher_core::flash::events::progress::Progress;
use voucher_core::flash::gate::Gate;

use super::{delete_keys, Broker, EdgeProcess, REDIS_URL};
use crate::helpers::{settings_for, TestApp, TestDb};
use crate::invariants::{self, Accepted};

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

/// How to build a [`FlashStack`].
pub struct FlashStackBuilder {
    cores: usize,
    edge: Option<(std::path::PathBuf, Duration)>,
    edge_env: Vec<(&'static str, &'static str)>,
    database: Option<(String, CoreUrl)>,
}

/// The URL the cores are given for the test's database, from its name.
type CoreUrl = Box<dyn Fn(&str) -> String + Send>;

impl FlashStackBuilder {
    /// The test's database on `server` (`postgres://user@host:port`) instead of the shared
    /// one, and the URL the cores reach it by, from its name: several servers' hosts, say,
    /// when `server` is a primary with standbys.
    pub fn database_on(
        mut self,
        server: String,
        core_url: impl Fn(&str) -> String + Send + 'static,
    ) -> Self {
        self.database = Some((server, Box::new(core_url)));
        self
    }
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
        let (db, core_url) = match self.database {
            Some((server, core_url)) => {
                let db = TestDb::create_on(&server).await;
                let url = core_url(&db.name);
                (db, url)
            }
            None => {
                let db = TestDb::create().await;
                let url = db.url.clone();
                (db, url)
            }
        };
        let broker = Broker::start().await;
        let tag = uuid::Uuid::new_v4().simple().to_string();
        let mut settings = flash_settings(&core_url, &broker, &tag);
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
                        // The cores' own Redis (or cluster nodes), as an operator sets both.
                        secrecy::ExposeSecret::expose_secret(&redis.url),
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
            database: None,
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
    /// that just formed may take seconds to get its partitions). With PostgreSQL deciding
    /// and no writers configured there is nothing to wait for: every 201's row was
    /// committed before it.
    pub async fn caught_up(&self) {
        let writers =
            self.settings.kafka.as_ref().is_some_and(|k| {
                voucher_core::flash::runs_writers(k, self.settings.flash.decision)
            });
        if !writers && self.settings.flash.decision == Decision::Database {
            return;
        }
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

/// A flash voucher body valid now.
pub fn flash_voucher(code: &str, total_limit: i64, per_user_limit: i64) -> serde_json::Value {
    let mut body = crate::helpers::voucher_body(code, total_limit, per_user_limit);
    body["mode"] = serde_json::json!("flash");
    body
}
