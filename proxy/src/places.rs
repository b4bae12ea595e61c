//! Places at the cores per voucher: how many of one voucher's reservations this edge has at
//! the cores at once (`voucher_in_flight`).
//!
//! A flash sale opens with one voucher's burst. Sent on all at once, it queues inside the
//! cores, ahead of the gate, and when the gate takes the last use every request still
//! queued there becomes a refusal a core must look up in PostgreSQL, while the sale's
//! accepts wait behind them: at 10,000 requests a second, 217 such refusals, with the
//! accepts' p99 at 96 ms (`reports/bench/SALE-places.md`, the row without a bound). Held
//! here instead, a reservation that waited for its place asks the voucher's flag again
//! before it goes on, so once the gate has announced the sell-out the queue is answered by
//! the edge.
//!
//! A reservation waits at most `admission.queue_timeout` for a place, then gets
//! `503 OVERLOADED`, as for the edge's own admission limit. Unlike that limit's, which go
//! newest first once its wait has stood for the timeout, these places always go first
//! come, first served (a fair semaphore): a sale's opening burst waits here longer than
//! 50 ms, and newest first refused its earliest customers
//! (`reports/bench/OVERLOAD-newest-first.md`). Vouchers have their places in a cache of
//! `cache_capacity` entries, idle ones forgotten after a minute (a forgotten voucher whose
//! requests are still at the cores starts afresh, so the bound may be passed for a moment,
//! never by more than once more).

use std::sync::Arc;
use std::time::Duration;

use moka::sync::Cache;
use prometheus::IntGauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::metrics::Counted;

/// A voucher's places, shared by clones.
#[derive(Clone)]
pub struct VoucherPlaces {
    /// `None`: no bound (`voucher_in_flight: 0`).
    vouchers: Option<Cache<String, Arc<Semaphore>>>,
    per_voucher: usize,
    timeout: Duration,
}

/// How a reservation came by its place.
#[derive(Debug)]
pub enum Place {
    /// At once: nothing changed while it asked.
    Free(Option<OwnedSemaphorePermit>),
    /// After waiting: the voucher may have been flagged meanwhile.
    Waited(OwnedSemaphorePermit),
    /// None within the timeout.
    Full,
}

impl VoucherPlaces {
    pub fn new(per_voucher: usize, timeout: Duration, capacity: u64) -> Self {
        let vouchers = (per_voucher > 0).then(|| {
            Cache::builder()
                .max_capacity(capacity)
                .time_to_idle(Duration::from_secs(60))
                .build()
        });
        Self {
            vouchers,
            per_voucher: per_voucher.min(Semaphore::MAX_PERMITS),
            timeout,
        }
    }

    /// A place for one of `code`'s reservations, held until the permit is dropped; a wait
    /// for one is counted in `waiting` while it lasts.
    pub async fn take(&self, code: &str, waiting: &IntGauge) -> Place {
        let Some(vouchers) = &self.vouchers else {
            return Place::Free(None);
        };
        let places = vouchers.get_with_by_ref(code, || Arc::new(Semaphore::new(self.per_voucher)));
        if let Ok(permit) = places.clone().try_acquire_owned() {
            return Place::Free(Some(permit));
        }
        let _waiting = Counted::new(waiting);
        match tokio::time::timeout(self.timeout, places.acquire_owned()).await {
            Ok(Ok(permit)) => Place::Waited(permit),
            // Timed out, or closed (never: no one closes it).
            _ => Place::Full,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_voucher_has_its_places_and_others_have_theirs() {
        let gauge = IntGauge::new("waiting", "waiting").expect("gauge");
        let places = VoucherPlaces::new(2, Duration::from_millis(20), 100);
        let a = places.take("V", &gauge).await;
        let b = places.take("V", &gauge).await;
        assert!(matches!(a, Place::Free(Some(_))) && matches!(b, Place::Free(Some(_))));
        assert!(
            matches!(places.take("V", &gauge).await, Place::Full),
            "no third"
        );
        assert!(matches!(
            places.take("W", &gauge).await,
            Place::Free(Some(_))
        ));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_place_given_back_goes_to_the_one_waiting() {
        let gauge = IntGauge::new("waiting", "waiting").expect("gauge");
        let places = VoucherPlaces::new(1, Duration::from_secs(30), 100);
        let held = places.take("V", &gauge).await;
        let waiting = tokio::spawn({
            let (places, gauge) = (places.clone(), gauge.clone());
            async move { places.take("V", &gauge).await }
        });
        // One thread: the task runs until it waits for the place.
        tokio::task::yield_now().await;
        assert_eq!(gauge.get(), 1, "counted while it waits");
        drop(held);
        assert!(matches!(waiting.await.expect("task"), Place::Waited(_)));
        assert_eq!(gauge.get(), 0);
    }

    #[tokio::test]
    async fn zero_is_no_bound() {
        let gauge = IntGauge::new("waiting", "waiting").expect("gauge");
        let places = VoucherPlaces::new(0, Duration::from_millis(1), 100);
        for _ in 0..10 {
            assert!(matches!(places.take("V", &gauge).await, Place::Free(None)));
        }
    }
}
