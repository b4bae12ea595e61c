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
//! - [`otlp`]: an OTLP/HTTP receiver that keeps the spans it is sent.

pub mod assert;
pub mod helpers;
pub mod invariants;
pub mod locks;
pub mod metrics;
pub mod otlp;
pub mod postgres;
pub mod process;
pub mod sale;
pub mod stack;
pub mod tls;
pub mod wait;

/// A port nothing listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
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
