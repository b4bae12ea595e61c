//! The flash-mode gate: one atomic Lua script in Redis decides each reservation.
//!
//! The scripts live in `lua/` beside this file (see its README for the keys). They are loaded once and run
//! by SHA; `redis::Script` falls back to sending the source when Redis answers NOSCRIPT
//! (after a restart or SCRIPT FLUSH). Outcomes come back as the typed enums below.

mod record;

use redis::aio::ConnectionManager;
use redis::{Script, Value};
use secrecy::ExposeSecret;

pub use record::{OrderRecord, RecordState};

use crate::config::RedisSettings;
use crate::domain::{Ineligibility, OrderId, ReservationRequest, Voucher, VoucherCode};
use crate::{Error, Result};

/// What the reserve script decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GateDecision {
    /// The gate holds nothing for this voucher: rebuild it before deciding.
    NotLoaded,
    /// This orderId already has a record: answer from it.
    Exists(OrderRecord),
    /// A use was taken; its record is Pending until the event is acknowledged.
    Reserved(OrderRecord),
    Refused(Refusal),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    NotStarted,
    Expired,
    BelowMinOrder,
    OutOfStock,
    AlreadyUsed,
}

/// A refusal is the same answer standard mode gives for the same reason.
impl From<Refusal> for Error {
    fn from(refusal: Refusal) -> Self {
        match refusal {
            Refusal::NotStarted => Error::NotEligible(Ineligibility::NotStarted),
            Refusal::Expired => Error::NotEligible(Ineligibility::Expired),
            Refusal::BelowMinOrder => Error::NotEligible(Ineligibility::BelowMinOrder),
            Refusal::OutOfStock => Error::OutOfStock,
            Refusal::AlreadyUsed => Error::AlreadyUsed,
        }
    }
}

/// What the release script did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseOutcome {
    Released,
    /// The record exists but held nothing (already released).
    Already,
    Absent,
    /// Not forgotten: the record changed state, or a publish of its event may still land.
    Busy,
    NotLoaded,
}

/// How a use is given back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GiveBack {
    /// The order was released in PostgreSQL: keep the record as released, so a retry of
    /// the order is answered, not re-run.
    Release,
    /// The order's event was never recorded: drop the record, if it is still in one of
    /// `states` and its latest publish started at or before `published_by_ms`.
    Forget {
        states: Vec<RecordState>,
        published_by_ms: i64,
    },
}

/// The state a gate is loaded with.
#[derive(Debug, Clone, Default)]
pub struct GateLoad {
    pub remaining: i64,
    pub users: Vec<(String, i64)>,
    pub orders: Vec<(String, OrderRecord)>,
}

/// A consistent read of a loaded gate.
#[derive(Debug, Clone)]
pub struct GateSnapshot {
    /// When it was read, by Redis's clock (the clock of the records' times).
    pub at_ms: i64,
    pub remaining: i64,
    /// Uses each customer holds, as the gate counts them.
    pub users: std::collections::HashMap<String, i64>,
    pub orders: Vec<(String, OrderRecord)>,
}

/// The reserve script, public so the benchmark can measure it alone.
pub const RESERVE_SCRIPT: &str = include_str!("lua/reserve.lua");

/// How long an orderId stays claimed by its voucher: far longer than any sale.
const ORDER_CLAIM_TTL_SECS: u64 = 30 * 24 * 3600;

struct Scripts {
    adjust: Script,
    reserve: Script,
    mark: Script,
    release: Script,
    load: Script,
    snapshot: Script,
}

#[derive(Clone)]
pub struct Gate {
    conn: ConnectionManager,
    /// Put before every key, so several deployments (or tests) can share one Redis.
    prefix: String,
    /// Where uses given back are announced to the edges.
    channel: String,
    scripts: std::sync::Arc<Scripts>,
}

/// The keys of one voucher, all under the hash tag `{CODE}`.
struct Keys {
    meta: String,
    remaining: String,
    users: String,
    orders: String,
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
        let client = redis::Client::open(settings.url.expose_secret())?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(settings.timeout)
            .set_response_timeout(settings.timeout)
            .set_number_of_retries(1);
        let conn = ConnectionManager::new_with_config(client, config).await?;
        let scripts = Scripts {
            adjust: Script::new(include_str!("lua/adjust.lua")),
            reserve: Script::new(RESERVE_SCRIPT),
            mark: Script::new(include_str!("lua/mark.lua")),
            release: Script::new(include_str!("lua/release.lua")),
            load: Script::new(include_str!("lua/load.lua")),
            snapshot: Script::new(include_str!("lua/snapshot.lua")),
        };
        let gate = Self {
            conn,
            prefix: settings.key_prefix.clone(),
            channel: settings.availability_channel(),
            scripts: std::sync::Arc::new(scripts),
        };
        gate.load_scripts().await?;
        Ok(gate)
    }

    /// SCRIPT LOAD once at start-up, so the hot path sends only the SHA.
    async fn load_scripts(&self) -> anyhow::Result<()> {
        let mut conn = self.conn.clone();
        for script in [
            &self.scripts.adjust,
            &self.scripts.reserve,
            &self.scripts.mark,
            &self.scripts.release,
            &self.scripts.load,
            &self.scripts.snapshot,
        ] {
            script.prepare_invoke().load_async(&mut conn).await?;
        }
        Ok(())
    }

    fn keys(&self, code: &VoucherCode) -> Keys {
        let base = format!("{}{{{}}}", self.prefix, code.as_str());
        Keys {
            meta: format!("{base}:meta"),
            remaining: format!("{base}:remaining"),
            users: format!("{base}:users"),
            orders: format!("{base}:orders"),
        }
    }

    /// Runs the reserve script. The script reads the time from Redis: no core's clock
    /// decides the sale window or the TTL.
    #[tracing::instrument(name = "gate.reserve", skip_all, fields(code = %request.voucher_code))]
    pub async fn reserve(&self, request: &ReservationRequest, ttl_ms: i64) -> Result<GateDecision> {
        let k = self.keys(&request.voucher_code);
        let reply: Vec<String> = self
            .scripts
            .reserve
            .key(&k.meta)
            .key(&k.remaining)
            .key(&k.users)
            .key(&k.orders)
            .arg(request.order_id.as_str())
            .arg(request.customer_id.as_str())
            .arg(request.order_amount.minor_units())
            .arg(ttl_ms)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(redis_down)?;
        let outcome = reply.first().map(String::as_str).unwrap_or("");
        let record = || {
            reply
                .get(1)
                .ok_or_else(|| Error::corrupt("gate reply without record"))
                .and_then(|r| OrderRecord::parse(r))
        };
        Ok(match outcome {
            "NOT_LOADED" => GateDecision::NotLoaded,
            "EXISTS" => GateDecision::Exists(record()?),
            "RESERVED" => GateDecision::Reserved(record()?),
            "NOT_STARTED" => GateDecision::Refused(Refusal::NotStarted),
            "EXPIRED" => GateDecision::Refused(Refusal::Expired),
            "BELOW_MIN_ORDER" => GateDecision::Refused(Refusal::BelowMinOrder),
            "OUT_OF_STOCK" => GateDecision::Refused(Refusal::OutOfStock),
            "ALREADY_USED" => GateDecision::Refused(Refusal::AlreadyUsed),
            other => return Err(Error::corrupt(format!("gate outcome {other:?}"))),
        })
    }

    /// Moves an order's record from one of `from` to `to`. With `touch`, its latest publish
    /// start becomes now (by Redis's clock). Returns the state the record ends in, `None`
    /// when there is no record.
    #[tracing::instrument(name = "gate.mark", skip(self))]
    pub async fn mark(
        &self,
        code: &VoucherCode,
        order_id: &OrderId,
        from: &[RecordState],
        to: RecordState,
        touch: bool,
    ) -> Result<Option<RecordState>> {
        let k = self.keys(code);
        let from: String = from.iter().map(|s| s.letter()).collect();
        let mut invocation = self.scripts.mark.prepare_invoke();
        invocation
            .key(&k.orders)
            .arg(order_id.as_str())
            .arg(from)
            .arg(to.letter().to_string());
        if touch {
            invocation.arg("touch");
        }
        let state: Option<String> = invocation
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(redis_down)?;
        Ok(state
            .and_then(|s| s.chars().next())
            .and_then(RecordState::from_letter))
    }

    /// The record of one order, if the gate has one.
    pub async fn record(
        &self,
        code: &VoucherCode,
        order_id: &OrderId,
    ) -> Result<Option<OrderRecord>> {
        let k = self.keys(code);
        let raw: Option<String> = redis::cmd("HGET")
            .arg(&k.orders)
            .arg(order_id.as_str())
            .query_async(&mut self.conn.clone())
            .await
            .map_err(redis_down)?;
        raw.map(|r| OrderRecord::parse(&r)).transpose()
    }

    #[tracing::instrument(name = "gate.release", skip(self))]
    pub async fn release(
        &self,
        code: &VoucherCode,
        order_id: &OrderId,
        how: GiveBack,
    ) -> Result<ReleaseOutcome> {
        let k = self.keys(code);
        let mut invocation = self.scripts.release.prepare_invoke();
        invocation
            .key(&k.meta)
            .key(&k.remaining)
            .key(&k.users)
            .key(&k.orders)
            .arg(order_id.as_str());
        match &how {
            GiveBack::Release => {
                invocation.arg("release");
            }
            GiveBack::Forget {
                states,
                published_by_ms,
            } => {
                let states: String = states.iter().map(|s| s.letter()).collect();
                invocation.arg("forget").arg(states).arg(*published_by_ms);
            }
        }
        let outcome: String = invocation
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(redis_down)?;
        Ok(match outcome.as_str() {
            "RELEASED" => ReleaseOutcome::Released,
            "ALREADY" => ReleaseOutcome::Already,
            "ABSENT" => ReleaseOutcome::Absent,
            "BUSY" => ReleaseOutcome::Busy,
            "NOT_LOADED" => ReleaseOutcome::NotLoaded,
            other => return Err(Error::corrupt(format!("release outcome {other:?}"))),
        })
    }

    /// Loads the gate unless this voucher's gate is loaded; `true` when this call loaded it.
    /// Keys an older voucher of the same code left behind are replaced, never inherited.
    #[tracing::instrument(name = "gate.load", skip_all, fields(code = %voucher.code))]
    pub async fn load(&self, voucher: &Voucher, state: &GateLoad) -> Result<bool> {
        let k = self.keys(&voucher.code);
        let mut invocation = self.scripts.load.prepare_invoke();
        invocation
            .key(&k.meta)
            .key(&k.remaining)
            .key(&k.users)
            .key(&k.orders)
            .arg(identity(voucher))
            .arg(voucher.total_limit)
            .arg(voucher.per_user_limit)
            .arg(ms(voucher.starts_at))
            .arg(ms(voucher.ends_at))
            .arg(voucher.min_order_amount.minor_units())
            .arg(voucher.discount_amount.minor_units())
            .arg(state.remaining)
            .arg(state.users.len());
        for (customer, held) in &state.users {
            invocation.arg(customer).arg(*held);
        }
        for (order, record) in &state.orders {
            invocation.arg(order).arg(record.format());
        }
        let loaded: i64 = invocation
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(redis_down)?;
        if loaded == 2 {
            tracing::warn!(code = %voucher.code, "gate keys of an older voucher with this code replaced");
        }
        Ok(loaded != 0)
    }

    /// Claims every order of `orders` for `code` unless another voucher holds it: after a
    /// rebuild, the claims lost with the gate are back. Pipelined in chunks, so a voucher
    /// with many orders costs few round trips and no long Redis call.
    pub async fn claim_orders(&self, code: &VoucherCode, orders: &[String]) -> Result<()> {
        for chunk in orders.chunks(1000) {
            let mut pipe = redis::pipe();
            for order in chunk {
                pipe.cmd("SET")
                    .arg(self.claim_key(order))
                    .arg(code.as_str())
                    .arg("NX")
                    .arg("EX")
                    .arg(ORDER_CLAIM_TTL_SECS)
                    .ignore();
            }
            pipe.query_async::<()>(&mut self.conn.clone())
                .await
                .map_err(redis_down)?;
        }
        Ok(())
    }

    /// Remaining uses and every order record, read atomically; `None` when not loaded.
    pub async fn snapshot(&self, code: &VoucherCode) -> Result<Option<GateSnapshot>> {
        let k = self.keys(code);
        let reply: Value = self
            .scripts
            .snapshot
            .key(&k.meta)
            .key(&k.remaining)
            .key(&k.users)
            .key(&k.orders)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(redis_down)?;
        let items: Vec<String> = match reply {
            Value::Nil => return Ok(None),
            other => redis::from_redis_value(&other).map_err(redis_down)?,
        };
        let mut items = items.into_iter();
        let mut number = |what: &str| {
            items
                .next()
                .and_then(|r| r.parse().ok())
                .ok_or_else(|| Error::corrupt(format!("gate snapshot without {what}")))
        };
        let at_ms = number("time")?;
        let remaining = number("remaining")?;
        let customers = number("customer count")?;
        let mut users = std::collections::HashMap::new();
        for _ in 0..customers {
            match (items.next(), items.next().and_then(|n| n.parse().ok())) {
                (Some(customer), Some(count)) => users.insert(customer, count),
                _ => return Err(Error::corrupt("gate snapshot with a short customer list")),
            };
        }
        let mut orders = Vec::new();
        while let (Some(order), Some(record)) = (items.next(), items.next()) {
            orders.push((order, OrderRecord::parse(&record)?));
        }
        Ok(Some(GateSnapshot {
            at_ms,
            remaining,
            users,
            orders,
        }))
    }

    /// Adds `remaining` to the remaining uses of `voucher`'s gate and each customer's delta
    /// to its count (reconciliation's repair); the new remaining count, or `None` when the
    /// gate is not loaded for this voucher.
    #[tracing::instrument(name = "gate.adjust", skip(self, voucher, customers), fields(code = %voucher.code))]
    pub async fn adjust(
        &self,
        voucher: &Voucher,
        remaining: i64,
        customers: &[(String, i64)],
    ) -> Result<Option<i64>> {
        let k = self.keys(&voucher.code);
        let mut invocation = self.scripts.adjust.prepare_invoke();
        invocation
            .key(&k.meta)
            .key(&k.remaining)
            .key(&k.users)
            .arg(remaining)
            .arg(identity(voucher));
        for (customer, delta) in customers {
            invocation.arg(customer).arg(*delta);
        }
        invocation
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(redis_down)
    }

    /// Remaining uses, or `None` when the gate is not loaded.
    pub async fn remaining(&self, code: &VoucherCode) -> Result<Option<i64>> {
        Ok(self.snapshot(code).await?.map(|s| s.remaining))
    }

    /// Claims `order_id` for `code` across all vouchers; `false` when another voucher holds it.
    pub async fn claim_order(&self, order_id: &OrderId, code: &VoucherCode) -> Result<bool> {
        let key = self.claim_key(order_id.as_str());
        let set: Option<String> = redis::cmd("SET")
            .arg(&key)
            .arg(code.as_str())
            .arg("NX")
            .arg("EX")
            .arg(ORDER_CLAIM_TTL_SECS)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(redis_down)?;
        if set.is_some() {
            return Ok(true);
        }
        let owner: Option<String> = redis::cmd("GET")
            .arg(&key)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(redis_down)?;
        Ok(owner.as_deref() == Some(code.as_str()))
    }

    /// The claim of one orderId: its own slot, deliberately outside any voucher's hash tag.
    fn claim_key(&self, order_id: &str) -> String {
        format!("{}order-owner:{}", self.prefix, order_id)
    }

    /// Tells edges that a use of `code` became available again, so they drop their
    /// sold-out flag at once instead of at its TTL. Best effort: a lost message only
    /// delays availability until the TTL.
    pub async fn announce_available(&self, code: &VoucherCode) {
        let published: redis::RedisResult<i64> = redis::cmd("PUBLISH")
            .arg(&self.channel)
            .arg(code.as_str())
            .query_async(&mut self.conn.clone())
            .await;
        if let Err(e) = published {
            tracing::debug!(error = %e, "availability not announced");
        }
    }

    /// The order ids the gate has a record of, whatever their state.
    pub async fn order_ids(&self, code: &VoucherCode) -> Result<Option<Vec<String>>> {
        Ok(self
            .snapshot(code)
            .await?
            .map(|s| s.orders.into_iter().map(|(order, _)| order).collect()))
    }

    /// Drops every key of a voucher's gate (operator reload; tests simulating data loss).
    pub async fn unload(&self, code: &VoucherCode) -> Result<()> {
        let k = self.keys(code);
        redis::cmd("DEL")
            .arg(&k.meta)
            .arg(&k.remaining)
            .arg(&k.users)
            .arg(&k.orders)
            .query_async::<()>(&mut self.conn.clone())
            .await
            .map_err(redis_down)
    }

    pub async fn ping(&self) -> Result<()> {
        redis::cmd("PING")
            .query_async::<()>(&mut self.conn.clone())
            .await
            .map_err(redis_down)
    }
}
