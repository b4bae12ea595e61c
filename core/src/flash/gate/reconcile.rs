//! What reconciliation reads of a gate and the repair it writes: one consistent snapshot
//! of the remaining count and the unsettled orders, records and customers' counts in
//! pieces, settling orders whose rows were seen, and adjusting counts. Scripts:
//! `lua/reconcile/`.

use redis::Value;

use super::{identity, redis_down, Gate, OrderRecord, CHUNK};
use crate::domain::{Voucher, VoucherCode};
use crate::{Error, Result};

/// What reconciliation reads of a loaded gate, in one consistent step.
#[derive(Debug, Clone)]
pub struct GateSnapshot {
    /// When it was read, by Redis's clock (the clock of the records' times).
    pub at_ms: i64,
    pub remaining: i64,
    /// The limit the gate holds with `remaining` (an operator's change moves both).
    pub total_limit: i64,
    /// How many orders are unsettled (all of them, even beyond `unsettled`).
    pub unsettled_count: usize,
    /// The oldest unsettled orders with their latest publish start (ms, Redis's clock).
    pub unsettled: Vec<(String, i64)>,
}

impl GateSnapshot {
    /// Whether `unsettled` holds every unsettled order.
    pub fn is_complete(&self) -> bool {
        self.unsettled.len() == self.unsettled_count
    }
}

/// Most unsettled orders one snapshot reads: the snapshot stays a short Redis call however
/// far reconciliation fell behind, and the rest waits for the next rounds.
pub const SNAPSHOT_UNSETTLED_MAX: usize = 2_000;

impl Gate {
    /// The remaining count and the oldest unsettled orders (at most
    /// [`SNAPSHOT_UNSETTLED_MAX`]), read atomically; `None` when not loaded.
    #[tracing::instrument(name = "gate.snapshot", skip(self))]
    pub async fn snapshot(&self, code: &VoucherCode) -> Result<Option<GateSnapshot>> {
        let k = self.keys(code);
        let reply: Value = self
            .scripts
            .snapshot
            .key(&k.meta)
            .key(&k.remaining)
            .key(&k.unsettled)
            .arg(SNAPSHOT_UNSETTLED_MAX)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(redis_down)?;
        let items: Vec<String> = match reply {
            Value::Nil => return Ok(None),
            other => redis::from_redis_value(&other).map_err(redis_down)?,
        };
        let mut items = items.into_iter();
        let mut number = |what: &str| {
            items
                .next()
                .and_then(|r| r.parse::<i64>().ok())
                .ok_or_else(|| Error::corrupt(format!("gate snapshot without {what}")))
        };
        let at_ms = number("time")?;
        let remaining = number("remaining")?;
        let unsettled_count = usize::try_from(number("unsettled count")?)
            .map_err(|_| Error::corrupt("gate snapshot with a negative count"))?;
        let total_limit = number("total limit")?;
        let mut unsettled = Vec::new();
        while let (Some(order), Some(score)) = (items.next(), items.next()) {
            let publish_ms = score
                .parse::<f64>()
                .map_err(|_| Error::corrupt(format!("unsettled score {score:?}")))?;
            unsettled.push((order, publish_ms as i64));
        }
        Ok(Some(GateSnapshot {
            at_ms,
            remaining,
            total_limit,
            unsettled_count,
            unsettled,
        }))
    }

    /// Drops settled orders (their rows are in PostgreSQL) from the unsettled set.
    pub async fn settle<S: AsRef<str>>(&self, code: &VoucherCode, orders: &[S]) -> Result<()> {
        let k = self.keys(code);
        for chunk in orders.chunks(CHUNK) {
            let members: Vec<&str> = chunk.iter().map(AsRef::as_ref).collect();
            redis::cmd("ZREM")
                .arg(&k.unsettled)
                .arg(members)
                .query_async::<()>(&mut self.conn.clone())
                .await
                .map_err(redis_down)?;
        }
        Ok(())
    }

    /// The records of some orders (`None` where there is none); `Ok(None)` when not loaded.
    /// Not atomic across chunks: callers act through the scripts, which check again.
    pub async fn records(
        &self,
        code: &VoucherCode,
        orders: &[String],
    ) -> Result<Vec<Option<OrderRecord>>> {
        let k = self.keys(code);
        let mut records = Vec::with_capacity(orders.len());
        for chunk in orders.chunks(CHUNK) {
            let raw: Vec<Option<String>> = redis::cmd("HMGET")
                .arg(&k.orders)
                .arg(chunk)
                .query_async(&mut self.conn.clone())
                .await
                .map_err(redis_down)?;
            for r in raw {
                records.push(r.map(|r| OrderRecord::parse(&r)).transpose()?);
            }
        }
        Ok(records)
    }

    /// The uses the gate counts for each of `customers` (at most [`CHUNK`]), with the
    /// moment of the read by Redis's clock; `None` when not loaded.
    pub async fn customer_counts(
        &self,
        code: &VoucherCode,
        customers: &[String],
    ) -> Result<Option<(i64, Vec<i64>)>> {
        let k = self.keys(code);
        let mut invocation = self.scripts.counts.prepare_invoke();
        invocation.key(&k.meta).key(&k.users);
        for customer in customers {
            invocation.arg(customer);
        }
        let reply: Option<Vec<i64>> = invocation
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(redis_down)?;
        Ok(reply.and_then(|mut items| {
            if items.is_empty() {
                return None;
            }
            let at_ms = items.remove(0);
            Some((at_ms, items))
        }))
    }

    /// Adds `remaining` to the remaining uses of `voucher`'s gate and each customer's delta
    /// to its count (reconciliation's repair); the new remaining count, or `None` when the
    /// gate is not loaded for this voucher.
    #[tracing::instrument(name = "gate.adjust", skip(self, voucher, customers), fields(code = %voucher.code))]
    pub async fn adjust(
        &self,
        voucher: &Voucher,
        remaining: i64,
        customers: &[(String, i64)],
    ) -> Result<Option<i64>> {
        let k = self.keys(&voucher.code);
        let mut invocation = self.scripts.adjust.prepare_invoke();
        invocation
            .key(&k.meta)
            .key(&k.remaining)
            .key(&k.users)
            .arg(remaining)
            .arg(identity(voucher));
        for (customer, delta) in customers {
            invocation.arg(customer).arg(*delta);
        }
        invocation
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(redis_down)
    }
}
