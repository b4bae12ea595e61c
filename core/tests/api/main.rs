//! Integration tests of voucher-core against the real local PostgreSQL. Each test creates
//! its own database and starts the real application on port 0.

mod admission;
mod checkouts;
mod clock;
mod cluster;
mod concurrency;
mod constraints;
mod consumer;
mod contract_file;
mod expiry;
mod failover;
mod flash;
mod flash_lifecycle;
mod gate_load;
mod grouped;
mod input;
mod ledger;
mod lifecycle;
mod managed;
mod operations;
mod replay;
mod reservations;
mod sessions;
mod tokens;
mod vouchers;

// The shared harness, under the names the test modules use.
pub use voucher_testkit::{helpers, invariants, sale, stack};
