//! Flash mode: the Redis gate decides, Kafka carries the decision, PostgreSQL records it.
//!
//! A reservation answers 201 only after its event is acknowledged by the broker, so every
//! 201 ends up as a row (the consumer is at-least-once and idempotent). When the broker's
//! answer is ambiguous (a timeout: the event may or may not be written), the use stays held
//! and the client gets 503; its retry with the same orderId re-publishes the same event and
//! gets the 201 once that is acknowledged. A use whose event was certainly not written is
//! given back at once; one whose event never reached the database is given back by
//! reconciliation, after the consumer has caught up past any late write.
//!
//! Layout (every arrow points down: this module uses `store` and `domain`, never the reverse):
//! - [`gate`]: the Redis gate, its Lua scripts and the per-order record they keep;
//! - [`events`]: the event, its publisher, the consumer that writes it into PostgreSQL,
//!   and "has the consumer written everything published so far?";
//! - `reserve`: the reserve protocol (gate, claim, publish or record, acknowledge);
//! - [`recorder`]: PostgreSQL's last word before a 201, in grouped transactions, when
//!   `flash.decision = "database"`;
//! - `settle`: confirm and release, which wait for the consumer to write the row;
//! - `give_back`: the one place a use goes back to the gate and the edges hear of it;
//! - [`rebuild`]: a lost gate rebuilt from PostgreSQL once that is safe;
//! - [`reconcile`]: the periodic comparison of gate and database, and its repairs.

pub mod events;
pub mod gate;
mod give_back;
pub mod rebuild;
pub mod reconcile;
pub mod recorder;
mod reserve;
mod settle;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::config::{Decision, FlashSettings, KafkaSettings};
use crate::domain::{Voucher, VoucherCode};
use crate::metrics::Metrics;
use crate::store::Store;
use crate::{Error, Result};
use events::monitor::ConsumerHealth;
use events::progress::Progress;
use events::publisher::Publisher;
use gate::Gate;
use recorder::Recorder;

pub use rebuild::Rebuild;

#[derive(Clone)]
pub struct FlashPath {
    inner: Arc<Inner>,
}

struct Inner {
    gate: Gate,
    publisher: Publisher,
    /// With `flash.decision = "database"`: PostgreSQL's last word before a 201.
    recorder: Option<Recorder>,
    progress: Progress,
    /// What the consumer monitor last saw; readiness reports it.
    consumer_health: Arc<ConsumerHealth>,
    store: Store,
    metrics: Arc<Metrics>,
    settings: FlashSettings,
    /// After a gate is lost, a reservation that passed it just before may still be
    /// publishing for this long: the rebuild waits it out.
    message_timeout: Duration,
    /// Vouchers whose gate this instance is rebuilding (one rebuild each at a time).
    rebuilding: Mutex<HashSet<VoucherCode>>,
}

impl FlashPath {
    pub fn new(
        gate: Gate,
        kafka: &KafkaSettings,
        store: Store,
        metrics: Arc<Metrics>,
        settings: FlashSettings,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            inner: Arc::new(Inner {
                gate,
                publisher: Publisher::new(kafka)?,
                recorder: (settings.decision == Decision::Database).then(|| {
                    Recorder::start(
                        store.clone(),
                        settings.record_workers,
                        settings.record_batch_max,
                    )
                }),
                progress: Progress::new(kafka, store.clone())?,
                consumer_health: Arc::default(),
                store,
                metrics,
                settings,
                message_timeout: kafka.message_timeout,
                rebuilding: Mutex::new(HashSet::new()),
            }),
        })
    }

    /// Whether PostgreSQL has the last word before a 201 (`flash.decision = "database"`):
    /// then every acknowledged use is a row, and PostgreSQL alone can say who holds uses.
    pub fn database_decides(&self) -> bool {
        self.inner.recorder.is_some()
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
