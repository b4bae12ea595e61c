//! Voucher definitions, cached in memory.
//!
//! A voucher's definition (limits, window, mode) never changes after creation, so a cached
//! copy can never be stale; only its counts change, and those are never cached here.
//! Unknown codes are not cached either: another instance may create the voucher a moment
//! later. The cache holds only vouchers that exist, so it is bounded by their number.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use crate::domain::{Voucher, VoucherCode};
use crate::store::Store;
use crate::Result;

#[derive(Debug, Clone)]
pub struct Catalog {
    store: Store,
    known: Arc<RwLock<HashMap<VoucherCode, Arc<Voucher>>>>,
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
        if let Some(v) = self.cached(code) {
            return Ok(v);
        }
        let voucher = self.store.voucher(code).await?;
        Ok(self.remember(voucher))
    }

    pub fn remember(&self, voucher: Voucher) -> Arc<Voucher> {
        let voucher = Arc::new(voucher);
        // A poisoned lock only means a panic elsewhere mid-insert; the map is still usable.
        let mut known = self.known.write().unwrap_or_else(|e| e.into_inner());
        known.insert(voucher.code.clone(), voucher.clone());
        voucher
    }

    fn cached(&self, code: &VoucherCode) -> Option<Arc<Voucher>> {
        let known = self.known.read().unwrap_or_else(|e| e.into_inner());
        known.get(code).cloned()
    }
}
