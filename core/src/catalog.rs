//! Voucher definitions, cached in memory and refreshed in the background.
//!
//! An operator may change a voucher (`store::lifecycle`) on any core, so a cached copy can
//! lag. Nothing that takes a use trusts it for what decides: the statements that take a
//! use read the state, limit, window and discount from the voucher's row (`store::batch`),
//! and a flash gate holds its own copy, amended with each change (`amend.lua`). The cache
//! only picks the path (the mode, which never changes) and answers early; a copy older
//! than `refresh_after` is still used, and one request starts its re-read, so every core
//! has a change within about that long and no request waits for it. The core that made a
//! change has it at once ([`Catalog::remember`]).
//!
//! Unknown codes are not cached: another instance may create the voucher a moment later.
//! The cache holds only vouchers that exist, so it is bounded by their number.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use crate::domain::{Voucher, VoucherCode};
use crate::store::Store;
use crate::Result;

/// How long a cached definition is used before a request starts its re-read.
pub const REFRESH_AFTER: Duration = Duration::from_millis(500);

struct Entry {
    voucher: Arc<Voucher>,
    read_at: Instant,
    /// A re-read is under way (at most one per voucher).
    refreshing: bool,
}

#[derive(Clone)]
pub struct Catalog {
    store: Store,
    known: Arc<RwLock<HashMap<VoucherCode, Entry>>>,
}

impl Catalog {
    pub fn new(store: Store) -> Self {
        Self {
            store,
            known: Arc::default(),
        }
    }

    /// The voucher's definition; `VoucherNotFound` when there is none.
    pub async fn get(&self, code: &VoucherCode) -> Result<Arc<Voucher>> {
        if let Some((voucher, stale)) = self.cached(code) {
            if stale {
                self.refresh(code);
            }
            return Ok(voucher);
        }
        let voucher = self.store.voucher(code).await?;
        Ok(self.remember(voucher))
    }

    /// Keeps `voucher` unless a later version is cached already (two reads can finish out
    /// of order).
    pub fn remember(&self, voucher: Voucher) -> Arc<Voucher> {
        let voucher = Arc::new(voucher);
        // A poisoned lock only means a panic elsewhere mid-insert; the map is still usable.
        let mut known = self.known.write().unwrap_or_else(|e| e.into_inner());
        match known.get_mut(&voucher.code) {
            Some(entry) if entry.voucher.version > voucher.version => {
                entry.read_at = Instant::now();
                entry.voucher.clone()
            }
            _ => {
                known.insert(
                    voucher.code.clone(),
                    Entry {
                        voucher: voucher.clone(),
                        read_at: Instant::now(),
                        refreshing: false,
                    },
                );
                voucher
            }
        }
    }

    /// The cached copy, and whether it is due for a re-read that nobody started yet (this
    /// caller claims it).
    fn cached(&self, code: &VoucherCode) -> Option<(Arc<Voucher>, bool)> {
        {
            let known = self.known.read().unwrap_or_else(|e| e.into_inner());
            let entry = known.get(code)?;
            if entry.refreshing || entry.read_at.elapsed() < REFRESH_AFTER {
                return Some((entry.voucher.clone(), false));
            }
        }
        let mut known = self.known.write().unwrap_or_else(|e| e.into_inner());
        let entry = known.get_mut(code)?;
        let claim = !entry.refreshing && entry.read_at.elapsed() >= REFRESH_AFTER;
        entry.refreshing |= claim;
        Some((entry.voucher.clone(), claim))
    }

    /// Re-reads `code` in the background; the copy stays in use meanwhile, and a failed
    /// read leaves it for the next request to try again.
    fn refresh(&self, code: &VoucherCode) {
        let (this, code) = (self.clone(), code.clone());
        tokio::spawn(async move {
            match this.store.voucher(&code).await {
                Ok(voucher) => {
                    this.remember(voucher);
                }
                Err(e) => {
                    tracing::debug!(%code, error = %e.chain(), "voucher definition not re-read");
                }
            }
            let mut known = this.known.write().unwrap_or_else(|e| e.into_inner());
            if let Some(entry) = known.get_mut(&code) {
                entry.refreshing = false;
            }
        });
    }
}
