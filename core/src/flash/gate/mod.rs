//! The flash-mode gate: atomic Lua scripts in Redis filter each reservation before
//! PostgreSQL (or, with `flash.decision = "broker"`, the broker) has the last word.
//!
//! The scripts live in the top-level `lua/` folder (see its README for the keys) and are
//! included at build time (`scripts.rs`). They are loaded once and run by SHA;
//! `redis::Script` falls back to sending the source when Redis answers NOSCRIPT (after a
//! restart or SCRIPT FLUSH, or on a replica promoted on a cluster). Outcomes come back as
//! typed enums. One Redis or a Redis Cluster, by configuration ([`connection`]).
//!
//! One module per family of calls:
//! - [`connection`]: the one connection, to a server or a cluster;
//! - [`reserve`]: the reserve path (decide, mark, settle a batch, release, the orderId's claim);
//! - [`load`]: loading a gate and its generations;
//! - [`reconcile`]: what reconciliation reads, and its repair;
//! - [`orders`]: every order of a gate, for the orders endpoint and the edge's filter;
//! - [`record`]: the per-order record the scripts keep.

mod connection;
mod load;
mod orders;
mod reconcile;
mod record;
mod reserve;
mod scripts;

pub use connection::Topology;
pub use load::{Amended, GateLoad, LoadStart, Loading};
pub use reconcile::{GateSnapshot, SNAPSHOT_UNSETTLED_MAX};
pub use record::{OrderRecord, RecordState};
pub use reserve::{GateDecision, GiveBack, MarkAlso, Refusal, ReleaseOutcome};
pub use scripts::{ScriptSource, RESERVE_SCRIPT, SCRIPT_SOURCES};

use crate::config::RedisSettings;
use crate::domain::{Voucher, VoucherCode};
use crate::{Error, Result};
use connection::GateConnection;
use scripts::Scripts;

/// The generation of the PostgreSQL read a gate was loaded from (`vouchers.gate_generation`), or a
/// later one it took on (`load_begin.lua`): a use this gate decides may be recorded only
/// while it is still the voucher's latest, so that no row lands behind the read of a newer
/// gate. (The store takes 0 as "unfenced", for the event writers; no gate decides with 0.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Generation(pub i64);

/// Entries per Redis call when a gate is loaded or read in pieces. Measured on a million-use
/// voucher (`loadtest/big-voucher.sh`): 500 orders per load call took 1.6 ms at the median
/// on a quiet stack; 250 keep each call near a millisecond.
pub const CHUNK: usize = 250;

#[derive(Clone)]
pub struct Gate {
    /// A single Redis or a Redis Cluster (`connection.rs`).
    conn: GateConnection,
    /// Put before every key, so several deployments (or tests) can share one Redis.
    prefix: String,
    /// Where uses given back are announced to the edges.
    channel: String,
    /// Where a voucher's last use taken is announced to the edges (by `reserve.lua`).
    sold_out_channel: String,
    scripts: std::sync::Arc<Scripts>,
}

/// The keys of one voucher, all under the hash tag `{CODE}`.
struct Keys {
    meta: String,
    remaining: String,
    users: String,
    orders: String,
    /// Orders taken by the gate whose row reconciliation has not seen yet (sorted set, score:
    /// the latest publish start in ms).
    unsettled: String,
    /// `identity|generation` of the load under way, while the gate is being filled.
    loading: String,
}

fn redis_down(e: redis::RedisError) -> Error {
    Error::unavailable_because("redis", e)
}

fn ms(t: chrono::DateTime<chrono::Utc>) -> i64 {
    t.timestamp_millis()
}

/// What tells two vouchers of one code apart: when the row was created (to the microsecond).
fn identity(voucher: &Voucher) -> i64 {
    voucher.created_at.timestamp_micros()
}

impl Gate {
    pub async fn connect(settings: &RedisSettings) -> anyhow::Result<Self> {
        let conn = GateConnection::open(settings).await?;
        let scripts = Scripts::new();
        let gate = Self {
            conn,
            prefix: settings.key_prefix.clone(),
            channel: settings.availability_channel(),
            sold_out_channel: settings.sold_out_channel(),
            scripts: std::sync::Arc::new(scripts),
        };
        gate.load_scripts().await?;
        Ok(gate)
    }

    /// SCRIPT LOAD once at start-up, so the hot path sends only the SHA.
    async fn load_scripts(&self) -> anyhow::Result<()> {
        let mut conn = self.conn.clone();
        for script in self.scripts.all() {
            script.prepare_invoke().load_async(&mut conn).await?;
        }
        Ok(())
    }

    /// The voucher's keys, `{prefix}{{code}}:{name}`: one hash slot per voucher. Appended
    /// piece by piece, not with `format!`: the seven `format!` calls took about 4,900
    /// instructions, twice per accept (the reserve script and its batch's settle call),
    /// 5.5% of an accept in `reports/callgrind/REPORT.md`.
    fn keys(&self, code: &VoucherCode) -> Keys {
        let key = |name: &str| {
            let code = code.as_str();
            let mut key = String::with_capacity(self.prefix.len() + code.len() + 3 + name.len());
            key.push_str(&self.prefix);
            key.push('{');
            key.push_str(code);
            key.push_str("}:");
            key.push_str(name);
            key
        };
        Keys {
            meta: key("meta"),
            remaining: key("remaining"),
            users: key("users"),
            orders: key("orders"),
            unsettled: key("unsettled"),
            loading: key("loading"),
        }
    }

    /// Remaining uses, or `None` when the gate is not loaded.
    pub async fn remaining(&self, code: &VoucherCode) -> Result<Option<i64>> {
        let k = self.keys(code);
        let (open, remaining): (bool, Option<i64>) = redis::pipe()
            .atomic()
            .exists(&k.meta)
            .get(&k.remaining)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(redis_down)?;
        Ok(if open {
            Some(remaining.unwrap_or(0))
        } else {
            None
        })
    }

    pub async fn ping(&self) -> Result<()> {
        redis::cmd("PING")
            .query_async::<()>(&mut self.conn.clone())
            .await
            .map_err(redis_down)
    }
}
