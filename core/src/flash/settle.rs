//! Confirm and release of flash reservations. Both act on the row in PostgreSQL, which the
//! consumer may write a moment after the 201: while the gate holds the order, they wait for
//! the row (up to `flash.row_wait`), then bring the gate's record in step.

use std::time::{Duration, Instant};

use super::gate::{MarkAlso, RecordState};
use super::FlashPath;
use crate::domain::{OrderId, Reservation, VoucherCode};
use crate::{Error, Result};

impl FlashPath {
    pub async fn confirm(&self, code: &VoucherCode, order_id: &OrderId) -> Result<Reservation> {
        let confirmed = self
            .when_recorded(code, order_id, || self.inner.store.confirm(code, order_id))
            .await?;
        // PostgreSQL decided. If Redis fails here the record stays a step behind (a retry of
        // the order then reports RESERVED, not CONFIRMED); it holds the use either way.
        self.inner
            .gate
            .mark_best_effort(
                code,
                order_id,
                &[RecordState::Pending, RecordState::Accepted],
                RecordState::Confirmed,
                MarkAlso::Settle,
            )
            .await;
        Ok(confirmed)
    }

    pub async fn release(&self, code: &VoucherCode, order_id: &OrderId) -> Result<Reservation> {
        let released = self
            .when_recorded(code, order_id, || self.inner.store.release(code, order_id))
            .await?;
        self.released_in_db(code, order_id).await;
        Ok(released)
    }

    /// Runs `op` on the order's row; while the row is not written yet but the gate holds the
    /// order (the consumer is a moment behind), waits for it, up to `row_wait`.
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
        let deadline = Instant::now() + self.inner.settings.row_wait;
        loop {
            match op().await {
                Err(Error::ReservationNotFound) => {
                    let held = self.inner.gate.record(code, order_id).await?;
                    if held.is_none() {
                        return Err(Error::ReservationNotFound);
                    }
                    if Instant::now() >= deadline {
                        return Err(Error::unavailable(
                            "event consumer (reservation not yet recorded)",
                        ));
                    }
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
                other => return other,
            }
        }
    }
}
