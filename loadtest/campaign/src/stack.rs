//! The stack a campaign runs against, as `scripts/up.sh` lays it out (tansu, two cores, the
//! edge in front, PostgreSQL and Redis), but every piece its own: a PostgreSQL primary with a
//! streaming standby, a tansu broker and a Redis server on free ports, so that faults can
//! restart them without touching anything else on the machine, and so that tests can run a
//! slice of the campaign in parallel with the rest. The cores are given both PostgreSQL
//! servers in one URL and follow the primary, as production's cores do. The scaled layout
//! ([`Layout::Scaled`]) is `scripts/up-scaled.sh`'s: a Redis Cluster of three masters with a
//! replica each instead of one Redis, three cores, two edges, and six event partitions.

use std::path::PathBuf;
use std::time::Duration;

use sqlx::PgPool;
use voucher_core::config::{RedisSettings, Settings};
use voucher_core::flash::events::progress::Progress;
use voucher_core::flash::gate::Gate;
use voucher_core::flash::gate::Topology;
use voucher_core::store::Store;
use voucher_testkit::helpers::database_url;
use voucher_testkit::helpers::{ApiClient, TestDb};
use voucher_testkit::link::Link;
use voucher_testkit::postgres::{multi_host_url, PostgresServer, Replication};
use voucher_testkit::stack::{
    flash_settings, Broker, CoreProcess, EdgeProcess, RedisCluster, RedisServer,
};

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

/// How the campaign's stack is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// `scripts/up.sh`'s: one Redis, two cores, one edge, three event partitions.
    Single,
    /// `scripts/up-scaled.sh`'s: a Redis Cluster (three masters, a replica each), three
    /// cores, two edges, six event partitions.
    Scaled,
}

impl Layout {
    pub fn name(self) -> &'static str {
        match self {
            Layout::Single => "single",
            Layout::Scaled => "scaled",
        }
    }
}

/// The gate's Redis: one server, or a cluster.
pub enum Redis {
    Single(RedisServer),
    Cluster(RedisCluster),
}

pub struct CampaignStack {
    pub layout: Layout,
    /// The PostgreSQL primary of the campaign's own, so that it can crash, restart or be
    /// lost.
    pub postgres: PostgresServer,
    /// Its standby, streaming (synchronously or not, as the campaign was asked).
    pub standby: PostgresServer,
    pub replication: Replication,
    /// The link the standby streams over when it is far from its primary
    /// (`Setup::link_delay` above zero); the primary's loss cuts it.
    pub link: Option<Link>,
    pub db: TestDb,
    pub pool: PgPool,
    pub broker: Broker,
    pub redis: Redis,
    pub settings: Settings,
    pub cores: Vec<CoreProcess>,
    /// The edges; customers are spread over them.
    pub edges: Vec<EdgeProcess>,
    /// The gate as the cores see it.
    pub gate: Gate,
    pub progress: Progress,
}

impl CampaignStack {
    /// Which of `cores` the edges send `code`'s reservations to while every core is ready.
    pub fn voucher_core(&self, code: &str) -> Option<usize> {
        let addresses: Vec<String> = self.cores.iter().map(CoreProcess::address).collect();
        let core = voucher_edge::routing::voucher_core(&addresses, code)?;
        addresses.iter().position(|a| *a == core)
    }

    pub async fn start(binaries: &Binaries, setup: crate::Setup) -> anyhow::Result<Self> {
        let crate::Setup {
            layout,
            decision,
            replication,
            link_delay,
        } = setup;
        let (cores, edges, partitions) = match layout {
            Layout::Single => (2, 1, 3),
            Layout::Scaled => (3, 2, 6),
        };
        let postgres = PostgresServer::start_primary(replication).await?;
        let (standby, link) =
            far_standby(&postgres, voucher_testkit::free_port(), link_delay).await?;
        let db = TestDb::create_on(&postgres.url()).await;
        let broker = Broker::start().await;
        let (redis, redis_url, topology) = match layout {
            Layout::Single => {
                let server = RedisServer::start().await;
                let url = server.url();
                (Redis::Single(server), url, Topology::Single)
            }
            Layout::Scaled => {
                let cluster = RedisCluster::start().await;
                let url = cluster.url();
                (Redis::Cluster(cluster), url, Topology::Cluster)
            }
        };
        let tag = uuid::Uuid::new_v4().simple().to_string();
        let mut settings = flash_settings(
            &multi_host_url(&[postgres.port, standby.port], &db.name),
            &broker,
            &tag,
        );
        let redis_settings = RedisSettings {
            url: redis_url.clone().into(),
            topology,
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
        if let Some(kafka) = settings.kafka.as_mut() {
            kafka.partitions = partitions;
        }
        let mut processes = Vec::with_capacity(cores);
        for _ in 0..cores {
            processes.push(CoreProcess::start(&binaries.core, &settings, &[]).await);
        }
        let upstreams: Vec<String> = processes.iter().map(CoreProcess::address).collect();
        let upstreams: Vec<&str> = upstreams.iter().map(String::as_str).collect();
        let mut started = Vec::with_capacity(edges);
        for _ in 0..edges {
            started.push(
                EdgeProcess::start_on(
                    &binaries.edge,
                    &upstreams,
                    &redis_url,
                    &redis_settings.key_prefix,
                    Duration::from_secs(2),
                )
                .await,
            );
        }
        let pool = PgPool::connect(&db.url).await?;
        let gate = Gate::connect(&redis_settings).await?;
        let kafka = settings
            .kafka
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("flash settings have kafka"))?;
        let progress = Progress::new(kafka, Store::new(pool.clone()))?;
        Ok(Self {
            layout,
            postgres,
            standby,
            replication,
            link,
            db,
            pool,
            broker,
            redis,
            settings,
            cores: processes,
            edges: started,
            gate,
            progress,
        })
    }

    /// After the primary was lost and its standby promoted: a new standby of the promoted
    /// server on the lost one's port (so the cores' URL names both again), and the
    /// campaign's own views of the database moved to the new primary.
    pub async fn replace_lost_primary(&mut self) -> anyhow::Result<()> {
        let port = self.postgres.port;
        let delay = self.link.as_ref().map_or(Duration::ZERO, |l| l.delay);
        let (standby, link) = far_standby(&self.standby, port, delay).await?;
        self.link = link;
        self.postgres = std::mem::replace(&mut self.standby, standby);
        self.db.moved_to(&self.postgres.url());
        self.pool.close().await;
        self.pool = PgPool::connect(&database_url(&self.postgres.url(), &self.db.name)).await?;
        let kafka = self
            .settings
            .kafka
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("flash settings have kafka"))?;
        self.progress = Progress::new(kafka, Store::new(self.pool.clone()))?;
        Ok(())
    }

    /// Where admin calls go: the first core (the edge refuses them).
    pub fn admin(&self) -> &ApiClient {
        &self.cores[0].api
    }

    /// A client of the first edge (a late customer, the replays, the buyers of what is left).
    pub fn public(&self) -> ApiClient {
        ApiClient::new(self.edges[0].api.base.clone())
    }

    /// A client of each edge, for the round's customers to spread over.
    pub fn publics(&self) -> Vec<ApiClient> {
        self.edges
            .iter()
            .map(|e| ApiClient::new(e.api.base.clone()))
            .collect()
    }

    /// The single Redis server, for the faults that restart, stall or flush it; an error
    /// on a cluster (those faults are not drawn there).
    pub fn redis(&mut self) -> anyhow::Result<&mut RedisServer> {
        match &mut self.redis {
            Redis::Single(server) => Ok(server),
            Redis::Cluster(_) => anyhow::bail!("this fault needs the single Redis layout"),
        }
    }

    /// The Redis Cluster, for the faults of its nodes; an error on one server.
    pub fn cluster(&mut self) -> anyhow::Result<&mut RedisCluster> {
        match &mut self.redis {
            Redis::Cluster(cluster) => Ok(cluster),
            Redis::Single(_) => anyhow::bail!("this fault needs the scaled layout's cluster"),
        }
    }

    /// Stops every process and drops the database.
    pub async fn tear_down(self) {
        drop(self.edges);
        drop(self.cores);
        self.pool.close().await;
        self.db.drop_db().await;
        drop(self.postgres);
        drop(self.standby);
    }
}

/// A standby of `primary` on `port`, streaming over a [`Link`] of `delay` when `delay` is
/// above zero, from `primary`'s own port otherwise.
async fn far_standby(
    primary: &PostgresServer,
    port: u16,
    delay: Duration,
) -> anyhow::Result<(PostgresServer, Option<Link>)> {
    if delay.is_zero() {
        return Ok((PostgresServer::start_standby_on(primary, port).await?, None));
    }
    let link = Link::start(primary.port, delay).await?;
    let standby = PostgresServer::start_standby_through(primary, port, link.port).await?;
    Ok((standby, Some(link)))
}
