//! Flash mode: an atomic Redis gate filters each reservation, PostgreSQL has the last word
//! on it, and Kafka carries the events to whoever reads them.
//!
//! With `flash.decision = "database"` (the default) a reservation the gate let through is
//! committed by the recorder (grouped transactions, fenced by the gate's generation) before
//! its 201; a refusal by PostgreSQL's constraints puts the gate's record and use back, and
//! an unknown outcome (the database failed mid-commit) keeps the use held and answers 503.
//! The event is published afterwards. With `flash.decision = "broker"`, the 201 waits for
//! the broker's acknowledgement instead, and the writers turn events into rows; an
//! ambiguous publish keeps the use held (503) and a retry re-publishes the same event.
//!
//! [`start`] is the front door: it builds the gate, the recorder and its announcer (or, with
//! the broker deciding, the publisher), the writers, the consumer monitor and
//! reconciliation from the settings and hands back the
//! [`FlashPath`] the HTTP layer calls and the [`FlashJobs`] that run beside it.
//!
//! Layout (every arrow points down: this module uses `store` and `domain`, never the reverse):
//! - [`gate`]: the Redis gate, one module per family of its Lua scripts (`lua/`);
//! - [`events`]: the event, its producers, the writers that put it into PostgreSQL, and
//!   "has every published event been written?";
//! - `reserve`: the reserve use case (gate, then record and announce, or claim, publish
//!   and acknowledge);
//! - [`recorder`]: PostgreSQL's last word before a 201, in grouped transactions;
//! - `settle`: the confirm and release use cases, which act on the row first;
//! - `give_back`: the one place a use goes back to the gate and the edges hear of it;
//! - [`rebuild`]: a lost gate rebuilt from PostgreSQL once that is safe;
//! - [`reconcile`]: the periodic comparison of gate and database, and its repairs.

pub mod events;
pub mod gate;
mod give_back;
mod lookups;
pub mod rebuild;
pub mod reconcile;
pub mod recorder;
mod reserve;
mod settle;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::{Decision, FlashSettings, KafkaSettings, Settings};
use crate::domain::{Voucher, VoucherCode};
use crate::metrics::Metrics;
use crate::store::Store;
use crate::{Error, Result};
use events::consumer::EventConsumer;
use events::monitor::{ConsumerHealth, ConsumerMonitor};
use events::progress::Progress;
use events::publisher::{Announcer, Publisher};
use gate::Gate;
use reconcile::Reconciler;
use recorder::Recorder;

pub use rebuild::Rebuild;

/// Flash mode, started: the path reservations take and the jobs that keep it honest.
pub struct Flash {
    pub path: FlashPath,
    pub jobs: FlashJobs,
}

/// The background jobs of flash mode; [`FlashJobs::spawn`] runs them until shutdown.
pub struct FlashJobs {
    /// The writers (absent unless [`runs_writers`]).
    consumer: Option<EventConsumer>,
    monitor: ConsumerMonitor,
    /// Absent with `flash.reconcile_enabled = false`.
    reconciler: Option<Reconciler>,
}

impl FlashJobs {
    /// Spawns every job into `set`, each stopping when `shutdown` is cancelled.
    pub fn spawn(self, set: &mut JoinSet<()>, shutdown: &CancellationToken) {
        if let Some(consumer) = self.consumer {
            set.spawn(consumer.run(shutdown.child_token()));
        }
        set.spawn(self.monitor.run(shutdown.child_token()));
        if let Some(reconciler) = self.reconciler {
            set.spawn(reconciler.run(shutdown.child_token()));
        }
    }
}

/// Starts flash mode when Redis and Kafka are both configured (`None` otherwise: every
/// voucher then runs in standard mode). Creates the topics, connects the gate and loads its
/// scripts, starts the recorder's workers, and builds the writers, the monitor and the
/// reconciler, which [`FlashJobs::spawn`] runs.
pub async fn start(
    settings: &Settings,
    store: Store,
    metrics: Arc<Metrics>,
) -> anyhow::Result<Option<Flash>> {
    let (Some(redis), Some(kafka)) = (&settings.redis, &settings.kafka) else {
        return Ok(None);
    };
    events::topics::ensure_topics(kafka)
        .await
        .context("creating Kafka topics")?;
    let gate = Gate::connect(redis).await.context("connecting to Redis")?;
    let path = FlashPath::new(
        gate,
        kafka,
        store.clone(),
        metrics.clone(),
        settings.flash.clone(),
    )?;
    let monitor = ConsumerMonitor::new(
        path.progress().clone(),
        metrics.clone(),
        path.consumer_health().clone(),
        kafka.monitor_interval,
        events_are_written(kafka, settings.flash.decision),
    );
    let consumer = if runs_writers(kafka, settings.flash.decision) {
        Some(
            EventConsumer::new(kafka, store.clone(), metrics.clone())?
                .settling(path.gate().clone()),
        )
    } else {
        None
    };
    let reconciler = settings
        .flash
        .reconcile_enabled
        .then(|| Reconciler::new(path.clone(), store, metrics, &settings.flash));
    Ok(Some(Flash {
        path,
        jobs: FlashJobs {
            consumer,
            monitor,
            reconciler,
        },
    }))
}

/// Whether this instance runs the event writers: as `kafka.consume` says, and when unset,
/// only with the broker deciding (with PostgreSQL deciding, the rows are there before the
/// events: the writers would only write them again).
pub fn runs_writers(kafka: &KafkaSettings, decision: Decision) -> bool {
    kafka.consume.unwrap_or(decision == Decision::Broker)
}

/// Whether the deployment writes its events to PostgreSQL at all, on this core or others:
/// always with the broker deciding (rows come only from the writers), and with PostgreSQL
/// deciding only where asked (`kafka.consume = true`). Where it does not, no event is ever
/// behind, and the consumer monitor exports no lag.
pub fn events_are_written(kafka: &KafkaSettings, decision: Decision) -> bool {
    decision == Decision::Broker || kafka.consume == Some(true)
}

#[derive(Clone)]
pub struct FlashPath {
    inner: Arc<Inner>,
}

/// Who turns a use the gate took into a 201 (`flash.decision`), with the one producer that
/// decision needs.
enum Decider {
    /// PostgreSQL's commit, by the recorder; the events of the uses it holds are announced
    /// after the answers, never awaited.
    Database {
        recorder: Recorder,
        announcer: Announcer,
    },
    /// The broker's acknowledgement of the event, awaited by the request.
    Broker { publisher: Publisher },
}

struct Inner {
    gate: Gate,
    decider: Decider,
    /// PostgreSQL's rows of the orders the gate refuses or recognises, looked up in groups.
    lookups: lookups::OrderLookups,
    progress: Progress,
    /// What the consumer monitor last saw; readiness reports it.
    consumer_health: Arc<ConsumerHealth>,
    store: Store,
    metrics: Arc<Metrics>,
    settings: FlashSettings,
    /// After a gate is lost, a reservation that passed it just before may still be
    /// publishing for this long: the rebuild waits it out.
    message_timeout: Duration,
    /// Vouchers whose gate this instance is rebuilding or healing (one job each at a
    /// time), each with whether a rebuild was asked for while it ran (it follows).
    rebuilding: Mutex<HashMap<VoucherCode, bool>>,
}

impl FlashPath {
    pub fn new(
        gate: Gate,
        kafka: &KafkaSettings,
        store: Store,
        metrics: Arc<Metrics>,
        settings: FlashSettings,
    ) -> anyhow::Result<Self> {
        let linger = kafka.linger_for(settings.decision);
        let decider = match settings.decision {
            Decision::Database => Decider::Database {
                recorder: Recorder::start(store.clone(), gate.clone(), &settings, metrics.clone()),
                announcer: Announcer::new(kafka, linger, metrics.clone())?,
            },
            Decision::Broker => Decider::Broker {
                publisher: Publisher::new(kafka, linger)?,
            },
        };
        Ok(Self {
            inner: Arc::new(Inner {
                gate,
                decider,
                lookups: lookups::OrderLookups::start(store.clone(), &metrics),
                progress: Progress::new(kafka, store.clone())?,
                consumer_health: Arc::default(),
                store,
                metrics,
                settings,
                message_timeout: kafka.message_timeout,
                rebuilding: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// Whether PostgreSQL has the last word before a 201 (`flash.decision = "database"`):
    /// then every acknowledged use is a row, and PostgreSQL alone can say who holds uses.
    pub fn database_decides(&self) -> bool {
        matches!(self.inner.decider, Decider::Database { .. })
    }

    pub fn gate(&self) -> &Gate {
        &self.inner.gate
    }

    pub fn progress(&self) -> &Progress {
        &self.inner.progress
    }

    /// Whether every published event's row is in PostgreSQL, waiting up to `timeout` for
    /// the writers. With PostgreSQL deciding, the row is committed before the 201 and
    /// before the event is published: nothing to wait for (the writers only find
    /// duplicates, and their lag holds up neither a rebuild nor reconciliation).
    pub async fn rows_caught_up(&self, timeout: Duration) -> Result<bool> {
        if self.inner.settings.decision == Decision::Database {
            return Ok(true);
        }
        self.inner
            .progress
            .wait_caught_up(timeout)
            .await
            .map_err(|e| Error::internal(e.context("reading the writers' progress")))
    }

    pub fn consumer_health(&self) -> &Arc<ConsumerHealth> {
        &self.inner.consumer_health
    }

    /// Loads the gate of a voucher just created: nothing can have been published for it,
    /// so there is nothing to wait for; the load itself is the fenced one of a rebuild.
    pub async fn warm_up(&self, voucher: &Voucher) -> Result<()> {
        self.load_from_database(voucher).await?;
        Ok(())
    }
}
