//! The voucher use cases, and the seam where a reservation is decided per voucher mode.
//!
//! Handlers call this with parsed domain values; this picks the path (standard: PostgreSQL
//! decides in groups, see `standard`; flash: the Redis gate, see `flash`) and counts
//! outcomes.

use std::sync::Arc;

use voucher_contract::order_filter::OrderFilter;

use crate::catalog::Catalog;
use crate::domain::{
    Lowering, NewVoucher, OrderId, Reservation, ReservationRequest, ReservationStatus, Voucher,
    VoucherChange, VoucherCode, VoucherMode, VoucherState, VoucherStats,
};
use crate::flash::FlashPath;
use crate::metrics::Metrics;
use crate::standard::Grouper;
use crate::store::{
    Actor, AuditEvent, LedgerRow, ReserveOutcome, StateChange, Store, VoucherFilter,
};
use crate::{Error, Result};

#[derive(Clone)]
pub struct VoucherService {
    store: Store,
    catalog: Catalog,
    metrics: Arc<Metrics>,
    reservation_ttl: chrono::Duration,
    /// Standard mode's reservations, decided in groups.
    standard: Grouper,
    /// Present when Redis and Kafka are configured; without it flash vouchers are refused.
    flash: Option<FlashPath>,
}

impl VoucherService {
    pub fn new(
        store: Store,
        metrics: Arc<Metrics>,
        reservation_ttl: chrono::Duration,
        standard: Grouper,
        flash: Option<FlashPath>,
    ) -> Self {
        Self {
            catalog: Catalog::new(store.clone()),
            store,
            metrics,
            reservation_ttl,
            standard,
            flash,
        }
    }

    pub fn flash(&self) -> Option<&FlashPath> {
        self.flash.as_ref()
    }

    fn flash_path(&self) -> Result<&FlashPath> {
        self.flash.as_ref().ok_or(Error::ModeUnavailable("flash"))
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub async fn create(&self, new: NewVoucher, by: &Actor) -> Result<Voucher> {
        // Refused rather than silently served by the standard path: an operator who asks
        // for flash mode expects the Redis gate in front of PostgreSQL.
        let flash = match new.mode {
            VoucherMode::Flash => Some(self.flash_path()?),
            VoucherMode::Standard => None,
        };
        let voucher = self.store.create_voucher(&new, by).await?;
        self.catalog.remember(voucher.clone());
        self.metrics
            .voucher_changes
            .with_label_values(&["create"])
            .inc();
        if let Some(flash) = flash {
            // If Redis is down now, the first reservation finds the gate unloaded and
            // rebuilds it; nothing is lost by not failing the creation.
            if let Err(e) = flash.warm_up(&voucher).await {
                tracing::warn!(error = %e.chain(), code = %voucher.code, "gate not warmed up; it will be rebuilt on demand");
            }
        }
        Ok(voucher)
    }

    pub async fn get(&self, code: &VoucherCode) -> Result<(Voucher, VoucherStats)> {
        let (voucher, mut stats) = self.store.voucher_with_stats(code).await?;
        if let (VoucherMode::Flash, Some(flash)) = (voucher.mode, &self.flash) {
            stats.gate_remaining = flash.gate().remaining(code).await.ok().flatten();
        }
        Ok((voucher, stats))
    }

    /// Changes a voucher's definition if it is still at version `expected` (see
    /// [`Store::change_voucher`]), then hands it to its gate ([`Self::in_force`]).
    pub async fn change(
        &self,
        code: &VoucherCode,
        expected: i64,
        change: &VoucherChange,
        by: &Actor,
    ) -> Result<Voucher> {
        let current = self.catalog.get(code).await?;
        let lowering = match (current.mode, &self.flash) {
            (VoucherMode::Flash, Some(flash)) if !flash.database_decides() => Lowering::Refused,
            _ => Lowering::ToUsesHeld,
        };
        let voucher = self
            .store
            .change_voucher(code, expected, change, lowering, by)
            .await?;
        self.in_force(voucher, "change").await
    }

    /// Pauses, resumes or archives a voucher (see [`Store::change_state`]), then hands the
    /// state to its gate ([`Self::in_force`]). Asking again for the state it is in is
    /// answered as the first time, and hands it to the gate again.
    pub async fn change_state(
        &self,
        code: &VoucherCode,
        change: StateChange,
        expected: Option<i64>,
        by: &Actor,
    ) -> Result<Voucher> {
        let voucher = self.store.change_state(code, change, expected, by).await?;
        self.in_force(voucher, change.action()).await
    }

    /// A committed change takes effect: this core's catalog has it at once (the others
    /// within `catalog::REFRESH_AFTER`), and a flash voucher's open gate takes it in one
    /// step before the operator is answered. PostgreSQL already holds it for every use
    /// taken after (`store::batch` reads the row); a gate that could not be reached is
    /// answered 503 (the change stays committed, a retry of a pause or resume hands it to
    /// the gate again, and reconciliation does within its interval).
    async fn in_force(&self, voucher: Voucher, action: &str) -> Result<Voucher> {
        self.catalog.remember(voucher.clone());
        self.metrics
            .voucher_changes
            .with_label_values(&[action])
            .inc();
        match (voucher.mode, &self.flash) {
            // The gate announces what it took (`amend.lua`).
            (VoucherMode::Flash, Some(flash)) => {
                flash.gate().amend(&voucher).await?;
            }
            // A standard voucher has no gate, but edges may hold a flag for it: an active
            // one may have uses again (resumed, or its limit raised).
            _ if voucher.state == VoucherState::Active => {
                self.announce_available(&voucher.code).await;
            }
            _ => {}
        }
        Ok(voucher)
    }

    /// One page of vouchers (see [`Store::list_vouchers`]), with the uses each holds.
    pub async fn list(&self, filter: &VoucherFilter) -> Result<Vec<(Voucher, i32)>> {
        self.store.list_vouchers(filter).await
    }

    /// One page of a voucher's reservations in `status`; `VoucherNotFound` for an unknown
    /// code.
    pub async fn ledger_page(
        &self,
        code: &VoucherCode,
        status: ReservationStatus,
        after: Option<i64>,
        limit: i64,
    ) -> Result<Vec<LedgerRow>> {
        self.catalog.get(code).await?;
        self.store.ledger_page(code, status, after, limit).await
    }

    /// A voucher's reservation for `order_id`, if it has one.
    pub async fn ledger_row(
        &self,
        code: &VoucherCode,
        order_id: &OrderId,
    ) -> Result<Option<LedgerRow>> {
        self.catalog.get(code).await?;
        self.store.ledger_row(code, order_id.as_str()).await
    }

    /// Every reservation of a voucher (in `status`), in chunks (see
    /// [`Store::ledger_stream`]).
    pub async fn ledger_stream(
        &self,
        code: &VoucherCode,
        status: Option<ReservationStatus>,
    ) -> Result<tokio::sync::mpsc::Receiver<Result<Vec<LedgerRow>>>> {
        self.catalog.get(code).await?;
        Ok(self.store.ledger_stream(code, status))
    }

    /// One page of a voucher's audit trail; `VoucherNotFound` for an unknown code.
    pub async fn audit(
        &self,
        code: &VoucherCode,
        after: Option<i64>,
        limit: i64,
    ) -> Result<Vec<AuditEvent>> {
        self.catalog.get(code).await?;
        self.store.audit_events(code, after, limit).await
    }

    /// Operator command: drop the voucher's gate and rebuild it from PostgreSQL once that
    /// is safe. Reservations for it get 503 until then. Audited.
    pub async fn reload_gate(&self, code: &VoucherCode, by: &Actor) -> Result<()> {
        let voucher = self.catalog.get(code).await?;
        if voucher.mode != VoucherMode::Flash {
            return Err(Error::InvalidRequest(crate::domain::FieldError::new(
                "code",
                "only flash vouchers have a gate",
            )));
        }
        let flash = self.flash_path()?;
        self.store
            .audit_command(&voucher, "reload_gate", by)
            .await?;
        flash.gate().unload(code).await?;
        flash.trigger_rebuild(voucher);
        Ok(())
    }

    pub async fn reserve(&self, request: &ReservationRequest) -> Result<ReserveOutcome> {
        let voucher = self.catalog.get(&request.voucher_code).await?;
        let result = match voucher.mode {
            VoucherMode::Standard => self.standard.reserve(&voucher, request).await,
            VoucherMode::Flash => {
                self.flash_path()?
                    .reserve(&voucher, request, self.reservation_ttl)
                    .await
            }
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
        match self.mode_of(code).await? {
            VoucherMode::Standard => self.store.confirm(code, order_id).await,
            VoucherMode::Flash => self.flash_path()?.confirm(code, order_id).await,
        }
    }

    /// Releases a reservation. Flash mode gives the use back to its gate, which tells the
    /// edges; a standard voucher has no gate, but edges may still hold a sold-out flag for
    /// it, so they are told too (when Redis is configured).
    pub async fn release(&self, code: &VoucherCode, order_id: &OrderId) -> Result<Reservation> {
        match self.mode_of(code).await? {
            VoucherMode::Standard => {
                let released = self.store.release(code, order_id).await?;
                self.announce_available(code).await;
                Ok(released)
            }
            VoucherMode::Flash => self.flash_path()?.release(code, order_id).await,
        }
    }

    /// Tells the edges a use of a standard voucher is available again.
    async fn announce_available(&self, code: &VoucherCode) {
        if let Some(flash) = &self.flash {
            flash.gate().announce_available(code).await;
        }
    }

    /// Every orderId that has a reservation on the voucher, whatever its state: the edge
    /// forwards retries of these while the voucher is sold out.
    pub async fn order_ids(&self, code: &VoucherCode) -> Result<Vec<String>> {
        let voucher = self.catalog.get(code).await?;
        match (voucher.mode, &self.flash) {
            // With PostgreSQL deciding, its rows are every use acknowledged, whatever the
            // gate went through (a gate restored from an older snapshot lacks orders that
            // hold rows, and an edge must never answer their retries OUT_OF_STOCK); the
            // gate adds the orders whose commit is under way.
            (VoucherMode::Flash, Some(flash)) if flash.database_decides() => {
                let mut ids = self.store.voucher_order_ids(code).await?;
                if let Some(gate) = flash.gate().order_ids(code).await? {
                    ids.extend(gate);
                    ids.sort_unstable();
                    ids.dedup();
                }
                Ok(ids)
            }
            // With the broker deciding, some rows may still be on their way: the gate's.
            (VoucherMode::Flash, Some(flash)) => match flash.gate().order_ids(code).await? {
                Some(ids) => Ok(ids),
                None => Err(Error::unavailable("voucher gate (rebuilding)")),
            },
            _ => self.store.voucher_order_ids(code).await,
        }
    }

    /// Every orderId that has a reservation on the voucher, as a filter with the uses left
    /// when it was read: what an edge needs to answer a sold-out voucher's newcomers.
    ///
    /// With it, the voucher's state as PostgreSQL holds it (read before the orders, so a
    /// filter read after a pause was committed says paused): whether the filter answers
    /// for a paused voucher or a sold-out one.
    pub async fn order_filter(&self, code: &VoucherCode) -> Result<(OrderFilter, VoucherState)> {
        let voucher = self.store.voucher(code).await?;
        let state = voucher.state;
        let filter = self.order_filter_of(&voucher).await?;
        Ok((filter, state))
    }

    async fn order_filter_of(&self, voucher: &Voucher) -> Result<OrderFilter> {
        let code = &voucher.code;
        match (voucher.mode, &self.flash) {
            // As for `order_ids`: PostgreSQL's rows, read first, and the gate's orders with
            // the uses it had left (the gate says sold out while a last commit is under
            // way; PostgreSQL's count would not yet). Without a gate: PostgreSQL's rows and
            // count, in one snapshot.
            (VoucherMode::Flash, Some(flash)) if flash.database_decides() => {
                let rows = self.store.voucher_order_ids(code).await?;
                match flash.gate().order_filter_with(code, &rows).await? {
                    Some(filter) => Ok(filter),
                    None => self.store.voucher_order_filter(code).await,
                }
            }
            (VoucherMode::Flash, Some(flash)) => match flash.gate().order_filter(code).await? {
                Some(filter) => Ok(filter),
                None => Err(Error::unavailable("voucher gate (rebuilding)")),
            },
            _ => self.store.voucher_order_filter(code).await,
        }
    }

    /// After the expiry job released reservations in PostgreSQL: flash gates get their
    /// uses back (and tell the edges); edges hear of standard vouchers' uses too.
    pub async fn after_expiry(&self, released: &[Reservation]) {
        let Some(flash) = &self.flash else { return };
        let mut standard = std::collections::BTreeSet::new();
        for r in released {
            match self.catalog.get(&r.voucher_code).await.map(|v| v.mode) {
                Ok(VoucherMode::Flash) => {
                    flash.released_in_db(&r.voucher_code, &r.order_id).await;
                }
                _ => {
                    standard.insert(&r.voucher_code);
                }
            }
        }
        for code in standard {
            self.announce_available(code).await;
        }
    }

    /// The mode of the voucher an order is on; an unknown voucher has no reservation.
    async fn mode_of(&self, code: &VoucherCode) -> Result<VoucherMode> {
        match self.catalog.get(code).await {
            Ok(voucher) => Ok(voucher.mode),
            Err(Error::VoucherNotFound) => Err(Error::ReservationNotFound),
            Err(e) => Err(e),
        }
    }
}
