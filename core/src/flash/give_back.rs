//! Giving a use back to the gate: the one place it happens, and (through the release
//! script, atomically) the one place the edges are told: a flag that says "sold out" must
//! drop as soon as a use is free again.
//!
//! Who calls it: the publish path (the event was certainly not written, or the order was
//! claimed by another voucher), release and expiry (the row was released in PostgreSQL),
//! reconciliation (the event never reached the database, or the gate missed a release), and
//! the recorder's refusals (PostgreSQL would not hold the use the gate took).

use super::gate::{GiveBack, ReleaseOutcome};
use super::FlashPath;
use crate::domain::{OrderId, VoucherCode};
use crate::Result;

impl FlashPath {
    /// Gives the use `order_id` holds on `code` back, as `how` says. The release script
    /// announces it to the edges itself when a use was in fact returned: in the same
    /// script, so a core dying in between cannot free a use the edges never hear of.
    pub(crate) async fn give_back(
        &self,
        code: &VoucherCode,
        order_id: &OrderId,
        how: GiveBack,
    ) -> Result<ReleaseOutcome> {
        self.inner.gate.release(code, order_id, how).await
    }

    /// PostgreSQL refused an order the gate let through: its pending record goes and its use
    /// goes back to where the gate had it. When PostgreSQL refused for the customer or the
    /// orderId, that use is free for someone else, so it is announced like every other
    /// give-back (an edge's flag must not hide it). When it refused for stock, the gate
    /// counts too many remaining (it went back in time): reconciliation repairs that count
    /// from PostgreSQL, PostgreSQL keeps refusing what it cannot hold, and the announcement
    /// only costs the edges a flag.
    pub(crate) async fn forget_refused(
        &self,
        code: &VoucherCode,
        order_id: &OrderId,
    ) -> Result<ReleaseOutcome> {
        let how = GiveBack::Forget {
            states: vec![super::gate::RecordState::Pending],
            published_by_ms: i64::MAX,
        };
        self.give_back(code, order_id, how).await
    }

    /// After PostgreSQL released an order (a release call, the expiry job): the gate gives
    /// its use back. If Redis fails here, reconciliation gives it back later (an undersell
    /// meanwhile, never an oversell), so the failure is logged, not raised. `true` when
    /// this call gave a use back (not when another already had).
    pub async fn released_in_db(&self, code: &VoucherCode, order_id: &OrderId) -> bool {
        match self.give_back(code, order_id, GiveBack::Release).await {
            Ok(ReleaseOutcome::Released) => true,
            Ok(ReleaseOutcome::Already) => false,
            Ok(other) => {
                tracing::info!(?other, %order_id, "released in PostgreSQL; nothing held in the gate");
                false
            }
            Err(e) => {
                tracing::warn!(error = %e.chain(), %order_id, "released in PostgreSQL; the gate will be reconciled");
                false
            }
        }
    }
}
