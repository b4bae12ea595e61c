//! Recording reservations decided elsewhere (by the flash gate), in batches, idempotently.
//!
//! The callers (flash mode's event consumer, and flash mode's recorder when PostgreSQL has
//! the last word) hand over RESERVED reservations; this module knows nothing of events or
//! brokers.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};

use sqlx::{Connection, PgConnection};

use super::kept::KeptConnection;
use super::partitions::{store_offset, PartitionKey};
use super::reservations::{RedemptionRow, REDEMPTION_COLUMNS};
use crate::domain::{Money, Reservation};
use crate::Result;

impl super::Store {
    /// Records a batch of RESERVED reservations the gate decided, on a connection of the
    /// pool, in one transaction when nothing is refused (see [`record_reserved`]).
    ///
    /// `generations[i]` is the generation of the gate that decided `batch[i]` (0: none
    /// known). The fence: a row is written only while that generation is still the
    /// voucher's latest (`vouchers.gate_generation`), read from the voucher's row as the
    /// statement locks it (the lock every batch needs anyway, to count its uses there). A
    /// rebuild takes the next generation by updating that row, which waits for the lock,
    /// and reads PostgreSQL only after: so every use an old gate
    /// decided is either committed before the new gate's read (and in it), or refused as
    /// stale (`BatchResult::stale`, a 503 whose retry the new gate decides). Without it, a
    /// commit held up across a rebuild landed behind the read: a 201 the new gate did not
    /// know.
    pub async fn record_decided(
        &self,
        batch: &[Reservation],
        generations: &[i64],
    ) -> Result<Recording> {
        self.decided_writer().record(batch, generations).await
    }

    /// A writer of decided batches that keeps one connection of the pool between batches
    /// (the recorder's): no test of the connection before each batch, which would cost a
    /// round trip per batch (`super::kept`).
    pub fn decided_writer(&self) -> DecidedWriter {
        DecidedWriter {
            conn: KeptConnection::new(self.pool.clone()),
        }
    }
}

/// Records decided batches on a connection it keeps (see [`super::Store::record_decided`]
/// for what a batch does). A batch that fails with the connection in an unknown state
/// (an I/O error, the session ended) drops it: the next batch takes a fresh one.
pub struct DecidedWriter {
    conn: KeptConnection,
}

/// The longest a batch may take on the kept connection before its outcome counts as
/// unknown and the connection is dropped: a connection whose peer vanished without a reset
/// would otherwise hold every reservation of the core for TCP's retransmission timeout.
/// Well above what a healthy batch takes, and above the 5 s a stuck session may hold a
/// voucher's row (`database.idle_in_transaction_timeout`).
const BATCH_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

impl DecidedWriter {
    /// Records a batch a flash gate decided (see [`super::Store::record_decided`]).
    pub async fn record(
        &mut self,
        batch: &[Reservation],
        generations: &[i64],
    ) -> Result<Recording> {
        self.write(batch, generations, Terms::Gated).await
    }

    /// Decides and records a batch of standard-mode reservations, on PostgreSQL's clock:
    /// the reservations' own times are ignored, each written row is reserved `now()` and
    /// expires `ttl` later (`BatchResult::written`); a reservation outside the voucher's
    /// window or below its minimum is refused `not_started`, `expired` or
    /// `below_min_order`.
    pub async fn reserve_standard(
        &mut self,
        batch: &[Reservation],
        ttl: chrono::Duration,
    ) -> Result<Recording> {
        self.write(batch, &[], Terms::Standard { ttl }).await
    }

    async fn write(
        &mut self,
        batch: &[Reservation],
        generations: &[i64],
        terms: Terms,
    ) -> Result<Recording> {
        let conn = match self.conn.get().await {
            Ok(conn) => conn,
            // No connection, nothing sent: certainly not written, which the caller may act
            // on at once (give the uses back) instead of waiting for reconciliation.
            Err(e) => return Ok(Recording::NotSent(e.into())),
        };
        let writing = record_reserved(conn, batch, generations, None, terms);
        let recorded = match tokio::time::timeout(BATCH_DEADLINE, writing).await {
            Ok(recorded) => recorded,
            Err(_) => Err(crate::Error::unavailable(
                "database (batch past its deadline)",
            )),
        };
        self.conn.finish(recorded.is_ok(), BATCH_DEADLINE).await;
        recorded.map(Recording::Done)
    }
}

/// How an attempt to record a batch ended.
#[derive(Debug)]
pub enum Recording {
    /// The statement ran: what it did.
    Done(BatchResult),
    /// No connection could be had (pool timeout, connection refused): no statement was
    /// sent, nothing of the batch is written.
    NotSent(crate::Error),
}

/// What a batch did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BatchResult {
    /// New rows: uses recorded.
    pub inserted: usize,
    /// Those rows, with the times stored (PostgreSQL's own, for standard mode).
    pub written: Vec<Written>,
    /// Reservations whose row already existed (redelivery, replay): no-ops.
    pub duplicates: usize,
    /// Those repeats with the row PostgreSQL holds for them (by index in the batch): what
    /// a retry is answered from, whatever the gate's record says.
    pub repeats: Vec<(usize, Reservation)>,
    /// Reservations the database refuses (by index in the batch, with the reason).
    pub refused: Vec<(usize, String)>,
    /// Reservations not written because the gate that decided them is no longer the
    /// voucher's latest (by index in the batch; see [`super::Store::record_decided`]).
    pub stale: Vec<usize>,
    /// Transactions spent, for the "far fewer transactions than uses" figure.
    pub transactions: usize,
    /// Whether the partition's next offset was stored with the rows.
    pub offset_stored: bool,
}

/// The offset to store with a batch's rows, for the partition it was read from.
#[derive(Clone, Copy)]
pub(super) struct Advance<'a> {
    pub key: &'a PartitionKey,
    pub next_offset: i64,
    pub owner: &'a str,
}

/// A constraint the database named when it refused a write.
fn refusal(e: &sqlx::Error) -> Option<String> {
    match e {
        sqlx::Error::Database(db) => match (db.constraint(), db.code().as_deref()) {
            (Some(name), _) => Some(name.to_owned()),
            // check, not-null, foreign-key, unique, exclusion violations; invalid text
            (None, Some(code)) if code.starts_with("23") || code.starts_with("22") => {
                Some(format!("sqlstate {code}"))
            }
            _ => None,
        },
        _ => None,
    }
}

/// Records a batch of RESERVED reservations on `conn`.
///
/// One statement writes the whole batch ([`admit`]), with `advance` stored in the same
/// transaction when nothing is refused. A batch is expected to fit (a flash gate decided
/// it; a standard voucher far from its limit): it is written as it is
/// ([`Ranking::Optimistic`]), the CHECKs refusing the statement if anything is past a
/// limit. A refused one is decided by one statement that applies the voucher's and each customer's limits in arrival order
/// ([`Ranking::Ranked`]): what they leave room for is inserted and counted, the rest is
/// refused by name. The CHECKs stay the last guard there too: that statement reads
/// customers' counts as of its start, so a batch of another core that gave a customer a
/// use meanwhile can make it count one too few and break `customer_usage_within_limit`.
/// Such a batch is decided again by a new statement (which sees what committed); after
/// three statements in all, one reservation per transaction, so that only the refused
/// ones are set aside; the offset is then the caller's to store.
#[tracing::instrument(name = "db.record_reserved", skip_all, fields(events = batch.len()))]
///
/// `generations` fences the rows (see [`super::Store::record_decided`]); empty for the
/// event writers, whose events need no fence.
pub(super) async fn record_reserved(
    conn: &mut PgConnection,
    batch: &[Reservation],
    generations: &[i64],
    advance: Option<Advance<'_>>,
    terms: Terms,
) -> Result<BatchResult> {
    let fence = Fence::new(batch, generations);
    let mut ranking = Ranking::Optimistic;
    let mut attempts = 0;
    loop {
        attempts += 1;
        match record_batch(conn, batch, &fence, advance, terms, ranking).await {
            Ok(mut result) => {
                result.transactions = attempts;
                return Ok(result);
            }
            Err(e) if refusal(&e).is_some() && attempts < DECIDE_ATTEMPTS => {
                tracing::debug!(error = %crate::error::cause_chain(&e), ?ranking, "batch broke a limit; deciding it reservation by reservation");
                ranking = Ranking::Ranked;
            }
            Err(e) if refusal(&e).is_some() => {
                tracing::warn!(error = %crate::error::cause_chain(&e), "batch refused; recording its reservations one by one");
                let mut result = record_one_by_one(conn, batch, &fence, terms).await?;
                result.transactions += attempts;
                return Ok(result);
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Statements that write a whole batch before it is recorded one by one.
const DECIDE_ATTEMPTS: usize = 3;

/// The gate generation each reservation of a batch was decided under (0: unfenced).
struct Fence {
    generations: Vec<i64>,
}

impl Fence {
    fn new(batch: &[Reservation], generations: &[i64]) -> Self {
        let generations = (0..batch.len())
            .map(|i| generations.get(i).copied().unwrap_or(0))
            .collect();
        Self { generations }
    }
}

/// The vouchers of a batch, each once, in the order their rows are locked.
fn voucher_codes(batch: &[Reservation]) -> Vec<&str> {
    let mut codes: Vec<&str> = batch.iter().map(|r| r.voucher_code.as_str()).collect();
    codes.sort_unstable();
    codes.dedup();
    codes
}

/// The whole batch at once: decided and its rows inserted and counted by one statement
/// ([`admit`]), then repeats told from conflicts among the rows that were not new. Without
/// an offset to store, that statement is its own transaction: one round trip for the
/// batch, which is what a recorder waiting on PostgreSQL before its 201s needs. With one,
/// it runs in a transaction that stores the offset too, if nothing was refused.
async fn record_batch(
    conn: &mut PgConnection,
    batch: &[Reservation],
    fence: &Fence,
    advance: Option<Advance<'_>>,
    terms: Terms,
    ranking: Ranking,
) -> Result<BatchResult, sqlx::Error> {
    let Some(advance) = advance else {
        let admitted = admit(&mut *conn, batch, fence, terms, ranking).await?;
        // Rows never change voucher or customer: reading them after the commit is safe.
        let settled = if admitted.inserted.len() == batch.len() {
            Settled::default()
        } else {
            let mut tx = conn.begin().await?;
            by_index(&mut tx).await?;
            let settled = classify(&mut tx, batch, &admitted, fence).await?;
            tx.commit().await?;
            settled
        };
        return Ok(settled.into_result(admitted.inserted, false));
    };
    let mut tx = conn.begin().await?;
    by_index(&mut tx).await?;
    let admitted = admit(&mut tx, batch, fence, terms, ranking).await?;
    let settled = classify(&mut tx, batch, &admitted, fence).await?;
    let offset_stored = settled.refused.is_empty() && settled.stale.is_empty();
    if offset_stored {
        store_offset(&mut tx, advance.key, advance.next_offset, advance.owner).await?;
    }
    tx.commit().await?;
    Ok(settled.into_result(admitted.inserted, offset_stored))
}

/// What became of the reservations of a batch that were not inserted.
#[derive(Default)]
struct Settled {
    repeats: Vec<(usize, Reservation)>,
    refused: Vec<(usize, String)>,
    stale: Vec<usize>,
}

impl Settled {
    fn into_result(self, written: Vec<Written>, offset_stored: bool) -> BatchResult {
        BatchResult {
            inserted: written.len(),
            written,
            duplicates: self.repeats.len(),
            repeats: self.repeats,
            refused: self.refused,
            stale: self.stale,
            transactions: 1,
            offset_stored,
        }
    }
}

/// Of the reservations not inserted: those the statement found stale stay so (a stale one
/// is a 503 whose retry the new gate answers from what it holds, even when that retry's
/// row is already stored: this attempt's record is not that row); those it refused stay
/// refused unless their orderId has a row by now (the statement judged them by its
/// snapshot, taken before it waited for the voucher's row: another core may have
/// committed the same order meanwhile, and then the row is the answer); the rest are
/// repeats or refused by [`classify_existing`].
async fn classify(
    conn: &mut PgConnection,
    batch: &[Reservation],
    admitted: &Admitted,
    fence: &Fence,
) -> Result<Settled, sqlx::Error> {
    let mut settled = Settled {
        stale: admitted.stale.clone(),
        ..Settled::default()
    };
    let refused_orders: Vec<&str> = admitted
        .refused
        .iter()
        .filter_map(|(i, _)| batch.get(*i))
        .map(|r| r.order_id.as_str())
        .collect();
    let stored = stored_rows(conn, &refused_orders).await?;
    let mut still_refused: HashMap<usize, &str> = HashMap::new();
    for (i, why) in &admitted.refused {
        let Some(r) = batch.get(*i) else { continue };
        match stored.get(r.order_id.as_str()) {
            Some(row) if row.is_same_use(r) => settled.repeats.push((*i, row.clone())),
            Some(_) => settled.refused.push((*i, ORDER_ID_TAKEN.to_owned())),
            None => {
                settled.refused.push((*i, why.clone()));
                still_refused.insert(*i, why.as_str());
            }
        }
    }
    let decided: HashSet<usize> = admitted
        .refused
        .iter()
        .map(|(i, _)| *i)
        .chain(admitted.stale.iter().copied())
        .collect();
    let fresh: HashSet<&str> = admitted
        .inserted
        .iter()
        .map(|w| w.order_id.as_str())
        .collect();
    // A later occurrence of an orderId whose first occurrence in this batch stays refused,
    // or was found stale under the same generation: the same request (a concurrent retry)
    // gets the same answer.
    let mut first_of: HashMap<&str, usize> = HashMap::new();
    for (i, r) in batch.iter().enumerate() {
        first_of.entry(r.order_id.as_str()).or_insert(i);
    }
    let mut undecided = Vec::new();
    for i in (0..batch.len()).filter(|i| !decided.contains(i)) {
        let first = first_of
            .get(batch[i].order_id.as_str())
            .copied()
            .unwrap_or(i);
        if first != i && batch[i].is_same_use(&batch[first]) {
            if let Some(why) = still_refused.get(&first) {
                settled.refused.push((i, (*why).to_owned()));
                continue;
            }
            if admitted.stale.contains(&first) && fence.generations[i] == fence.generations[first] {
                settled.stale.push(i);
                continue;
            }
        }
        undecided.push(i);
    }
    let rest: Vec<Reservation> = undecided.iter().map(|&i| batch[i].clone()).collect();
    for (k, found) in classify_existing(conn, &rest, &fresh).await? {
        let i = undecided[k];
        match found {
            Existing::Repeat(row) => settled.repeats.push((i, row)),
            Existing::Conflict => settled.refused.push((i, ORDER_ID_TAKEN.to_owned())),
        }
    }
    Ok(settled)
}

/// The last resort for a batch the CHECKs refused however often it was decided: each
/// reservation decided alone, in its own transaction, so that a refusal sets aside only
/// the one that breaks a constraint.
async fn record_one_by_one(
    conn: &mut PgConnection,
    batch: &[Reservation],
    fence: &Fence,
    terms: Terms,
) -> Result<BatchResult> {
    let mut result = BatchResult::default();
    for (i, reservation) in batch.iter().enumerate() {
        let alone = Fence {
            generations: vec![fence.generations[i]],
        };
        result.transactions += 1;
        let alone_batch = std::slice::from_ref(reservation);
        let one = match record_batch(conn, alone_batch, &alone, None, terms, Ranking::Ranked).await
        {
            Ok(one) => one,
            Err(e) => match refusal(&e) {
                Some(reason) => {
                    result.refused.push((i, reason));
                    continue;
                }
                None => return Err(e.into()),
            },
        };
        result.inserted += one.inserted;
        result.written.extend(one.written);
        result.duplicates += one.duplicates;
        result
            .repeats
            .extend(one.repeats.into_iter().map(|(_, row)| (i, row)));
        result
            .refused
            .extend(one.refused.into_iter().map(|(_, why)| (i, why)));
        result.stale.extend(one.stale.into_iter().map(|_| i));
    }
    Ok(result)
}

/// Makes the rest of the transaction look rows up by their indexes whatever the planner's
/// statistics say. Measured: with autovacuum off (as on this machine's PostgreSQL) the
/// tables are never analyzed, the planner takes `redemptions` for empty, and looking 500
/// orderIds up with `= ANY` became a scan of a million rows per batch (13.6 s each; the
/// writers fell 940,000 events behind after a million-use sale).
pub(super) async fn by_index(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    sqlx::query("SET LOCAL enable_seqscan = off")
        .execute(conn)
        .await?;
    Ok(())
}

/// [`by_index`], and no bitmap scans either: an `ORDER BY` along an index with a `LIMIT`
/// then reads its page in the index's order and stops, where a planner with stale
/// statistics expected few rows, read every match in a bitmap scan and sorted them
/// (the reconciliation's page of customers, the expiry's batch; measured at each).
pub(super) async fn along_index(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    by_index(conn).await?;
    sqlx::query("SET LOCAL enable_bitmapscan = off")
        .execute(conn)
        .await?;
    Ok(())
}

/// Writes a batch in one statement, [`OPTIMISTIC`] or [`RANKED`] as `ranking` says;
/// returns what it did.
///
/// Both lock the batch's voucher rows first (`FOR NO KEY UPDATE`, in code order byte by
/// byte, the order `give_back_uses` takes them in; the lock the count's update needs
/// anyway); a locked row is read as its latest version, so the voucher's count and
/// generation are exact however long the lock took. A reservation whose gate's generation
/// is not the voucher's latest is stale (the fence, see [`super::Store::record_decided`]);
/// one outside the window or below the minimum (standard terms), or on a voucher sold out
/// already, is refused. [`OPTIMISTIC`] inserts the rest. [`RANKED`] goes on, in arrival
/// order; each reservation is:
/// - left for [`classify_existing`], if its orderId has a row already (a repeat, or
///   another reservation's) or came earlier in the batch (a concurrent retry: it takes
///   no place of its own, and is answered as the first occurrence is);
/// - refused `customer_usage_within_limit` past its customer's limit, then
///   `vouchers_used_within_limit` past the voucher's: the names of the CHECKs that would
///   refuse the same write;
/// - otherwise inserted, and counted against its customer and its voucher.
///
/// Rows go in in orderId order, so two batches that share orderIds (one orderId sent to
/// two vouchers, through two cores) wait on each other's index entries in the same order
/// instead of deadlocking. One orderId twice in a batch is inserted once; in [`RANKED`], a
/// new orderId that another transaction inserts meanwhile is skipped by the unique index,
/// its place in the ranking unused (it can only make this batch admit fewer, never more;
/// the reservation is then a repeat, see [`classify`]). [`RANKED`] reads customers' counts
/// as of the statement's start: one that another core's batch raised meanwhile makes the
/// upsert break its CHECK (decided again, see [`record_reserved`]); one that a release
/// lowered meanwhile can refuse `customer_usage_within_limit` a use the customer had room
/// for, an answer its retry corrects.
async fn admit(
    conn: &mut PgConnection,
    batch: &[Reservation],
    fence: &Fence,
    terms: Terms,
    ranking: Ranking,
) -> Result<Admitted, sqlx::Error> {
    let text = |f: fn(&Reservation) -> &str| batch.iter().map(f).collect::<Vec<_>>();
    let (times, ttl): (Vec<Option<Stay>>, _) = match terms {
        Terms::Decided | Terms::Gated => (
            batch
                .iter()
                .map(|r| Some((r.reserved_at, r.expires_at)))
                .collect(),
            chrono::Duration::zero(),
        ),
        Terms::Standard { ttl } => (vec![None; batch.len()], ttl),
    };
    let sql = match ranking {
        Ranking::Optimistic => OPTIMISTIC,
        Ranking::Ranked => RANKED,
    };
    let query = sqlx::query_as::<_, AdmitRow>(sql)
        .bind(text(|r| r.voucher_code.as_str()))
        .bind(text(|r| r.customer_id.as_str()))
        .bind(text(|r| r.order_id.as_str()))
        .bind(
            batch
                .iter()
                .map(|r| r.order_amount.minor_units())
                .collect::<Vec<_>>(),
        )
        .bind(
            batch
                .iter()
                .map(|r| r.discount_amount.minor_units())
                .collect::<Vec<_>>(),
        )
        .bind(times.iter().map(|t| t.map(|t| t.0)).collect::<Vec<_>>())
        .bind(times.iter().map(|t| t.map(|t| t.1)).collect::<Vec<_>>())
        .bind(&fence.generations)
        .bind(voucher_codes(batch))
        .bind(ttl);
    let rows = query
        .bind(matches!(terms, Terms::Standard { .. }))
        .bind(!matches!(terms, Terms::Decided))
        .fetch_all(conn)
        .await?;
    let mut admitted = Admitted::default();
    for row in rows {
        match row {
            AdmitRow {
                order_id: Some(order_id),
                discount_amount: Some(discount_amount),
                reserved_at: Some(reserved_at),
                expires_at: Some(expires_at),
                ..
            } => admitted.inserted.push(Written {
                order_id,
                discount_amount: Money::from_db(discount_amount),
                reserved_at,
                expires_at,
            }),
            // WITH ORDINALITY counts from 1.
            AdmitRow {
                idx: Some(nth),
                verdict: Some(verdict),
                ..
            } => {
                let Some(i) = usize::try_from(nth - 1).ok().filter(|i| *i < batch.len()) else {
                    continue;
                };
                if verdict == "stale" {
                    admitted.stale.push(i);
                } else {
                    admitted.refused.push((i, verdict));
                }
            }
            _ => {}
        }
    }
    Ok(admitted)
}

/// When a reservation was reserved, and when it expires.
type Stay = (DateTime<Utc>, DateTime<Utc>);

/// The CTE of both statements of [`admit`] that locks the batch's vouchers, in code order
/// byte by byte, and reads each as the lock hands it over: its latest version.
macro_rules! voucher_cte {
    () => {
        "voucher AS (
     SELECT code, used_count, total_limit, per_user_limit, gate_generation,
            min_order_amount, discount_amount, state, now() < starts_at AS early, now() >= ends_at AS late
     FROM vouchers WHERE code = ANY($9::text[])
     ORDER BY code COLLATE \"C\"
     FOR NO KEY UPDATE
 ),
 "
    };
}

/// The CTEs of both statements of [`admit`] that count what `inserted` wrote against its
/// customers and its vouchers.
macro_rules! count_ctes {
    () => {
        "customers AS (
     INSERT INTO customer_usage AS u (voucher_code, customer_id, active_count,
                                      per_user_limit)
     SELECT i.voucher_code, i.customer_id, count(*)::int4, v.per_user_limit
     FROM inserted i JOIN voucher v ON v.code = i.voucher_code
     GROUP BY i.voucher_code, i.customer_id, v.per_user_limit
     ORDER BY i.voucher_code, i.customer_id
     ON CONFLICT (voucher_code, customer_id)
     DO UPDATE SET active_count = u.active_count + excluded.active_count
 ),
 used AS (
     UPDATE vouchers v SET used_count = v.used_count + n.uses
     FROM (SELECT voucher_code, count(*)::int4 AS uses FROM inserted
           GROUP BY voucher_code) n
     WHERE v.code = n.voucher_code
 )
"
    };
}

/// [`admit`] when the batch is expected to fit: every reservation of a current generation
/// (and, on the standard terms, within the window and the minimum) is inserted and
/// counted unless the voucher is sold out already, and the CHECKs refuse the whole
/// statement if that breaks a limit; repeats are told apart afterwards ([`classify`],
/// which also answers a refused order from its row if it has one). The cheapest
/// statement that can write a batch: no ranking, no lookup before the insert.
/// Parameters: the batch's columns ($1-$8), its vouchers ($9), the TTL of rows without
/// times ($10), whether the standard terms' checks apply ($11), whether the voucher's state
/// is checked ($12: `voucher_paused`, `voucher_archived`, before the window; a repeat so
/// refused is answered from its row by [`classify`], as [`RANKED`] recognises it first).
const OPTIMISTIC: &str = concat!(
    "WITH input AS (
     SELECT u.*
     FROM unnest($1::text[], $2::text[], $3::text[], $4::int8[], $5::int8[],
                 $6::timestamptz[], $7::timestamptz[], $8::int8[])
          WITH ORDINALITY
          AS u(voucher_code, customer_id, order_id, order_amount, discount_amount,
               reserved_at, expires_at, generation, idx)
 ),
 ",
    voucher_cte!(),
    "candidate AS (
     SELECT i.*, v.discount_amount AS voucher_discount,
            CASE
                WHEN v.code IS NULL THEN 'redemptions_voucher_fkey'
                WHEN i.generation <> 0 AND i.generation <> v.gate_generation THEN 'stale'
                WHEN $12 AND v.state <> 'active' THEN 'voucher_' || v.state
                WHEN $11 AND v.early THEN 'not_started'
                WHEN $11 AND v.late THEN 'expired'
                WHEN $11 AND i.order_amount < v.min_order_amount THEN 'below_min_order'
                WHEN v.used_count >= v.total_limit THEN 'vouchers_used_within_limit'
            END AS verdict
     FROM input i LEFT JOIN voucher v ON v.code = i.voucher_code
 ),
 inserted AS (
     INSERT INTO redemptions (voucher_code, customer_id, order_id, order_amount,
                              discount_amount, reserved_at, expires_at)
     SELECT voucher_code, customer_id, order_id, order_amount,
            CASE WHEN $11 THEN least(voucher_discount, order_amount) ELSE discount_amount END,
            coalesce(reserved_at, now()), coalesce(expires_at, now() + $10::interval)
     FROM candidate WHERE verdict IS NULL
     ORDER BY order_id
     ON CONFLICT (order_id) DO NOTHING
     RETURNING voucher_code, customer_id, order_id, discount_amount, reserved_at, expires_at
 ),
 ",
    count_ctes!(),
    " SELECT order_id, discount_amount, reserved_at, expires_at, NULL::int8 AS idx,
        NULL::text AS verdict
 FROM inserted
 UNION ALL
 SELECT NULL, NULL, NULL, NULL, idx, verdict FROM candidate WHERE verdict IS NOT NULL"
);

/// [`admit`] deciding each reservation (see there); the parameters of [`OPTIMISTIC`].
const RANKED: &str = concat!(
    "WITH input AS (
     SELECT u.*, row_number() OVER (PARTITION BY u.order_id ORDER BY u.idx)
                     AS nth_of_order
     FROM unnest($1::text[], $2::text[], $3::text[], $4::int8[], $5::int8[],
                 $6::timestamptz[], $7::timestamptz[], $8::int8[])
          WITH ORDINALITY
          AS u(voucher_code, customer_id, order_id, order_amount, discount_amount,
               reserved_at, expires_at, generation, idx)
 ),
 ",
    voucher_cte!(),
    "held AS (
     SELECT c.voucher_code, c.customer_id, c.active_count
     FROM customer_usage c
     WHERE (c.voucher_code, c.customer_id) IN
           (SELECT voucher_code, customer_id FROM input)
 ),
 candidate AS (
     SELECT i.*, v.used_count, v.total_limit, v.per_user_limit,
            v.discount_amount AS voucher_discount,
            coalesce(h.active_count, 0) AS active_count,
            CASE
                WHEN v.code IS NULL THEN 'redemptions_voucher_fkey'
                WHEN i.generation <> 0 AND i.generation <> v.gate_generation
                    THEN 'stale'
                WHEN i.nth_of_order > 1
                  OR EXISTS (SELECT 1 FROM redemptions r WHERE r.order_id = i.order_id)
                    THEN 'known'
                WHEN $12 AND v.state <> 'active' THEN 'voucher_' || v.state
                WHEN $11 AND v.early THEN 'not_started'
                WHEN $11 AND v.late THEN 'expired'
                WHEN $11 AND i.order_amount < v.min_order_amount
                    THEN 'below_min_order'
                WHEN v.used_count >= v.total_limit THEN 'vouchers_used_within_limit'
            END AS verdict
     FROM input i
     LEFT JOIN voucher v ON v.code = i.voucher_code
     LEFT JOIN held h ON h.voucher_code = i.voucher_code
                     AND h.customer_id = i.customer_id
 ),
 by_customer AS (
     SELECT c.*, c.active_count + row_number() OVER (
                PARTITION BY c.voucher_code, c.customer_id ORDER BY c.idx
            ) AS customer_uses
     FROM candidate c WHERE c.verdict IS NULL
 ),
 by_voucher AS (
     SELECT b.*, b.used_count + row_number() OVER (
                PARTITION BY b.voucher_code ORDER BY b.idx
            ) AS voucher_uses
     FROM by_customer b WHERE b.customer_uses <= b.per_user_limit
 ),
 inserted AS (
     INSERT INTO redemptions (voucher_code, customer_id, order_id, order_amount,
                              discount_amount, reserved_at, expires_at)
     SELECT voucher_code, customer_id, order_id, order_amount,
            CASE WHEN $11 THEN least(voucher_discount, order_amount) ELSE discount_amount END,
            coalesce(reserved_at, now()), coalesce(expires_at, now() + $10::interval)
     FROM by_voucher WHERE voucher_uses <= total_limit
     ORDER BY order_id
     ON CONFLICT (order_id) DO NOTHING
     RETURNING voucher_code, customer_id, order_id, discount_amount, reserved_at, expires_at
 ),
 ",
    count_ctes!(),
    "SELECT order_id, discount_amount, reserved_at, expires_at, NULL::int8 AS idx,
        NULL::text AS verdict
 FROM inserted
 UNION ALL
 SELECT NULL, NULL, NULL, NULL, idx, verdict FROM candidate WHERE verdict <> 'known'
 UNION ALL
 SELECT NULL, NULL, NULL, NULL, idx, 'customer_usage_within_limit' FROM by_customer
 WHERE customer_uses > per_user_limit
 UNION ALL
 SELECT NULL, NULL, NULL, NULL, idx, 'vouchers_used_within_limit' FROM by_voucher
 WHERE voucher_uses > total_limit"
);

/// One row of [`admit`]'s answer: a row it inserted, or a reservation's verdict.
#[derive(sqlx::FromRow)]
struct AdmitRow {
    order_id: Option<String>,
    discount_amount: Option<i64>,
    reserved_at: Option<DateTime<Utc>>,
    expires_at: Option<DateTime<Utc>>,
    idx: Option<i64>,
    verdict: Option<String>,
}

/// What [`admit`] did: the rows inserted, and the reservations it refused (by index in
/// the batch, with the constraint's name or the ineligibility) or found stale.
#[derive(Default)]
struct Admitted {
    inserted: Vec<Written>,
    refused: Vec<(usize, String)>,
    stale: Vec<usize>,
}

/// A row a batch inserted, with its times as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    pub order_id: String,
    /// As stored: on the standard terms, the voucher's discount as its row held it when
    /// the use was taken (never more than the order).
    pub discount_amount: Money,
    pub reserved_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

/// How [`admit`] decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ranking {
    /// Everything of a current generation is written, the CHECKs guarding: one
    /// statement refused whole if anything is past a limit ([`OPTIMISTIC`]).
    Optimistic,
    /// Each reservation decided in arrival order against the limits ([`RANKED`]).
    Ranked,
}

/// On what terms a batch is admitted.
#[derive(Debug, Clone, Copy)]
pub(super) enum Terms {
    /// Decided before and acknowledged (the broker's events, with the broker deciding): the
    /// reservations' own times are stored, and nothing the gate checked (the window, the
    /// minimum, the voucher's state) is checked again; a 201 was given for each.
    Decided,
    /// Taken by a flash gate, with PostgreSQL deciding (the recorder): as [`Terms::Decided`],
    /// but a voucher paused or archived since refuses the use (`voucher_paused`,
    /// `voucher_archived`): no client has a 201 for it yet, and a pause committed must hold
    /// for every commit after it, whatever a gate that has not heard of it decided.
    Gated,
    /// Standard mode, decided here: PostgreSQL's clock reserves (`now()`, expiring `ttl`
    /// later; the reservations' own times are ignored), the discount is the voucher row's
    /// (never more than the order; the reservations' own, from a cached definition, is
    /// ignored), and the window and the minimum order are checked (`not_started`, `expired`, `below_min_order`) after a repeat is
    /// recognised, before any limit.
    Standard { ttl: chrono::Duration },
}

/// The rows PostgreSQL holds for `orders` (those that have one), by orderId.
async fn stored_rows(
    conn: &mut PgConnection,
    orders: &[&str],
) -> Result<HashMap<String, Reservation>, sqlx::Error> {
    if orders.is_empty() {
        return Ok(HashMap::new());
    }
    let rows: Vec<RedemptionRow> = sqlx::query_as(&format!(
        "SELECT {REDEMPTION_COLUMNS} FROM redemptions WHERE order_id = ANY($1)"
    ))
    .bind(orders)
    .fetch_all(conn)
    .await?;
    let mut stored = HashMap::with_capacity(rows.len());
    for row in rows {
        let row = Reservation::try_from(row)
            .map_err(|e| sqlx::Error::Decode(Box::new(std::io::Error::other(e.chain()))))?;
        stored.insert(row.order_id.as_str().to_owned(), row);
    }
    Ok(stored)
}

/// The constraint an orderId that belongs to another reservation would break.
const ORDER_ID_TAKEN: &str = "redemptions_order_id_key";

/// What PostgreSQL holds for a reservation of a batch that was not inserted (or that
/// shares its orderId with another of the batch).
#[derive(Debug)]
enum Existing {
    /// The stored row is this reservation (same voucher, customer and amount): a repeat,
    /// answered from the row.
    Repeat(Reservation),
    /// The orderId's row is another reservation's: refused.
    Conflict,
}

/// Tells, for every reservation of the batch whose orderId was not inserted or appears
/// more than once in the batch, whether the stored row is this reservation. It compares
/// with the stored row itself, never with the row order an `INSERT ... SELECT` returned:
/// one orderId twice in a batch (on two vouchers, say) is inserted for one of them, and
/// only that one may count as inserted. Reservations not listed were inserted.
async fn classify_existing(
    conn: &mut PgConnection,
    batch: &[Reservation],
    fresh: &HashSet<&str>,
) -> Result<Vec<(usize, Existing)>, sqlx::Error> {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for r in batch {
        *seen.entry(r.order_id.as_str()).or_default() += 1;
    }
    let to_check: Vec<(usize, &Reservation)> = batch
        .iter()
        .enumerate()
        .filter(|(_, r)| {
            let order = r.order_id.as_str();
            !fresh.contains(order) || seen.get(order).copied().unwrap_or(0) > 1
        })
        .collect();
    if to_check.is_empty() {
        return Ok(vec![]);
    }
    let ids: Vec<&str> = to_check.iter().map(|(_, r)| r.order_id.as_str()).collect();
    let stored = stored_rows(conn, &ids).await?;
    // The first reservation of the batch that is the inserted row is the one inserted.
    let mut inserted_taken: HashSet<&str> = HashSet::new();
    let mut found = Vec::with_capacity(to_check.len());
    for (i, r) in to_check {
        let order = r.order_id.as_str();
        match stored.get(order) {
            Some(row) if row.is_same_use(r) => {
                if fresh.contains(order) && inserted_taken.insert(order) {
                    continue;
                }
                found.push((i, Existing::Repeat(row.clone())));
            }
            _ => found.push((i, Existing::Conflict)),
        }
    }
    Ok(found)
}
