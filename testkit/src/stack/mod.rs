//! The flash-mode stack for tests, the one every flash and edge test runs on: a
//! Kafka-protocol broker of the test's own (tansu, on a free port, its data in a temporary
//! SQLite file), the shared local Redis under a key prefix of the test's own, a topic and a
//! consumer group of the test's own, one or more cores, and optionally the real edge binary
//! in front of them.
//!
//! One file per job, so that a test touching one piece reads only that piece:
//! - `broker.rs`: the tansu broker, plain or secured, killed, frozen and resumed;
//! - `redis.rs`: the shared Redis and its per-test keys, and a Redis server of a test's own;
//! - `redis_cluster.rs`: a Redis Cluster of a test's own (three masters, a replica each);
//! - `core.rs`: the core binary as a process of its own, and the clocks made wrong for it;
//! - `edge.rs`: the edge binary as a process of its own;
//! - `flash.rs`: the pieces assembled into a [`FlashStack`], and its settings.
//!
//! Everything is re-exported here: callers name `voucher_testkit::stack::X` and never the
//! file it lives in.

mod broker;
mod core;
mod edge;
mod flash;
mod redis;
mod redis_cluster;

// `self::`: `core` and `redis` alone would also name the crates of those names.
pub use self::broker::Broker;
pub use self::core::{CoreProcess, CLOCK_MINUTE_BEHIND, CLOCK_STEPPED_BACK, LIBFAKETIME};
pub use self::edge::EdgeProcess;
pub use self::flash::{flash_settings, flash_voucher, FlashStack, FlashStackBuilder};
pub use self::redis::{
    delete_keys, redis_connection, save_gate, until_subscribed, RedisServer, SavedGate, REDIS_URL,
};
pub use self::redis_cluster::{ClusterNode, RedisCluster, NODE_TIMEOUT};
