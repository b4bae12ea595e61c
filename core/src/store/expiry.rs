use chrono::{DateTime, Utc};
use sqlx::FromRow;

use super::reservations::give_back_uses;
use super::Store;
use crate::domain::{CustomerId, OrderId, VoucherCode};
use crate::{Error, Result};

/// A reservation the expiry job released.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpiredReservation {
    pub voucher_code: VoucherCode,
    pub customer_id: CustomerId,
    pub order_id: OrderId,
}

impl Store {
    /// Releases up to `batch` reservations whose TTL ended at or before `now`, and gives
    /// their uses back, in one transaction.
    ///
    /// Exactly once, with any number of instances running this at the same time: the rows
    /// are claimed with `FOR UPDATE SKIP LOCKED` (two workers never wait on each other,
    /// they take different rows) and the status change from RESERVED is what gives a use
    /// back, so a row a confirm or release got to first is not released again.
    #[tracing::instrument(skip(self))]
    pub async fn release_expired(
        &self,
        now: DateTime<Utc>,
        batch: i64,
    ) -> Result<Vec<ExpiredReservation>> {
        #[derive(FromRow)]
        struct Row {
            voucher_code: String,
            customer_id: String,
            order_id: String,
        }
        let mut tx = self.pool().begin().await?;
        let rows: Vec<Row> = sqlx::query_as(
            "WITH due AS (
                 SELECT id FROM redemptions
                 WHERE status = 'RESERVED' AND expires_at <= $1
                 ORDER BY expires_at
                 LIMIT $2
                 FOR UPDATE SKIP LOCKED
             )
             UPDATE redemptions r SET status = 'RELEASED', released_at = $1
             FROM due WHERE r.id = due.id AND r.status = 'RESERVED'
             RETURNING r.voucher_code, r.customer_id, r.order_id",
        )
        .bind(now)
        .bind(batch)
        .fetch_all(&mut *tx)
        .await?;
        let corrupt = |what: &str| Error::Internal(format!("stored redemption has invalid {what}"));
        let released = rows
            .into_iter()
            .map(|r| {
                Ok(ExpiredReservation {
                    voucher_code: VoucherCode::parse(r.voucher_code)
                        .map_err(|_| corrupt("voucher_code"))?,
                    customer_id: CustomerId::parse(r.customer_id)
                        .map_err(|_| corrupt("customer_id"))?,
                    order_id: OrderId::parse(r.order_id).map_err(|_| corrupt("order_id"))?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let uses: Vec<_> = released
            .iter()
            .map(|r| (r.voucher_code.clone(), r.customer_id.clone()))
            .collect();
        give_back_uses(&mut tx, &uses).await?;
        tx.commit().await?;
        Ok(released)
    }
}
