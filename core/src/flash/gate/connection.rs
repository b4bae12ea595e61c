//! The gate's one connection to Redis: a single server or a Redis Cluster, chosen by
//! `[redis] topology`. Every call of the gate goes through [`GateConnection`], which is
//! `redis::aio::ConnectionLike` for both, so the scripts, pipelines and commands are written
//! once.
//!
//! On a cluster, redis-rs routes each call by its first key. Every key of one voucher carries
//! the voucher's hash tag (`lua/README.md`), so a script or an atomic pipeline of one voucher
//! is one slot on one master. The client follows MOVED (a slot that moved for good: it
//! refreshes its slot map) and ASK (a slot being migrated), and retries a call the server
//! answers TRYAGAIN (a script whose keys are split mid-migration); while a master is down
//! it retries until its replica is promoted or the retries run out, and the call then fails
//! like any Redis outage: a 503 that took nothing.

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};
use serde::Deserialize;
use voucher_contract::redis_tls;

use crate::config::RedisSettings;

/// What `[redis] url` points at.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Topology {
    /// One server (or a primary behind a fixed address): `url` is its URL.
    #[default]
    Single,
    /// A Redis Cluster: `url` lists one or more of its nodes, comma-separated; the client
    /// learns the rest, and every slot's master, from them.
    Cluster,
}

/// Retries of one call on a cluster, and the waits between them. Each redirect (ASK, MOVED)
/// and each TRYAGAIN takes one retry: while a voucher's slot is being migrated, a script
/// whose keys are split between the two masters is answered TRYAGAIN (it ran nothing) until
/// its last key has moved, so a call needs several. The waits grow from 20 ms to at most
/// 200 ms (redis-rs: `factor * base^retry`, clamped, then jittered below it): at most 1.5 s
/// of waiting in all, about half that on average, where
/// redis-rs's default (16 retries, minutes of back-off) would hold a customer far past any
/// answer worth giving. A master that died is replaced after `cluster-node-timeout` plus an
/// election; calls to it meanwhile run out of retries and answer 503, having taken nothing.
const CLUSTER_RETRIES: u32 = 10;
const CLUSTER_RETRY_FACTOR_MS: u64 = 10;
const CLUSTER_MIN_RETRY_WAIT_MS: u64 = 20;
const CLUSTER_MAX_RETRY_WAIT_MS: u64 = 200;

#[derive(Clone)]
pub enum GateConnection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl GateConnection {
    pub async fn open(settings: &RedisSettings) -> anyhow::Result<Self> {
        match settings.topology {
            Topology::Single => {
                let client = settings.client()?;
                let config = redis::aio::ConnectionManagerConfig::new()
                    .set_connection_timeout(settings.timeout)
                    .set_response_timeout(settings.timeout)
                    .set_number_of_retries(1);
                Ok(Self::Single(
                    ConnectionManager::new_with_config(client, config).await?,
                ))
            }
            Topology::Cluster => Ok(Self::Cluster(
                cluster_client(settings)?.get_async_connection().await?,
            )),
        }
    }
}

/// The cluster's client: the nodes of `url`, the call's timeouts, bounded retries, and the
/// certificates of `[redis.tls]` for `rediss://` nodes.
fn cluster_client(settings: &RedisSettings) -> anyhow::Result<redis::cluster::ClusterClient> {
    use secrecy::ExposeSecret;
    let nodes = redis_tls::node_urls(settings.url.expose_secret());
    anyhow::ensure!(
        !nodes.is_empty(),
        "redis.topology is cluster but redis.url names no node"
    );
    // As for one server (`redis_tls::redis_client`): certificates for plain nodes would be
    // silently ignored.
    anyhow::ensure!(
        settings.tls.is_empty() || nodes.iter().all(|n| n.starts_with("rediss://")),
        "Redis certificates are set but not every node's URL is rediss://"
    );
    let mut builder = redis::cluster::ClusterClientBuilder::new(nodes)
        .connection_timeout(settings.timeout)
        .response_timeout(settings.timeout)
        .retries(CLUSTER_RETRIES)
        .retry_wait_formula(CLUSTER_RETRY_FACTOR_MS, 2)
        .min_retry_wait(CLUSTER_MIN_RETRY_WAIT_MS)
        .max_retry_wait(CLUSTER_MAX_RETRY_WAIT_MS);
    if let Some(certs) = redis_tls::certificates(&settings.tls)? {
        builder = builder.certs(certs);
    }
    Ok(builder.build()?)
}

impl ConnectionLike for GateConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(c) => c.req_packed_commands(cmd, offset, count),
            Self::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
        }
    }
}
