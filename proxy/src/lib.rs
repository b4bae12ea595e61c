//! voucher-edge: the Pingora edge of the voucher gate.
//!
//! Once a voucher is sold out (or an operator paused it), late flash-sale traffic is
//! answered here, from a table of flags with a TTL, and never reaches a core. Everything else is
//! forwarded to a ready core: a reservation to its voucher's core, the rest round-robin.
//!
//! - [`edge`]: the `ProxyHttp` phases (request id and refusals first, upstream choice,
//!   setting flags from the cores' answers);
//! - `refusals`: every answer the edge gives itself, as the named steps of `request_filter`;
//! - [`sold_out`]: the flags and the order lists that let retries of holders through;
//! - [`flagging`]: starts and renews a flag, fetching its order filter from a core;
//! - [`places`]: how many of one voucher's reservations are at the cores at once, so a
//!   sale's burst queues here, where the flag can answer it, rather than inside the cores;
//! - [`signals`]: drops a flag at once when a core announces a use given back (or a resume,
//!   or a raised limit), and starts one when a core announces that a voucher stopped
//!   taking new reservations;
//! - [`routing`]: which core a request goes to (a voucher's reservations to one core);
//! - [`discovery`]: the cores, from names resolved again and again;
//! - `traces`: the edge's span of a request, continuing the client's trace and passed on
//!   to the core (tracing on);
//! - [`server`]: the assembly, the edge's readiness and its drain on SIGTERM;
//! - [`config`], [`metrics`]: the rest.
//!
//! What the edge shares with the cores (header names, error codes, the route table, the
//! availability channel) comes from the `voucher-contract` crate, never from a copy.

pub mod config;
pub mod discovery;
pub mod edge;
pub mod flagging;
pub mod metrics;
pub mod places;
pub mod rate_limit;
mod refusals;
pub mod routing;
pub mod server;
pub mod signals;
pub mod sold_out;
mod traces;
