//! Per-client request rates, for bots: a client over its rate is answered
//! `429 RATE_LIMITED` with `Retry-After` at the edge, before anything reaches a core.
//!
//! Counts are kept in pingora-limits' `Rate`, a count-min sketch per one-second window:
//! memory is fixed whatever the number of clients (a scanner with a million addresses costs
//! what one does), and a count is a few atomic adds. A sketch may count a client high when
//! it shares cells with a heavy one, never low; the sketch is wide enough (2^16 cells per
//! row) that this takes a flood on many other clients.

use std::hash::Hash;
use std::net::IpAddr;
use std::time::Duration;

use pingora_limits::rate::Rate;
use serde::Deserialize;

/// Rows and columns of each sketch: 4 × 65,536 cells of 8 bytes, two windows: 4 MiB each.
const HASHES: usize = 4;
const SLOTS: usize = 1 << 16;

/// Rates per client, in requests per second; 0 turns a limit off.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct RateLimitSettings {
    /// Requests per second from one IP address, any route.
    pub per_ip: u32,
    /// Reservations per second naming one customerId (read from the body).
    pub per_customer: u32,
}

/// Who was over their rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limited {
    Ip,
    Customer,
}

impl Limited {
    /// Metric label.
    pub fn label(self) -> &'static str {
        match self {
            Limited::Ip => "ip",
            Limited::Customer => "customer",
        }
    }
}

struct Limit {
    rate: Rate,
    max: isize,
}

impl Limit {
    fn new(per_second: u32) -> Option<Self> {
        (per_second > 0).then(|| Self {
            rate: Rate::new_with_estimator_config(Duration::from_secs(1), HASHES, SLOTS),
            max: per_second as isize,
        })
    }

    /// Counts one request of `key`; `false` when that takes it over the limit this second.
    fn admit<K: Hash>(&self, key: &K) -> bool {
        self.rate.observe(key, 1) <= self.max
    }
}

pub struct RateLimits {
    per_ip: Option<Limit>,
    per_customer: Option<Limit>,
}

impl RateLimits {
    pub fn new(settings: &RateLimitSettings) -> Self {
        Self {
            per_ip: Limit::new(settings.per_ip),
            per_customer: Limit::new(settings.per_customer),
        }
    }

    /// Counts a request from `ip` (unknown for a Unix socket peer: not limited).
    pub fn check_ip(&self, ip: Option<IpAddr>) -> Result<(), Limited> {
        match (&self.per_ip, ip) {
            (Some(limit), Some(ip)) if !limit.admit(&ip) => Err(Limited::Ip),
            _ => Ok(()),
        }
    }

    /// Counts a reservation naming `customer` (as the core reads it, so `42` and `"42"`
    /// share one count).
    pub fn check_customer(&self, customer: &str) -> Result<(), Limited> {
        match &self.per_customer {
            Some(limit) if !limit.admit(&customer) => Err(Limited::Customer),
            _ => Ok(()),
        }
    }

    pub fn is_off(&self) -> bool {
        self.per_ip.is_none() && self.per_customer.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_over_its_rate_is_refused_and_others_are_not() {
        let limits = RateLimits::new(&RateLimitSettings {
            per_ip: 5,
            per_customer: 3,
        });
        let bot: IpAddr = "10.0.0.1".parse().expect("ip");
        let other: IpAddr = "10.0.0.2".parse().expect("ip");
        let admitted = (0..100)
            .filter(|_| limits.check_ip(Some(bot)).is_ok())
            .count();
        assert!(
            (5..=6).contains(&admitted),
            "{admitted} of 100 in one second (a window may turn over once)"
        );
        assert_eq!(limits.check_ip(Some(other)), Ok(()));
        let admitted = (0..100)
            .filter(|_| limits.check_customer("42").is_ok())
            .count();
        assert!((3..=4).contains(&admitted), "{admitted}");
        assert_eq!(limits.check_customer("43"), Ok(()));
        assert_eq!(limits.check_ip(None), Ok(()), "no address, no count");
    }

    #[test]
    fn zero_turns_a_limit_off() {
        let limits = RateLimits::new(&RateLimitSettings::default());
        assert!(limits.is_off());
        let ip: IpAddr = "10.0.0.1".parse().expect("ip");
        assert!((0..10_000).all(|_| limits.check_ip(Some(ip)).is_ok()));
    }
}
