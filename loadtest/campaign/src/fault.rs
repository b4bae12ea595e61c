//! The faults a round can suffer, one per round, each struck at a moment of the sale and
//! healed a while later, the way an operator's worst day brings them.

use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Message, Offset, TopicPartitionList};
use sqlx::{Connection, PgConnection};

use voucher_testkit::stack::CLOCK_STEPPED_BACK;

use crate::rng::Rng;
use crate::stack::CampaignStack;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Fault {
    /// Nothing: the control, what a round looks like with no fault (uses released late in
    /// the sale stay unsold without any fault, for one).
    None,
    /// `kill -9` one core; it restarts when healed.
    KillCore,
    /// `kill -9` both cores at once.
    KillBothCores,
    /// `kill -9` the edge.
    KillEdge,
    /// SIGSTOP one core (a paused VM): its writers, publishes and answers all freeze.
    PauseCore,
    /// SIGSTOP the broker: connections open, nothing answered.
    PauseBroker,
    /// `kill -9` the broker; restarted on the same data when healed.
    KillBroker,
    /// FLUSHALL on the gate's Redis.
    RedisFlushAll,
    /// Redis killed and restarted with nothing.
    RedisRestartEmpty,
    /// A snapshot taken when struck, Redis killed when healed and restarted from it: the
    /// gate goes back in time by the fault's length, as after a restart from an older
    /// RDB or the promotion of a lagging replica.
    RedisOldSnapshot,
    /// The database refuses connections and its sessions are terminated (a failover's
    /// first seconds, or an operator closing it).
    DatabaseOutage,
    /// The PostgreSQL server crashes (an immediate stop: sessions cut, no checkpoint) and
    /// restarts when healed, replaying its write-ahead log: every committed row must be
    /// there after it, and nothing the cores were doing may be left half done.
    DatabaseRestart,
    /// Every event of the round published so far is published again, and again after the
    /// sale (duplicated, and delayed past releases).
    DuplicateEvents,
    /// One core restarted under libfaketime: its wall clock steps back a minute 1 s later
    /// and stays behind for the rest of the sale; set right after the round.
    ClockBehind,
}

impl Fault {
    pub const ALL: [Fault; 14] = [
        Fault::None,
        Fault::KillCore,
        Fault::KillBothCores,
        Fault::KillEdge,
        Fault::PauseCore,
        Fault::PauseBroker,
        Fault::KillBroker,
        Fault::RedisFlushAll,
        Fault::RedisRestartEmpty,
        Fault::RedisOldSnapshot,
        Fault::DatabaseOutage,
        Fault::DatabaseRestart,
        Fault::DuplicateEvents,
        Fault::ClockBehind,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fault::None => "none",
            Fault::KillCore => "kill-core",
            Fault::KillBothCores => "kill-both-cores",
            Fault::KillEdge => "kill-edge",
            Fault::PauseCore => "pause-core",
            Fault::PauseBroker => "pause-broker",
            Fault::KillBroker => "kill-broker",
            Fault::RedisFlushAll => "redis-flushall",
            Fault::RedisRestartEmpty => "redis-restart-empty",
            Fault::RedisOldSnapshot => "redis-old-snapshot",
            Fault::DatabaseOutage => "database-outage",
            Fault::DatabaseRestart => "database-restart",
            Fault::DuplicateEvents => "duplicate-events",
            Fault::ClockBehind => "clock-behind",
        }
    }

    pub fn parse(name: &str) -> Option<Fault> {
        Self::ALL.into_iter().find(|f| f.name() == name.trim())
    }
}

/// What a struck fault needs to be healed.
#[derive(Debug)]
pub struct Struck {
    fault: Fault,
    core: usize,
    /// Where the round's events start, per partition (for duplicates).
    round_start: Vec<(i32, i64)>,
}

impl Fault {
    /// Strikes the fault now. `round_start` are the events topic's high watermarks when the
    /// round began.
    pub async fn strike(
        self,
        stack: &mut CampaignStack,
        rng: &mut Rng,
        round_start: Vec<(i32, i64)>,
    ) -> anyhow::Result<Struck> {
        let core = rng.between(0, stack.cores.len() as u64) as usize;
        match self {
            Fault::None => {}
            Fault::KillCore => stack.cores[core].kill(),
            Fault::KillBothCores => stack.cores.iter_mut().for_each(|c| c.kill()),
            Fault::KillEdge => stack.edge.kill(),
            Fault::PauseCore => stack.cores[core].pause(),
            Fault::PauseBroker => stack.broker.pause(),
            Fault::KillBroker => stack.broker.kill(),
            Fault::RedisFlushAll => {
                let mut conn = redis::Client::open(stack.redis.url())?
                    .get_multiplexed_async_connection()
                    .await?;
                redis::cmd("FLUSHALL").query_async::<()>(&mut conn).await?;
            }
            Fault::RedisRestartEmpty => {
                stack.redis.forget_snapshot();
                stack.redis.kill();
            }
            Fault::RedisOldSnapshot => stack.redis.snapshot().await?,
            Fault::DatabaseOutage => database_connections(stack, false).await?,
            Fault::DatabaseRestart => stack.postgres.crash(),
            Fault::DuplicateEvents => {
                replay_events(stack, &round_start).await?;
            }
            Fault::ClockBehind => stack.cores[core].restart_with(&CLOCK_STEPPED_BACK).await,
        }
        Ok(Struck {
            fault: self,
            core,
            round_start,
        })
    }
}

impl Struck {
    /// Ends the fault: what was killed restarts, what was paused goes on.
    pub async fn heal(&self, stack: &mut CampaignStack) -> anyhow::Result<()> {
        match self.fault {
            Fault::None => {}
            Fault::KillCore => stack.cores[self.core].restart().await,
            Fault::KillBothCores => {
                for core in &mut stack.cores {
                    core.restart().await;
                }
            }
            Fault::KillEdge => stack.edge.restart().await,
            Fault::PauseCore => stack.cores[self.core].unpause(),
            Fault::PauseBroker => stack.broker.unpause(),
            Fault::KillBroker => stack.broker.resume().await,
            Fault::RedisFlushAll => {}
            Fault::RedisRestartEmpty => stack.redis.restart().await,
            Fault::RedisOldSnapshot => {
                stack.redis.kill();
                stack.redis.restart().await;
                stack.redis.forget_snapshot();
            }
            Fault::DatabaseOutage => database_connections(stack, true).await?,
            Fault::DatabaseRestart => stack.postgres.restart().await?,
            Fault::DuplicateEvents | Fault::ClockBehind => {}
        }
        Ok(())
    }

    /// After the round's customers are done: the late half of a fault (duplicates that
    /// arrive after the releases).
    pub async fn after_sale(&self, stack: &mut CampaignStack) -> anyhow::Result<()> {
        match self.fault {
            Fault::DuplicateEvents => {
                replay_events(stack, &self.round_start).await?;
            }
            Fault::ClockBehind => stack.cores[self.core].restart().await,
            _ => {}
        }
        Ok(())
    }
}

/// Closes the round's database to new connections and ends its sessions, or opens it again.
async fn database_connections(stack: &CampaignStack, allow: bool) -> anyhow::Result<()> {
    let (server, _) = stack
        .db
        .url
        .rsplit_once('/')
        .ok_or_else(|| anyhow::anyhow!("database url without a name"))?;
    let mut admin = PgConnection::connect(&format!("{server}/postgres")).await?;
    let name = &stack.db.name;
    sqlx::query(&format!("ALTER DATABASE {name} ALLOW_CONNECTIONS {allow}"))
        .execute(&mut admin)
        .await?;
    if !allow {
        sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1")
            .bind(name)
            .execute(&mut admin)
            .await?;
    }
    Ok(())
}

/// Publishes again every event from `from` (per partition) up to the high watermarks now,
/// with its key and payload: duplicates as a producer's retry or a mirror would make them.
/// Returns how many.
pub async fn replay_events(stack: &CampaignStack, from: &[(i32, i64)]) -> anyhow::Result<usize> {
    let kafka = stack
        .settings
        .kafka
        .as_ref()
        .ok_or_else(|| anyhow::anyhow!("flash settings have kafka"))?;
    let until = stack.progress.high_watermarks().await?;
    let mut assignment = TopicPartitionList::new();
    let mut remaining = 0;
    for &(partition, high) in &until {
        let start = from
            .iter()
            .find(|(p, _)| *p == partition)
            .map_or(0, |(_, o)| *o);
        if high > start {
            assignment.add_partition_offset(&kafka.topic, partition, Offset::Offset(start))?;
            remaining += high - start;
        }
    }
    if remaining == 0 {
        return Ok(0);
    }
    let reader: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", &kafka.brokers)
        .set(
            "group.id",
            format!("campaign-replay-{}", uuid::Uuid::new_v4()),
        )
        .set("enable.auto.commit", "false")
        .create()?;
    reader.assign(&assignment)?;
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &kafka.brokers)
        .set("acks", "all")
        .create()?;
    let mut replayed = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while replayed < remaining {
        let message = match tokio::time::timeout_at(deadline, reader.recv()).await {
            Ok(m) => m?,
            Err(_) => break,
        };
        let high = until
            .iter()
            .find(|(p, _)| *p == message.partition())
            .map_or(0, |(_, h)| *h);
        if message.offset() >= high {
            continue;
        }
        let mut record = FutureRecord::to(&kafka.topic)
            .partition(message.partition())
            .payload(message.payload().unwrap_or_default());
        if let Some(key) = message.key() {
            record = record.key(key);
        }
        producer
            .send(record, Duration::from_secs(5))
            .await
            .map_err(|(e, _)| anyhow::anyhow!("replay send failed: {e}"))?;
        replayed += 1;
    }
    Ok(replayed as usize)
}
