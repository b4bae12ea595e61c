//! A voucher's reservations as the people who count money read them: pages by status, one
//! order, and every row as a stream (the CSV export), read in the order they were taken
//! (`redemptions.id`).

use chrono::{DateTime, Utc};
use futures::stream::StreamExt;
use sqlx::FromRow;

use super::Store;
use crate::domain::{ReservationStatus, VoucherCode};
use crate::Result;

/// One reservation with everything finance needs: both amounts, every timestamp.
#[derive(Debug, Clone, FromRow)]
pub struct LedgerRow {
    /// Where the row stands in the order reservations were taken: the cursor of a page.
    pub id: i64,
    pub order_id: String,
    pub customer_id: String,
    pub status: String,
    pub order_amount: i64,
    pub discount_amount: i64,
    pub reserved_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub confirmed_at: Option<DateTime<Utc>>,
    pub released_at: Option<DateTime<Utc>>,
}

const LEDGER_COLUMNS: &str = "id, order_id, customer_id, status, order_amount, discount_amount, \
     reserved_at, expires_at, confirmed_at, released_at";

impl Store {
    /// One page of `code`'s reservations in `status`, after the row `after` (an `id`).
    #[tracing::instrument(name = "db.ledger_page", skip(self))]
    pub async fn ledger_page(
        &self,
        code: &VoucherCode,
        status: ReservationStatus,
        after: Option<i64>,
        limit: i64,
    ) -> Result<Vec<LedgerRow>> {
        let rows = sqlx::query_as(&format!(
            "SELECT {LEDGER_COLUMNS} FROM redemptions
             WHERE voucher_code = $1 AND status = $2 AND id > $3
             ORDER BY id LIMIT $4"
        ))
        .bind(code.as_str())
        .bind(status.as_str())
        .bind(after.unwrap_or(0))
        .bind(limit)
        .fetch_all(self.pool())
        .await?;
        Ok(rows)
    }

    /// `code`'s reservation for `order_id`, if it has one.
    pub async fn ledger_row(
        &self,
        code: &VoucherCode,
        order_id: &str,
    ) -> Result<Option<LedgerRow>> {
        let row = sqlx::query_as(&format!(
            "SELECT {LEDGER_COLUMNS} FROM redemptions WHERE voucher_code = $1 AND order_id = $2"
        ))
        .bind(code.as_str())
        .bind(order_id)
        .fetch_optional(self.pool())
        .await?;
        Ok(row)
    }

    /// Every reservation of `code` (in `status`, when given), in chunks of [`CHUNK_ROWS`],
    /// from one statement on one connection of the pool, held while it runs. A task reads
    /// the rows as they arrive and hands them over a channel of [`CHUNKS_AHEAD`] chunks:
    /// when the consumer is slower, the task waits, the statement's rows wait in the
    /// socket and the server waits on it, so a voucher of any size streams in the memory
    /// of a few chunks. When the consumer goes away (the client hung up), the task ends
    /// and the statement with it.
    pub fn ledger_stream(
        &self,
        code: &VoucherCode,
        status: Option<ReservationStatus>,
    ) -> tokio::sync::mpsc::Receiver<Result<Vec<LedgerRow>>> {
        let (tx, rx) = tokio::sync::mpsc::channel(CHUNKS_AHEAD);
        let (pool, code) = (self.pool().clone(), code.as_str().to_owned());
        let status = status.map(|s| s.as_str().to_owned());
        tokio::spawn(async move {
            let sql = format!(
                "SELECT {LEDGER_COLUMNS} FROM redemptions
                 WHERE voucher_code = $1 AND ($2::text IS NULL OR status = $2)
                 ORDER BY id"
            );
            let mut rows = sqlx::query_as::<_, LedgerRow>(&sql)
                .bind(code)
                .bind(status)
                .fetch(&pool)
                .chunks(CHUNK_ROWS);
            while let Some(chunk) = rows.next().await {
                let chunk: std::result::Result<Vec<LedgerRow>, sqlx::Error> =
                    chunk.into_iter().collect();
                let failed = chunk.is_err();
                if tx.send(chunk.map_err(Into::into)).await.is_err() || failed {
                    return;
                }
            }
        });
        rx
    }
}

/// Rows per chunk of an export, and chunks read ahead of the consumer.
pub const CHUNK_ROWS: usize = 500;
pub const CHUNKS_AHEAD: usize = 4;
