//! Reads that flash mode's rebuild and reconciliation need.

use sqlx::FromRow;

use super::reservations::{RedemptionRow, REDEMPTION_COLUMNS};
use super::vouchers::{VoucherRow, VOUCHER_COLUMNS};
use super::Store;
use crate::domain::{Reservation, Voucher, VoucherCode};
use crate::Result;

impl Store {
    /// Every reservation of a voucher, whatever its status.
    #[tracing::instrument(name = "db.voucher_reservations", skip(self))]
    pub async fn voucher_reservations(&self, code: &VoucherCode) -> Result<Vec<Reservation>> {
        let rows: Vec<RedemptionRow> = sqlx::query_as(&format!(
            "SELECT {REDEMPTION_COLUMNS} FROM redemptions WHERE voucher_code = $1"
        ))
        .bind(code.as_str())
        .fetch_all(self.pool())
        .await?;
        rows.into_iter().map(Reservation::try_from).collect()
    }

    /// The order ids of every reservation of a voucher.
    pub async fn voucher_order_ids(&self, code: &VoucherCode) -> Result<Vec<String>> {
        Ok(
            sqlx::query_scalar("SELECT order_id FROM redemptions WHERE voucher_code = $1")
                .bind(code.as_str())
                .fetch_all(self.pool())
                .await?,
        )
    }

    /// Flash vouchers whose sale has not been over for a day: the ones worth reconciling.
    pub async fn live_flash_vouchers(&self) -> Result<Vec<Voucher>> {
        #[derive(FromRow)]
        struct Row {
            #[sqlx(flatten)]
            voucher: VoucherRow,
        }
        let rows: Vec<Row> = sqlx::query_as(&format!(
            "SELECT {VOUCHER_COLUMNS} FROM vouchers v
             WHERE v.mode = 'flash' AND v.ends_at > now() - interval '1 day'"
        ))
        .fetch_all(self.pool())
        .await?;
        rows.into_iter()
            .map(|r| Voucher::try_from(r.voucher))
            .collect()
    }
}
