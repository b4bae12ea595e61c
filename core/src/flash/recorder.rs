//! PostgreSQL's last word on flash reservations (`flash.decision = "database"`): the rows
//! of uses the gate took are committed in grouped transactions before anyone gets a 201.
//!
//! Reservations queue on a channel (`crate::batching`); each of `record_workers` tasks
//! takes whatever has queued, waits up to `record_linger` for more (up to
//! `record_batch_max` in all), and records the batch in one statement
//! (`store::record_decided`: the voucher's and the customer's counted limits and the
//! orderId's uniqueness are checked there; one more decides a batch that crosses a
//! limit), on a connection it keeps between batches. Under load the queue fills while the previous
//! transaction runs, so batches grow with the load; the linger bounds what a lone
//! reservation waits for company. Once the answers are out, the batch's committed orders
//! are settled in the gate, one call per voucher (`settle.lua`).
//!
//! Traced, a request's wait is its `recorder.commit` span, in the request's trace; the
//! batch's transaction is a `recorder.transaction` span of its own, linked to the wait of
//! every request it holds (a span has one parent, a transaction many requests).

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::oneshot;
use tracing::Instrument;

use super::gate::{Gate, Generation};
use crate::batching::{self, Batches, Queue};
use crate::config::FlashSettings;
use crate::domain::{Reservation, VoucherCode};
use crate::error::Error;
use crate::metrics::Metrics;
use crate::store::{Recording, Store};
use crate::Result;

/// What PostgreSQL said about one reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    /// Its row is committed now.
    Stored,
    /// Its row was committed before (an earlier attempt of the same order): the row as
    /// PostgreSQL holds it, status included, is the answer.
    Existing(Reservation),
    /// Certainly not written: no statement was sent (no connection could be had).
    NotSent,
    /// Refused by the constraint named: the gate let through what the database will not
    /// hold (a stale gate, or an orderId taken elsewhere).
    Refused(String),
    /// Not written: the gate that decided it was replaced by a newer load meanwhile (see
    /// `Store::record_decided`). Nothing is held for it in PostgreSQL.
    Superseded,
}

struct Job {
    reservation: Reservation,
    /// The generation of the gate that decided it.
    generation: Generation,
    answer: oneshot::Sender<Result<Recorded>>,
    /// The request's `recorder.commit` span, for the transaction's link to it (disabled
    /// while tracing is off).
    waiting: tracing::Span,
}

#[derive(Clone)]
pub struct Recorder {
    queue: Queue<Job>,
}

impl Recorder {
    /// Starts the recording tasks on `store`, settling committed orders in `gate`; they end
    /// when every `Recorder` clone is dropped.
    /// Batches are grouped by `flash.record_workers`, `record_batch_max` and
    /// `record_linger`.
    pub fn start(
        store: Store,
        gate: Gate,
        settings: &FlashSettings,
        metrics: Arc<Metrics>,
    ) -> Self {
        let workers = settings.record_workers.max(1);
        let (queue, batches) = batching::queue(
            workers,
            settings.record_batch_max,
            settings.record_linger,
            &metrics,
            "flash",
        );
        for _ in 0..workers {
            let worker = Worker {
                writer: store.decided_writer(),
                gate: gate.clone(),
                batches: batches.clone(),
                metrics: metrics.clone(),
            };
            tokio::spawn(worker.run());
        }
        Self { queue }
    }

    /// Records `reservation` and waits for PostgreSQL's answer. An error means the outcome
    /// is unknown (the transaction may have committed): the use stays held and a retry of
    /// the same order records again, which is a no-op if it did commit.
    #[tracing::instrument(level = "debug", name = "recorder.commit", skip_all)]
    pub async fn record(
        &self,
        reservation: Reservation,
        generation: Generation,
    ) -> Result<Recorded> {
        let (answer, answered) = oneshot::channel();
        self.queue
            .send(Job {
                reservation,
                generation,
                answer,
                waiting: voucher_telemetry::trace::current(),
            })
            .await
            .map_err(|_| Error::unavailable("reservation recorder (stopped)"))?;
        answered
            .await
            .map_err(|_| Error::unavailable("reservation recorder (stopped)"))?
    }
}

/// One recording task.
struct Worker {
    writer: crate::store::DecidedWriter,
    gate: Gate,
    batches: Batches<Job>,
    metrics: Arc<Metrics>,
}

impl Worker {
    /// Takes a batch, records it, answers each waiter, settles; until the queue closes.
    async fn run(mut self) {
        while let Some(batch) = self.batches.next().await {
            let transaction = tracing::debug_span!(
                "recorder.transaction",
                reservations = batch.len(),
                otel.kind = "client",
                db.system = "postgresql",
            );
            let generations: Vec<i64> = batch.iter().map(|job| job.generation.0).collect();
            let (reservations, answers): (Vec<Reservation>, Vec<_>) = batch
                .into_iter()
                .map(|job| {
                    voucher_telemetry::trace::link(&transaction, &job.waiting);
                    (job.reservation, job.answer)
                })
                .unzip();
            let outcomes: Vec<Result<Recorded>> = match self
                .writer
                .record(&reservations, &generations)
                .instrument(transaction)
                .await
            {
                Ok(Recording::NotSent(e)) => {
                    tracing::warn!(error = %e.chain(), "no database connection; reservations not recorded");
                    (0..answers.len()).map(|_| Ok(Recorded::NotSent)).collect()
                }
                Ok(Recording::Done(result)) => {
                    self.metrics
                        .group_transactions
                        .with_label_values(&["flash"])
                        .inc_by(result.transactions as u64);
                    let mut outcomes = vec![Recorded::Stored; answers.len()];
                    for (i, row) in result.repeats {
                        if let Some(outcome) = outcomes.get_mut(i) {
                            *outcome = Recorded::Existing(row);
                        }
                    }
                    for (i, reason) in result.refused {
                        if let Some(outcome) = outcomes.get_mut(i) {
                            *outcome = Recorded::Refused(reason);
                        }
                    }
                    for i in result.stale {
                        if let Some(outcome) = outcomes.get_mut(i) {
                            *outcome = Recorded::Superseded;
                        }
                    }
                    outcomes.into_iter().map(Ok).collect()
                }
                Err(e) => {
                    let shared = Arc::new(e);
                    (0..answers.len())
                        .map(|_| Err(Error::unavailable_because("database", shared.clone())))
                        .collect()
                }
            };
            let committed: Vec<bool> = outcomes
                .iter()
                .map(|o| matches!(o, Ok(Recorded::Stored)))
                .collect();
            for (answer, outcome) in answers.into_iter().zip(outcomes) {
                let _ = answer.send(outcome);
            }
            self.settle(committed_by_voucher(reservations, &committed));
        }
    }

    /// The records of orders now committed move P -> A in the gate, one call per voucher,
    /// off the answers' path. Best effort: a record left in P whose row exists is settled
    /// by reconciliation, and is never given back meanwhile.
    fn settle(&self, stored: BTreeMap<VoucherCode, Vec<Reservation>>) {
        if stored.is_empty() {
            return;
        }
        let gate = self.gate.clone();
        tokio::spawn(async move {
            for (code, committed) in stored {
                if let Err(e) = gate.settle_committed(&code, &committed).await {
                    tracing::debug!(error = %e.chain(), %code, "committed orders not settled in the gate; reconciliation will");
                }
            }
        });
    }
}

/// The reservations of a batch whose rows this batch committed (`committed[i]`), by
/// voucher; the batch is no longer needed once answered, so nothing is copied.
fn committed_by_voucher(
    batch: Vec<Reservation>,
    committed: &[bool],
) -> BTreeMap<VoucherCode, Vec<Reservation>> {
    let mut stored: BTreeMap<VoucherCode, Vec<Reservation>> = BTreeMap::new();
    for (r, _) in batch.into_iter().zip(committed).filter(|(_, c)| **c) {
        stored.entry(r.voucher_code.clone()).or_default().push(r);
    }
    stored
}
