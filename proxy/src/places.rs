//! Places at the cores per voucher: how many of one voucher's reservations this edge has at
//! the cores at once.
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
//! The bound is `voucher_in_flight`, and lower near a sell-out: a core's 201 says how many
//! uses the gate had left after it (`x-voucher-remaining`), and while that was heard less
//! than `sold_out_ttl` ago the edge sends at most that many of the voucher's reservations
//! (at least one) to the cores at once. With one edge, every request it has at the cores
//! can then still take a use, and the rest wait here for the sell-out's flag; with several,
//! each bounds its own. A use given back (the availability announcement) forgets the count.
//!
//! A reservation waits at most `admission.queue_timeout` for a place, then gets
//! `503 OVERLOADED`, as for the edge's own admission limit. Vouchers have their places in a
//! cache of `cache_capacity` entries, idle ones forgotten after a minute (a forgotten
//! voucher whose requests are still at the cores starts afresh, so the bound may be passed
//! for a moment, never by more than once more).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use moka::sync::Cache;
use prometheus::IntGauge;
use tokio::sync::Notify;

use crate::metrics::Counted;

/// Each voucher's places, shared by clones.
#[derive(Clone)]
pub struct VoucherPlaces {
    /// `None`: no bound (`voucher_in_flight: 0`).
    vouchers: Option<Cache<String, Arc<Lane>>>,
    per_voucher: usize,
    timeout: Duration,
    /// How long a core's count of uses left bounds the voucher's places.
    left_for: Duration,
}

/// One voucher's requests at the cores.
#[derive(Debug, Default)]
struct Lane {
    in_flight: AtomicUsize,
    /// Wakes one waiter when a place is given back.
    released: Notify,
    /// The uses the gate had left, as the latest 201 said, and when it was heard.
    left: Mutex<Option<(u64, Instant)>>,
}

/// A reservation's place among its voucher's at the cores, given back when dropped.
#[derive(Debug)]
pub struct Held(Arc<Lane>);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.0.released.notify_one();
    }
}

/// How a reservation came by its place.
#[derive(Debug)]
pub enum Place {
    /// At once: nothing changed while it asked (`None`: no bound).
    Free(Option<Held>),
    /// After waiting: the voucher may have been flagged meanwhile.
    Waited(Held),
    /// None within the timeout.
    Full,
}

impl VoucherPlaces {
    pub fn new(per_voucher: usize, timeout: Duration, left_for: Duration, capacity: u64) -> Self {
        let vouchers = (per_voucher > 0).then(|| {
            Cache::builder()
                .max_capacity(capacity)
                .time_to_idle(Duration::from_secs(60))
                .build()
        });
        Self {
            vouchers,
            per_voucher,
            timeout,
            left_for,
        }
    }

    /// A place for one of `code`'s reservations, held until it is dropped; a wait for one
    /// is counted in `waiting` while it lasts.
    pub async fn take(&self, code: &str, waiting: &IntGauge) -> Place {
        let Some(vouchers) = &self.vouchers else {
            return Place::Free(None);
        };
        let lane = vouchers.get_with_by_ref(code, || Arc::new(Lane::default()));
        if let Some(held) = self.enter(&lane) {
            return Place::Free(Some(held));
        }
        let _waiting = Counted::new(waiting);
        let deadline = tokio::time::Instant::now() + self.timeout;
        loop {
            // Registered before the check: a place given back between the two still wakes
            // this waiter.
            let released = lane.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            if let Some(held) = self.enter(&lane) {
                return Place::Waited(held);
            }
            if tokio::time::timeout_at(deadline, released).await.is_err() {
                return Place::Full;
            }
        }
    }

    /// A core said the gate had `left` uses of `code` after the use it just took.
    pub fn heard_left(&self, code: &str, left: u64) {
        if let Some(lane) = self.vouchers.as_ref().and_then(|v| v.get(code)) {
            if let Ok(mut known) = lane.left.lock() {
                *known = Some((left, Instant::now()));
            }
        }
    }

    /// A use of `code` was given back: its last count of uses left is stale.
    pub fn forget_left(&self, code: &str) {
        if let Some(lane) = self.vouchers.as_ref().and_then(|v| v.get(code)) {
            if let Ok(mut known) = lane.left.lock() {
                *known = None;
            }
            // Waiters may now fit under the bound again.
            lane.released.notify_waiters();
        }
    }

    /// Drops every count (the availability channel was lost: give-backs may be missed).
    pub fn forget_all_left(&self) {
        if let Some(vouchers) = &self.vouchers {
            for (_, lane) in vouchers.iter() {
                if let Ok(mut known) = lane.left.lock() {
                    *known = None;
                }
                lane.released.notify_waiters();
            }
        }
    }

    /// The lane's bound now: `per_voucher`, or the uses left if a core said so lately.
    fn bound(&self, lane: &Lane) -> usize {
        let left = lane
            .left
            .lock()
            .ok()
            .and_then(|known| *known)
            .filter(|(_, at)| at.elapsed() < self.left_for)
            .map(|(left, _)| usize::try_from(left).unwrap_or(usize::MAX).max(1));
        left.map_or(self.per_voucher, |left| left.min(self.per_voucher))
    }

    fn enter(&self, lane: &Arc<Lane>) -> Option<Held> {
        let bound = self.bound(lane);
        lane.in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < bound).then_some(n + 1)
            })
            .ok()
            .map(|_| Held(lane.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gauge() -> IntGauge {
        IntGauge::new("waiting", "waiting").expect("gauge")
    }

    #[tokio::test]
    async fn a_voucher_has_its_places_and_others_have_theirs() {
        let (gauge, places) = (
            gauge(),
            VoucherPlaces::new(2, Duration::from_millis(20), Duration::from_secs(60), 100),
        );
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
        let gauge = gauge();
        let places = VoucherPlaces::new(1, Duration::from_secs(30), Duration::from_secs(60), 100);
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
    async fn uses_left_lower_the_bound_until_forgotten_or_stale() {
        let gauge = gauge();
        let places = VoucherPlaces::new(4, Duration::from_millis(10), Duration::from_secs(60), 100);
        let first = places.take("V", &gauge).await;
        places.heard_left("V", 2);
        let second = places.take("V", &gauge).await;
        assert!(matches!(second, Place::Free(Some(_))));
        assert!(
            matches!(places.take("V", &gauge).await, Place::Full),
            "two at the cores, two uses left: no third"
        );
        places.heard_left("V", 0);
        drop(second);
        assert!(
            matches!(places.take("V", &gauge).await, Place::Full),
            "none left: one at a time, and one is there"
        );
        drop(first);
        let one = places.take("V", &gauge).await;
        assert!(matches!(one, Place::Free(Some(_))), "at least one");
        places.forget_left("V");
        let mut held = vec![one];
        for _ in 0..3 {
            let place = places.take("V", &gauge).await;
            assert!(
                matches!(place, Place::Free(Some(_))),
                "a give-back: the whole bound"
            );
            held.push(place);
        }
        drop(held);
        let stale = VoucherPlaces::new(4, Duration::from_millis(10), Duration::ZERO, 100);
        let _in = stale.take("V", &gauge).await;
        stale.heard_left("V", 0);
        assert!(
            matches!(stale.take("V", &gauge).await, Place::Free(Some(_))),
            "a count older than left_for bounds nothing"
        );
    }

    #[tokio::test]
    async fn zero_is_no_bound() {
        let gauge = gauge();
        let places = VoucherPlaces::new(0, Duration::from_millis(1), Duration::from_secs(60), 100);
        for _ in 0..10 {
            assert!(matches!(places.take("V", &gauge).await, Place::Free(None)));
        }
    }
}
