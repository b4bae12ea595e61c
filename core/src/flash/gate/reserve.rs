//! The gate on a reservation's path: the reserve script's decision, moving an order's
//! record along (`mark`, and `settle` for a recorder's committed batch), giving a use back
//! (`release`), and, with the broker deciding, the orderId's claim across vouchers.
//! Scripts: `lua/reserve/`.

use super::{redis_down, Gate, Generation, OrderRecord, RecordState};
use crate::domain::{Ineligibility, OrderId, Reservation, ReservationRequest, VoucherCode};
use crate::{Error, Result};

/// What the reserve script decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GateDecision {
    /// The gate holds nothing for this voucher: rebuild it before deciding.
    NotLoaded,
    /// This orderId already has a record: answer from it.
    Exists(OrderRecord, Generation),
    /// A use was taken; its record is Pending until the event is acknowledged.
    Reserved(OrderRecord, Generation),
    Refused(Refusal),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    NotStarted,
    Expired,
    BelowMinOrder,
    OutOfStock,
    AlreadyUsed,
    /// An operator paused the voucher (the gate holds its state, `amend.lua`).
    Paused,
    Archived,
}

/// A refusal is the same answer standard mode gives for the same reason.
impl From<Refusal> for Error {
    fn from(refusal: Refusal) -> Self {
        match refusal {
            Refusal::NotStarted => Error::NotEligible(Ineligibility::NotStarted),
            Refusal::Expired => Error::NotEligible(Ineligibility::Expired),
            Refusal::BelowMinOrder => Error::NotEligible(Ineligibility::BelowMinOrder),
            Refusal::OutOfStock => Error::OutOfStock,
            Refusal::AlreadyUsed => Error::AlreadyUsed,
            Refusal::Paused => Error::VoucherPaused,
            Refusal::Archived => Error::VoucherArchived,
        }
    }
}

/// What the release script did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseOutcome {
    Released,
    /// The record exists but held nothing (already released).
    Already,
    Absent,
    /// Not forgotten: the record changed state, or a publish of its event may still land.
    Busy,
    NotLoaded,
}

/// What a mark does besides moving the record's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkAlso {
    Nothing,
    /// Its latest publish starts now (by Redis's clock): a retry re-publishing.
    Touch,
    /// Its row is known to be in PostgreSQL: off the unsettled set.
    Settle,
}

/// How a use is given back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GiveBack {
    /// The order was released in PostgreSQL: keep the record as released, so a retry of
    /// the order is answered, not re-run.
    Release,
    /// The order's event was never recorded: drop the record, if it is still in one of
    /// `states` and its latest publish started at or before `published_by_ms`.
    Forget {
        states: Vec<RecordState>,
        published_by_ms: i64,
    },
}

/// How long an orderId stays claimed by its voucher: far longer than any sale.
pub(super) const ORDER_CLAIM_TTL_SECS: u64 = 30 * 24 * 3600;

impl Gate {
    /// Runs the reserve script. The script reads the time from Redis: no core's clock
    /// decides the sale window or the TTL.
    #[tracing::instrument(name = "gate.reserve", skip_all, fields(code = %request.voucher_code))]
    pub async fn reserve(&self, request: &ReservationRequest, ttl_ms: i64) -> Result<GateDecision> {
        let k = self.keys(&request.voucher_code);
        let reply: Vec<String> = self
            .scripts
            .reserve
            .key(&k.meta)
            .key(&k.remaining)
            .key(&k.users)
            .key(&k.orders)
            .key(&k.unsettled)
            .arg(request.order_id.as_str())
            .arg(request.customer_id.as_str())
            .arg(request.order_amount.minor_units())
            .arg(ttl_ms)
            .arg(&self.sold_out_channel)
            .arg(request.voucher_code.as_str())
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(redis_down)?;
        let outcome = reply.first().map(String::as_str).unwrap_or("");
        let record = || {
            reply
                .get(1)
                .ok_or_else(|| Error::corrupt("gate reply without record"))
                .and_then(|r| OrderRecord::parse(r))
        };
        let generation = || {
            reply
                .get(2)
                .and_then(|g| g.parse().ok())
                .map(Generation)
                .ok_or_else(|| Error::corrupt("gate reply without generation"))
        };
        Ok(match outcome {
            "NOT_LOADED" => GateDecision::NotLoaded,
            "EXISTS" => GateDecision::Exists(record()?, generation()?),
            "RESERVED" => GateDecision::Reserved(record()?, generation()?),
            "NOT_STARTED" => GateDecision::Refused(Refusal::NotStarted),
            "EXPIRED" => GateDecision::Refused(Refusal::Expired),
            "BELOW_MIN_ORDER" => GateDecision::Refused(Refusal::BelowMinOrder),
            "OUT_OF_STOCK" => GateDecision::Refused(Refusal::OutOfStock),
            "ALREADY_USED" => GateDecision::Refused(Refusal::AlreadyUsed),
            "PAUSED" => GateDecision::Refused(Refusal::Paused),
            "ARCHIVED" => GateDecision::Refused(Refusal::Archived),
            other => return Err(Error::corrupt(format!("gate outcome {other:?}"))),
        })
    }

    /// Moves an order's record from one of `from` to `to`, and does `also`. Returns the
    /// state the record ends in, `None` when there is no record.
    #[tracing::instrument(name = "gate.mark", skip(self))]
    pub async fn mark(
        &self,
        code: &VoucherCode,
        order_id: &OrderId,
        from: &[RecordState],
        to: RecordState,
        also: MarkAlso,
    ) -> Result<Option<RecordState>> {
        let k = self.keys(code);
        let from: String = from.iter().map(|s| s.letter()).collect();
        let mut invocation = self.scripts.mark.prepare_invoke();
        invocation
            .key(&k.orders)
            .key(&k.unsettled)
            .arg(order_id.as_str())
            .arg(from)
            .arg(to.letter().to_string());
        match also {
            MarkAlso::Nothing => {}
            MarkAlso::Touch => {
                invocation.arg("touch");
            }
            MarkAlso::Settle => {
                invocation.arg("settle");
            }
        }
        let state: Option<String> = invocation
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(redis_down)?;
        Ok(state
            .and_then(|s| s.chars().next())
            .and_then(RecordState::from_letter))
    }

    /// Moves the records of `committed` (reservations of voucher `code` whose rows one
    /// batch committed) from P to A and out of the unsettled set, in one call
    /// (`settle.lua`). Only the very record that was committed moves (same customer, same
    /// reservation time); returns how many moved.
    pub async fn settle_committed(
        &self,
        code: &VoucherCode,
        committed: &[Reservation],
    ) -> Result<i64> {
        if committed.is_empty() {
            return Ok(0);
        }
        let k = self.keys(code);
        let mut invocation = self.scripts.settle.prepare_invoke();
        invocation.key(&k.orders).key(&k.unsettled);
        for r in committed {
            invocation
                .arg(r.order_id.as_str())
                .arg(r.customer_id.as_str())
                .arg(r.reserved_at.timestamp_millis());
        }
        invocation
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(redis_down)
    }

    /// Moves the order's record like [`Gate::mark`] after the decision was made elsewhere
    /// (the broker's ack, PostgreSQL's commit or confirm): a failure is logged, not raised,
    /// because the record a step behind holds the use either way.
    pub async fn mark_best_effort(
        &self,
        code: &VoucherCode,
        order_id: &OrderId,
        from: &[RecordState],
        to: RecordState,
        also: MarkAlso,
    ) {
        if let Err(e) = self.mark(code, order_id, from, to, also).await {
            tracing::warn!(error = %e.chain(), %order_id, ?to, "gate record not updated");
        }
    }

    /// The record of one order, if the gate has one.
    pub async fn record(
        &self,
        code: &VoucherCode,
        order_id: &OrderId,
    ) -> Result<Option<OrderRecord>> {
        let k = self.keys(code);
        let raw: Option<String> = redis::cmd("HGET")
            .arg(&k.orders)
            .arg(order_id.as_str())
            .query_async(&mut self.conn.clone())
            .await
            .map_err(redis_down)?;
        raw.map(|r| OrderRecord::parse(&r)).transpose()
    }

    #[tracing::instrument(name = "gate.release", skip(self))]
    pub async fn release(
        &self,
        code: &VoucherCode,
        order_id: &OrderId,
        how: GiveBack,
    ) -> Result<ReleaseOutcome> {
        let k = self.keys(code);
        let mut invocation = self.scripts.release.prepare_invoke();
        invocation
            .key(&k.meta)
            .key(&k.remaining)
            .key(&k.users)
            .key(&k.orders)
            .key(&k.unsettled)
            .arg(order_id.as_str());
        match &how {
            GiveBack::Release => {
                invocation.arg("release").arg("").arg(0);
            }
            GiveBack::Forget {
                states,
                published_by_ms,
            } => {
                let states: String = states.iter().map(|s| s.letter()).collect();
                invocation.arg("forget").arg(states).arg(*published_by_ms);
            }
        }
        // A use given back is announced by the script itself.
        invocation.arg(&self.channel).arg(code.as_str());
        let outcome: String = invocation
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(redis_down)?;
        Ok(match outcome.as_str() {
            "RELEASED" => ReleaseOutcome::Released,
            "ALREADY" => ReleaseOutcome::Already,
            "ABSENT" => ReleaseOutcome::Absent,
            "BUSY" => ReleaseOutcome::Busy,
            "NOT_LOADED" => ReleaseOutcome::NotLoaded,
            other => return Err(Error::corrupt(format!("release outcome {other:?}"))),
        })
    }

    /// Claims `order_id` for `code` across all vouchers; `false` when another voucher holds it.
    #[tracing::instrument(level = "debug", name = "gate.claim_order", skip_all)]
    pub async fn claim_order(&self, order_id: &OrderId, code: &VoucherCode) -> Result<bool> {
        let key = self.claim_key(order_id.as_str());
        let set: Option<String> = redis::cmd("SET")
            .arg(&key)
            .arg(code.as_str())
            .arg("NX")
            .arg("EX")
            .arg(ORDER_CLAIM_TTL_SECS)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(redis_down)?;
        if set.is_some() {
            return Ok(true);
        }
        let owner: Option<String> = redis::cmd("GET")
            .arg(&key)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(redis_down)?;
        Ok(owner.as_deref() == Some(code.as_str()))
    }

    /// The claim of one orderId: its own slot, deliberately outside any voucher's hash tag.
    pub(super) fn claim_key(&self, order_id: &str) -> String {
        format!("{}order-owner:{}", self.prefix, order_id)
    }

    /// Tells edges that a use of `code` became available again, so they drop their
    /// sold-out flag at once instead of at its TTL. Best effort: a lost message only
    /// delays availability until the TTL.
    pub async fn announce_available(&self, code: &VoucherCode) {
        let published: redis::RedisResult<i64> = redis::cmd("PUBLISH")
            .arg(&self.channel)
            .arg(code.as_str())
            .query_async(&mut self.conn.clone())
            .await;
        if let Err(e) = published {
            tracing::debug!(error = %crate::error::cause_chain(&e), "availability not announced");
        }
    }
}
