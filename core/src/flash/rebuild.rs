//! Rebuilding a lost gate from PostgreSQL, and only once PostgreSQL holds every event
//! published for the voucher: otherwise the gate would count too few uses and oversell.

use std::sync::Arc;

use futures::TryStreamExt;

use super::gate::{Generation, LoadStart, OrderRecord, CHUNK};
use super::FlashPath;
use crate::domain::Voucher;
use crate::Result;

/// How long a gate open under a refused generation is given before it is taken for
/// stranded: a live loader hands it the new one within one Redis call of its bump.
const STRANDED_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// How a rebuild ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rebuild {
    Loaded,
    AlreadyLoaded,
    /// A load of a newer read began meanwhile; it opens the gate, not this one.
    Superseded,
    /// The consumer did not catch up in time; the next reservation tries again.
    NotCaughtUp,
}

impl Rebuild {
    fn label(self) -> &'static str {
        match self {
            Self::Loaded => "loaded",
            Self::AlreadyLoaded => "already_loaded",
            Self::Superseded => "superseded",
            Self::NotCaughtUp => "not_caught_up",
        }
    }
}

impl FlashPath {
    /// Starts a rebuild of the voucher's gate unless this instance is already at it.
    /// One asked for while a job of the voucher runs follows that job if the gate is still
    /// closed then: a reload that unloads the gate as a rebuild is finishing (it found the
    /// gate loaded, or opened it just before the unload) would otherwise leave it unloaded
    /// until the next reservation.
    pub fn trigger_rebuild(&self, voucher: Arc<Voucher>) {
        if !self.start_job(&voucher.code, true) {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            let result = this.rebuild(&voucher).await;
            let label = result.as_ref().map_or("error", |r| r.label());
            this.inner
                .metrics
                .gate_rebuilds
                .with_label_values(&[label])
                .inc();
            match result {
                Ok(outcome) => tracing::info!(code = %voucher.code, ?outcome, "gate rebuild"),
                Err(e) => {
                    tracing::warn!(code = %voucher.code, error = %e.chain(), "gate rebuild failed")
                }
            }
            this.finish_job(voucher).await;
        });
    }

    /// After a use was refused as stale while the gate that decided it is still open
    /// under that generation: if it still is a moment later, a loader took the next
    /// generation and never reached the gate (it died, or failed in between; a live one
    /// reaches it within one Redis call), and every use would be refused for good. The
    /// gate is handed the voucher's latest generation then, without a rebuild: nothing is
    /// loaded, and every use this gate decided is in it. One at a time per voucher.
    pub fn heal_stranded(&self, voucher: Arc<Voucher>, refused: Generation) {
        if !self.start_job(&voucher.code, false) {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(STRANDED_AFTER).await;
            match this.raise_if_stranded(&voucher, refused).await {
                Ok(true) => {
                    this.inner
                        .metrics
                        .gate_rebuilds
                        .with_label_values(&["raised"])
                        .inc();
                    tracing::warn!(code = %voucher.code, "a gate stranded under an older generation was handed the latest");
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(code = %voucher.code, error = %e.chain(), "stranded gate check failed")
                }
            }
            this.finish_job(voucher).await;
        });
    }

    async fn raise_if_stranded(&self, voucher: &Voucher, refused: Generation) -> Result<bool> {
        if self.inner.gate.generation(&voucher.code).await? != Some(refused.0) {
            return Ok(false);
        }
        let latest = self.inner.store.gate_generation(&voucher.code).await?;
        if latest <= refused.0 {
            return Ok(false);
        }
        self.inner.gate.raise_generation(voucher, latest).await
    }

    /// Marks a rebuild or heal of `code` under way in this instance; `false` if one is,
    /// and then, if `rebuild_after`, a rebuild is to follow it ([`Self::end_job`]).
    fn start_job(&self, code: &crate::domain::VoucherCode, rebuild_after: bool) -> bool {
        let mut jobs = self
            .inner
            .rebuilding
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match jobs.get_mut(code) {
            Some(again) => {
                *again |= rebuild_after;
                false
            }
            None => {
                jobs.insert(code.clone(), false);
                true
            }
        }
    }

    /// Ends the job of `voucher` and starts the rebuild asked for while it ran, if the gate
    /// is still not open: a rebuild of an open gate would only bump its generation, and
    /// refuse as stale the uses it decides until it takes the new one on.
    async fn finish_job(&self, voucher: Arc<Voucher>) {
        if !self.end_job(&voucher.code) {
            return;
        }
        match self.inner.gate.remaining(&voucher.code).await {
            Ok(Some(_)) => {}
            // Closed, or Redis not answering (the rebuild then says why in its log).
            Ok(None) | Err(_) => self.trigger_rebuild(voucher),
        }
    }

    /// Ends the job of `code`: `true` if a rebuild was asked for while it ran.
    fn end_job(&self, code: &crate::domain::VoucherCode) -> bool {
        self.inner
            .rebuilding
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(code)
            .unwrap_or(false)
    }

    /// Rebuilds the gate: with the broker deciding, wait out publishes in flight and the
    /// consumer; then read PostgreSQL and load (unless another instance got there first).
    pub async fn rebuild(&self, voucher: &Voucher) -> Result<Rebuild> {
        // 1. With the broker deciding, a reservation that passed the gate just before it
        //    was lost may still be publishing; after message_timeout its event is written
        //    or never will be. With PostgreSQL deciding there is nothing to wait out: a
        //    use's row is committed before its 201 and its event, and a recording still in
        //    flight is ordered by the load's generation bump (it commits before the bump and
        //    the read sees it, or it is refused as stale and never answered 201). Waiting
        //    anyway cost every customer of the voucher 503s for message_timeout (5 s by
        //    default) after a Redis failover.
        if !self.database_decides() {
            tokio::time::sleep(self.inner.message_timeout).await;
        }
        // 2. Every event published so far is in PostgreSQL once the writers caught up.
        if !self
            .rows_caught_up(self.inner.settings.catch_up_timeout)
            .await?
        {
            return Ok(Rebuild::NotCaughtUp);
        }
        // 3. Load it from PostgreSQL; edges that flagged it sold out while it was closed
        //    look again.
        let outcome = self.load_from_database(voucher).await?;
        if outcome == Rebuild::Loaded {
            self.inner.gate.announce_available(&voucher.code).await;
        }
        Ok(outcome)
    }

    /// Loads the voucher's gate from PostgreSQL, fenced and in pieces:
    ///
    /// 1. the voucher's next generation is taken (committed on its own, after every write of
    ///    a use an older gate decided), then one consistent read;
    /// 2. the gate is filled while closed, [`CHUNK`] entries per Redis call, so a voucher of
    ///    any size loads without a long call; with the broker deciding, each chunk's order
    ///    claims are restored first, so no other voucher can take one of these orders once
    ///    the gate opens;
    /// 3. it opens only if the generation is still the voucher's latest in PostgreSQL and
    ///    the loading marker in Redis is still this load's. A slow load of an older read
    ///    (a paused core) can therefore never open over a newer one, even if Redis lost
    ///    everything in between: the newer load bumped the generation first.
    pub async fn load_from_database(&self, voucher: &Voucher) -> Result<Rebuild> {
        let (gate, store) = (&self.inner.gate, &self.inner.store);
        let generation = store.next_gate_generation(&voucher.code).await?;
        // At once after the bump: a gate found open takes the new generation on here
        // (load_begin.lua), and until then the uses it decides are refused as stale.
        let (start, loading) = gate.begin_load(voucher, generation).await?;
        match start {
            LoadStart::Started => {}
            LoadStart::AlreadyLoaded => return Ok(Rebuild::AlreadyLoaded),
            LoadStart::Superseded => return Ok(Rebuild::Superseded),
        }
        let mut read = store.read_gate(&voucher.code, generation).await?;
        let remaining = read.remaining;
        let definition = read.voucher.clone();
        let mut filled = true;
        {
            let mut rows = read.reservations().try_chunks(CHUNK);
            while let Some(chunk) = rows.try_next().await.map_err(|e| e.1)? {
                let orders: Vec<(String, OrderRecord)> = chunk
                    .iter()
                    .map(|r| (r.order_id.to_string(), OrderRecord::from(r)))
                    .collect();
                // With the broker deciding, the claims lost with the gate come back before
                // it opens; with PostgreSQL deciding there are none (its unique orderId is
                // the guard across vouchers).
                if !self.database_decides() {
                    let ids: Vec<String> = orders.iter().map(|(o, _)| o.clone()).collect();
                    gate.claim_orders(&voucher.code, &ids).await?;
                }
                if !gate.fill_load(&loading, &[], &orders).await? {
                    filled = false;
                    break;
                }
            }
        }
        if filled {
            let mut customers = read.customers().try_chunks(CHUNK);
            while let Some(chunk) = customers.try_next().await.map_err(|e| e.1)? {
                if !gate.fill_load(&loading, &chunk, &[]).await? {
                    filled = false;
                    break;
                }
            }
        }
        read.finish().await?;
        if !filled || store.gate_generation(&voucher.code).await? != loading.generation() {
            return Ok(Rebuild::Superseded);
        }
        if !gate.open_load(&loading, &definition, remaining).await? {
            return Ok(Rebuild::Superseded);
        }
        // An operator's change committed after the read found no open gate to amend: the
        // gate takes it now (only a newer version is taken), not a reconciliation later.
        let latest = store.voucher(&voucher.code).await?;
        if latest.version > definition.version {
            gate.amend(&latest).await?;
        }
        Ok(Rebuild::Loaded)
    }
}
