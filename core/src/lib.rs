//! voucher-core: the service that decides whether an order may use a voucher, and never
//! lets a voucher be used more often than its limit.
//!
//! Layout, from the outside in:
//! - [`http`]: routes, extractors that parse untrusted input, the OpenAPI document;
//! - [`service`]: the use cases, and the seam where each voucher mode decides;
//! - [`flash`]: flash mode: the Redis [`gate`] decides, [`events`] carry it to PostgreSQL,
//!   [`reconcile`] keeps the two in step;
//! - [`domain`]: types that can only hold valid values (codes, ids, money, vouchers);
//! - [`store`]: every SQL statement; PostgreSQL's constraints are the last guard;
//! - [`expiry`]: the job that gives back uses of abandoned reservations;
//! - [`invariants`]: the checks of DESIGN.md that every concurrency test ends with;
//! - [`config`], [`metrics`], [`telemetry`], [`startup`]: running it.
//!
//! Errors: one enum, [`Error`], mapped to HTTP status and stable code in one place.

pub mod catalog;
pub mod config;
pub mod domain;
pub mod error;
pub mod events;
pub mod expiry;
pub mod flash;
pub mod gate;
pub mod http;
pub mod invariants;
pub mod metrics;
pub mod reconcile;
pub mod service;
pub mod startup;
pub mod store;
pub mod telemetry;

pub use error::{Error, Result};
