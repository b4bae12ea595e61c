//! The voucher use cases, and the seam where a reservation is decided per voucher mode.
//!
//! Handlers call this with parsed domain values; this picks the path (standard: one
//! PostgreSQL transaction; flash: the Redis gate, in its own issue) and counts outcomes.

use std::sync::Arc;

use chrono::Utc;

use crate::catalog::Catalog;
use crate::domain::{
    NewVoucher, OrderId, Reservation, ReservationRequest, Voucher, VoucherCode, VoucherMode,
    VoucherStats,
};
use crate::metrics::Metrics;
use crate::store::{ReserveOutcome, Store};
use crate::{Error, Result};

#[derive(Clone)]
pub struct VoucherService {
    store: Store,
    catalog: Catalog,
    metrics: Arc<Metrics>,
    reservation_ttl: chrono::Duration,
}

impl VoucherService {
    pub fn new(store: Store, metrics: Arc<Metrics>, reservation_ttl: chrono::Duration) -> Self {
        Self {
            catalog: Catalog::new(store.clone()),
            store,
            metrics,
            reservation_ttl,
        }
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub async fn create(&self, new: NewVoucher) -> Result<Voucher> {
        if new.mode == VoucherMode::Flash {
            // Refused rather than silently served by the standard path: an operator who
            // asks for flash mode expects the Redis gate in front of PostgreSQL.
            return Err(Error::ModeUnavailable("flash"));
        }
        let voucher = self.store.create_voucher(&new).await?;
        self.catalog.remember(voucher.clone());
        Ok(voucher)
    }

    pub async fn get(&self, code: &VoucherCode) -> Result<(Voucher, VoucherStats)> {
        self.store.voucher_with_stats(code).await
    }

    pub async fn reserve(&self, request: &ReservationRequest) -> Result<ReserveOutcome> {
        let voucher = self.catalog.get(&request.voucher_code).await?;
        let result = match voucher.mode {
            VoucherMode::Standard => {
                self.store
                    .reserve_standard(&voucher, request, Utc::now(), self.reservation_ttl)
                    .await
            }
            VoucherMode::Flash => Err(Error::ModeUnavailable("flash")),
        };
        let outcome = match &result {
            Ok(ReserveOutcome::Reserved(_)) => "reserved",
            Ok(ReserveOutcome::Retried(_)) => "retried",
            Err(e) => e.code(),
        };
        self.metrics
            .reservations
            .with_label_values(&[voucher.mode.as_str(), outcome])
            .inc();
        result
    }

    pub async fn confirm(&self, code: &VoucherCode, order_id: &OrderId) -> Result<Reservation> {
        self.store.confirm(code, order_id, Utc::now()).await
    }

    pub async fn release(&self, code: &VoucherCode, order_id: &OrderId) -> Result<Reservation> {
        self.store.release(code, order_id, Utc::now()).await
    }
}
