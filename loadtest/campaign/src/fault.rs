//! The faults a round can suffer, one per round, each struck at a moment of the sale and
//! healed a while later, the way an operator's worst day brings them.

use std::str::FromStr;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Message, Offset, TopicPartitionList};
use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection};

use voucher_testkit::stack::CLOCK_STEPPED_BACK;

use crate::rng::Rng;
use crate::stack::{CampaignStack, Layout, RECONCILE_GRACE, RECONCILE_INTERVAL};
use crate::twin::{self, TwinOrder};

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
    /// A snapshot taken when struck, and Redis restarted from it only once the round's
    /// customers are done: the gate goes back past every sale, release and confirm since
    /// the strike, seconds longer ago than the reconciliation grace.
    RedisBackPastSettles,
    /// SIGSTOP one core for longer than the reconciliation grace plus two rounds: the
    /// other core gives back what it held pending, and whatever it sends once it wakes (a
    /// commit of a use reconciliation has forgotten, a release of it) lands after that.
    PauseCoreLong,
    /// SIGSTOP Redis: connections open, nothing answered, nothing lost (slow, not dead).
    RedisStall,
    /// SIGSTOP the whole PostgreSQL server, postmaster and backends: connections open,
    /// nothing answered, no new one accepted (slow, not dead).
    DatabaseStall,
    /// Another session holds the round voucher's row (`SELECT ... FOR UPDATE` in a
    /// transaction left open, as an operator's forgotten session does): every write of a
    /// use waits on it.
    DatabaseLockHeld,
    /// Another client takes every connection the server will give (until it refuses one),
    /// the cores' sessions are ended, and the slots they free are taken too: the cores'
    /// pools find no connection to have.
    DatabaseConnectionsTaken,
    /// Customers send one orderId to the round's voucher and to a second flash voucher at
    /// the same moment: one of the two may have it, never both.
    TwinOrders,
    /// The operator's kill switch: the round's voucher is paused mid-sale (through a core's
    /// admin API) and resumed when healed. Between the pause's answer and the resume, no
    /// new use may be taken: every 201 to a request sent in that window is a replay, and
    /// PostgreSQL holds the same rows of the voucher at both ends of it.
    OperatorPause,
    /// The PostgreSQL primary's machine lost mid-sale (every process of it frozen at one
    /// instant, then killed) and its standby promoted by `scripts/pg-promote.sh`; the cores
    /// follow it. Healed by a new standby of the promoted server (until then a synchronous
    /// primary commits nothing). Every 201 given before the loss must have its row on the
    /// promoted server: with a synchronous standby that is a guarantee, with an
    /// asynchronous one it is what the campaign measures.
    PrimaryLost,
    /// The Redis Cluster master of the round voucher's slot killed (SIGKILL) mid-sale: its
    /// replica is promoted after `cluster-node-timeout`, perhaps behind it (the gate back
    /// in time). Healed by starting the node again, which rejoins as a replica. Scaled
    /// layout only.
    RedisMasterKilled,
}

impl Fault {
    pub const ALL: [Fault; 24] = [
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
        Fault::RedisBackPastSettles,
        Fault::PauseCoreLong,
        Fault::RedisStall,
        Fault::DatabaseStall,
        Fault::DatabaseLockHeld,
        Fault::DatabaseConnectionsTaken,
        Fault::TwinOrders,
        Fault::OperatorPause,
        Fault::PrimaryLost,
        Fault::RedisMasterKilled,
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
            Fault::RedisBackPastSettles => "redis-back-past-settles",
            Fault::PauseCoreLong => "pause-core-long",
            Fault::RedisStall => "redis-stall",
            Fault::DatabaseStall => "database-stall",
            Fault::DatabaseLockHeld => "database-lock-held",
            Fault::DatabaseConnectionsTaken => "database-connections-taken",
            Fault::TwinOrders => "twin-orders",
            Fault::OperatorPause => "operator-pause",
            Fault::PrimaryLost => "primary-lost",
            Fault::RedisMasterKilled => "redis-master-killed",
        }
    }

    /// Whether the fault can strike a stack of `layout`: the faults of the one Redis server
    /// (flushed, restarted, stalled, from a snapshot) need it, and a cluster master's death
    /// needs the cluster.
    pub fn fits(self, layout: Layout) -> bool {
        let single_redis = matches!(
            self,
            Fault::RedisFlushAll
                | Fault::RedisRestartEmpty
                | Fault::RedisOldSnapshot
                | Fault::RedisBackPastSettles
                | Fault::RedisStall
        );
        match layout {
            Layout::Single => self != Fault::RedisMasterKilled,
            Layout::Scaled => !single_redis,
        }
    }

    /// How long the fault lasts when the seed drew `drawn` (1 to 3 s): a long pause
    /// outlasts the grace and two reconciliation rounds by that much.
    pub fn lasts(self, drawn: Duration) -> Duration {
        match self {
            Fault::PauseCoreLong => RECONCILE_GRACE + 2 * RECONCILE_INTERVAL + drawn,
            _ => drawn,
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
    /// The round's voucher.
    code: String,
    /// Where the round's events start, per partition (for duplicates).
    round_start: Vec<(i32, i64)>,
    /// Database sessions the fault holds while it lasts (a lock, the connections taken).
    sessions: Vec<PgConnection>,
    /// The twin orders' race, under way.
    twins: Option<tokio::task::JoinHandle<Vec<TwinOrder>>>,
    /// What the fault did, for the report (see [`Struck::effect`]).
    effect: String,
    /// `operator-pause`: when the pause was answered and the voucher's rows then; when the
    /// resume was sent and the rows just before.
    paused: Option<PauseWindow>,
    /// `redis-master-killed`: the port of the node killed.
    node: Option<u16>,
}

/// The window of an operator's pause, from its answer to the resume's request.
#[derive(Debug, Clone)]
struct PauseWindow {
    answered: Instant,
    rows_at_pause: i64,
    resume_sent: Option<Instant>,
    rows_at_resume: i64,
}

impl Fault {
    /// Strikes the fault now, in the round of voucher `code` whose customers give up at
    /// `give_up`. `round_start` are the events topic's high watermarks when the round began.
    pub async fn strike(
        self,
        stack: &mut CampaignStack,
        rng: &mut Rng,
        round_start: Vec<(i32, i64)>,
        code: &str,
        give_up: Instant,
    ) -> anyhow::Result<Struck> {
        // A fault of one core strikes the core the edges send the round voucher's
        // reservations to (`voucher_edge::routing`): the one doing the sale's work. (Drawn
        // all the same, so the seed's later draws stay what they were.)
        let drawn = rng.between(0, stack.cores.len() as u64) as usize;
        let (core, whose) = match stack.voucher_core(code) {
            Some(core) => (core, "the voucher's"),
            None => (drawn, "drawn"),
        };
        let mut sessions = Vec::new();
        let mut twins = None;
        let mut effect = match self {
            Fault::KillCore | Fault::PauseCore | Fault::ClockBehind | Fault::PauseCoreLong => {
                format!("core {} ({whose})", core + 1)
            }
            _ => String::new(),
        };
        let mut paused = None;
        let mut node = None;
        match self {
            Fault::None => {}
            Fault::KillCore => stack.cores[core].kill(),
            Fault::KillBothCores => stack.cores.iter_mut().for_each(|c| c.kill()),
            Fault::KillEdge => stack.edges[0].kill(),
            Fault::PauseCore => stack.cores[core].pause(),
            Fault::PauseBroker => stack.broker.pause(),
            Fault::KillBroker => stack.broker.kill(),
            Fault::RedisFlushAll => {
                let mut conn = redis::Client::open(stack.redis()?.url())?
                    .get_multiplexed_async_connection()
                    .await?;
                redis::cmd("FLUSHALL").query_async::<()>(&mut conn).await?;
            }
            Fault::RedisRestartEmpty => {
                stack.redis()?.forget_snapshot();
                stack.redis()?.kill();
            }
            Fault::RedisOldSnapshot => stack.redis()?.snapshot().await?,
            Fault::DatabaseOutage => database_connections(stack, false).await?,
            Fault::DatabaseRestart => stack.postgres.crash(),
            Fault::DuplicateEvents => {
                effect = replay_events(stack, &round_start).await?.to_string();
            }
            Fault::ClockBehind => stack.cores[core].restart_with(&CLOCK_STEPPED_BACK).await,
            Fault::RedisBackPastSettles => stack.redis()?.snapshot().await?,
            Fault::PauseCoreLong => stack.cores[core].pause(),
            Fault::RedisStall => stack.redis()?.pause(),
            Fault::DatabaseStall => stack.postgres.pause(),
            Fault::DatabaseLockHeld => sessions.push(lock_voucher_row(stack, code).await?),
            Fault::DatabaseConnectionsTaken => {
                let ended;
                (sessions, ended) = take_connections(stack).await?;
                effect = format!(
                    "{} connections taken, {ended} sessions of others ended",
                    sessions.len()
                );
            }
            Fault::TwinOrders => twins = Some(twin::race(stack, code, give_up).await?),
            Fault::PrimaryLost => {
                let lost = Instant::now();
                let old = stack.postgres.port;
                // The primary's site goes at one instant: the link to a far standby with
                // what is on it, then the server itself.
                if let Some(link) = stack.link.as_mut() {
                    link.cut();
                }
                stack.postgres.lose();
                stack.standby.promote(old).await?;
                effect = format!(
                    "primary lost, standby promoted {} ms later",
                    lost.elapsed().as_millis()
                );
            }
            Fault::RedisMasterKilled => {
                let cluster = stack.cluster()?;
                let master = cluster
                    .master_of(cluster.slot(&format!("{{{code}}}")).await)
                    .await;
                cluster.kill(master.port);
                node = Some(master.port);
                effect = format!("master on {} killed", master.port);
            }
            Fault::OperatorPause => {
                lifecycle(stack, code, "pause").await?;
                paused = Some(PauseWindow {
                    answered: Instant::now(),
                    rows_at_pause: voucher_rows(stack, code).await?,
                    resume_sent: None,
                    rows_at_resume: 0,
                });
            }
        }
        Ok(Struck {
            fault: self,
            core,
            code: code.to_owned(),
            round_start,
            sessions,
            twins,
            effect,
            paused,
            node,
        })
    }
}

impl Struck {
    /// Ends the fault: what was killed restarts, what was paused goes on, what was held is
    /// let go.
    pub async fn heal(&mut self, stack: &mut CampaignStack) -> anyhow::Result<()> {
        for session in self.sessions.drain(..) {
            // Closing ends its transaction (rolled back) and frees its slot.
            let _ = session.close().await;
        }
        match self.fault {
            Fault::None => {}
            Fault::KillCore => stack.cores[self.core].restart().await,
            Fault::KillBothCores => {
                for core in &mut stack.cores {
                    core.restart().await;
                }
            }
            Fault::KillEdge => stack.edges[0].restart().await,
            Fault::PauseCore => stack.cores[self.core].unpause(),
            Fault::PauseBroker => stack.broker.unpause(),
            Fault::KillBroker => stack.broker.resume().await,
            Fault::RedisFlushAll => {}
            Fault::RedisRestartEmpty => stack.redis()?.restart().await,
            Fault::RedisOldSnapshot => {
                stack.redis()?.kill();
                stack.redis()?.restart().await;
                stack.redis()?.forget_snapshot();
            }
            Fault::DatabaseOutage => database_connections(stack, true).await?,
            Fault::DatabaseRestart => stack.postgres.restart().await?,
            Fault::PauseCoreLong => stack.cores[self.core].unpause(),
            Fault::RedisStall => stack.redis()?.unpause(),
            Fault::DatabaseStall => stack.postgres.unpause(),
            Fault::PrimaryLost => stack.replace_lost_primary().await?,
            Fault::RedisMasterKilled => {
                if let Some(port) = self.node {
                    stack.cluster()?.restart(port).await;
                }
            }
            Fault::DuplicateEvents
            | Fault::ClockBehind
            | Fault::RedisBackPastSettles
            | Fault::DatabaseLockHeld
            | Fault::DatabaseConnectionsTaken
            | Fault::TwinOrders => {}
            Fault::OperatorPause => {
                let code = self.code.clone();
                if let Some(window) = &mut self.paused {
                    window.rows_at_resume = voucher_rows(stack, &code).await?;
                    window.resume_sent = Some(Instant::now());
                }
                lifecycle(stack, &code, "resume").await?;
            }
        }
        Ok(())
    }

    /// `operator-pause`: no new use between the pause's answer and the resume's request (a
    /// 201 to a request sent in that window must be a replay, and the voucher's rows must
    /// not have changed); and the pause must have refused someone, or the round proved
    /// nothing. Nothing for any other fault.
    pub async fn check_paused(
        &mut self,
        code: &str,
        checkouts: &[crate::round::Checkout],
        violations: &mut Vec<String>,
    ) -> anyhow::Result<()> {
        let Some(window) = &self.paused else {
            return Ok(());
        };
        let resumed = window.resume_sent.unwrap_or_else(Instant::now);
        if window.rows_at_resume != window.rows_at_pause {
            violations.push(format!(
                "pause: {} rows of {code} written while it was paused",
                window.rows_at_resume - window.rows_at_pause
            ));
        }
        let inside =
            |c: &&crate::round::Checkout| c.sent_at > window.answered && c.sent_at < resumed;
        let fresh: Vec<&str> = checkouts
            .iter()
            .filter(inside)
            .filter(|c| c.status == 201 && !c.replayed)
            .map(|c| c.order.as_str())
            .collect();
        if !fresh.is_empty() {
            violations.push(format!(
                "pause: {} new 201s to requests sent while paused (e.g. {})",
                fresh.len(),
                fresh[0]
            ));
        }
        let refused = checkouts
            .iter()
            .filter(inside)
            .filter(|c| c.status == 409)
            .count();
        if refused == 0 {
            violations.push(
                "pause: no checkout sent while paused was refused; the round proved nothing".into(),
            );
        }
        self.effect =
            format!(
            "paused {:.1} s: {refused} checkouts sent meanwhile refused 409, rows {} at both ends",
            resumed.saturating_duration_since(window.answered).as_secs_f64(),
            window.rows_at_pause
        );
        Ok(())
    }

    /// What the fault did, where its name does not say it all (empty otherwise).
    pub fn effect(&self) -> &str {
        &self.effect
    }

    /// The twin orders' race, once the round's customers are done (empty for any other
    /// fault).
    pub async fn twins(&mut self) -> anyhow::Result<Vec<TwinOrder>> {
        match self.twins.take() {
            Some(race) => race
                .await
                .map_err(|e| anyhow::anyhow!("the twin orders' task failed: {e}")),
            None => Ok(Vec::new()),
        }
    }

    /// After the round's customers are done: the late half of a fault (duplicates that
    /// arrive after the releases).
    pub async fn after_sale(&mut self, stack: &mut CampaignStack) -> anyhow::Result<()> {
        match self.fault {
            Fault::DuplicateEvents => {
                let late = replay_events(stack, &self.round_start).await?;
                self.effect = format!("during: {}; after: {late}", self.effect);
            }
            Fault::ClockBehind => stack.cores[self.core].restart().await,
            Fault::RedisBackPastSettles => {
                stack.redis()?.kill();
                stack.redis()?.restart().await;
                stack.redis()?.forget_snapshot();
            }
            _ => {}
        }
        Ok(())
    }
}

/// A session of the round's database with the voucher's row locked in a transaction it
/// leaves open (the campaign's own session: no idle timeout ends it).
async fn lock_voucher_row(stack: &CampaignStack, code: &str) -> anyhow::Result<PgConnection> {
    let mut session = PgConnection::connect(&stack.db.url).await?;
    sqlx::query("BEGIN").execute(&mut session).await?;
    sqlx::query("SELECT 1 FROM vouchers WHERE code = $1 FOR UPDATE")
        .bind(code)
        .execute(&mut session)
        .await?;
    Ok(session)
}

/// Opens sessions until the server refuses one, ends the cores' sessions, and takes the
/// slots they free: what a runaway client or a connection storm does to a shared server.
/// Returns the sessions taken and how many others were ended.
async fn take_connections(stack: &CampaignStack) -> anyhow::Result<(Vec<PgConnection>, usize)> {
    // The server's own limit bounds the loop; this only guards against a server that
    // never refuses.
    const AT_MOST: usize = 1_000;
    const TAKER: &str = "voucher-campaign-taker";
    async fn fill(options: &PgConnectOptions, sessions: &mut Vec<PgConnection>) {
        while sessions.len() < AT_MOST {
            match PgConnection::connect_with(options).await {
                Ok(session) => sessions.push(session),
                Err(_) => break,
            }
        }
    }
    let options = PgConnectOptions::from_str(&stack.db.url)?.application_name(TAKER);
    let mut sessions = Vec::new();
    fill(&options, &mut sessions).await;
    let Some(first) = sessions.first_mut() else {
        anyhow::bail!("no connection to take: the database refused the first one");
    };
    let ended: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()
           AND application_name <> $1",
    )
    .bind(TAKER)
    .fetch_all(&mut *first)
    .await?;
    fill(&options, &mut sessions).await;
    Ok((sessions, ended.into_iter().filter(|e| *e).count()))
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
/// Returns how many, and why it stopped short if the broker did not take one (a fault
/// that could not be struck whole is not the service's failure; the report says so).
pub async fn replay_events(stack: &CampaignStack, from: &[(i32, i64)]) -> anyhow::Result<Replayed> {
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
        return Ok(Replayed::default());
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
    // Bounded: librdkafka's default waits five minutes for an acknowledgement (a broker
    // that came back from a kill may take its time), and a round must not.
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &kafka.brokers)
        .set("acks", "all")
        .set("message.timeout.ms", "5000")
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
        if let Err((e, _)) = producer.send(record, Duration::from_secs(5)).await {
            return Ok(Replayed {
                count: replayed as usize,
                stopped: Some(e.to_string()),
            });
        }
        replayed += 1;
    }
    Ok(Replayed {
        count: replayed as usize,
        stopped: None,
    })
}

/// What [`replay_events`] published again.
#[derive(Debug, Default)]
pub struct Replayed {
    pub count: usize,
    /// Why it stopped before the last event, if it did.
    pub stopped: Option<String>,
}

impl std::fmt::Display for Replayed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} events published again", self.count)?;
        if let Some(why) = &self.stopped {
            write!(f, ", then the broker took no more ({why})")?;
        }
        Ok(())
    }
}

/// `POST /vouchers/{code}/{action}` through the first core's admin API, until it is
/// answered 200 (a 503 is retried: a pause is acknowledged only once in force).
async fn lifecycle(stack: &CampaignStack, code: &str, action: &str) -> anyhow::Result<()> {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let status = stack.admin().lifecycle(code, action).await.status();
        if status == reqwest::StatusCode::OK {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < until,
            "{action} of {code} not answered 200 within 10 s (last {status})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The rows PostgreSQL holds for `code`, whatever their status.
async fn voucher_rows(stack: &CampaignStack, code: &str) -> anyhow::Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT count(*) FROM redemptions WHERE voucher_code = $1")
            .bind(code)
            .fetch_one(&stack.pool)
            .await?,
    )
}
