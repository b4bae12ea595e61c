//! Sold-out flags per voucher code, in a moka cache with a short TTL.
//!
//! A flag is set when a core answers OUT_OF_STOCK. While it holds, new reservations for
//! the code are answered here. A retry of an order that already has a reservation must
//! still reach a core (it gets its original 201), with any number of edges and cores: so
//! a flag carries a filter of the orderIds the voucher has reservations for (no false
//! negatives), fetched from a core when the flag is set. Until it has arrived, nothing is
//! answered here; a filter read while the gate still had uses left is no flag at all.
//!
//! New reservations can appear only after a use is given back. Cores announce that on a
//! Redis channel, and the flag is dropped at once (a filter still being fetched is then
//! never stored); without the announcement (no Redis, a lost message) the flag ends with
//! its TTL.
//!
//! Keys are voucher codes as the core reads them (percent-decoded and valid), so one
//! voucher has one flag. One fetch per voucher at a time, and at most one per
//! `fetch_interval`, whatever clients send.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use moka::ops::compute::Op;
use moka::sync::Cache;
use voucher_contract::order_filter::OrderFilter;

/// What the edge knows about a sold-out voucher.
#[derive(Debug, Clone)]
pub enum Flag {
    /// Sold out, order filter being fetched: forward everything meanwhile.
    Pending { id: u64 },
    /// Sold out; orderIds the filter may contain have reservations (or are one of its
    /// false positives) and are forwarded.
    Ready { orders: Arc<OrderFilter> },
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
    /// Vouchers whose filter was fetched less than `fetch_interval` ago: no new flag yet.
    fetched: Cache<String, ()>,
    next_id: Arc<AtomicU64>,
}

impl SoldOutCache {
    pub fn new(ttl: Duration, fetch_interval: Duration, capacity: u64) -> Self {
        Self {
            flags: Cache::builder()
                .time_to_live(ttl)
                .max_capacity(capacity)
                .build(),
            fetched: Cache::builder()
                .time_to_live(fetch_interval.max(Duration::from_millis(1)))
                .max_capacity(capacity)
                .build(),
            next_id: Arc::new(AtomicU64::new(1)),
        }
    }

    /// What to do with a reservation of `order_id` (when it could be read) for `code`.
    pub fn verdict(&self, code: &str, order_id: Option<&str>) -> Verdict {
        match (self.flags.get(code), order_id) {
            (Some(Flag::Ready { orders }), Some(order)) if !orders.may_contain(order) => {
                Verdict::SoldOut
            }
            _ => Verdict::Forward,
        }
    }

    /// Flags `code` as pending unless it is flagged already or its filter was fetched
    /// less than `fetch_interval` ago; returns the id the filter must be stored under, or
    /// `None` (no fetch).
    pub fn begin(&self, code: &str) -> Option<u64> {
        if self.fetched.contains_key(code) {
            return None;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let result =
            self.flags
                .entry(code.to_owned())
                .and_compute_with(|existing| match existing {
                    Some(_) => Op::Nop,
                    None => Op::Put(Flag::Pending { id }),
                });
        let inserted = matches!(result, moka::ops::compute::CompResult::Inserted(_));
        if inserted {
            self.fetched.insert(code.to_owned(), ());
        }
        inserted.then_some(id)
    }

    /// Stores the filter fetched for flag `id`, unless the flag was dropped or replaced
    /// meanwhile (a use was given back while it was being fetched).
    pub fn complete(&self, code: &str, id: u64, orders: OrderFilter) -> bool {
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

    /// Drops every flag: after the availability channel was lost, any announcement may
    /// have been missed meanwhile.
    pub fn clear_all(&self) {
        self.flags.invalidate_all();
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
        SoldOutCache::new(Duration::from_secs(60), Duration::from_millis(1), 100)
    }

    fn filter(orders: &[&str]) -> OrderFilter {
        let mut f = OrderFilter::with_capacity(orders.len(), 0);
        orders.iter().for_each(|o| f.insert(o));
        f
    }

    /// Lets the `fetched` entries of the 1 ms interval expire.
    fn after_interval() {
        std::thread::sleep(Duration::from_millis(5));
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
        assert!(c.complete("V", id, filter(&["o1"])));
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
        assert!(!c.complete("V", id, filter(&[])));
        assert_eq!(c.verdict("V", Some("o9")), Verdict::Forward);
        after_interval();
        let newer = c.begin("V").expect("new flag");
        c.abandon("V", id);
        assert!(
            c.complete("V", newer, filter(&[])),
            "an old failure does not drop a newer flag"
        );
        assert_eq!(c.verdict("V", Some("o9")), Verdict::SoldOut);
    }

    #[test]
    fn flags_expire_with_their_ttl() {
        let c = SoldOutCache::new(Duration::from_millis(30), Duration::from_millis(1), 100);
        let id = c.begin("V").expect("flag");
        c.complete("V", id, filter(&[]));
        assert_eq!(c.verdict("V", Some("o9")), Verdict::SoldOut);
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(c.verdict("V", Some("o9")), Verdict::Forward);
    }

    #[test]
    fn one_fetch_per_voucher_per_interval_whatever_clients_do() {
        let c = SoldOutCache::new(Duration::from_secs(60), Duration::from_secs(60), 100);
        let id = c.begin("V").expect("first flag");
        c.abandon("V", id); // the fetch failed
        for _ in 0..1_000 {
            assert!(
                c.begin("V").is_none(),
                "no second fetch within the interval"
            );
            c.clear("V"); // give-backs announced as fast as a client can cause them
        }
        assert!(c.begin("W").is_some(), "another voucher has its own");
    }
}
