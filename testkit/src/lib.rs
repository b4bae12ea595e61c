//! The harness of the workspace's integration tests: a PostgreSQL database per test, the
//! real core on port 0, a tansu broker per flash test, Redis key prefixes, and the
//! invariant checks every concurrency test ends with.
//!
//! - [`helpers`]: databases, apps, voucher bodies, concurrent reservations;
//! - [`stack`]: the flash-mode stack (broker, Redis prefix, topic, group).

pub mod helpers;
pub mod stack;
