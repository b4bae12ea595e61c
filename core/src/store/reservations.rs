use chrono::{DateTime, Utc};
use sqlx::{FromRow, PgConnection};
use voucher_contract::order_filter::OrderFilter;

use super::kept::KeptConnection;
use super::Store;
use crate::domain::{CustomerId, Money, OrderId, Reservation, ReservationStatus, VoucherCode};
use crate::{Error, Result};

/// A `redemptions` row as stored.
#[derive(Debug, FromRow)]
pub(crate) struct RedemptionRow {
    pub order_id: String,
    pub voucher_code: String,
    pub customer_id: String,
    pub order_amount: i64,
    pub discount_amount: i64,
    pub status: String,
    pub reserved_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

pub(crate) const REDEMPTION_COLUMNS: &str = "order_id, voucher_code, customer_id, order_amount, \
     discount_amount, status, reserved_at, expires_at";

/// [`OrderReader::rows`]'s statement: [`REDEMPTION_COLUMNS`] of the function's rows.
static ROWS_OF_ORDERS: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!("SELECT {REDEMPTION_COLUMNS} FROM redemptions_of_orders($1)")
});

impl TryFrom<RedemptionRow> for Reservation {
    type Error = Error;

    fn try_from(row: RedemptionRow) -> Result<Self> {
        let corrupt = |what: &str| Error::corrupt(format!("stored redemption has invalid {what}"));
        Ok(Reservation {
            order_id: OrderId::parse(row.order_id).map_err(|_| corrupt("order_id"))?,
            voucher_code: VoucherCode::parse(row.voucher_code)
                .map_err(|_| corrupt("voucher_code"))?,
            customer_id: CustomerId::parse(row.customer_id).map_err(|_| corrupt("customer_id"))?,
            order_amount: Money::from_db(row.order_amount),
            discount_amount: Money::from_db(row.discount_amount),
            status: ReservationStatus::from_db(&row.status).ok_or_else(|| corrupt("status"))?,
            reserved_at: row.reserved_at,
            expires_at: row.expires_at,
        })
    }
}

/// What a successful reservation call did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReserveOutcome {
    /// A new use was taken for this order.
    Reserved(Reservation),
    /// This exact request had been served before: its reservation, nothing consumed.
    Retried(Reservation),
}

impl ReserveOutcome {
    pub fn reservation(&self) -> &Reservation {
        match self {
            Self::Reserved(r) | Self::Retried(r) => r,
        }
    }
}

impl Store {
    /// A reader of orders' rows (the order lookups') that keeps one connection of the
    /// pool between lookups: no test of the connection before each (`super::kept`).
    pub fn order_reader(&self) -> OrderReader {
        OrderReader {
            conn: KeptConnection::new(self.pool.clone()),
        }
    }

    /// Confirms a reservation. Idempotent: confirming a confirmed one answers the same.
    #[tracing::instrument(skip_all, fields(code = %code, order_id = %order_id))]
    pub async fn confirm(&self, code: &VoucherCode, order_id: &OrderId) -> Result<Reservation> {
        let row: Option<RedemptionRow> = sqlx::query_as(&format!(
            "UPDATE redemptions SET status = 'CONFIRMED', confirmed_at = now()
             WHERE voucher_code = $1 AND order_id = $2 AND status = 'RESERVED'
             RETURNING {REDEMPTION_COLUMNS}"
        ))
        .bind(code.as_str())
        .bind(order_id.as_str())
        .fetch_optional(self.pool())
        .await?;
        if let Some(row) = row {
            return row.try_into();
        }
        let current = self.reservation_on_voucher(code, order_id).await?;
        match current.status {
            ReservationStatus::Confirmed => Ok(current),
            ReservationStatus::Released => Err(Error::AlreadyReleased),
            // Only reachable if a concurrent release was rolled back between our two reads.
            ReservationStatus::Reserved => Err(Error::unavailable("database")),
        }
    }

    /// Releases a reservation and gives its use back. Idempotent: releasing a released one
    /// answers the same and gives nothing back twice.
    #[tracing::instrument(skip_all, fields(code = %code, order_id = %order_id))]
    pub async fn release(&self, code: &VoucherCode, order_id: &OrderId) -> Result<Reservation> {
        let mut tx = self.pool().begin().await?;
        let row: Option<RedemptionRow> = sqlx::query_as(&format!(
            "UPDATE redemptions SET status = 'RELEASED', released_at = now()
             WHERE voucher_code = $1 AND order_id = $2 AND status = 'RESERVED'
             RETURNING {REDEMPTION_COLUMNS}"
        ))
        .bind(code.as_str())
        .bind(order_id.as_str())
        .fetch_optional(&mut *tx)
        .await?;
        if let Some(row) = row {
            let released: Reservation = row.try_into()?;
            give_back_uses(&mut tx, std::slice::from_ref(&released)).await?;
            tx.commit().await?;
            return Ok(released);
        }
        tx.rollback().await?;
        let current = self.reservation_on_voucher(code, order_id).await?;
        match current.status {
            ReservationStatus::Released => Ok(current),
            ReservationStatus::Confirmed => Err(Error::AlreadyConfirmed),
            ReservationStatus::Reserved => Err(Error::unavailable("database")),
        }
    }

    /// The order ids of every reservation of a voucher (on the indexes, `batch::by_index`:
    /// a voucher's rows, not the table's).
    pub async fn voucher_order_ids(&self, code: &VoucherCode) -> Result<Vec<String>> {
        let mut tx = self.pool().begin().await?;
        super::batch::by_index(&mut tx).await?;
        let ids = sqlx::query_scalar("SELECT order_id FROM redemptions WHERE voucher_code = $1")
            .bind(code.as_str())
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(ids)
    }

    /// The order ids of every reservation of a voucher as a filter, with the uses it had
    /// left, in one statement (one snapshot): standard vouchers, and flash ones whose gate is
    /// gone while PostgreSQL decides. `VoucherNotFound` when there is none. On the indexes
    /// (`batch::by_index`): edges fetch it at every sell-out, while the sale's last accepts
    /// are still being committed.
    pub async fn voucher_order_filter(&self, code: &VoucherCode) -> Result<OrderFilter> {
        let mut tx = self.pool().begin().await?;
        super::batch::by_index(&mut tx).await?;
        let row: Option<(i64, Vec<String>)> = sqlx::query_as(
            "SELECT greatest(v.total_limit - v.used_count, 0)::bigint,
                    coalesce(array_agg(r.order_id) FILTER (WHERE r.order_id IS NOT NULL), '{}')
             FROM vouchers v LEFT JOIN redemptions r ON r.voucher_code = v.code
             WHERE v.code = $1
             GROUP BY v.code",
        )
        .bind(code.as_str())
        .fetch_optional(&mut *tx)
        .await?;
        tx.commit().await?;
        let (remaining, ids) = row.ok_or(Error::VoucherNotFound)?;
        let mut filter = OrderFilter::with_capacity(ids.len(), remaining as u64);
        for id in &ids {
            filter.insert(id);
        }
        Ok(filter)
    }

    async fn reservation_on_voucher(
        &self,
        code: &VoucherCode,
        order_id: &OrderId,
    ) -> Result<Reservation> {
        let row: Option<RedemptionRow> = sqlx::query_as(&format!(
            "SELECT {REDEMPTION_COLUMNS} FROM redemptions WHERE voucher_code = $1 AND order_id = $2"
        ))
        .bind(code.as_str())
        .bind(order_id.as_str())
        .fetch_optional(self.pool())
        .await?;
        row.ok_or(Error::ReservationNotFound)?.try_into()
    }
}

/// Gives back one use per released reservation, to its customer and its voucher, taking
/// the locks in the store's order (customers sorted, then vouchers sorted).
pub(super) async fn give_back_uses(
    conn: &mut PgConnection,
    released: &[Reservation],
) -> Result<()> {
    let mut per_customer: std::collections::BTreeMap<(&str, &str), i32> = Default::default();
    let mut per_voucher: std::collections::BTreeMap<&str, i32> = Default::default();
    for r in released {
        *per_customer
            .entry((r.voucher_code.as_str(), r.customer_id.as_str()))
            .or_default() += 1;
        *per_voucher.entry(r.voucher_code.as_str()).or_default() += 1;
    }
    // The vouchers' rows first, in byte order, then the customers': the order the grouped
    // statement of `batch.rs` locks them in, so the two never wait on each other in a
    // circle.
    for (code, n) in per_voucher {
        sqlx::query("UPDATE vouchers SET used_count = used_count - $2 WHERE code = $1")
            .bind(code)
            .bind(n)
            .execute(&mut *conn)
            .await?;
    }
    for ((code, customer), n) in per_customer {
        sqlx::query(
            "UPDATE customer_usage SET active_count = active_count - $3
             WHERE voucher_code = $1 AND customer_id = $2",
        )
        .bind(code)
        .bind(customer)
        .bind(n)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// Reads orders' rows on a connection it keeps (see [`Store::order_reader`]).
pub struct OrderReader {
    conn: KeptConnection,
}

impl OrderReader {
    /// The rows of `order_ids`, whatever voucher each belongs to, by orderId (those without
    /// a row are absent; a row that does not parse back is an error of its own order
    /// only): one statement for a group of lookups, on the reader's kept connection, within
    /// `deadline`. Past it the connection is closed, not handed back (it may be mid-
    /// statement on a peer that vanished), and the lookups are unavailable: a stalled
    /// PostgreSQL costs the waiting requests a 503 after `deadline`, never TCP's timeout.
    /// The statement is `redemptions_of_orders`, planned where sequential scans are off
    /// (`migrations/0008_redemptions_of_orders.sql`): with the table's statistics missing,
    /// a group of orderIds was once planned as a scan of the whole table.
    pub async fn rows(
        &mut self,
        order_ids: &[&str],
        deadline: std::time::Duration,
    ) -> Result<std::collections::HashMap<String, Result<Reservation>>> {
        let lookup = async {
            let conn = self.conn.get().await?;
            sqlx::query_as::<_, RedemptionRow>(&ROWS_OF_ORDERS)
                .bind(order_ids)
                .fetch_all(conn)
                .await
        };
        let rows = tokio::time::timeout(deadline, lookup).await;
        self.conn.finish(matches!(rows, Ok(Ok(_))), deadline).await;
        let rows = match rows {
            Ok(rows) => rows?,
            Err(_) => return Err(Error::unavailable("database (lookup past its deadline)")),
        };
        Ok(rows
            .into_iter()
            .map(|row| (row.order_id.clone(), Reservation::try_from(row)))
            .collect())
    }
}
