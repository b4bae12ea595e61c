//! The stack a campaign runs against, as `scripts/up.sh` lays it out (tansu, two cores, the
//! edge in front, PostgreSQL and Redis), but every piece its own: a PostgreSQL server, a
//! tansu broker and a Redis server on free ports, so that faults can restart them without touching
//! anything else on the machine, and so that tests can run a slice of the campaign in
//! parallel with the rest.

use std::path::PathBuf;
use std::time::Duration;

use sqlx::PgPool;
use voucher_core::config::{Decision, RedisSettings, Settings};
use voucher_core::flash::events::progress::Progress;
use voucher_core::flash::gate::Gate;
use voucher_core::store::Store;
use voucher_testkit::helpers::{ApiClient, TestDb};
use voucher_testkit::postgres::PostgresServer;
use voucher_testkit::stack::{flash_settings, Broker, CoreProcess, EdgeProcess, RedisServer};

/// The binaries under test.
#[derive(Debug, Clone)]
pub struct Binaries {
    pub core: PathBuf,
    pub edge: PathBuf,
}

impl Binaries {
    /// `voucher-core` and `voucher-edge` in `dir` (a cargo profile directory).
    pub fn in_dir(dir: impl Into<PathBuf>) -> anyhow::Result<Self> {
        let dir = dir.into();
        let this = Self {
            core: dir.join("voucher-core"),
            edge: dir.join("voucher-edge"),
        };
        for binary in [&this.core, &this.edge] {
            anyhow::ensure!(
                binary.exists(),
                "{} not found: build voucher-core and voucher-edge first",
                binary.display()
            );
        }
        Ok(this)
    }
}

/// How fast the stack gives back what a fault left held: what an operator sets for a sale.
/// Reconciliation every second, and a pending use given back once it is older than the grace.
pub const RECONCILE_INTERVAL: Duration = Duration::from_secs(1);
pub const RECONCILE_GRACE: Duration = Duration::from_secs(3);

pub struct CampaignStack {
    /// A PostgreSQL server of the campaign's own, so that it can crash and restart.
    pub postgres: PostgresServer,
    pub db: TestDb,
    pub pool: PgPool,
    pub broker: Broker,
    pub redis: RedisServer,
    pub settings: Settings,
    pub cores: Vec<CoreProcess>,
    pub edge: EdgeProcess,
    /// The gate as the cores see it.
    pub gate: Gate,
    pub progress: Progress,
}

impl CampaignStack {
    pub async fn start(
        binaries: &Binaries,
        cores: usize,
        decision: Decision,
    ) -> anyhow::Result<Self> {
        let postgres = PostgresServer::start().await?;
        let db = TestDb::create_on(&postgres.url()).await;
        let broker = Broker::start().await;
        let redis = RedisServer::start().await;
        let tag = uuid::Uuid::new_v4().simple().to_string();
        let mut settings = flash_settings(&db.url, &broker, &tag);
        let redis_settings = RedisSettings {
            url: redis.url().into(),
            key_prefix: "vg:".into(),
            timeout: Duration::from_secs(1),
            ..RedisSettings::default()
        };
        settings.redis = Some(redis_settings.clone());
        settings.flash.reconcile_enabled = true;
        settings.flash.reconcile_interval = RECONCILE_INTERVAL;
        settings.flash.reconcile_grace = RECONCILE_GRACE;
        settings.reservations.expiry_enabled = true;
        settings.flash.decision = decision;
        let mut processes = Vec::with_capacity(cores);
        for _ in 0..cores.max(1) {
            processes.push(CoreProcess::start(&binaries.core, &settings, &[]).await);
        }
        let upstreams: Vec<String> = processes.iter().map(CoreProcess::address).collect();
        let upstreams: Vec<&str> = upstreams.iter().map(String::as_str).collect();
        let edge = EdgeProcess::start_on(
            &binaries.edge,
            &upstreams,
            &redis.url(),
            &redis_settings.key_prefix,
            Duration::from_secs(2),
        )
        .await;
        let pool = PgPool::connect(&db.url).await?;
        let gate = Gate::connect(&redis_settings).await?;
        let kafka = settings
            .kafka
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("flash settings have kafka"))?;
        let progress = Progress::new(kafka, Store::new(pool.clone()))?;
        Ok(Self {
            postgres,
            db,
            pool,
            broker,
            redis,
            settings,
            cores: processes,
            edge,
            gate,
            progress,
        })
    }

    /// Where admin calls go: the first core (the edge refuses them).
    pub fn admin(&self) -> &ApiClient {
        &self.cores[0].api
    }

    /// A client of the edge for one round's customers.
    pub fn public(&self) -> ApiClient {
        ApiClient::new(self.edge.api.base.clone())
    }

    /// Stops every process and drops the database.
    pub async fn tear_down(self) {
        drop(self.edge);
        drop(self.cores);
        self.pool.close().await;
        self.db.drop_db().await;
        drop(self.postgres);
    }
}
