//! voucher-core: the service that decides whether an order may use a voucher, and never
//! lets a voucher be used more often than its limit.
//!
//! Layout, from the outside in (every module uses only those below it):
//! - [`http`]: routes, extractors that parse untrusted input, the OpenAPI document, the
//!   layers that count and log every answer;
//! - [`auth`]: named bearer tokens with scopes, kept as digests, re-read periodically;
//! - [`service`]: the use cases, and the seam where each voucher mode decides;
//! - [`standard`]: standard mode: PostgreSQL decides reservations in groups, one statement
//!   per group;
//! - [`flash`]: flash mode: the Redis gate decides, Kafka events carry the decision to
//!   PostgreSQL, rebuild and reconciliation keep the two in step;
//! - [`expiry`], [`periodic`]: the job that gives back uses of abandoned reservations, and
//!   the loop every periodic job runs in; [`batching`]: the queue grouped writers take
//!   their batches from;
//! - [`catalog`]: voucher definitions cached in memory, re-read in the background (they
//!   pick the path; what decides a use reads the database's row or the gate);
//! - [`store`]: every SQL statement; PostgreSQL's constraints are the last guard;
//! - [`domain`]: types that can only hold valid values (codes, ids, money, vouchers);
//! - [`config`], [`metrics`], [`startup`]: running it (logs and traces are set up by the
//!   `voucher-telemetry` crate, shared with the edge).
//!
//! Errors: one enum, [`Error`], mapped to HTTP status and stable code in one place
//! (`error.rs`), keeping its cause. The architecture as a whole (edge, core, gate, broker,
//! consumer, and the invariants they keep) is described in `ARCHITECTURE.md` at the root of
//! the repository.

pub mod auth;
pub mod batching;
pub mod catalog;
pub mod config;
pub mod domain;
pub mod error;
pub mod expiry;
pub mod flash;
pub mod http;
pub mod metrics;
pub mod periodic;
pub mod service;
pub mod standard;
pub mod startup;
pub mod store;

pub use error::{Error, Result};
