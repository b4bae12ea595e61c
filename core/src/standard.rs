//! Standard mode's reservations, decided by PostgreSQL in groups.
//!
//! Concurrent reservations queue (`crate::batching`); each of `standard.group_workers`
//! tasks takes what has queued, waits up to `standard.group_linger` for more (up to
//! `standard.group_batch_max`), and has the group decided on a connection it keeps
//! (`DecidedWriter::reserve_standard`, the statements flash mode's recorder uses). The
//! first statement writes the group as it is: a request outside the window or below the
//! minimum (on PostgreSQL's clock) or on a voucher already sold out is refused from the
//! voucher's locked row, a repeat of an order is skipped by the unique orderId and
//! answered from its row, and the CHECKs refuse the statement if the rest crosses a limit;
//! a group they refuse is decided by one more, reservation by reservation, the customers'
//! limits then the voucher's, in arrival order. The rows' times are PostgreSQL's. One
//! statement takes the voucher's row lock once for the whole group, where one transaction
//! per reservation took it once per use: that lock is what a hot voucher queues on.
//!
//! Nothing is lost when a statement fails: it is one transaction, so either the group's
//! rows are all committed or none is; every waiter gets 503 and its retry is answered
//! from the row if the commit happened after all.

use std::collections::HashMap;
use std::sync::Arc;

use chrono::Utc;
use tokio::sync::oneshot;

use crate::batching::{self, Batches, Queue};
use crate::config::StandardSettings;
use crate::domain::{Ineligibility, Reservation, ReservationRequest, ReservationStatus, Voucher};
use crate::error::constraint_error;
use crate::metrics::Metrics;
use crate::store::{BatchResult, DecidedWriter, Recording, ReserveOutcome, Store, Written};
use crate::{Error, Result};

struct Job {
    reservation: Reservation,
    answer: oneshot::Sender<Result<ReserveOutcome>>,
}

/// The front door of standard mode's reservations.
#[derive(Clone)]
pub struct Grouper {
    queue: Queue<Job>,
}

impl Grouper {
    /// Starts the grouping tasks on `store`; reservations expire `ttl` after PostgreSQL
    /// reserved them. The tasks end when every `Grouper` clone is dropped.
    pub fn start(
        store: &Store,
        settings: &StandardSettings,
        ttl: chrono::Duration,
        metrics: Arc<Metrics>,
    ) -> Self {
        let workers = settings.group_workers.max(1);
        let (queue, batches) = batching::queue(
            workers,
            settings.group_batch_max,
            settings.group_linger,
            &metrics,
            "standard",
        );
        for _ in 0..workers {
            let worker = Worker {
                writer: store.decided_writer(),
                batches: batches.clone(),
                ttl,
                metrics: metrics.clone(),
            };
            tokio::spawn(worker.run());
        }
        Self { queue }
    }

    /// Decides `request` on `voucher` with the group it lands in, and waits for the answer.
    /// An error of the database means the outcome is unknown (the commit may have
    /// happened): a retry of the same order is answered from its row if it did.
    pub async fn reserve(
        &self,
        voucher: &Voucher,
        request: &ReservationRequest,
    ) -> Result<ReserveOutcome> {
        // The times are PostgreSQL's, set by the statement; these are never stored.
        let now = Utc::now();
        let reservation = Reservation {
            order_id: request.order_id.clone(),
            voucher_code: request.voucher_code.clone(),
            customer_id: request.customer_id.clone(),
            order_amount: request.order_amount,
            discount_amount: voucher.discount_for(request.order_amount),
            status: ReservationStatus::Reserved,
            reserved_at: now,
            expires_at: now,
        };
        let (answer, answered) = oneshot::channel();
        self.queue
            .send(Job {
                reservation,
                answer,
            })
            .await
            .map_err(|_| Error::unavailable("reservation grouper (stopped)"))?;
        answered
            .await
            .map_err(|_| Error::unavailable("reservation grouper (stopped)"))?
    }
}

/// One grouping task.
struct Worker {
    writer: DecidedWriter,
    batches: Batches<Job>,
    ttl: chrono::Duration,
    metrics: Arc<Metrics>,
}

impl Worker {
    async fn run(mut self) {
        while let Some(batch) = self.batches.next().await {
            let (reservations, answers): (Vec<Reservation>, Vec<_>) = batch
                .into_iter()
                .map(|job| (job.reservation, job.answer))
                .unzip();
            let outcomes = match self.writer.reserve_standard(&reservations, self.ttl).await {
                Ok(Recording::Done(result)) => {
                    self.metrics
                        .group_transactions
                        .with_label_values(&["standard"])
                        .inc_by(result.transactions as u64);
                    answers_of(reservations, result)
                }
                // No connection (nothing sent), or the statement failed: either way nothing
                // of the group was committed but by a commit whose answer was lost, which
                // a retry finds as the row.
                Ok(Recording::NotSent(e)) | Err(e) => {
                    let shared = Arc::new(e);
                    (0..answers.len())
                        .map(|_| Err(Error::unavailable_because("database", shared.clone())))
                        .collect()
                }
            };
            for (answer, outcome) in answers.into_iter().zip(outcomes) {
                let _ = answer.send(outcome);
            }
        }
    }
}

/// Each reservation's answer from what its group's statement did.
fn answers_of(batch: Vec<Reservation>, result: BatchResult) -> Vec<Result<ReserveOutcome>> {
    let mut answers: Vec<Option<Result<ReserveOutcome>>> = (0..batch.len()).map(|_| None).collect();
    for (i, row) in result.repeats {
        if let Some(answer) = answers.get_mut(i) {
            *answer = Some(Ok(ReserveOutcome::Retried(row)));
        }
    }
    for (i, reason) in result.refused {
        if let Some(answer) = answers.get_mut(i) {
            *answer = Some(Err(refusal(&reason)));
        }
    }
    for i in result.stale {
        // Standard reservations carry no gate generation; never stale.
        if let Some(answer) = answers.get_mut(i) {
            *answer = Some(Err(Error::internal(anyhow::anyhow!(
                "a standard reservation was fenced as stale"
            ))));
        }
    }
    // Looked up once per reservation: a linear search per reservation was quadratic in
    // the group's size, on the hot path.
    let written: HashMap<&str, &Written> = result
        .written
        .iter()
        .map(|w| (w.order_id.as_str(), w))
        .collect();
    batch
        .into_iter()
        .zip(answers)
        .map(|(mut reservation, answer)| {
            answer.unwrap_or_else(|| {
                // Neither repeated, refused nor stale: written by this statement.
                let written = written.get(reservation.order_id.as_str()).ok_or_else(|| {
                    Error::internal(anyhow::anyhow!("a written reservation has no row"))
                })?;
                reservation.reserved_at = written.reserved_at;
                reservation.expires_at = written.expires_at;
                reservation.discount_amount = written.discount_amount;
                Ok(ReserveOutcome::Reserved(reservation))
            })
        })
        .collect()
}

/// The answer to a reservation the statement refused, by the name it gave.
fn refusal(reason: &str) -> Error {
    match reason {
        "not_started" => Error::NotEligible(Ineligibility::NotStarted),
        "expired" => Error::NotEligible(Ineligibility::Expired),
        "below_min_order" => Error::NotEligible(Ineligibility::BelowMinOrder),
        "redemptions_voucher_fkey" => Error::VoucherNotFound,
        other => constraint_error(other)
            .unwrap_or_else(|| Error::corrupt(format!("reservation refused by {other}"))),
    }
}
