//! Which core a request goes to: a reservation to its voucher's core, anything else to
//! the next core round-robin.
//!
//! A voucher's core is the first ready one on a consistent-hash ring of the cores
//! (pingora's Ketama), keyed by the voucher's code. One core then takes all of a hot
//! voucher's accepts, and its recorder groups them into fewer, larger transactions than
//! two cores' halves: on the 1,000-use sale, 15 to 21 writing transactions where
//! round-robin took 29 to 42, and the accepts' p50 and p99 lower at 8,000/s
//! (`reports/bench/SALE-affinity.md`, which also has the cost: a grouped commit frees its
//! batch's places at the edge at once, so near the sell-out a larger wave of waiting
//! reservations reaches the core, and in some runs more are refused there). A core that is
//! not ready, or that this request already failed on, is passed over for the next one on
//! the ring: the voucher moves while its core is away, and only that core's vouchers move.
//! The ring follows the cores as discovery finds them; a core that comes or goes takes or
//! gives up about its share.

use std::collections::BTreeSet;
use std::sync::Arc;

use pingora::lb::selection::consistent::{KetamaHashing, OwnedNodeIterator};
use pingora::lb::selection::weighted::WeightedIterator;
use pingora::lb::selection::{algorithms, BackendIter, BackendSelection, RoundRobin};
use pingora::lb::Backend;

/// The edge's choice of core: by voucher for a non-empty key (a voucher code), round-robin
/// for the empty key.
pub struct CoreChoice {
    by_voucher: Arc<KetamaHashing>,
    any: Arc<RoundRobin>,
}

/// The cores in the order a request tries them.
pub enum Choices {
    Voucher(OwnedNodeIterator),
    Any(WeightedIterator<algorithms::RoundRobin>),
}

impl BackendSelection for CoreChoice {
    type Iter = Choices;
    type Config = ();

    fn build(backends: &BTreeSet<Backend>) -> Self {
        CoreChoice {
            by_voucher: Arc::new(KetamaHashing::build(backends)),
            any: Arc::new(RoundRobin::build(backends)),
        }
    }

    fn iter(self: &Arc<Self>, key: &[u8]) -> Choices {
        if key.is_empty() {
            Choices::Any(self.any.iter(key))
        } else {
            Choices::Voucher(self.by_voucher.iter(key))
        }
    }
}

impl BackendIter for Choices {
    fn next(&mut self) -> Option<&Backend> {
        match self {
            Choices::Voucher(ring) => ring.next(),
            Choices::Any(round) => round.next(),
        }
    }
}

/// The key of a request's choice of core: its voucher's code for a reservation the edge
/// has screened (`Ctx::code`), empty (round-robin) for anything else.
pub fn key(code: Option<&str>) -> &[u8] {
    code.map_or(&[], str::as_bytes)
}

/// The core of `cores` (`host:port`, as the edge's upstreams) that `code`'s reservations go
/// to while every one of them is ready: for tests and tools that must know which core a
/// sale runs on (the fault campaign strikes it). `None` when no address parses.
pub fn voucher_core(cores: &[impl AsRef<str>], code: &str) -> Option<String> {
    let backends = cores
        .iter()
        .filter_map(|a| Backend::new(a.as_ref()).ok())
        .collect();
    let choice = Arc::new(CoreChoice::build(&backends));
    let mut ring = choice.iter(code.as_bytes());
    ring.next().map(|b| b.addr.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cores(addresses: &[&str]) -> Arc<CoreChoice> {
        let backends = addresses
            .iter()
            .map(|a| Backend::new(a).expect("an address"))
            .collect();
        Arc::new(CoreChoice::build(&backends))
    }

    fn first(choice: &Arc<CoreChoice>, key: &[u8]) -> String {
        let mut choices = choice.iter(key);
        choices.next().expect("a core").addr.to_string()
    }

    #[test]
    fn voucher_core_names_the_first_core_of_the_ring() {
        let addresses = ["127.0.0.1:8081", "127.0.0.1:8082"];
        let choice = cores(&addresses);
        for i in 0..100 {
            let code = format!("FLASH{i}");
            assert_eq!(
                voucher_core(&addresses, &code),
                Some(first(&choice, code.as_bytes()))
            );
        }
        assert_eq!(voucher_core(&["not an address"], "FLASH1"), None);
    }

    #[test]
    fn a_voucher_always_goes_to_its_one_core_and_codes_spread_over_the_cores() {
        let choice = cores(&["127.0.0.1:8081", "127.0.0.1:8082", "127.0.0.1:8083"]);
        let mut per_core = std::collections::BTreeMap::new();
        for i in 0..3_000 {
            let code = format!("FLASH{i}");
            let core = first(&choice, code.as_bytes());
            for _ in 0..3 {
                assert_eq!(first(&choice, code.as_bytes()), core, "{code} moved");
            }
            *per_core.entry(core).or_insert(0) += 1;
        }
        assert_eq!(per_core.len(), 3, "{per_core:?}");
        assert!(per_core.values().all(|&n| n > 600), "{per_core:?}");
    }

    #[test]
    fn a_removed_core_gives_up_only_its_own_vouchers() {
        let three = cores(&["127.0.0.1:8081", "127.0.0.1:8082", "127.0.0.1:8083"]);
        let two = cores(&["127.0.0.1:8081", "127.0.0.1:8082"]);
        for i in 0..1_000 {
            let code = format!("FLASH{i}");
            let before = first(&three, code.as_bytes());
            if before != "127.0.0.1:8083" {
                assert_eq!(first(&two, code.as_bytes()), before, "{code} moved");
            }
        }
    }

    #[test]
    fn a_voucher_ring_offers_every_core_and_the_empty_key_takes_turns() {
        let choice = cores(&["127.0.0.1:8081", "127.0.0.1:8082"]);
        let mut seen = BTreeSet::new();
        let mut ring = choice.iter(b"FLASH1");
        for _ in 0..400 {
            match ring.next() {
                Some(b) => seen.insert(b.addr.to_string()),
                None => break,
            };
        }
        assert_eq!(
            seen.len(),
            2,
            "the next core is there when the first is away"
        );
        let turns: Vec<String> = (0..4).map(|_| first(&choice, key(None))).collect();
        assert_ne!(turns[0], turns[1]);
        assert_eq!(turns[0], turns[2]);
        assert_eq!(turns[1], turns[3]);
    }
}
