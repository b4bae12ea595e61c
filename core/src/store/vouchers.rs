use chrono::{DateTime, Utc};
use sqlx::FromRow;

use super::lifecycle::Actor;
use super::Store;
use crate::domain::{
    Money, NewVoucher, Voucher, VoucherCode, VoucherMode, VoucherState, VoucherStats,
};
use crate::{Error, Result};

/// A `vouchers` row as stored.
#[derive(Debug, FromRow)]
pub(super) struct VoucherRow {
    pub code: String,
    pub discount_amount: i64,
    pub min_order_amount: i64,
    pub total_limit: i32,
    pub per_user_limit: i32,
    pub starts_at: DateTime<Utc>,
    pub ends_at: DateTime<Utc>,
    pub mode: String,
    pub created_at: DateTime<Utc>,
    pub state: String,
    pub version: i64,
    pub updated_at: DateTime<Utc>,
}

impl TryFrom<VoucherRow> for Voucher {
    type Error = Error;

    fn try_from(row: VoucherRow) -> Result<Self> {
        let corrupt = |what: &str| Error::corrupt(format!("stored voucher has invalid {what}"));
        Ok(Voucher {
            code: VoucherCode::parse(row.code).map_err(|_| corrupt("code"))?,
            discount_amount: Money::from_db(row.discount_amount),
            min_order_amount: Money::from_db(row.min_order_amount),
            total_limit: row.total_limit,
            per_user_limit: row.per_user_limit,
            starts_at: row.starts_at,
            ends_at: row.ends_at,
            mode: VoucherMode::parse(&row.mode).map_err(|_| corrupt("mode"))?,
            created_at: row.created_at,
            state: VoucherState::parse(&row.state).map_err(|_| corrupt("state"))?,
            version: row.version,
            updated_at: row.updated_at,
        })
    }
}

pub(super) const VOUCHER_COLUMNS: &str = "v.code, v.discount_amount, v.min_order_amount, \
     v.total_limit, v.per_user_limit, v.starts_at, v.ends_at, v.mode, v.created_at, v.state, \
     v.version, v.updated_at";

impl Store {
    /// Creates a voucher, with its audit row in the same transaction; `VoucherExists` when
    /// the code is taken.
    #[tracing::instrument(skip_all, fields(code = %new.code))]
    pub async fn create_voucher(&self, new: &NewVoucher, by: &Actor) -> Result<Voucher> {
        let mut tx = self.pool().begin().await?;
        let row: Option<VoucherRow> = sqlx::query_as(&format!(
            "INSERT INTO vouchers AS v (code, discount_amount, min_order_amount, total_limit,
                                        per_user_limit, starts_at, ends_at, mode)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
             ON CONFLICT (code) DO NOTHING
             RETURNING {VOUCHER_COLUMNS}"
        ))
        .bind(new.code.as_str())
        .bind(new.discount_amount.minor_units())
        .bind(new.min_order_amount.minor_units())
        .bind(new.total_limit)
        .bind(new.per_user_limit)
        .bind(new.starts_at)
        .bind(new.ends_at)
        .bind(new.mode.as_str())
        .fetch_optional(&mut *tx)
        .await?;
        let voucher: Voucher = row.ok_or(Error::VoucherExists)?.try_into()?;
        super::lifecycle::audit(&mut tx, by, "create", None, &voucher).await?;
        tx.commit().await?;
        Ok(voucher)
    }

    /// A voucher's definition; `VoucherNotFound` when there is none.
    #[tracing::instrument(skip_all, fields(code = %code))]
    pub async fn voucher(&self, code: &VoucherCode) -> Result<Voucher> {
        let row: Option<VoucherRow> = sqlx::query_as(&format!(
            "SELECT {VOUCHER_COLUMNS} FROM vouchers v WHERE v.code = $1"
        ))
        .bind(code.as_str())
        .fetch_optional(self.pool())
        .await?;
        row.ok_or(Error::VoucherNotFound)?.try_into()
    }

    /// A voucher with its live counts; `VoucherNotFound` when there is none.
    #[tracing::instrument(skip_all, fields(code = %code))]
    pub async fn voucher_with_stats(&self, code: &VoucherCode) -> Result<(Voucher, VoucherStats)> {
        #[derive(FromRow)]
        struct Row {
            #[sqlx(flatten)]
            voucher: VoucherRow,
            used_count: i32,
            reserved: i64,
            confirmed: i64,
        }
        let row: Option<Row> = sqlx::query_as(&format!(
            "SELECT {VOUCHER_COLUMNS}, v.used_count,
                    count(*) FILTER (WHERE r.status = 'RESERVED')  AS reserved,
                    count(*) FILTER (WHERE r.status = 'CONFIRMED') AS confirmed
             FROM vouchers v
             LEFT JOIN redemptions r ON r.voucher_code = v.code
             WHERE v.code = $1
             GROUP BY v.code"
        ))
        .bind(code.as_str())
        .fetch_optional(self.pool())
        .await?;
        let row = row.ok_or(Error::VoucherNotFound)?;
        let stats = VoucherStats {
            used_count: row.used_count,
            reserved: row.reserved,
            confirmed: row.confirmed,
            gate_remaining: None,
        };
        Ok((row.voucher.try_into()?, stats))
    }

    /// Flash vouchers whose sale has not been over for a day: the ones worth reconciling.
    pub async fn live_flash_vouchers(&self) -> Result<Vec<Voucher>> {
        let rows: Vec<VoucherRow> = sqlx::query_as(&format!(
            "SELECT {VOUCHER_COLUMNS} FROM vouchers v
             WHERE v.mode = 'flash' AND v.ends_at > now() - interval '1 day'"
        ))
        .fetch_all(self.pool())
        .await?;
        rows.into_iter().map(Voucher::try_from).collect()
    }
}
