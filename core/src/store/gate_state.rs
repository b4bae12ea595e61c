//! What a flash gate is loaded from and checked against.
//!
//! A load first takes the voucher's next gate generation (`vouchers.gate_generation`,
//! committed on its own: the update waits for every write of a use an older gate decided,
//! which holds the voucher's row locked, see `store::batch`), then reads the voucher in one REPEATABLE READ transaction. Only the
//! latest generation can open a gate (see `flash/rebuild.rs`), and the recorder writes a
//! use only under its gate's generation if that is still the latest: so an open gate never
//! misses a use PostgreSQL holds. Rows and counts stream out in pieces, so a voucher of any
//! size loads in bounded memory.
//!
//! Reconciliation's reads are narrow on purpose: the rows of the orders in flight, the
//! voucher's counter, the rows released lately, one page of customers. None of them reads
//! every order of a voucher.

use chrono::{DateTime, Utc};
use futures::stream::{BoxStream, StreamExt, TryStreamExt};
use sqlx::{Postgres, Transaction};

use super::reservations::RedemptionRow;
use super::vouchers::{VoucherRow, VOUCHER_COLUMNS};
use super::Store;
use crate::domain::{Reservation, Voucher, VoucherCode};
use crate::{Error, Result};

/// A voucher read for loading its gate: one consistent snapshot, open until [`finish`].
///
/// [`finish`]: GateRead::finish
pub struct GateRead {
    tx: Transaction<'static, Postgres>,
    code: String,
    /// The fencing generation this read took.
    pub generation: i64,
    /// Uses left as of this read.
    pub remaining: i64,
    /// The voucher's definition as of this read: what the gate opens with.
    pub voucher: Voucher,
}

impl GateRead {
    /// Every reservation of the voucher, whatever its status, as of this read.
    pub fn reservations(&mut self) -> BoxStream<'_, Result<Reservation>> {
        sqlx::query_as::<_, RedemptionRow>(
            "SELECT order_id, voucher_code, customer_id, order_amount, discount_amount, status,
                    reserved_at, expires_at
             FROM redemptions WHERE voucher_code = $1",
        )
        .bind(self.code.clone())
        .fetch(&mut *self.tx)
        .map(|row| Reservation::try_from(row?))
        .boxed()
    }

    /// Uses each customer holds, as of this read (customers holding none left out).
    pub fn customers(&mut self) -> BoxStream<'_, Result<(String, i64)>> {
        sqlx::query_as::<_, (String, i64)>(
            "SELECT customer_id, active_count::int8 FROM customer_usage
             WHERE voucher_code = $1 AND active_count > 0",
        )
        .bind(self.code.clone())
        .fetch(&mut *self.tx)
        .map_err(Error::from)
        .boxed()
    }

    /// Ends the read.
    pub async fn finish(self) -> Result<()> {
        self.tx.commit().await?;
        Ok(())
    }
}

/// Reconciliation's view of one voucher, from one snapshot.
#[derive(Debug, Default)]
pub struct ReconcileView {
    /// The rows of the orders asked about (those that have one).
    pub rows: Vec<Reservation>,
    /// Active uses (the voucher's counter) the gate's read came after: those reserved
    /// before its millisecond, and those of the orders asked about whatever their time.
    /// Times are to the millisecond, so another row of the read's very millisecond may be
    /// later than the read and is left out (counting too few here can only make a repair
    /// smaller, never oversell); the orders asked about are the gate's unsettled ones, which
    /// the gate took before its read, so each counts. Leaving those out too made a busy
    /// voucher (several uses per millisecond) report a surplus of a few uses in every round.
    pub active_by: i64,
}

fn lock_not_available(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|db| db.code())
        .is_some_and(|code| code == "55P03")
}

impl Store {
    /// Takes `code`'s next gate generation, committed on its own. The update waits for
    /// every recorder write holding the voucher's row locked (uses an older gate decided,
    /// being written; see `record_decided`), so a read started after this returns
    /// sees each of them, and a use of an older gate written later finds a newer generation
    /// and is not written. Bounded: behind a write that is itself stuck (a locked row) it
    /// gives up after 2 s and tries again, five times, rather than hang with the voucher
    /// closed.
    #[tracing::instrument(name = "db.next_gate_generation", skip(self))]
    pub async fn next_gate_generation(&self, code: &VoucherCode) -> Result<i64> {
        let mut attempt = 0;
        loop {
            match self.try_next_gate_generation(code).await {
                Err(e) if lock_not_available(&e) && attempt < 5 => {
                    attempt += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(200 * attempt)).await;
                }
                other => return Ok(other?),
            }
        }
    }

    async fn try_next_gate_generation(&self, code: &VoucherCode) -> Result<i64, sqlx::Error> {
        let mut bump = self.pool().begin().await?;
        sqlx::query("SET LOCAL lock_timeout = '2s'")
            .execute(&mut *bump)
            .await?;
        let generation: i64 = sqlx::query_scalar(
            "UPDATE vouchers SET gate_generation = gate_generation + 1 WHERE code = $1
             RETURNING gate_generation",
        )
        .bind(code.as_str())
        .fetch_one(&mut *bump)
        .await?;
        bump.commit().await?;
        Ok(generation)
    }

    /// Starts reading `code`'s gate state for a load of `generation` (taken before with
    /// [`Store::next_gate_generation`]), in one REPEATABLE READ snapshot.
    #[tracing::instrument(name = "db.read_gate", skip(self))]
    pub async fn read_gate(&self, code: &VoucherCode, generation: i64) -> Result<GateRead> {
        let mut tx = self.pool().begin().await?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .execute(&mut *tx)
            .await?;
        // A load streams a big voucher into Redis between its reads: idle in this read-only
        // transaction, which holds no row lock, for as long as Redis takes.
        sqlx::query("SET LOCAL idle_in_transaction_session_timeout = 0")
            .execute(&mut *tx)
            .await?;
        // A new voucher's load read the whole `redemptions` (every other voucher's rows)
        // when the plan was a scan (`batch::by_index`).
        super::batch::by_index(&mut tx).await?;
        #[derive(sqlx::FromRow)]
        struct Row {
            #[sqlx(flatten)]
            voucher: VoucherRow,
            used_count: i32,
        }
        let row: Option<Row> = sqlx::query_as(&format!(
            "SELECT {VOUCHER_COLUMNS}, v.used_count FROM vouchers v WHERE v.code = $1"
        ))
        .bind(code.as_str())
        .fetch_optional(&mut *tx)
        .await?;
        let row = row.ok_or(Error::VoucherNotFound)?;
        let voucher: Voucher = row.voucher.try_into()?;
        Ok(GateRead {
            tx,
            code: code.as_str().to_owned(),
            generation,
            remaining: i64::from(voucher.total_limit) - i64::from(row.used_count),
            voucher,
        })
    }

    /// The latest gate generation of `code` (0 before any load).
    pub async fn gate_generation(&self, code: &VoucherCode) -> Result<i64> {
        let generation: Option<i64> =
            sqlx::query_scalar("SELECT gate_generation FROM vouchers WHERE code = $1")
                .bind(code.as_str())
                .fetch_optional(self.pool())
                .await?;
        Ok(generation.unwrap_or(0))
    }

    /// The rows of `orders` and the active uses reserved before `at` or by one of
    /// `orders` (see [`ReconcileView::active_by`]), from one snapshot: a row written
    /// between two separate reads would count twice.
    #[tracing::instrument(name = "db.reconcile_view", skip(self, orders), fields(orders = orders.len()))]
    pub async fn reconcile_view(
        &self,
        code: &VoucherCode,
        orders: &[String],
        at: DateTime<Utc>,
    ) -> Result<ReconcileView> {
        let mut tx = self.pool().begin().await?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .execute(&mut *tx)
            .await?;
        super::batch::by_index(&mut tx).await?;
        let active_by: i64 = sqlx::query_scalar(
            "SELECT v.used_count - (SELECT count(*) FROM redemptions r
                                    WHERE r.voucher_code = v.code
                                      AND r.status IN ('RESERVED', 'CONFIRMED')
                                      AND r.reserved_at >= $2
                                      AND r.order_id <> ALL($3))
             FROM vouchers v WHERE v.code = $1",
        )
        .bind(code.as_str())
        .bind(at)
        .bind(orders)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or(Error::VoucherNotFound)?;
        let mut rows = Vec::new();
        for chunk in orders.chunks(1000) {
            let found: Vec<RedemptionRow> = sqlx::query_as(
                "SELECT order_id, voucher_code, customer_id, order_amount, discount_amount,
                        status, reserved_at, expires_at
                 FROM redemptions WHERE voucher_code = $1 AND order_id = ANY($2)",
            )
            .bind(code.as_str())
            .bind(chunk)
            .fetch_all(&mut *tx)
            .await?;
            for row in found {
                rows.push(row.try_into()?);
            }
        }
        tx.commit().await?;
        Ok(ReconcileView { rows, active_by })
    }

    /// Orders of `code` released after `after` (released_at, order id), oldest first, at
    /// most `limit`.
    pub async fn released_after(
        &self,
        code: &VoucherCode,
        after: &(DateTime<Utc>, String),
        limit: i64,
    ) -> Result<Vec<(DateTime<Utc>, String)>> {
        Ok(sqlx::query_as(
            "SELECT released_at, order_id FROM redemptions
             WHERE voucher_code = $1 AND status = 'RELEASED'
               AND (released_at, order_id) > ($2, $3)
             ORDER BY released_at, order_id LIMIT $4",
        )
        .bind(code.as_str())
        .bind(after.0)
        .bind(&after.1)
        .bind(limit)
        .fetch_all(self.pool())
        .await?)
    }

    /// The database's clock: cursors over times it stamped are kept on it.
    pub async fn now(&self) -> Result<DateTime<Utc>> {
        Ok(sqlx::query_scalar("SELECT now()")
            .fetch_one(self.pool())
            .await?)
    }

    /// One page of the customers holding uses of `code`, after `after` in id order.
    ///
    /// Read along the primary key, whatever the planner's statistics say. Measured on a
    /// voucher of 280,400 customers in a database never analyzed (autovacuum off): the
    /// planner expected 606 rows, read all of the voucher's with a bitmap scan and sorted
    /// them for each page: 160 ms a page, and a page per voucher every round, bounded by
    /// the voucher's size where this module means to be bounded by the page. Along the
    /// key, 0.9 ms (`EXPLAIN ANALYZE` of both, same database).
    pub async fn customers_after(
        &self,
        code: &VoucherCode,
        after: &str,
        limit: i64,
    ) -> Result<Vec<String>> {
        let mut tx = self.pool().begin().await?;
        super::batch::along_index(&mut tx).await?;
        let page = sqlx::query_scalar(
            "SELECT customer_id FROM customer_usage
             WHERE voucher_code = $1 AND customer_id > $2 AND active_count > 0
             ORDER BY customer_id LIMIT $3",
        )
        .bind(code.as_str())
        .bind(after)
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(page)
    }

    /// Active uses each of `customers` holds among rows reserved before `at` (a row of that
    /// very millisecond may be later than the gate's read: left out). Along the primary key
    /// (`batch::along_index`): planned with the table's statistics missing, it read the
    /// voucher's whole `customer_usage` for every page of a reconciliation round (a bitmap
    /// scan on the voucher alone, each row compared with the page's customers one by one:
    /// 135,600 rows read for 200, 28.8 ms against 1.7 ms, `EXPLAIN ANALYZE`); `perf` of
    /// PostgreSQL while a core accepted 6,000/s on a voucher of a hundred thousand
    /// customers found about 60% of its samples there (`texteq`, `memcmp`,
    /// `ExecEvalScalarArrayOp`).
    pub async fn customer_uses_by(
        &self,
        code: &VoucherCode,
        customers: &[String],
        at: DateTime<Utc>,
    ) -> Result<Vec<(String, i64)>> {
        let mut tx = self.pool().begin().await?;
        super::batch::along_index(&mut tx).await?;
        let uses = sqlx::query_as(
            "SELECT u.customer_id, u.active_count - COALESCE(later.n, 0)
             FROM customer_usage u
             LEFT JOIN (SELECT customer_id, count(*) AS n FROM redemptions
                        WHERE voucher_code = $1 AND status IN ('RESERVED', 'CONFIRMED')
                          AND reserved_at >= $3
                        GROUP BY customer_id) later USING (customer_id)
             WHERE u.voucher_code = $1 AND u.customer_id = ANY($2)",
        )
        .bind(code.as_str())
        .bind(customers)
        .bind(at)
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(uses)
    }
}
