//! PostgreSQL's last word on flash reservations (`flash.decision = "database"`): the rows
//! of uses the gate took are committed in grouped transactions before anyone gets a 201.
//!
//! Reservations queue on a channel; each of `record_workers` tasks takes whatever has
//! queued (up to `record_batch_max`) and records it in one transaction
//! (`store::record_decided`: the voucher's and the customer's counted limits and the
//! orderId's uniqueness are checked there). No batch waits for company: under load the
//! queue fills while the previous transactions run, so batches grow with the load.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, Mutex};

use super::gate::Generation;
use crate::domain::Reservation;
use crate::error::Error;
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
}

#[derive(Clone)]
pub struct Recorder {
    queue: mpsc::Sender<Job>,
}

impl Recorder {
    /// Starts `workers` recording tasks on `store`; they end when every `Recorder` clone
    /// is dropped.
    pub fn start(store: Store, workers: usize, batch_max: usize) -> Self {
        let batch_max = batch_max.max(1);
        let (queue, jobs) = mpsc::channel(batch_max * workers.max(1) * 4);
        let jobs = Arc::new(Mutex::new(jobs));
        for _ in 0..workers.max(1) {
            tokio::spawn(work(store.clone(), jobs.clone(), batch_max));
        }
        Self { queue }
    }

    /// Records `reservation` and waits for PostgreSQL's answer. An error means the outcome
    /// is unknown (the transaction may have committed): the use stays held and a retry of
    /// the same order records again, which is a no-op if it did commit.
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
            })
            .await
            .map_err(|_| Error::unavailable("reservation recorder (stopped)"))?;
        answered
            .await
            .map_err(|_| Error::unavailable("reservation recorder (stopped)"))?
    }
}

/// One worker: takes what has queued, records it, answers each waiter.
async fn work(store: Store, jobs: Arc<Mutex<mpsc::Receiver<Job>>>, batch_max: usize) {
    loop {
        let mut batch = Vec::new();
        {
            let mut jobs = jobs.lock().await;
            if jobs.recv_many(&mut batch, batch_max).await == 0 {
                return;
            }
        }
        let generations: Vec<i64> = batch.iter().map(|job| job.generation.0).collect();
        let (reservations, answers): (Vec<Reservation>, Vec<_>) = batch
            .into_iter()
            .map(|job| (job.reservation, job.answer))
            .unzip();
        match store.record_decided(&reservations, &generations).await {
            Ok(Recording::NotSent(e)) => {
                tracing::warn!(error = %e.chain(), "no database connection; reservations not recorded");
                for answer in answers {
                    let _ = answer.send(Ok(Recorded::NotSent));
                }
            }
            Ok(Recording::Done(result)) => {
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
                for (answer, outcome) in answers.into_iter().zip(outcomes) {
                    let _ = answer.send(Ok(outcome));
                }
            }
            Err(e) => {
                let shared = Arc::new(e);
                for answer in answers {
                    let _ =
                        answer.send(Err(Error::unavailable_because("database", shared.clone())));
                }
            }
        }
    }
}
