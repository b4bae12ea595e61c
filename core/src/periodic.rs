//! The loop of every periodic job of the core (expiry, reconciliation).

use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// Calls `round` every `interval` (a slow round delays the next rather than piling up)
/// until `shutdown` is cancelled. The loop of every periodic job of the core.
pub async fn every<F, Fut>(interval: Duration, shutdown: &CancellationToken, mut round: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = ticker.tick() => round().await,
        }
    }
}
