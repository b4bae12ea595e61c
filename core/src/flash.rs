//! Flash mode: the Redis gate decides, Kafka carries the decision, PostgreSQL records it.
//!
//! A reservation answers 201 only after its event is acknowledged by the broker, so every
//! 201 ends up as a row (the consumer is at-least-once and idempotent). When the broker's
//! answer is ambiguous (a timeout: the event may or may not be written), the use stays held
//! and the client gets 503; its retry with the same orderId re-publishes the same event and
//! gets the 201 once that is acknowledged. A use whose event was certainly not written is
//! given back at once; one whose event never reached the database is given back by
//! reconciliation, after the consumer has caught up past any late write.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeZone, Utc};

use crate::config::{FlashSettings, KafkaSettings};
use crate::domain::{
    CustomerId, Money, OrderId, Reservation, ReservationRequest, ReservationStatus, Voucher,
    VoucherCode,
};
use crate::events::progress::Progress;
use crate::events::publisher::{PublishError, Publisher};
use crate::events::ReservedEvent;
use crate::gate::{
    Gate, GateDecision, GateLoad, GiveBack, OrderRecord, RecordState, Refusal, ReleaseOutcome,
};
use crate::metrics::Metrics;
use crate::store::{ReserveOutcome, Store};
use crate::{Error, Result};

#[derive(Clone)]
pub struct FlashPath {
    inner: Arc<Inner>,
}

struct Inner {
    gate: Gate,
    publisher: Publisher,
    progress: Progress,
    store: Store,
    metrics: Arc<Metrics>,
    settings: FlashSettings,
    /// After a gate is lost, a reservation that passed it just before may still be
    /// publishing for this long: the rebuild waits it out.
    message_timeout: Duration,
    /// Vouchers whose gate this instance is rebuilding (one rebuild each at a time).
    rebuilding: Mutex<HashSet<VoucherCode>>,
}

fn at(ms: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ms).single().unwrap_or_default()
}

fn status_of(state: RecordState) -> ReservationStatus {
    match state {
        RecordState::Pending | RecordState::Accepted => ReservationStatus::Reserved,
        RecordState::Confirmed => ReservationStatus::Confirmed,
        RecordState::Released => ReservationStatus::Released,
    }
}

fn state_of(status: ReservationStatus) -> RecordState {
    match status {
        ReservationStatus::Reserved => RecordState::Accepted,
        ReservationStatus::Confirmed => RecordState::Confirmed,
        ReservationStatus::Released => RecordState::Released,
    }
}

/// The reservation a gate record stands for.
fn reservation(request: &ReservationRequest, record: &OrderRecord) -> Result<Reservation> {
    Ok(Reservation {
        order_id: request.order_id.clone(),
        voucher_code: request.voucher_code.clone(),
        customer_id: CustomerId::parse(record.customer_id.clone())
            .map_err(|_| Error::Internal("gate record with invalid customer".into()))?,
        order_amount: Money::from_db(record.order_amount),
        discount_amount: Money::from_db(record.discount_amount),
        status: status_of(record.state),
        reserved_at: at(record.reserved_ms),
        expires_at: at(record.expires_ms),
    })
}

fn event(request: &ReservationRequest, record: &OrderRecord) -> ReservedEvent {
    ReservedEvent {
        voucher_code: request.voucher_code.to_string(),
        order_id: request.order_id.to_string(),
        customer_id: record.customer_id.clone(),
        order_amount: record.order_amount,
        discount_amount: record.discount_amount,
        reserved_at_ms: record.reserved_ms,
        expires_at_ms: record.expires_ms,
    }
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
                progress: Progress::new(kafka)?,
                store,
                metrics,
                settings,
                message_timeout: Duration::from_millis(kafka.message_timeout_ms),
                rebuilding: Mutex::new(HashSet::new()),
            }),
        })
    }

    pub fn gate(&self) -> &Gate {
        &self.inner.gate
    }

    pub fn progress(&self) -> &Progress {
        &self.inner.progress
    }

    /// Loads the gate of a voucher just created: nothing can have been published for it.
    pub async fn warm_up(&self, voucher: &Voucher) -> Result<()> {
        let state = GateLoad {
            remaining: i64::from(voucher.total_limit),
            ..Default::default()
        };
        self.inner.gate.load(voucher, &state).await?;
        Ok(())
    }

    pub async fn reserve(
        &self,
        voucher: &Arc<Voucher>,
        request: &ReservationRequest,
        ttl: chrono::Duration,
    ) -> Result<ReserveOutcome> {
        // At most twice: a retry that finds its pending record forgotten by reconciliation
        // (its event was never recorded) reserves anew.
        for _ in 0..2 {
            let now = Utc::now().timestamp_millis();
            let started = Instant::now();
            let decision = self
                .inner
                .gate
                .reserve(request, now, ttl.num_milliseconds())
                .await?;
            self.inner
                .metrics
                .gate_duration
                .observe(started.elapsed().as_secs_f64());
            match decision {
                GateDecision::Refused(refusal) => return Err(refused(refusal)),
                GateDecision::NotLoaded => {
                    self.trigger_rebuild(voucher.clone());
                    return Err(Error::Unavailable("voucher gate (rebuilding)"));
                }
                GateDecision::Reserved(record) => return self.publish_new(request, record).await,
                GateDecision::Exists(record) => {
                    let same = record.customer_id == request.customer_id.as_str()
                        && record.order_amount == request.order_amount.minor_units();
                    if !same {
                        return Err(Error::OrderIdConflict);
                    }
                    if record.state != RecordState::Pending {
                        return Ok(ReserveOutcome::Retried(reservation(request, &record)?));
                    }
                    match self.republish(request, record).await? {
                        Some(outcome) => return Ok(outcome),
                        None => continue,
                    }
                }
            }
        }
        Err(Error::Unavailable("voucher gate"))
    }

    /// A use just taken: claim the orderId, publish, then answer.
    async fn publish_new(
        &self,
        request: &ReservationRequest,
        record: OrderRecord,
    ) -> Result<ReserveOutcome> {
        let gate = &self.inner.gate;
        let forget_mine = GiveBack::Forget {
            states: vec![RecordState::Pending],
            published_by_ms: record.publish_ms,
        };
        // One orderId, one voucher: the gate's records are per voucher, so a global claim
        // catches the same orderId on two flash vouchers.
        match gate
            .claim_order(&request.order_id, &request.voucher_code)
            .await
        {
            Ok(true) => {}
            Ok(false) => {
                gate.release(&request.voucher_code, &request.order_id, forget_mine)
                    .await?;
                return Err(Error::OrderIdConflict);
            }
            Err(e) => {
                gate.release(&request.voucher_code, &request.order_id, forget_mine)
                    .await?;
                return Err(e);
            }
        }
        match self.publish(request, &record).await {
            Ok(()) => Ok(ReserveOutcome::Reserved(
                self.acknowledged(request, record).await?,
            )),
            Err(PublishError::NotWritten(e)) => {
                tracing::warn!(error = %e, "event not written; giving the use back");
                // Only if no retry has started a publish of its own since.
                gate.release(&request.voucher_code, &request.order_id, forget_mine)
                    .await?;
                Err(Error::Unavailable("event broker"))
            }
            Err(PublishError::Ambiguous(e)) => {
                tracing::warn!(error = %e, "event may or may not be written; the use stays held");
                Err(Error::Unavailable("event broker"))
            }
        }
    }

    /// A retry of an order whose event is not yet acknowledged: publish it again (the
    /// consumer ignores the duplicate). `None` when reconciliation forgot the order.
    async fn republish(
        &self,
        request: &ReservationRequest,
        record: OrderRecord,
    ) -> Result<Option<ReserveOutcome>> {
        let now = Utc::now().timestamp_millis();
        let touched = self
            .inner
            .gate
            .mark(
                &request.voucher_code,
                &request.order_id,
                &[RecordState::Pending],
                RecordState::Pending,
                Some(now),
            )
            .await?;
        match touched {
            None => return Ok(None),
            Some(RecordState::Pending) => {}
            // Acknowledged (or moved on) meanwhile: answer from the record.
            Some(_) => {
                let current = self
                    .inner
                    .gate
                    .record(&request.voucher_code, &request.order_id)
                    .await?;
                return match current {
                    Some(r) => Ok(Some(ReserveOutcome::Retried(reservation(request, &r)?))),
                    None => Ok(None),
                };
            }
        }
        match self.publish(request, &record).await {
            Ok(()) => Ok(Some(ReserveOutcome::Retried(
                self.acknowledged(request, record).await?,
            ))),
            Err(e) => {
                tracing::warn!(error = %e, "re-publish failed; the use stays held");
                Err(Error::Unavailable("event broker"))
            }
        }
    }

    async fn publish(
        &self,
        request: &ReservationRequest,
        record: &OrderRecord,
    ) -> Result<(), PublishError> {
        let started = Instant::now();
        let result = self.inner.publisher.publish(&event(request, record)).await;
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

    /// The event is acknowledged: the record goes P -> A and the reservation is answered.
    async fn acknowledged(
        &self,
        request: &ReservationRequest,
        mut record: OrderRecord,
    ) -> Result<Reservation> {
        self.mark_accepted(request).await;
        record.state = RecordState::Accepted;
        reservation(request, &record)
    }

    /// P -> A once the event is acknowledged. Failing here changes nothing that matters:
    /// a pending record whose row exists is never forgotten.
    async fn mark_accepted(&self, request: &ReservationRequest) {
        let marked = self
            .inner
            .gate
            .mark(
                &request.voucher_code,
                &request.order_id,
                &[RecordState::Pending],
                RecordState::Accepted,
                None,
            )
            .await;
        if let Err(e) = marked {
            tracing::warn!(error = %e, "cannot mark the record accepted");
        }
    }

    /// Confirm or release in PostgreSQL, once the consumer has written the row, then bring
    /// the gate's record in step.
    pub async fn confirm(&self, code: &VoucherCode, order_id: &OrderId) -> Result<Reservation> {
        let confirmed = self
            .when_recorded(code, order_id, || {
                self.inner.store.confirm(code, order_id, Utc::now())
            })
            .await?;
        let marked = self
            .inner
            .gate
            .mark(
                code,
                order_id,
                &[RecordState::Pending, RecordState::Accepted],
                RecordState::Confirmed,
                None,
            )
            .await;
        if let Err(e) = marked {
            tracing::warn!(error = %e, "confirmed in PostgreSQL; gate record not updated");
        }
        Ok(confirmed)
    }

    pub async fn release(&self, code: &VoucherCode, order_id: &OrderId) -> Result<Reservation> {
        let released = self
            .when_recorded(code, order_id, || {
                self.inner.store.release(code, order_id, Utc::now())
            })
            .await?;
        self.give_back_released(code, order_id).await;
        Ok(released)
    }

    /// After PostgreSQL released an order: the gate gives its use back. If Redis fails
    /// here, reconciliation gives it back later (an undersell meanwhile, never an oversell).
    pub async fn give_back_released(&self, code: &VoucherCode, order_id: &OrderId) {
        match self
            .inner
            .gate
            .release(code, order_id, GiveBack::Release)
            .await
        {
            Ok(ReleaseOutcome::Released | ReleaseOutcome::Already) => {}
            Ok(other) => {
                tracing::info!(?other, %order_id, "released in PostgreSQL; nothing held in the gate")
            }
            Err(e) => {
                tracing::warn!(error = %e, %order_id, "released in PostgreSQL; the gate will be reconciled")
            }
        }
    }

    /// Runs `op` on the order's row; while the row is not written yet but the gate holds the
    /// order (the consumer is a moment behind), waits for it, up to `row_wait_ms`.
    async fn when_recorded<F, Fut>(
        &self,
        code: &VoucherCode,
        order_id: &OrderId,
        op: F,
    ) -> Result<Reservation>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<Reservation>>,
    {
        let deadline = Instant::now() + Duration::from_millis(self.inner.settings.row_wait_ms);
        loop {
            match op().await {
                Err(Error::ReservationNotFound) => {
                    let held = self.inner.gate.record(code, order_id).await?;
                    if held.is_none() {
                        return Err(Error::ReservationNotFound);
                    }
                    if Instant::now() >= deadline {
                        return Err(Error::Unavailable(
                            "event consumer (reservation not yet recorded)",
                        ));
                    }
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
                other => return other,
            }
        }
    }

    /// Starts a rebuild of the voucher's gate unless this instance is already at it.
    pub fn trigger_rebuild(&self, voucher: Arc<Voucher>) {
        {
            let mut rebuilding = self
                .inner
                .rebuilding
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if !rebuilding.insert(voucher.code.clone()) {
                return;
            }
        }
        let this = self.clone();
        tokio::spawn(async move {
            let result = this.rebuild(&voucher).await;
            let label = match &result {
                Ok(Rebuild::Loaded) => "loaded",
                Ok(Rebuild::AlreadyLoaded) => "already_loaded",
                Ok(Rebuild::NotCaughtUp) => "not_caught_up",
                Err(_) => "error",
            };
            this.inner
                .metrics
                .gate_rebuilds
                .with_label_values(&[label])
                .inc();
            match result {
                Ok(outcome) => tracing::info!(code = %voucher.code, ?outcome, "gate rebuild"),
                Err(e) => tracing::warn!(code = %voucher.code, error = %e, "gate rebuild failed"),
            }
            let mut rebuilding = this
                .inner
                .rebuilding
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            rebuilding.remove(&voucher.code);
        });
    }

    /// Rebuilds a lost gate from PostgreSQL, but only once PostgreSQL holds every event
    /// published for the voucher: otherwise the gate would count too few uses and oversell.
    pub async fn rebuild(&self, voucher: &Voucher) -> Result<Rebuild> {
        // 1. A reservation that passed the gate just before it was lost may still be
        //    publishing; after message_timeout its event is written or never will be.
        tokio::time::sleep(self.inner.message_timeout).await;
        // 2. Every event published so far is in PostgreSQL once the group caught up.
        let timeout = Duration::from_millis(self.inner.settings.catch_up_timeout_ms);
        let caught_up = self
            .inner
            .progress
            .wait_caught_up(timeout)
            .await
            .map_err(|e| Error::Internal(format!("consumer progress: {e}")))?;
        if !caught_up {
            return Ok(Rebuild::NotCaughtUp);
        }
        // 3. The gate as PostgreSQL knows it.
        let rows = self.inner.store.voucher_reservations(&voucher.code).await?;
        let mut users: HashMap<String, i64> = HashMap::new();
        let mut active = 0;
        let mut orders = Vec::with_capacity(rows.len());
        for r in rows {
            if r.status != ReservationStatus::Released {
                active += 1;
                *users.entry(r.customer_id.to_string()).or_default() += 1;
            }
            let reserved_ms = r.reserved_at.timestamp_millis();
            orders.push((
                r.order_id.to_string(),
                OrderRecord {
                    state: state_of(r.status),
                    customer_id: r.customer_id.to_string(),
                    order_amount: r.order_amount.minor_units(),
                    discount_amount: r.discount_amount.minor_units(),
                    reserved_ms,
                    expires_ms: r.expires_at.timestamp_millis(),
                    publish_ms: reserved_ms,
                },
            ));
        }
        let state = GateLoad {
            remaining: i64::from(voucher.total_limit) - active,
            users: users.into_iter().collect(),
            orders,
        };
        // 4. Load, unless another instance got there first.
        if self.inner.gate.load(voucher, &state).await? {
            self.inner.gate.announce_available(&voucher.code).await;
            Ok(Rebuild::Loaded)
        } else {
            Ok(Rebuild::AlreadyLoaded)
        }
    }
}

/// How a rebuild ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rebuild {
    Loaded,
    AlreadyLoaded,
    /// The consumer did not catch up in time; the next reservation tries again.
    NotCaughtUp,
}

fn refused(refusal: Refusal) -> Error {
    use crate::domain::Ineligibility;
    match refusal {
        Refusal::NotStarted => Error::NotEligible(Ineligibility::NotStarted),
        Refusal::Expired => Error::NotEligible(Ineligibility::Expired),
        Refusal::BelowMinOrder => Error::NotEligible(Ineligibility::BelowMinOrder),
        Refusal::OutOfStock => Error::OutOfStock,
        Refusal::AlreadyUsed => Error::AlreadyUsed,
    }
}
