//! Loading a gate and its generations: a load begins closed, fills in chunks and opens
//! only while it is still the load under way; an open gate can be handed a newer
//! generation; a gate can be dropped whole. Scripts: `lua/load/`.

use super::reserve::ORDER_CLAIM_TTL_SECS;
use super::{identity, ms, redis_down, Gate, OrderRecord, CHUNK};
use crate::domain::{Voucher, VoucherCode};
use crate::{Error, Result};

/// Claims sent at once when a rebuilt gate's orders are claimed again: enough to hide the
/// round trips, few enough that a million-order voucher does not queue a million commands.
const CLAIMS_IN_FLIGHT: usize = 256;

/// The state a gate is loaded with in one piece (a new voucher, tests, the benchmark).
#[derive(Debug, Clone, Default)]
pub struct GateLoad {
    pub remaining: i64,
    pub users: Vec<(String, i64)>,
    pub orders: Vec<(String, OrderRecord)>,
}

/// The fields of a voucher's definition a gate holds in its meta, as the script arguments
/// `load_open.lua` and `amend.lua` both take them, in this order: total_limit,
/// per_user_limit, starts_ms, ends_ms, min_order, discount.
struct Definition<'a>(&'a Voucher);

impl redis::ToRedisArgs for Definition<'_> {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        let v = self.0;
        v.total_limit.write_redis_args(out);
        v.per_user_limit.write_redis_args(out);
        ms(v.starts_at).write_redis_args(out);
        ms(v.ends_at).write_redis_args(out);
        v.min_order_amount.minor_units().write_redis_args(out);
        v.discount_amount.minor_units().write_redis_args(out);
    }
}

/// What [`Gate::amend`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Amended {
    /// The gate took the definition.
    Amended,
    /// The gate had it, or a later one.
    Current,
    /// No gate of this voucher is open.
    NotLoaded,
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

impl Gate {
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

    /// Opens a filled gate with `remaining` uses and the definition `voucher` (as the load's
    /// read found it), if its load is still the one under way. The caller checks first
    /// that its generation is still the voucher's latest.
    pub async fn open_load(
        &self,
        loading: &Loading<'_>,
        voucher: &Voucher,
        remaining: i64,
    ) -> Result<bool> {
        let k = self.keys(&voucher.code);
        let opened: i64 = self
            .scripts
            .load_open
            .key(&k.meta)
            .key(&k.remaining)
            .key(&k.loading)
            .arg(&loading.marker)
            .arg(identity(voucher))
            .arg(Definition(voucher))
            .arg(remaining)
            .arg(loading.generation)
            .arg(voucher.version)
            .arg(voucher.state.as_str())
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
        self.open_load(&loading, voucher, state.remaining).await
    }

    /// Claims every order of `orders` for `code` unless another voucher holds it: after a
    /// rebuild, the claims lost with the gate are back. Each claim is a key of its own slot
    /// (one per orderId, `claim_key`), so they are sent as separate commands, many at once:
    /// on one server the connection pipelines them; on a cluster each goes to its slot's
    /// master (a pipeline across slots would be refused).
    pub async fn claim_orders(&self, code: &VoucherCode, orders: &[String]) -> Result<()> {
        for chunk in orders.chunks(CLAIMS_IN_FLIGHT) {
            let claims = chunk.iter().map(|order| {
                let mut conn = self.conn.clone();
                let mut claim = redis::cmd("SET");
                claim
                    .arg(self.claim_key(order))
                    .arg(code.as_str())
                    .arg("NX")
                    .arg("EX")
                    .arg(ORDER_CLAIM_TTL_SECS);
                async move { claim.query_async::<Option<String>>(&mut conn).await }
            });
            futures::future::try_join_all(claims)
                .await
                .map_err(redis_down)?;
        }
        Ok(())
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

    /// Hands the voucher's open gate its definition `voucher` if that is newer than the
    /// gate's (`amend.lua`): the limit, window, terms and state change in one step, and the
    /// edges hear of it. A gate not open takes nothing: the load that opens it reads the
    /// definition then.
    #[tracing::instrument(name = "gate.amend", skip(self, voucher), fields(code = %voucher.code, version = voucher.version))]
    pub async fn amend(&self, voucher: &Voucher) -> Result<Amended> {
        let k = self.keys(&voucher.code);
        let outcome: String = self
            .scripts
            .amend
            .key(&k.meta)
            .key(&k.remaining)
            .arg(identity(voucher))
            .arg(voucher.version)
            .arg(Definition(voucher))
            .arg(voucher.state.as_str())
            .arg(&self.channel)
            .arg(&self.sold_out_channel)
            .arg(voucher.code.as_str())
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(redis_down)?;
        match outcome.as_str() {
            "AMENDED" => Ok(Amended::Amended),
            "CURRENT" => Ok(Amended::Current),
            "NOT_LOADED" => Ok(Amended::NotLoaded),
            other => Err(Error::corrupt(format!("amend outcome {other:?}"))),
        }
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
}
