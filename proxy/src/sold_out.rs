//! Sold-out flags per voucher code, in a moka cache with a short TTL.
//!
//! A flag is set when a core answers OUT_OF_STOCK. While it holds, new reservations for
//! the code are answered here. A retry of an order that already has a reservation must
//! still reach a core (it gets its original 201), with any number of edges and cores: so
//! a flag carries the list of orderIds the voucher has reservations for, fetched from a
//! core when the flag is set. Until that list has arrived, nothing is answered here.
//!
//! New reservations can appear only after a use is given back. Cores announce that on a
//! Redis channel, and the flag is dropped at once; without the announcement (no Redis, a
//! lost message) the flag ends with its TTL.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use moka::ops::compute::Op;
use moka::sync::Cache;

/// What the edge knows about a sold-out voucher.
#[derive(Debug, Clone)]
pub enum Flag {
    /// Sold out, order list being fetched: forward everything meanwhile.
    Pending { id: u64 },
    /// Sold out; these orderIds have reservations and their retries are forwarded.
    Ready { orders: Arc<HashSet<String>> },
}

/// The edge's decision for one reservation request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Forward,
    SoldOut,
}

#[derive(Clone)]
pub struct SoldOutCache {
    flags: Cache<String, Flag>,
    next_id: Arc<AtomicU64>,
}

impl SoldOutCache {
    pub fn new(ttl: Duration, capacity: u64) -> Self {
        Self {
            flags: Cache::builder()
                .time_to_live(ttl)
                .max_capacity(capacity)
                .build(),
            next_id: Arc::new(AtomicU64::new(1)),
        }
    }

    /// What to do with a reservation of `order_id` (when it could be read) for `code`.
    pub fn verdict(&self, code: &str, order_id: Option<&str>) -> Verdict {
        match (self.flags.get(code), order_id) {
            (Some(Flag::Ready { orders }), Some(order)) if !orders.contains(order) => {
                Verdict::SoldOut
            }
            _ => Verdict::Forward,
        }
    }

    /// Flags `code` as pending unless it is flagged already; returns the id the order list
    /// must be stored under, `None` when a flag exists.
    pub fn begin(&self, code: &str) -> Option<u64> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let result =
            self.flags
                .entry(code.to_owned())
                .and_compute_with(|existing| match existing {
                    Some(_) => Op::Nop,
                    None => Op::Put(Flag::Pending { id }),
                });
        matches!(result, moka::ops::compute::CompResult::Inserted(_)).then_some(id)
    }

    /// Stores the order list fetched for flag `id`, unless the flag was dropped or replaced
    /// meanwhile (a use was given back while the list was being fetched).
    pub fn complete(&self, code: &str, id: u64, orders: HashSet<String>) -> bool {
        let orders = Arc::new(orders);
        let result = self.flags.entry(code.to_owned()).and_compute_with(|existing| match existing {
            Some(entry) if matches!(entry.value(), Flag::Pending { id: current } if *current == id) => {
                Op::Put(Flag::Ready { orders: orders.clone() })
            }
            _ => Op::Nop,
        });
        matches!(result, moka::ops::compute::CompResult::ReplacedWith(_))
    }

    /// Drops the flag of `code` (fetch failed, or a use was given back).
    pub fn clear(&self, code: &str) {
        self.flags.invalidate(code);
    }

    /// Drops flag `id` only (a failed fetch must not drop a newer flag).
    pub fn abandon(&self, code: &str, id: u64) {
        self.flags.entry(code.to_owned()).and_compute_with(|existing| match existing {
            Some(entry) if matches!(entry.value(), Flag::Pending { id: current } if *current == id) => Op::Remove,
            _ => Op::Nop,
        });
    }

    pub fn len(&self) -> u64 {
        self.flags.run_pending_tasks();
        self.flags.entry_count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache() -> SoldOutCache {
        SoldOutCache::new(Duration::from_secs(60), 100)
    }

    #[test]
    fn forwards_until_the_order_list_arrives_then_answers_newcomers() {
        let c = cache();
        assert_eq!(c.verdict("V", Some("o1")), Verdict::Forward);
        let id = c.begin("V").expect("first flag");
        assert!(c.begin("V").is_none(), "one flag per code");
        assert_eq!(
            c.verdict("V", Some("o9")),
            Verdict::Forward,
            "pending: forward"
        );
        assert!(c.complete("V", id, HashSet::from(["o1".to_owned()])));
        assert_eq!(
            c.verdict("V", Some("o1")),
            Verdict::Forward,
            "a holder's retry passes"
        );
        assert_eq!(c.verdict("V", Some("o9")), Verdict::SoldOut);
        assert_eq!(
            c.verdict("V", None),
            Verdict::Forward,
            "unreadable body: the core decides"
        );
        assert_eq!(c.verdict("W", Some("o9")), Verdict::Forward);
    }

    #[test]
    fn a_list_fetched_for_a_dropped_flag_is_not_stored() {
        let c = cache();
        let id = c.begin("V").expect("flag");
        c.clear("V"); // a use was given back meanwhile
        assert!(!c.complete("V", id, HashSet::new()));
        assert_eq!(c.verdict("V", Some("o9")), Verdict::Forward);
        let newer = c.begin("V").expect("new flag");
        c.abandon("V", id);
        assert!(
            c.complete("V", newer, HashSet::new()),
            "an old failure does not drop a newer flag"
        );
        assert_eq!(c.verdict("V", Some("o9")), Verdict::SoldOut);
    }

    #[test]
    fn flags_expire_with_their_ttl() {
        let c = SoldOutCache::new(Duration::from_millis(30), 100);
        let id = c.begin("V").expect("flag");
        c.complete("V", id, HashSet::new());
        assert_eq!(c.verdict("V", Some("o9")), Verdict::SoldOut);
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(c.verdict("V", Some("o9")), Verdict::Forward);
    }
}
