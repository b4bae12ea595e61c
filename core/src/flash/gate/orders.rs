//! Reads of every order a gate holds, in pieces (HSCAN): the orders endpoint's list and
//! the edge's Bloom filter. No script: a read across a reload is detected by the
//! generation, not prevented.

use voucher_contract::order_filter::OrderFilter;

use super::{redis_down, Gate, CHUNK};
use crate::domain::VoucherCode;
use crate::Result;

impl Gate {
    /// The order ids the gate has a record of, whatever their state, read in pieces
    /// (HSCAN): no single call blocks Redis on a voucher's size. `None` when not loaded.
    pub async fn order_ids(&self, code: &VoucherCode) -> Result<Option<Vec<String>>> {
        let ids = self
            .scan_orders(code, |_, count| Vec::with_capacity(count), Vec::push)
            .await?;
        Ok(ids.map(|mut ids| {
            // HSCAN may return a field twice.
            ids.sort_unstable();
            ids.dedup();
            ids
        }))
    }

    /// The order ids the gate has a record of, as a filter, with the uses it had left
    /// before the first of them was read: an order that took a use after that read needed
    /// a use given back after it, and every give-back is announced, which drops the edge's
    /// flag. `None` when not loaded.
    pub async fn order_filter(&self, code: &VoucherCode) -> Result<Option<OrderFilter>> {
        self.order_filter_with(code, &[]).await
    }

    /// [`Gate::order_filter`] with `extra` orders in it too (PostgreSQL's, read before:
    /// a gate restored from an older snapshot lacks orders that hold rows). Sized for both.
    pub async fn order_filter_with(
        &self,
        code: &VoucherCode,
        extra: &[String],
    ) -> Result<Option<OrderFilter>> {
        let filter = self
            .scan_orders(
                code,
                // A few more than now: orders taken during the scan still fit the sizing.
                |remaining, count| {
                    let count = count + extra.len();
                    OrderFilter::with_capacity(count + count / 10, remaining.max(0) as u64)
                },
                |filter, order_id| filter.insert(&order_id),
            )
            .await?;
        Ok(filter.map(|mut filter| {
            for order_id in extra {
                filter.insert(order_id);
            }
            filter
        }))
    }

    /// Reads every order id of `code`'s gate in pieces (HSCAN), into what `start` makes
    /// from the uses left (read before the first id) and the number of orders then. `None`
    /// when the gate is not loaded, or was reloaded during the scan (its generation
    /// changed, or Redis restarted empty): a read across a reload may miss orders.
    async fn scan_orders<T>(
        &self,
        code: &VoucherCode,
        start: impl FnOnce(i64, usize) -> T,
        mut each: impl FnMut(&mut T, String),
    ) -> Result<Option<T>> {
        let k = self.keys(code);
        let generation = || async {
            redis::cmd("HGET")
                .arg(&k.meta)
                .arg("generation")
                .query_async::<Option<i64>>(&mut self.conn.clone())
                .await
                .map_err(redis_down)
        };
        let before = generation().await?;
        let Some(remaining) = self.remaining(code).await? else {
            return Ok(None);
        };
        let count: usize = redis::cmd("HLEN")
            .arg(&k.orders)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(redis_down)?;
        let mut into = start(remaining, count);
        let mut cursor: u64 = 0;
        loop {
            let (next, page): (u64, Vec<String>) = redis::cmd("HSCAN")
                .arg(&k.orders)
                .arg(cursor)
                .arg("COUNT")
                .arg(CHUNK)
                .query_async(&mut self.conn.clone())
                .await
                .map_err(redis_down)?;
            // HSCAN returns field, value, field, value, ...
            for order_id in page.into_iter().step_by(2) {
                each(&mut into, order_id);
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
        if before.is_none() || generation().await? != before {
            return Ok(None);
        }
        Ok(Some(into))
    }
}
