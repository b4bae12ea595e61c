//! The harness of the workspace's integration tests, and the oracle they (and the
//! benchmark) judge the system by.
//!
//! - [`helpers`]: a PostgreSQL database per test, the real core on port 0, the API client;
//! - [`stack`]: the flash-mode stack: a tansu broker, a Redis key prefix, topic and group of
//!   the test's own, one or more cores, and optionally the real edge binary in front;
//! - [`sale`]: many customers reserving at once, described with named fields;
//! - [`invariants`]: the invariants of `ARCHITECTURE.md`, checked against PostgreSQL and
//!   the gate at the end of every concurrency, load and fault test;
//! - [`wait`], [`metrics`], [`assert`]: bounded waiting, one Prometheus text parser, and
//!   the assertion every error answer gets;
//! - [`postgres`]: a PostgreSQL server of the test's own, for crashes and restarts;
//! - [`process`]: a child process a test owns, killed, frozen or thawed on purpose;
//! - [`tls`]: certificates a test makes, and a TLS front for a broker without TLS;
//! - [`link`]: a TCP relay with a one-way delay, for a standby far from its primary;
//! - [`otlp`]: an OTLP/HTTP receiver that keeps the spans it is sent.

pub mod assert;
pub mod helpers;
pub mod invariants;
pub mod link;
pub mod locks;
pub mod metrics;
pub mod otlp;
pub mod postgres;
pub mod process;
pub mod sale;
pub mod stack;
pub mod tls;
pub mod wait;

/// A port nothing listens on now, for a server the test starts a moment later.
///
/// It is taken from 20,000-31,999, below Linux's ephemeral range (32,768-60,999 by default),
/// and never twice in one process. A port from `bind(0)` comes from the ephemeral range, so
/// by the time the server binds it an outgoing connection of some other test may hold it as
/// its local port, and the server fails to start (a CI run lost a Redis Cluster node so).
/// Each process starts at its own offset; the bind check covers the rest.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let offset = std::process::id().wrapping_mul(7_919) % SPAN;
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        assert!(n < SPAN, "no free port left in {LOW}-{}", LOW + SPAN - 1);
        let port = (LOW + (offset + n) % SPAN) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// A directory of the test's own, removed when dropped.
pub struct TempDir(pub std::path::PathBuf);

impl TempDir {
    pub fn new(kind: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("vt-{kind}-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("temporary directory");
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
