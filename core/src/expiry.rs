//! The background job that releases reservations left unconfirmed past their TTL.
//!
//! Every instance may run it: the store claims rows with `SKIP LOCKED` and releases each
//! exactly once (see `Store::release_expired`); for flash vouchers the gate then gets the
//! use back.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::service::VoucherService;

pub struct ExpiryJob {
    pub service: VoucherService,
    pub metrics: Arc<Metrics>,
    pub interval: Duration,
    pub batch: i64,
}

impl ExpiryJob {
    /// Runs until `shutdown` is cancelled.
    pub async fn run(self, shutdown: CancellationToken) {
        crate::periodic::every(self.interval, &shutdown, || self.run_once(&shutdown)).await;
    }

    /// Releases everything due now, one batch (one transaction) at a time, and stops after
    /// the batch it is on when `shutdown` is cancelled: a backlog of expired reservations
    /// (a sale's unpaid orders) took a core's shutdown past its 10 s deadline otherwise,
    /// batch after batch while everything else had stopped (seen: 89 batches of 500 in a
    /// core's log from start to that deadline). Another instance, or this one's next start,
    /// releases the rest.
    async fn run_once(&self, shutdown: &CancellationToken) {
        while !shutdown.is_cancelled() {
            match self.service.store().release_expired(None, self.batch).await {
                Ok(released) => {
                    self.service.after_expiry(&released).await;
                    self.metrics.expiry_runs.with_label_values(&["ok"]).inc();
                    let n = released.len();
                    self.metrics.expired_releases.inc_by(n as u64);
                    if n > 0 {
                        tracing::info!(released = n, "released expired reservations");
                    }
                    if (n as i64) < self.batch {
                        return;
                    }
                }
                Err(e) => {
                    self.metrics.expiry_runs.with_label_values(&["error"]).inc();
                    tracing::warn!(error = %e.chain(), "expiry run failed; will retry next tick");
                    return;
                }
            }
        }
    }
}
