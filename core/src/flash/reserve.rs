//! The reserve use case of flash mode: the gate takes a use, then PostgreSQL's commit turns
//! it into a 201; with the broker deciding, the orderId is claimed across vouchers first
//! and the event's acknowledgement turns it into a 201.
//!
//! With PostgreSQL deciding, the gate script is the request's only Redis call: the
//! orderId's uniqueness across vouchers rests on `redemptions`' unique orderId (a second
//! voucher's commit is refused, its use goes back, `ORDER_ID_CONFLICT`), and the record's
//! move to "decided" is made for the recorder's whole batch at once, after the answers.
//!
//! A retry is answered from PostgreSQL's row whenever one exists: its status, amount,
//! discount and expiry, whatever the gate's record says (a gate restored from an older
//! snapshot, or a replica promoted behind its master, can hold a record behind the row).
//! A record that disagrees with the row is brought in step. The record answers only
//! while no row exists.

use std::sync::Arc;
use std::time::Instant;

use super::events::publisher::{PublishError, Publisher};
use super::events::ReservedEvent;
use super::gate::{
    GateDecision, Generation, GiveBack, MarkAlso, OrderRecord, RecordState, Refusal,
};
use super::recorder::{Recorded, Recorder};
use super::{Decider, FlashPath};
use crate::domain::{Reservation, ReservationRequest, ReservationStatus, Voucher};
use crate::store::ReserveOutcome;
use crate::{Error, Result};

/// Whether a recording is the order's first attempt (its record was just made by this
/// request) or a retry's (an earlier attempt's commit may be unknown).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Attempt {
    First,
    Retry,
}

impl FlashPath {
    pub async fn reserve(
        &self,
        voucher: &Arc<Voucher>,
        request: &ReservationRequest,
        ttl: chrono::Duration,
    ) -> Result<ReserveOutcome> {
        // At most twice: a retry that finds its pending record forgotten by reconciliation
        // (its event was never recorded) reserves anew.
        for _ in 0..2 {
            let decision = self.decide(request, ttl).await?;
            match decision {
                // The gate knows no record of this order (it may have lost it: restored from
                // an older snapshot). A row in PostgreSQL is still the answer to a retry,
                // before any refusal that a retry of a served order can meet: sold out,
                // the customer's limit reached, the sale over, the voucher paused or
                // archived. (No order exists before the start, and a retry's amount met
                // the minimum the first time.)
                GateDecision::Refused(
                    refusal @ (Refusal::OutOfStock
                    | Refusal::AlreadyUsed
                    | Refusal::Expired
                    | Refusal::Paused
                    | Refusal::Archived),
                ) => {
                    let row = self.inner.lookups.find(&request.order_id).await?;
                    return match row {
                        Some(row) => self.answer_from_row(row, request, None).await,
                        None => Err(refusal.into()),
                    };
                }
                GateDecision::Refused(refusal) => return Err(refusal.into()),
                GateDecision::NotLoaded => {
                    self.trigger_rebuild(voucher.clone());
                    return Err(Error::unavailable("voucher gate (rebuilding)"));
                }
                GateDecision::Reserved(record, generation) => {
                    return self.publish_new(voucher, request, record, generation).await
                }
                GateDecision::Exists(record, generation) => {
                    let row = self.inner.lookups.find(&request.order_id).await?;
                    if let Some(row) = row {
                        return self.answer_from_row(row, request, Some(record.state)).await;
                    }
                    if !record.is_retry_by(&request.customer_id, request.order_amount) {
                        return Err(Error::OrderIdConflict);
                    }
                    if record.state != RecordState::Pending {
                        let stored =
                            record.reservation(&request.voucher_code, &request.order_id)?;
                        return Ok(ReserveOutcome::Retried(stored));
                    }
                    match self.republish(voucher, request, record, generation).await? {
                        Some(outcome) => return Ok(outcome),
                        None => continue,
                    }
                }
            }
        }
        Err(Error::unavailable("voucher gate"))
    }

    /// One run of the gate's reserve script, timed.
    async fn decide(
        &self,
        request: &ReservationRequest,
        ttl: chrono::Duration,
    ) -> Result<GateDecision> {
        let started = Instant::now();
        let decision = self
            .inner
            .gate
            .reserve(request, ttl.num_milliseconds())
            .await;
        self.inner
            .metrics
            .gate_duration
            .observe(started.elapsed().as_secs_f64());
        decision
    }

    /// A use just taken: record it (PostgreSQL deciding), or claim the orderId and publish;
    /// then answer.
    async fn publish_new(
        &self,
        voucher: &Arc<Voucher>,
        request: &ReservationRequest,
        record: OrderRecord,
        generation: Generation,
    ) -> Result<ReserveOutcome> {
        let publisher = match &self.inner.decider {
            Decider::Database { recorder, .. } => {
                let attempt = Attempt::First;
                return self
                    .decided_by_database(voucher, recorder, request, record, generation, attempt)
                    .await;
            }
            Decider::Broker { publisher } => publisher,
        };
        // One orderId, one voucher: the gate's records are per voucher, and with the broker
        // deciding nothing else sees the same orderId on two flash vouchers before the 201.
        let claimed = self
            .inner
            .gate
            .claim_order(&request.order_id, &request.voucher_code)
            .await;
        match claimed {
            Ok(true) => {}
            Ok(false) => return self.undo(request, &record, Error::OrderIdConflict).await,
            Err(e) => return self.undo(request, &record, e).await,
        }
        match self.publish(publisher, request, &record).await {
            Ok(()) => Ok(ReserveOutcome::Reserved(
                self.acknowledged(request, record, MarkAlso::Nothing)
                    .await?,
            )),
            Err(e) => {
                let certainly_not_written = matches!(e, PublishError::NotWritten(_));
                let answer = Error::unavailable_because("event broker", e);
                if certainly_not_written {
                    self.undo(request, &record, answer).await
                } else {
                    // Ambiguous: the use stays held; a retry re-publishes, reconciliation
                    // gives it back if the event never lands.
                    Err(answer)
                }
            }
        }
    }

    /// The use just taken goes back, since nothing will be recorded for it, unless a retry
    /// has started a publish of its own since; then answers `answer`. (A claim of the
    /// orderId, with the broker deciding, stays: a retry on another core may hold the order
    /// again by now, and the claim is what keeps it off a second voucher.)
    async fn undo(
        &self,
        request: &ReservationRequest,
        record: &OrderRecord,
        answer: Error,
    ) -> Result<ReserveOutcome> {
        let mine = GiveBack::Forget {
            states: vec![RecordState::Pending],
            published_by_ms: record.publish_ms,
        };
        self.give_back(&request.voucher_code, &request.order_id, mine)
            .await?;
        Err(answer)
    }

    /// A retry of an order whose event is not yet acknowledged: publish it again (the
    /// consumer ignores the duplicate). `None` when reconciliation forgot the order.
    async fn republish(
        &self,
        voucher: &Arc<Voucher>,
        request: &ReservationRequest,
        record: OrderRecord,
        generation: Generation,
    ) -> Result<Option<ReserveOutcome>> {
        let (code, order_id) = (&request.voucher_code, &request.order_id);
        let gate = &self.inner.gate;
        let touched = gate
            .mark(
                code,
                order_id,
                &[RecordState::Pending],
                RecordState::Pending,
                MarkAlso::Touch,
            )
            .await?;
        match touched {
            None => return Ok(None),
            Some(RecordState::Pending) => {}
            // Acknowledged (or moved on) meanwhile: answer from the record.
            Some(_) => {
                return match gate.record(code, order_id).await? {
                    Some(r) => Ok(Some(ReserveOutcome::Retried(
                        r.reservation(code, order_id)?,
                    ))),
                    None => Ok(None),
                };
            }
        }
        let publisher = match &self.inner.decider {
            Decider::Database { recorder, .. } => {
                let attempt = Attempt::Retry;
                return self
                    .decided_by_database(voucher, recorder, request, record, generation, attempt)
                    .await
                    .map(Some);
            }
            Decider::Broker { publisher } => publisher,
        };
        // The claim may have been lost with Redis since the first attempt: hold it again
        // before publishing, or refuse if another voucher took the orderId meanwhile.
        if !gate.claim_order(order_id, code).await? {
            return Err(Error::OrderIdConflict);
        }
        match self.publish(publisher, request, &record).await {
            Ok(()) => Ok(Some(ReserveOutcome::Retried(
                self.acknowledged(request, record, MarkAlso::Nothing)
                    .await?,
            ))),
            // Whatever the broker said, an earlier publish may have landed: the use stays held.
            Err(e) => Err(Error::unavailable_because("event broker", e)),
        }
    }

    /// PostgreSQL's last word (`flash.decision = "database"`): the row is committed, or
    /// the constraint that refused it is the answer: the refused order's record and use go
    /// back where they were (`forget_refused`), and a retry is decided anew. An error
    /// leaves the outcome unknown (503): the record stays pending, a retry records again
    /// (a no-op once committed), and reconciliation gives the use back if no row appears.
    /// Certainly not written (no statement was sent) on the order's first attempt: the use
    /// goes back at once (503).
    ///
    /// Recorded, the client gets its reservation, the record moves P -> A with its batch,
    /// and the event is published afterwards. Found recorded already (an earlier attempt's
    /// row, which the gate had lost), the row is the answer and the record is brought in
    /// step with it.
    async fn decided_by_database(
        &self,
        voucher: &Arc<Voucher>,
        recorder: &Recorder,
        request: &ReservationRequest,
        record: OrderRecord,
        generation: Generation,
        attempt: Attempt,
    ) -> Result<ReserveOutcome> {
        let recorded = self
            .record_in_database(voucher, recorder, request, &record, generation, attempt)
            .await?;
        if let Some(row) = recorded {
            return self
                .answer_from_row(row, request, Some(RecordState::Pending))
                .await;
        }
        // Decided. The record moves P -> A with the rest of its batch, in one call the
        // recorder makes after the answers (`settle.lua`): no Redis call of its own here.
        let mut decided = record;
        decided.state = RecordState::Accepted;
        let reservation = decided.reservation(&request.voucher_code, &request.order_id)?;
        self.publish_afterwards(request, &decided);
        Ok(match attempt {
            Attempt::First => ReserveOutcome::Reserved(reservation),
            Attempt::Retry => ReserveOutcome::Retried(reservation),
        })
    }

    /// Records the use; `Some(row)` when PostgreSQL held the order's row already.
    async fn record_in_database(
        &self,
        voucher: &Arc<Voucher>,
        recorder: &Recorder,
        request: &ReservationRequest,
        record: &OrderRecord,
        generation: Generation,
        attempt: Attempt,
    ) -> Result<Option<Reservation>> {
        let reservation = record.reservation(&request.voucher_code, &request.order_id)?;
        let started = Instant::now();
        let recorded = recorder.record(reservation, generation).await;
        self.inner
            .metrics
            .record_duration
            .observe(started.elapsed().as_secs_f64());
        match recorded? {
            Recorded::Stored => Ok(None),
            Recorded::Existing(row) => Ok(Some(row)),
            // Nothing was sent. On a retry an earlier attempt's commit may still be unknown,
            // so the use stays held (reconciliation settles it); on the first attempt
            // nothing else can have written this order's row.
            Recorded::NotSent => {
                let answer = || Error::unavailable("database (not sent)");
                match attempt {
                    Attempt::Retry => Err(answer()),
                    Attempt::First => match self.undo(request, record, answer()).await {
                        Ok(_) => Err(answer()),
                        Err(e) => Err(e),
                    },
                }
            }
            // The gate that decided it was replaced while it waited to be written: nothing
            // is held in PostgreSQL, and a new gate never counted it. This record (and
            // only this attempt's: a retry may have one in the new gate) goes; the client
            // retries, and the new gate decides.
            Recorded::Superseded => {
                // A gate still open under the generation that was refused was stranded: a
                // loader took the next generation and never reached the gate (it died, or
                // failed in between). Its rebuild finds it open and gives it the latest.
                if self.inner.gate.generation(&request.voucher_code).await? == Some(generation.0) {
                    self.trigger_rebuild(voucher.clone());
                }
                let answer = || Error::unavailable("voucher gate (reloaded while recording)");
                // Never stored: an error whatever the undo answers.
                match self.undo(request, record, answer()).await {
                    Ok(_) => Err(answer()),
                    Err(e) => Err(e),
                }
            }
            Recorded::Refused(reason) => {
                // A pause committed before the gate took it (its amend follows the commit)
                // is expected, briefly; any other refusal is the gate being wrong.
                if reason.starts_with("voucher_") {
                    tracing::info!(code = %request.voucher_code, order_id = %request.order_id, reason, "use refused by the voucher's state in PostgreSQL");
                } else {
                    tracing::warn!(
                        code = %request.voucher_code,
                        order_id = %request.order_id,
                        reason,
                        "the gate let through a use PostgreSQL refuses"
                    );
                }
                self.forget_refused(&request.voucher_code, &request.order_id)
                    .await?;
                Err(crate::error::constraint_error(&reason)
                    .unwrap_or_else(|| Error::corrupt(format!("refused by {reason}"))))
            }
        }
    }

    /// A retry answered from PostgreSQL's row: its status, amount, discount and expiry. The
    /// same orderId with another voucher, customer or amount is `ORDER_ID_CONFLICT`. A gate
    /// record (in `state`; `None`: the gate has none) that disagrees with the row is brought
    /// in step, best effort: a record still holding a use the row released gives it back;
    /// one behind a confirm or a commit moves on. A missing record is left to
    /// reconciliation, which repairs the counts.
    async fn answer_from_row(
        &self,
        row: Reservation,
        request: &ReservationRequest,
        state: Option<RecordState>,
    ) -> Result<ReserveOutcome> {
        if !row.is_retry_of(request) {
            return Err(Error::OrderIdConflict);
        }
        let (code, order_id) = (&row.voucher_code, &row.order_id);
        let gate = &self.inner.gate;
        let Some(state) = state else {
            return Ok(ReserveOutcome::Retried(row));
        };
        let corrected = match (row.status, state) {
            // Counted only when this retry gave the use back: a concurrent release or
            // another core's retry may have done it first.
            (ReservationStatus::Released, s) if s.holds() => {
                self.released_in_db(code, order_id).await
            }
            (ReservationStatus::Confirmed, RecordState::Pending | RecordState::Accepted) => {
                let from = [RecordState::Pending, RecordState::Accepted];
                gate.mark_best_effort(
                    code,
                    order_id,
                    &from,
                    RecordState::Confirmed,
                    MarkAlso::Settle,
                )
                .await;
                true
            }
            (ReservationStatus::Reserved, RecordState::Pending) => {
                let from = [RecordState::Pending];
                gate.mark_best_effort(
                    code,
                    order_id,
                    &from,
                    RecordState::Accepted,
                    MarkAlso::Settle,
                )
                .await;
                false
            }
            _ => false,
        };
        if corrected {
            tracing::warn!(%code, %order_id, status = ?row.status, gate = ?state, "gate record behind PostgreSQL's row; corrected");
            self.inner
                .metrics
                .reconciled
                .with_label_values(&["replay_corrected"])
                .inc();
        }
        Ok(ReserveOutcome::Retried(row))
    }

    /// The event of a use PostgreSQL holds, for whoever reads the topic; the client has its
    /// answer already, so a broker that is slow or down delays nobody. Queued, never
    /// awaited (`Announcer`).
    fn publish_afterwards(&self, request: &ReservationRequest, record: &OrderRecord) {
        if let Decider::Database { announcer, .. } = &self.inner.decider {
            announcer.announce(ReservedEvent::new(
                &request.voucher_code,
                &request.order_id,
                record,
            ));
        }
    }

    async fn publish(
        &self,
        publisher: &Publisher,
        request: &ReservationRequest,
        record: &OrderRecord,
    ) -> Result<(), PublishError> {
        let started = Instant::now();
        let event = ReservedEvent::new(&request.voucher_code, &request.order_id, record);
        let result = publisher.publish(&event).await;
        let label = match &result {
            Ok(()) => "ok",
            Err(PublishError::NotWritten(_)) => "not_written",
            Err(PublishError::Ambiguous(_)) => "ambiguous",
        };
        self.inner
            .metrics
            .publish_duration
            .with_label_values(&[label])
            .observe(started.elapsed().as_secs_f64());
        result
    }

    /// The event is acknowledged (or the row committed, `also` then settles the order):
    /// the record goes P -> A and the reservation is answered. Failing to mark changes
    /// nothing that matters: a pending record whose row exists is never forgotten.
    async fn acknowledged(
        &self,
        request: &ReservationRequest,
        mut record: OrderRecord,
        also: MarkAlso,
    ) -> Result<Reservation> {
        let (code, order_id) = (&request.voucher_code, &request.order_id);
        self.inner
            .gate
            .mark_best_effort(
                code,
                order_id,
                &[RecordState::Pending],
                RecordState::Accepted,
                also,
            )
            .await;
        record.state = RecordState::Accepted;
        record.reservation(code, order_id)
    }
}
