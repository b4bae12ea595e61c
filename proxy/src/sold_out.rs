//! Flags of vouchers that take no new reservation, per voucher code, each with a short
//! TTL: sold out, or paused (or archived) by an operator.
//!
//! A flag is set when a core answers OUT_OF_STOCK (VOUCHER_PAUSED, VOUCHER_ARCHIVED), or
//! when a core announces that a gate took a voucher's last use or that an operator paused
//! it (`flagging`). While it holds, new reservations for the code are answered here with
//! the refusal the fetched filter came with ([`Refusal`]). A retry of an order that already has a reservation must
//! still reach a core (it gets its original 201), with any number of edges and cores: so
//! a flag carries a filter of the orderIds the voucher has reservations for (no false
//! negatives), fetched from a core when the flag is set. Until it has arrived, nothing is
//! answered here; a filter read while the gate still had uses left is no flag at all.
//! Meanwhile the voucher's reservations wait for it ([`Verdict::Wait`], bounded in time and
//! number by the caller) rather than go on: at a sale's sell-out every one that went on
//! would be a refusal for a core to look up in PostgreSQL, while the cores are busiest,
//! and the fetch takes milliseconds (`edge_order_fetch_seconds`).
//!
//! New reservations can appear only after a use is given back. Cores announce that on a
//! Redis channel, and the flag is dropped at once (a filter still being fetched is then
//! never stored); without the announcement (no Redis, a lost message) the flag ends with
//! its TTL.
//!
//! A flag in use is renewed before it ends: past half its TTL, the next answer it gives
//! starts a fetch of a new filter, and the flag goes on answering from its own until that
//! one is stored (a fresh TTL), or the fetch finds uses left (the flag is dropped), or its
//! TTL runs out. A flag that simply lapsed sent every request to the cores until its
//! successor's filter arrived: at 10,000 requests a second, a burst of some hundreds every
//! TTL, which failed the edge's reject ladder (`reports/bench/REJECT.md`). Every answer is
//! still given from a filter read at most a TTL (and a fetch) ago, as before.
//!
//! Keys are voucher codes as the core reads them (percent-decoded and valid), so one
//! voucher has one flag. One fetch per voucher at a time, and at most one per
//! `fetch_interval`, whatever clients send.
//!
//! The flags are a map behind a read-write lock ([`Flags`]), read by every reservation the
//! edge screens, written a few times per flagged voucher and TTL, and swept of lapsed flags
//! once a second: a moka cache here
//! (whose reads record themselves for its eviction policy and read its clock) cost the
//! reject path about 750 instructions an answer more (`reports/callgrind/EDGE.md`). The
//! fetch intervals, touched only when a flag begins or renews, stay in a moka cache.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use moka::sync::Cache;
use tokio::sync::watch;
use voucher_contract::order_filter::OrderFilter;

/// Why a flagged voucher takes no new reservation: the answer the edge gives for it, as
/// the cores would.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// 409 OUT_OF_STOCK.
    SoldOut,
    /// 409 VOUCHER_PAUSED.
    Paused,
    /// 409 VOUCHER_ARCHIVED.
    Archived,
}

/// What the edge knows about a voucher that takes no new reservation.
#[derive(Debug, Clone)]
pub enum Flag {
    /// Order filter being fetched: reservations wait until `settled` closes (the fetch
    /// ended, whichever way), then ask again.
    Pending {
        id: u64,
        settled: watch::Receiver<()>,
    },
    /// Refusing; orderIds the filter may contain have reservations (or are one of its
    /// false positives) and are forwarded. `id` names this flag for its renewal.
    Ready {
        id: u64,
        orders: Arc<OrderFilter>,
        refusal: Refusal,
        stored: Instant,
    },
}

/// The edge's decision for one reservation request.
#[derive(Debug, Clone)]
pub enum Verdict {
    Forward,
    /// The voucher's filter is being fetched: wait until this closes, then ask again (a
    /// caller that cannot wait forwards).
    Wait(watch::Receiver<()>),
    /// Answered here with `refusal`. `renew`: the flag is due for renewal and this answer
    /// claimed it; the caller fetches a new filter and stores it with
    /// [`SoldOutCache::complete`] under that id.
    Refuse {
        refusal: Refusal,
        renew: Option<u64>,
    },
}

/// The flags by voucher code, each until its TTL ends (a newer write of the code starts
/// a new TTL), at most `capacity` of them. A lapsed flag is no flag, and is taken out
/// (with its order filter) when the flags are counted, which the edge does every second
/// for its `edge_sold_out_flags` gauge, or when the map is full and a new one comes; when
/// none has lapsed then, the new one is not stored, and that voucher's reservations go to
/// the cores as if it had none (never a wrong refusal).
struct Flags {
    /// foldhash, not the standard SipHash: hashing the code was a quarter of a lookup on the
    /// reject path. The keys are codes of vouchers a core refused, not a client's choice.
    map: RwLock<HashMap<String, Stored, foldhash::fast::RandomState>>,
    ttl: Duration,
    capacity: usize,
}

struct Stored {
    flag: Flag,
    until: Instant,
}

/// What a write does with the flag stored for a code (`None`: none, or a lapsed one).
enum Write {
    Keep,
    Put(Flag),
    Remove,
}

impl Flags {
    fn new(ttl: Duration, capacity: u64) -> Self {
        Self {
            map: RwLock::new(HashMap::default()),
            ttl,
            capacity: usize::try_from(capacity).unwrap_or(usize::MAX),
        }
    }

    /// The flag of `code`, unless it lapsed before `now`. (A panic elsewhere while the
    /// lock was held left no half-written flag: a flag is put or removed in one map
    /// operation.)
    fn get(&self, code: &str, now: Instant) -> Option<Flag> {
        let map = self.map.read().unwrap_or_else(PoisonError::into_inner);
        map.get(code)
            .filter(|stored| stored.until > now)
            .map(|stored| stored.flag.clone())
    }

    /// Decides, from the live flag of `code` (if any), what to write, atomically with
    /// respect to every other read and write: `true` when it put a flag.
    fn write(&self, code: &str, decide: impl FnOnce(Option<&Flag>) -> Write) -> bool {
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        let live = map
            .get(code)
            .filter(|stored| stored.until > now)
            .map(|stored| &stored.flag);
        match decide(live) {
            Write::Keep => false,
            Write::Remove => {
                map.remove(code);
                false
            }
            Write::Put(flag) => {
                if !map.contains_key(code) && map.len() >= self.capacity {
                    map.retain(|_, stored| stored.until > now);
                    if map.len() >= self.capacity {
                        return false;
                    }
                }
                // A TTL past what an `Instant` holds (a configuration error): no flag,
                // rather than a panic in a request.
                let Some(until) = now.checked_add(self.ttl) else {
                    return false;
                };
                map.insert(code.to_owned(), Stored { flag, until });
                true
            }
        }
    }

    fn remove(&self, code: &str) {
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        map.remove(code);
    }

    fn clear(&self) {
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        map.clear();
    }

    /// Takes out the lapsed flags; the number left.
    fn purge(&self) -> usize {
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        map.retain(|_, stored| stored.until > now);
        map.len()
    }
}

#[derive(Clone)]
pub struct SoldOutCache {
    flags: Arc<Flags>,
    /// Vouchers whose filter was fetched less than `fetch_interval` ago: no new flag yet.
    fetched: Cache<String, ()>,
    next_id: Arc<AtomicU64>,
    /// A flag older than this is renewed by its next answer: half its TTL.
    renew_after: Duration,
}

impl SoldOutCache {
    pub fn new(ttl: Duration, fetch_interval: Duration, capacity: u64) -> Self {
        Self {
            flags: Arc::new(Flags::new(ttl, capacity)),
            fetched: Cache::builder()
                .time_to_live(fetch_interval.max(Duration::from_millis(1)))
                .max_capacity(capacity)
                .build(),
            next_id: Arc::new(AtomicU64::new(1)),
            renew_after: ttl / 2,
        }
    }

    /// What to do with a reservation of `order_id` (when it could be read) for `code`: one
    /// lookup of the flag decides the answer and whether it renews the flag.
    pub fn verdict(&self, code: &str, order_id: Option<&str>) -> Verdict {
        let now = Instant::now();
        match (self.flags.get(code, now), order_id) {
            (
                Some(Flag::Ready {
                    id,
                    orders,
                    refusal,
                    stored,
                }),
                Some(order),
            ) if !orders.may_contain(order) => Verdict::Refuse {
                refusal,
                renew: self.claim_renewal(code, id, now.saturating_duration_since(stored)),
            },
            (Some(Flag::Pending { settled, .. }), Some(_)) => Verdict::Wait(settled),
            _ => Verdict::Forward,
        }
    }

    /// Flags `code` as pending unless it is flagged already, its filter was fetched less
    /// than `fetch_interval` ago, or the table is full of live flags; returns the fetch the filter must be stored under,
    /// or `None` (no fetch). Reservations waiting for the filter go on asking once the
    /// [`Fetch`] is dropped: the fetch holds it until it has stored or dropped the flag.
    pub fn begin(&self, code: &str) -> Option<Fetch> {
        if self.fetched.contains_key(code) {
            return None;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (settle, settled) = watch::channel(());
        let inserted = self.flags.write(code, |existing| match existing {
            Some(_) => Write::Keep,
            None => Write::Put(Flag::Pending { id, settled }),
        });
        if inserted {
            self.fetched.insert(code.to_owned(), ());
        }
        inserted.then_some(Fetch {
            id,
            _settle: settle,
        })
    }

    /// Stores the filter fetched for flag `id`, answering `refusal`, unless the flag was
    /// dropped or replaced meanwhile (a use was given back, or the voucher resumed, while
    /// it was being fetched). For a renewal, `id` is the ready flag's own, which goes on
    /// answering until this replaces it.
    pub fn complete(&self, code: &str, id: u64, orders: OrderFilter, refusal: Refusal) -> bool {
        let orders = Arc::new(orders);
        self.flags.write(code, |existing| match existing {
            Some(flag) if flag_id(flag) == id => Write::Put(Flag::Ready {
                id: self.next_id.fetch_add(1, Ordering::Relaxed),
                orders,
                refusal,
                stored: Instant::now(),
            }),
            _ => Write::Keep,
        })
    }

    /// Flag `id` of `code`, `age` old, when it is due for renewal (older than half
    /// its TTL) and no fetch for the voucher ran within `fetch_interval`. `None`: no fetch.
    fn claim_renewal(&self, code: &str, id: u64, age: Duration) -> Option<u64> {
        if age < self.renew_after || self.fetched.contains_key(code) {
            return None;
        }
        // Single flight: the first caller past the check claims the interval.
        let claimed = self
            .fetched
            .entry(code.to_owned())
            .or_insert_with_if(|| (), |_| false)
            .is_fresh();
        claimed.then_some(id)
    }

    /// Drops the flag of `code` (fetch failed, a use was given back, the voucher resumed).
    pub fn clear(&self, code: &str) {
        self.flags.remove(code);
    }

    /// Drops every flag: after the availability channel was lost, any announcement may
    /// have been missed meanwhile.
    pub fn clear_all(&self) {
        self.flags.clear();
    }

    /// Drops flag `id` only (a failed fetch must not drop a newer flag; a renewal that
    /// found uses left drops the flag it renewed).
    pub fn abandon(&self, code: &str, id: u64) {
        self.flags.write(code, |existing| match existing {
            Some(flag) if flag_id(flag) == id => Write::Remove,
            _ => Write::Keep,
        });
    }

    /// Flags that have not lapsed (the lapsed ones are dropped on the way).
    pub fn len(&self) -> u64 {
        u64::try_from(self.flags.purge()).unwrap_or(u64::MAX)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A new flag's fetch of its filter: the id to store it under. Dropping it (after the
/// filter was stored or the flag dropped) releases the reservations waiting on the flag.
#[derive(Debug)]
pub struct Fetch {
    pub id: u64,
    /// Never sent on: its drop closes the channel, which is what waiters wait for.
    _settle: watch::Sender<()>,
}

fn flag_id(flag: &Flag) -> u64 {
    match flag {
        Flag::Pending { id, .. } | Flag::Ready { id, .. } => *id,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A verdict, comparable.
    #[derive(Debug, PartialEq)]
    enum Answer {
        Forward,
        Wait,
        Refuse {
            refusal: Refusal,
            renew: Option<u64>,
        },
    }

    fn answer(c: &SoldOutCache, code: &str, order: Option<&str>) -> Answer {
        match c.verdict(code, order) {
            Verdict::Forward => Answer::Forward,
            Verdict::Wait(_) => Answer::Wait,
            Verdict::Refuse { refusal, renew } => Answer::Refuse { refusal, renew },
        }
    }

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
    fn waits_until_the_order_list_arrives_then_answers_newcomers() {
        let c = cache();
        assert_eq!(answer(&c, "V", Some("o1")), Answer::Forward);
        let id = c.begin("V").expect("first flag").id;
        assert!(c.begin("V").is_none(), "one flag per code");
        assert_eq!(
            answer(&c, "V", Some("o9")),
            Answer::Wait,
            "pending: wait for the filter"
        );
        assert!(c.complete("V", id, filter(&["o1"]), Refusal::SoldOut));
        assert_eq!(
            answer(&c, "V", Some("o1")),
            Answer::Forward,
            "a holder's retry passes"
        );
        assert_eq!(
            answer(&c, "V", Some("o9")),
            Answer::Refuse {
                refusal: Refusal::SoldOut,
                renew: None
            }
        );
        assert_eq!(
            answer(&c, "V", None),
            Answer::Forward,
            "unreadable body: the core decides"
        );
        assert_eq!(answer(&c, "W", Some("o9")), Answer::Forward);
    }

    #[tokio::test]
    async fn waiters_are_released_when_the_fetch_ends_whichever_way() {
        let c = cache();
        let fetch = c.begin("V").expect("flag");
        let Verdict::Wait(mut settled) = c.verdict("V", Some("o9")) else {
            panic!("pending: wait");
        };
        assert!(
            settled.has_changed().is_ok(),
            "open while the fetch is under way"
        );
        assert!(c.complete("V", fetch.id, filter(&["o1"]), Refusal::SoldOut));
        drop(fetch);
        assert!(settled.changed().await.is_err(), "closed: ask again");
        assert!(matches!(c.verdict("V", Some("o9")), Verdict::Refuse { .. }));
        after_interval();
        c.clear("V");
        let failed = c.begin("W").expect("another flag");
        let Verdict::Wait(mut settled) = c.verdict("W", Some("o9")) else {
            panic!("pending: wait");
        };
        c.abandon("W", failed.id);
        drop(failed);
        assert!(settled.changed().await.is_err());
        assert_eq!(answer(&c, "W", Some("o9")), Answer::Forward, "no flag");
    }

    #[test]
    fn a_list_fetched_for_a_dropped_flag_is_not_stored() {
        let c = cache();
        let id = c.begin("V").expect("flag").id;
        c.clear("V"); // a use was given back meanwhile
        assert!(!c.complete("V", id, filter(&[]), Refusal::SoldOut));
        assert_eq!(answer(&c, "V", Some("o9")), Answer::Forward);
        after_interval();
        let newer = c.begin("V").expect("new flag").id;
        c.abandon("V", id);
        assert!(
            c.complete("V", newer, filter(&[]), Refusal::SoldOut),
            "an old failure does not drop a newer flag"
        );
        assert_eq!(
            answer(&c, "V", Some("o9")),
            Answer::Refuse {
                refusal: Refusal::SoldOut,
                renew: None
            }
        );
    }

    #[test]
    fn a_full_table_takes_a_new_flag_only_in_place_of_a_lapsed_one() {
        // A TTL no run outlasts: V's flag holds throughout.
        let c = SoldOutCache::new(Duration::from_secs(60), Duration::from_millis(1), 1);
        let id = c.begin("V").expect("flag").id;
        assert!(c.complete("V", id, filter(&[]), Refusal::SoldOut));
        assert!(c.begin("W").is_none(), "no place while V's flag holds");
        assert_eq!(answer(&c, "W", Some("o1")), Answer::Forward);
        assert_eq!(c.len(), 1);
        // A TTL that has surely lapsed after the sleep (sleeps only ever overrun).
        let c = SoldOutCache::new(Duration::from_millis(30), Duration::from_millis(1), 1);
        let id = c.begin("V").expect("flag").id;
        assert!(c.complete("V", id, filter(&[]), Refusal::SoldOut));
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(c.len(), 0, "a lapsed flag is no flag");
        let id = c.begin("W").expect("V's lapsed flag made room").id;
        assert!(
            c.complete("W", id, filter(&[]), Refusal::Paused),
            "W's flag is stored"
        );
    }

    #[test]
    fn flags_expire_with_their_ttl() {
        let c = SoldOutCache::new(Duration::from_millis(30), Duration::from_millis(1), 100);
        let id = c.begin("V").expect("flag").id;
        c.complete("V", id, filter(&[]), Refusal::SoldOut);
        assert_eq!(
            answer(&c, "V", Some("o9")),
            Answer::Refuse {
                refusal: Refusal::SoldOut,
                renew: None
            }
        );
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(answer(&c, "V", Some("o9")), Answer::Forward);
    }

    /// A newcomer's answer from the flag of `code`, which must be sold out: the renewal
    /// that answer claimed, if any.
    fn renewal_claimed(c: &SoldOutCache, code: &str) -> Option<u64> {
        match answer(c, code, Some("newcomer")) {
            Answer::Refuse { renew, .. } => renew,
            other => panic!("{code} is not answered as sold out: {other:?}"),
        }
    }

    #[test]
    fn a_flag_past_half_its_ttl_is_renewed_and_answers_until_the_new_filter_replaces_it() {
        // Sleeps only ever overrun: each check has at least 0.5 s of margin against its
        // deadline (the 500 ms fetch interval, which makes a renewal single-flight, is over
        // when the flag is due).
        let c = SoldOutCache::new(Duration::from_secs(2), Duration::from_millis(500), 100);
        let id = c.begin("V").expect("flag").id;
        assert!(c.complete("V", id, filter(&["o1"]), Refusal::SoldOut));
        assert_eq!(
            renewal_claimed(&c, "V"),
            None,
            "young flags are not renewed"
        );
        std::thread::sleep(Duration::from_millis(1200));
        let ready = renewal_claimed(&c, "V").expect("due past half the TTL");
        assert_eq!(
            renewal_claimed(&c, "V"),
            None,
            "one renewal at a time, and the flag answers meanwhile"
        );
        assert!(c.complete("V", ready, filter(&["o1", "o2"]), Refusal::SoldOut));
        assert_eq!(
            answer(&c, "V", Some("o2")),
            Answer::Forward,
            "the new filter answers"
        );
        std::thread::sleep(Duration::from_millis(1200));
        assert!(
            renewal_claimed(&c, "V").is_some(),
            "the renewed flag has a TTL of its own: past the first one's, it holds, and is \
             due for its own renewal"
        );
    }

    #[test]
    fn a_renewal_finding_uses_left_or_racing_a_give_back_leaves_no_flag() {
        let c = SoldOutCache::new(Duration::from_secs(2), Duration::from_millis(1), 100);
        let id = c.begin("V").expect("flag").id;
        c.complete("V", id, filter(&[]), Refusal::SoldOut);
        std::thread::sleep(Duration::from_millis(1200));
        let ready = renewal_claimed(&c, "V").expect("due");
        c.abandon("V", ready); // the fetched filter had uses left
        assert_eq!(answer(&c, "V", Some("o9")), Answer::Forward);
        after_interval();
        let id = c.begin("V").expect("a new flag").id;
        c.complete("V", id, filter(&[]), Refusal::SoldOut);
        std::thread::sleep(Duration::from_millis(1200));
        let ready = renewal_claimed(&c, "V").expect("due");
        c.clear("V"); // a use given back while the renewal was fetched
        assert!(
            !c.complete("V", ready, filter(&[]), Refusal::SoldOut),
            "never stored"
        );
        assert_eq!(answer(&c, "V", Some("o9")), Answer::Forward);
    }

    #[test]
    fn one_fetch_per_voucher_per_interval_whatever_clients_do() {
        let c = SoldOutCache::new(Duration::from_secs(60), Duration::from_secs(60), 100);
        let id = c.begin("V").expect("first flag").id;
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
