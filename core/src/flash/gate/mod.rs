//! The flash-mode gate: one atomic Lua script in Redis decides each reservation.
//!
//! The scripts live in `lua/` beside this file (see its README for the keys). They are loaded once and run
//! by SHA; `redis::Script` falls back to sending the source when Redis answers NOSCRIPT
//! (after a restart or SCRIPT FLUSH). Outcomes come back as the typed enums below.

mod record;

use redis::aio::ConnectionManager;
use redis::{Script, Value};
use voucher_contract::order_filter::OrderFilter;

pub use record::{OrderRecord, RecordState};

use crate::config::RedisSettings;
use crate::domain::{Ineligibility, OrderId, ReservationRequest, Voucher, VoucherCode};
use crate::{Error, Result};

/// The generation of the PostgreSQL read a gate was loaded from (`gate_generations`), or a
/// later one it took on (`load_begin.lua`): a use this gate decides may be recorded only
/// while it is still the voucher's latest, so that no row lands behind the read of a newer
/// gate. (The store takes 0 as "unfenced", for the event writers; no gate decides with 0.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Generation(pub i64);

/// What the reserve script decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GateDecision {
    /// The gate holds nothing for this voucher: rebuild it before deciding.
    NotLoaded,
    /// This orderId already has a record: answer from it.
    Exists(OrderRecord, Generation),
    /// A use was taken; its record is Pending until the event is acknowledged.
    Reserved(OrderRecord, Generation),
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

/// What a mark does besides moving the record's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkAlso {
    Nothing,
    /// Its latest publish starts now (by Redis's clock): a retry re-publishing.
    Touch,
    /// Its row is known to be in PostgreSQL: off the unsettled set.
    Settle,
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

/// The state a gate is loaded with in one piece (a new voucher, tests, the benchmark).
#[derive(Debug, Clone, Default)]
pub struct GateLoad {
    pub remaining: i64,
    pub users: Vec<(String, i64)>,
    pub orders: Vec<(String, OrderRecord)>,
}

/// How the start of a load ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadStart {
    /// This load may fill the gate now.
    Started,
    /// The voucher's gate is open already: another load won.
    AlreadyLoaded,
    /// A load of a later generation (a newer read) is under way.
    Superseded,
}

/// A load under way: the voucher it is for and the generation of its PostgreSQL read.
pub struct Loading<'a> {
    voucher: &'a Voucher,
    generation: i64,
    marker: String,
}

impl Loading<'_> {
    pub fn generation(&self) -> i64 {
        self.generation
    }
}

/// What reconciliation reads of a loaded gate, in one consistent step.
#[derive(Debug, Clone)]
pub struct GateSnapshot {
    /// When it was read, by Redis's clock (the clock of the records' times).
    pub at_ms: i64,
    pub remaining: i64,
    /// How many orders are unsettled (all of them, even beyond `unsettled`).
    pub unsettled_count: usize,
    /// The oldest unsettled orders with their latest publish start (ms, Redis's clock).
    pub unsettled: Vec<(String, i64)>,
}

impl GateSnapshot {
    /// Whether `unsettled` holds every unsettled order.
    pub fn is_complete(&self) -> bool {
        self.unsettled.len() == self.unsettled_count
    }
}

/// Most unsettled orders one snapshot reads: the snapshot stays a short Redis call however
/// far reconciliation fell behind, and the rest waits for the next rounds.
pub const SNAPSHOT_UNSETTLED_MAX: usize = 2_000;

/// Entries per Redis call when a gate is loaded or read in pieces. Measured on a million-use
/// voucher (`loadtest/big-voucher.sh`): 500 orders per load call took 1.6 ms at the median
/// on a quiet stack; 250 keep each call near a millisecond.
pub const CHUNK: usize = 250;

/// The reserve script, public so the benchmark can measure it alone.
pub const RESERVE_SCRIPT: &str = include_str!("lua/reserve.lua");

/// Every script by name, so measurements can tell which one Redis's slow log shows (it
/// names them by SHA1).
pub const SCRIPT_SOURCES: [(&str, &str); 10] = [
    ("adjust", include_str!("lua/adjust.lua")),
    ("counts", include_str!("lua/counts.lua")),
    ("reserve", RESERVE_SCRIPT),
    ("mark", include_str!("lua/mark.lua")),
    ("release", include_str!("lua/release.lua")),
    ("load_begin", include_str!("lua/load_begin.lua")),
    ("load_fill", include_str!("lua/load_fill.lua")),
    ("load_open", include_str!("lua/load_open.lua")),
    ("snapshot", include_str!("lua/snapshot.lua")),
    ("raise", include_str!("lua/raise.lua")),
];

fn script(name: &str) -> Script {
    let source = SCRIPT_SOURCES
        .iter()
        .find(|(n, _)| *n == name)
        .map_or("", |(_, source)| source);
    Script::new(source)
}

/// How long an orderId stays claimed by its voucher: far longer than any sale.
const ORDER_CLAIM_TTL_SECS: u64 = 30 * 24 * 3600;

struct Scripts {
    adjust: Script,
    counts: Script,
    reserve: Script,
    mark: Script,
    release: Script,
    load_begin: Script,
    load_fill: Script,
    load_open: Script,
    snapshot: Script,
    raise: Script,
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
        let client = settings.client()?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(settings.timeout)
            .set_response_timeout(settings.timeout)
            .set_number_of_retries(1);
        let conn = ConnectionManager::new_with_config(client, config).await?;
        let scripts = Scripts {
            adjust: script("adjust"),
            counts: script("counts"),
            reserve: script("reserve"),
            mark: script("mark"),
            release: script("release"),
            load_begin: script("load_begin"),
            load_fill: script("load_fill"),
            load_open: script("load_open"),
            snapshot: script("snapshot"),
            raise: script("raise"),
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
            &self.scripts.counts,
            &self.scripts.reserve,
            &self.scripts.mark,
            &self.scripts.release,
            &self.scripts.load_begin,
            &self.scripts.load_fill,
            &self.scripts.load_open,
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
            unsettled: format!("{base}:unsettled"),
            loading: format!("{base}:loading"),
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
            .key(&k.unsettled)
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
        let generation = || {
            reply
                .get(2)
                .and_then(|g| g.parse().ok())
                .map(Generation)
                .ok_or_else(|| Error::corrupt("gate reply without generation"))
        };
        Ok(match outcome {
            "NOT_LOADED" => GateDecision::NotLoaded,
            "EXISTS" => GateDecision::Exists(record()?, generation()?),
            "RESERVED" => GateDecision::Reserved(record()?, generation()?),
            "NOT_STARTED" => GateDecision::Refused(Refusal::NotStarted),
            "EXPIRED" => GateDecision::Refused(Refusal::Expired),
            "BELOW_MIN_ORDER" => GateDecision::Refused(Refusal::BelowMinOrder),
            "OUT_OF_STOCK" => GateDecision::Refused(Refusal::OutOfStock),
            "ALREADY_USED" => GateDecision::Refused(Refusal::AlreadyUsed),
            other => return Err(Error::corrupt(format!("gate outcome {other:?}"))),
        })
    }

    /// Moves an order's record from one of `from` to `to`, and does `also`. Returns the
    /// state the record ends in, `None` when there is no record.
    #[tracing::instrument(name = "gate.mark", skip(self))]
    pub async fn mark(
        &self,
        code: &VoucherCode,
        order_id: &OrderId,
        from: &[RecordState],
        to: RecordState,
        also: MarkAlso,
    ) -> Result<Option<RecordState>> {
        let k = self.keys(code);
        let from: String = from.iter().map(|s| s.letter()).collect();
        let mut invocation = self.scripts.mark.prepare_invoke();
        invocation
            .key(&k.orders)
            .key(&k.unsettled)
            .arg(order_id.as_str())
            .arg(from)
            .arg(to.letter().to_string());
        match also {
            MarkAlso::Nothing => {}
            MarkAlso::Touch => {
                invocation.arg("touch");
            }
            MarkAlso::Settle => {
                invocation.arg("settle");
            }
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
            .key(&k.unsettled)
            .arg(order_id.as_str());
        match &how {
            GiveBack::Release => {
                invocation.arg("release").arg("").arg(0);
            }
            GiveBack::Forget {
                states,
                published_by_ms,
            } => {
                let states: String = states.iter().map(|s| s.letter()).collect();
                invocation.arg("forget").arg(states).arg(*published_by_ms);
            }
        }
        // A use given back is announced by the script itself.
        invocation.arg(&self.channel).arg(code.as_str());
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

    /// Starts loading `voucher`'s gate from a PostgreSQL read of `generation`: the gate is
    /// closed (reservations see it not loaded) until [`Gate::open_load`]. Keys an older
    /// voucher of the same code left behind are replaced, never inherited.
    #[tracing::instrument(name = "gate.load_begin", skip_all, fields(code = %voucher.code, generation))]
    pub async fn begin_load<'a>(
        &self,
        voucher: &'a Voucher,
        generation: i64,
    ) -> Result<(LoadStart, Loading<'a>)> {
        let k = self.keys(&voucher.code);
        let outcome: String = self
            .scripts
            .load_begin
            .key(&k.meta)
            .key(&k.remaining)
            .key(&k.users)
            .key(&k.orders)
            .key(&k.unsettled)
            .key(&k.loading)
            .arg(identity(voucher))
            .arg(generation)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(redis_down)?;
        let start = match outcome.as_str() {
            "STARTED" => LoadStart::Started,
            "REPLACED" => {
                tracing::warn!(code = %voucher.code, "gate keys of an older voucher with this code replaced");
                LoadStart::Started
            }
            "LOADED" => LoadStart::AlreadyLoaded,
            "SUPERSEDED" => LoadStart::Superseded,
            other => return Err(Error::corrupt(format!("load outcome {other:?}"))),
        };
        let loading = Loading {
            voucher,
            generation,
            marker: format!("{}|{generation}", identity(voucher)),
        };
        Ok((start, loading))
    }

    /// Adds a chunk of customers' counts and orders' records to a load under way; `false`
    /// when another load took over (nothing written). Callers send at most [`CHUNK`] entries.
    pub async fn fill_load(
        &self,
        loading: &Loading<'_>,
        users: &[(String, i64)],
        orders: &[(String, OrderRecord)],
    ) -> Result<bool> {
        let k = self.keys(&loading.voucher.code);
        let mut invocation = self.scripts.load_fill.prepare_invoke();
        invocation
            .key(&k.loading)
            .key(&k.users)
            .key(&k.orders)
            .arg(&loading.marker)
            .arg(users.len());
        for (customer, held) in users {
            invocation.arg(customer).arg(*held);
        }
        for (order, record) in orders {
            invocation.arg(order).arg(record.format());
        }
        let filled: i64 = invocation
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(redis_down)?;
        Ok(filled == 1)
    }

    /// Opens a filled gate with `remaining` uses, if its load is still the one under way.
    /// The caller checks first that its generation is still the voucher's latest.
    pub async fn open_load(&self, loading: &Loading<'_>, remaining: i64) -> Result<bool> {
        let voucher = loading.voucher;
        let k = self.keys(&voucher.code);
        let opened: i64 = self
            .scripts
            .load_open
            .key(&k.meta)
            .key(&k.remaining)
            .key(&k.loading)
            .arg(&loading.marker)
            .arg(identity(voucher))
            .arg(voucher.total_limit)
            .arg(voucher.per_user_limit)
            .arg(ms(voucher.starts_at))
            .arg(ms(voucher.ends_at))
            .arg(voucher.min_order_amount.minor_units())
            .arg(voucher.discount_amount.minor_units())
            .arg(remaining)
            .arg(loading.generation)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(redis_down)?;
        Ok(opened == 1)
    }

    /// Loads a whole gate in one go (begin, fill in chunks, open), unless this voucher's
    /// gate is open; `true` when this call opened it. Unfenced against PostgreSQL: for
    /// states known whole (tests, the benchmark); the service loads through
    /// `FlashPath::load_from_database`.
    pub async fn load(&self, voucher: &Voucher, generation: i64, state: &GateLoad) -> Result<bool> {
        let (start, loading) = self.begin_load(voucher, generation).await?;
        if start != LoadStart::Started {
            return Ok(false);
        }
        for users in state.users.chunks(CHUNK) {
            if !self.fill_load(&loading, users, &[]).await? {
                return Ok(false);
            }
        }
        for orders in state.orders.chunks(CHUNK) {
            if !self.fill_load(&loading, &[], orders).await? {
                return Ok(false);
            }
        }
        self.open_load(&loading, state.remaining).await
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

    /// The remaining count and the oldest unsettled orders (at most
    /// [`SNAPSHOT_UNSETTLED_MAX`]), read atomically; `None` when not loaded.
    #[tracing::instrument(name = "gate.snapshot", skip(self))]
    pub async fn snapshot(&self, code: &VoucherCode) -> Result<Option<GateSnapshot>> {
        let k = self.keys(code);
        let reply: Value = self
            .scripts
            .snapshot
            .key(&k.meta)
            .key(&k.remaining)
            .key(&k.unsettled)
            .arg(SNAPSHOT_UNSETTLED_MAX)
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
                .and_then(|r| r.parse::<i64>().ok())
                .ok_or_else(|| Error::corrupt(format!("gate snapshot without {what}")))
        };
        let at_ms = number("time")?;
        let remaining = number("remaining")?;
        let unsettled_count = usize::try_from(number("unsettled count")?)
            .map_err(|_| Error::corrupt("gate snapshot with a negative count"))?;
        let mut unsettled = Vec::new();
        while let (Some(order), Some(score)) = (items.next(), items.next()) {
            let publish_ms = score
                .parse::<f64>()
                .map_err(|_| Error::corrupt(format!("unsettled score {score:?}")))?;
            unsettled.push((order, publish_ms as i64));
        }
        Ok(Some(GateSnapshot {
            at_ms,
            remaining,
            unsettled_count,
            unsettled,
        }))
    }

    /// Drops settled orders (their rows are in PostgreSQL) from the unsettled set.
    pub async fn settle<S: AsRef<str>>(&self, code: &VoucherCode, orders: &[S]) -> Result<()> {
        let k = self.keys(code);
        for chunk in orders.chunks(CHUNK) {
            let members: Vec<&str> = chunk.iter().map(AsRef::as_ref).collect();
            redis::cmd("ZREM")
                .arg(&k.unsettled)
                .arg(members)
                .query_async::<()>(&mut self.conn.clone())
                .await
                .map_err(redis_down)?;
        }
        Ok(())
    }

    /// The records of some orders (`None` where there is none); `Ok(None)` when not loaded.
    /// Not atomic across chunks: callers act through the scripts, which check again.
    pub async fn records(
        &self,
        code: &VoucherCode,
        orders: &[String],
    ) -> Result<Vec<Option<OrderRecord>>> {
        let k = self.keys(code);
        let mut records = Vec::with_capacity(orders.len());
        for chunk in orders.chunks(CHUNK) {
            let raw: Vec<Option<String>> = redis::cmd("HMGET")
                .arg(&k.orders)
                .arg(chunk)
                .query_async(&mut self.conn.clone())
                .await
                .map_err(redis_down)?;
            for r in raw {
                records.push(r.map(|r| OrderRecord::parse(&r)).transpose()?);
            }
        }
        Ok(records)
    }

    /// The uses the gate counts for each of `customers` (at most [`CHUNK`]), with the
    /// moment of the read by Redis's clock; `None` when not loaded.
    pub async fn customer_counts(
        &self,
        code: &VoucherCode,
        customers: &[String],
    ) -> Result<Option<(i64, Vec<i64>)>> {
        let k = self.keys(code);
        let mut invocation = self.scripts.counts.prepare_invoke();
        invocation.key(&k.meta).key(&k.users);
        for customer in customers {
            invocation.arg(customer);
        }
        let reply: Option<Vec<i64>> = invocation
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(redis_down)?;
        Ok(reply.and_then(|mut items| {
            if items.is_empty() {
                return None;
            }
            let at_ms = items.remove(0);
            Some((at_ms, items))
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

    /// Hands the voucher's open gate `generation` if it is newer than its own (`raise.lua`);
    /// `true` when it did.
    #[tracing::instrument(name = "gate.raise", skip(self, voucher), fields(code = %voucher.code))]
    pub async fn raise_generation(&self, voucher: &Voucher, generation: i64) -> Result<bool> {
        let k = self.keys(&voucher.code);
        let raised: i64 = self
            .scripts
            .raise
            .key(&k.meta)
            .arg(identity(voucher))
            .arg(generation)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(redis_down)?;
        Ok(raised == 1)
    }

    /// The generation of the voucher's open gate (`None` when it is not open).
    pub async fn generation(&self, code: &VoucherCode) -> Result<Option<i64>> {
        let k = self.keys(code);
        let generation: Option<i64> = redis::cmd("HGET")
            .arg(&k.meta)
            .arg("generation")
            .query_async(&mut self.conn.clone())
            .await
            .map_err(redis_down)?;
        Ok(generation)
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

    /// The order ids the gate has a record of, whatever their state, read in pieces
    /// (HSCAN): no single call blocks Redis on a voucher's size. `None` when not loaded.
    pub async fn order_ids(&self, code: &VoucherCode) -> Result<Option<Vec<String>>> {
        let ids = self
            .scan_orders(code, |_, count| Vec::with_capacity(count), Vec::push)
            .await?;
        Ok(ids.map(|mut ids| {
            // HSCAN may return a field twice.
            ids.sort_unstable();
            ids.dedup();
            ids
        }))
    }

    /// The order ids the gate has a record of, as a filter, with the uses it had left
    /// before the first of them was read: an order that took a use after that read needed
    /// a use given back after it, and every give-back is announced, which drops the edge's
    /// flag. `None` when not loaded.
    pub async fn order_filter(&self, code: &VoucherCode) -> Result<Option<OrderFilter>> {
        self.scan_orders(
            code,
            // A few more than now: orders taken during the scan still fit the sizing.
            |remaining, count| {
                OrderFilter::with_capacity(count + count / 10, remaining.max(0) as u64)
            },
            |filter, order_id| filter.insert(&order_id),
        )
        .await
    }

    /// Reads every order id of `code`'s gate in pieces (HSCAN), into what `start` makes
    /// from the uses left (read before the first id) and the number of orders then. `None`
    /// when the gate is not loaded, or was reloaded during the scan (its generation
    /// changed, or Redis restarted empty): a read across a reload may miss orders.
    async fn scan_orders<T>(
        &self,
        code: &VoucherCode,
        start: impl FnOnce(i64, usize) -> T,
        mut each: impl FnMut(&mut T, String),
    ) -> Result<Option<T>> {
        let k = self.keys(code);
        let generation = || async {
            redis::cmd("HGET")
                .arg(&k.meta)
                .arg("generation")
                .query_async::<Option<i64>>(&mut self.conn.clone())
                .await
                .map_err(redis_down)
        };
        let before = generation().await?;
        let Some(remaining) = self.remaining(code).await? else {
            return Ok(None);
        };
        let count: usize = redis::cmd("HLEN")
            .arg(&k.orders)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(redis_down)?;
        let mut into = start(remaining, count);
        let mut cursor: u64 = 0;
        loop {
            let (next, page): (u64, Vec<String>) = redis::cmd("HSCAN")
                .arg(&k.orders)
                .arg(cursor)
                .arg("COUNT")
                .arg(CHUNK)
                .query_async(&mut self.conn.clone())
                .await
                .map_err(redis_down)?;
            // HSCAN returns field, value, field, value, ...
            for order_id in page.into_iter().step_by(2) {
                each(&mut into, order_id);
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
        if before.is_none() || generation().await? != before {
            return Ok(None);
        }
        Ok(Some(into))
    }

    /// Drops every key of a voucher's gate (operator reload; tests simulating data loss).
    /// UNLINK frees them in the background, whatever their size.
    pub async fn unload(&self, code: &VoucherCode) -> Result<()> {
        let k = self.keys(code);
        redis::cmd("UNLINK")
            .arg(&k.meta)
            .arg(&k.remaining)
            .arg(&k.users)
            .arg(&k.orders)
            .arg(&k.unsettled)
            .arg(&k.loading)
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
