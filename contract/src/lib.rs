//! The wire contract of the voucher gate: what the edge and the core must agree on, kept in
//! one crate both import so that neither can drift from the other.
//!
//! - [`headers`]: response headers with a meaning beyond HTTP itself;
//! - [`ErrorCode`]: the stable `error` codes of every error answer, the edge's own included;
//! - [`Route`]: the API's calls as the edge recognises them from method and path;
//! - [`request`]: how a request is read where edge and core must agree (identifiers,
//!   percent-decoding, the reservation body);
//! - [`order_filter`]: the compact set of a sold-out voucher's orderIds the edge fetches;
//! - [`exposition`]: reading the Prometheus text both expose (tests, `voucherctl watch`);
//! - [`availability_channel`]: the Redis Pub/Sub channel on which cores announce uses given
//!   back, derived from the one Redis key prefix both sides are configured with.
//!
//! - [`redis_tls`] (feature `redis`): how both open their client of the shared Redis, TLS
//!   and client certificates included.
//!
//! Without the `redis` feature it depends only on serde and percent-encoding, so a proxy
//! and a web framework can both use it.

mod codes;
pub mod exposition;
pub mod order_filter;
#[cfg(feature = "redis")]
pub mod redis_tls;
pub mod request;
mod routes;

pub use codes::ErrorCode;
pub use routes::Route;

/// Response headers of the API.
pub mod headers {
    /// On every error answer: the same code as the body's `error`, so a proxy can act on an
    /// answer without parsing its body (the edge sets its sold-out flag from it).
    pub const ERROR_CODE: &str = "x-error-code";
    /// `true` on a 201 that repeats a reservation already made for the same orderId.
    pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";
    /// `edge` on answers the edge gave itself, without asking a core.
    pub const SERVED_BY: &str = "x-served-by";
    /// Seconds to wait before retrying a 503 or a 429.
    pub const RETRY_AFTER: &str = "retry-after";
    /// The request's id: taken from the client when it is a valid one
    /// ([`crate::request::valid_request_id`]), else made by the edge (or the core, when
    /// called directly); passed from edge to core, echoed on every answer and written in
    /// both access logs, so one request can be followed through both.
    pub const REQUEST_ID: &str = "x-request-id";
    /// On the order filter: the voucher's state (`active`, `paused`, `archived`) as read
    /// with the filter, so that an edge knows whether the filter's answer is OUT_OF_STOCK
    /// or VOUCHER_PAUSED (VOUCHER_ARCHIVED).
    pub const VOUCHER_STATE: &str = "x-voucher-state";
}

/// The `Retry-After` of every 503, edge and core alike.
pub const RETRY_AFTER_SECS: u32 = 1;

/// The Redis key prefix of a deployment unless configured otherwise.
pub const DEFAULT_KEY_PREFIX: &str = "vg:";

/// The Pub/Sub channel of availability announcements for a deployment whose Redis keys
/// start with `key_prefix`. Cores publish a voucher code on it whenever a use of that
/// voucher is given back; edges drop the voucher's sold-out flag on it.
pub fn availability_channel(key_prefix: &str) -> String {
    format!("{key_prefix}available")
}

/// The Pub/Sub channel on which cores announce, for a deployment whose Redis keys start
/// with `key_prefix`, that a voucher stopped taking new reservations: its gate took its
/// last use (the reserve script publishes the code in the same step as it takes that
/// use), or an operator paused or archived it. Edges start the voucher's flag on it
/// (fetching its order filter, which says which of the two it is) without waiting for a
/// core's first refusal. Best effort, like the availability channel.
pub fn sold_out_channel(key_prefix: &str) -> String {
    format!("{key_prefix}sold-out")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_channel_follows_the_key_prefix() {
        assert_eq!(availability_channel(DEFAULT_KEY_PREFIX), "vg:available");
        assert_eq!(availability_channel("shop1:"), "shop1:available");
        assert_eq!(sold_out_channel("shop1:"), "shop1:sold-out");
    }
}
