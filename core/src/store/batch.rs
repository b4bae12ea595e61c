//! Recording reservations decided elsewhere (by the flash gate), in batches, idempotently.
//!
//! The callers (flash mode's event consumer, and flash mode's recorder when PostgreSQL has
//! the last word) hand over RESERVED reservations; this module knows nothing of events or
//! brokers.

use std::collections::{HashMap, HashSet};

use sqlx::pool::PoolConnection;
use sqlx::{Connection, PgConnection, Postgres};

use super::partitions::{store_offset, PartitionKey};
use super::reservations::{take_customer_use, take_voucher_use, RedemptionRow, REDEMPTION_COLUMNS};
use crate::domain::Reservation;
use crate::Result;

impl super::Store {
    /// Records a batch of RESERVED reservations the gate decided, on a connection of the
    /// pool, in one transaction when nothing is refused (see [`record_reserved`]).
    ///
    /// `generations[i]` is the generation of the gate that decided `batch[i]` (0: none
    /// known). The fence: a row is written only while that generation is still the
    /// voucher's latest in `gate_generations`, checked under a share lock on that row in
    /// the same statement. A rebuild takes the next generation by updating the row, which
    /// waits for those locks, and reads PostgreSQL only after: so every use an old gate
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
    /// round trip per batch.
    pub fn decided_writer(&self) -> DecidedWriter {
        DecidedWriter {
            store: self.clone(),
            conn: None,
            last_used: std::time::Instant::now(),
        }
    }
}

/// Records decided batches on a connection it keeps (see [`super::Store::record_decided`]
/// for what a batch does). A batch that fails with the connection in an unknown state
/// (an I/O error, the session ended) drops it: the next batch takes a fresh one.
pub struct DecidedWriter {
    store: super::Store,
    conn: Option<PoolConnection<Postgres>>,
    /// When the kept connection last finished a batch.
    last_used: std::time::Instant,
}

/// A kept connection idle longer than this goes back to the pool before the next batch,
/// and the pool's test (acquire's ping, bounded by its timeout) vets the one taken then:
/// under load batches follow each other and nothing is tested; after a lull, a connection
/// that a restart, a failover or a middlebox dropped meanwhile is found before a batch is
/// sent on it.
const KEEP_IDLE: std::time::Duration = std::time::Duration::from_secs(1);

/// The longest a batch may take on the kept connection before its outcome counts as
/// unknown and the connection is dropped: a connection whose peer vanished without a reset
/// would otherwise hold every reservation of the core for TCP's retransmission timeout.
/// Well above what a healthy batch takes, and above the 5 s a stuck session may hold a
/// voucher's row (`database.idle_in_transaction_timeout`).
const BATCH_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

impl DecidedWriter {
    pub async fn record(
        &mut self,
        batch: &[Reservation],
        generations: &[i64],
    ) -> Result<Recording> {
        if self.last_used.elapsed() > KEEP_IDLE {
            // Handed back (not closed): the pool tests it before anyone uses it again.
            self.conn = None;
        }
        let conn = match &mut self.conn {
            Some(conn) => conn,
            // No connection, nothing sent: certainly not written, which the caller may act
            // on at once (give the uses back) instead of waiting for reconciliation.
            None => match self.store.pool.acquire().await {
                Ok(conn) => self.conn.insert(conn),
                Err(e) => return Ok(Recording::NotSent(e.into())),
            },
        };
        let writing = record_reserved(conn, batch, generations, None);
        let recorded = match tokio::time::timeout(BATCH_DEADLINE, writing).await {
            Ok(recorded) => recorded,
            Err(_) => Err(crate::Error::unavailable(
                "database (batch past its deadline)",
            )),
        };
        if recorded.is_err() {
            if let Some(conn) = self.conn.take() {
                // Closed, not handed back: it may be broken, or inside a failed
                // transaction. Closing a dead one is bounded too.
                let _ = tokio::time::timeout(BATCH_DEADLINE, conn.close()).await;
            }
        }
        self.last_used = std::time::Instant::now();
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
/// Fast path: one transaction for the whole batch, with `advance` stored in it when nothing
/// is refused. If the database refuses any of it (a constraint: the last guard caught
/// something the gate let through), the batch is replayed one reservation per transaction,
/// so that only the refused ones are set aside; the offset is then the caller's to store.
#[tracing::instrument(name = "db.record_reserved", skip_all, fields(events = batch.len()))]
///
/// `generations` fences the rows (see [`super::Store::record_decided`]); empty for the
/// event writers, whose events need no fence.
pub(super) async fn record_reserved(
    conn: &mut PgConnection,
    batch: &[Reservation],
    generations: &[i64],
    advance: Option<Advance<'_>>,
) -> Result<BatchResult> {
    let fence = Fence::new(batch, generations);
    match record_batch(conn, batch, &fence, advance).await {
        Ok(result) => Ok(result),
        Err(e) if refusal(&e).is_some() => {
            tracing::warn!(error = %crate::error::cause_chain(&e), "batch refused; recording its reservations one by one");
            record_one_by_one(conn, batch, &fence).await
        }
        Err(e) => Err(e.into()),
    }
}

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

    /// The vouchers whose `gate_generations` row must be share-locked and compared.
    fn codes<'a>(&self, batch: &'a [Reservation]) -> Vec<&'a str> {
        let mut codes: Vec<&str> = batch
            .iter()
            .zip(&self.generations)
            .filter(|(_, g)| **g != 0)
            .map(|(r, _)| r.voucher_code.as_str())
            .collect();
        codes.sort_unstable();
        codes.dedup();
        codes
    }

    /// Indexes of the reservations whose generation is not the voucher's latest.
    fn stale(&self, batch: &[Reservation], latest: &HashMap<String, i64>) -> Vec<usize> {
        batch
            .iter()
            .zip(&self.generations)
            .enumerate()
            .filter(|(_, (r, g))| **g != 0 && latest.get(r.voucher_code.as_str()) != Some(*g))
            .map(|(i, _)| i)
            .collect()
    }
}

/// The whole batch at once: its rows inserted and their uses counted against the customers'
/// and the vouchers' limits in one statement (whose CHECKs refuse an overshoot), then
/// repeats told from conflicts among the rows that were not new. Without an offset to
/// store, that statement is its own transaction: one round trip for the batch, which is
/// what a recorder waiting on PostgreSQL before its 201s needs. With one, it runs in a
/// transaction that stores the offset too, if all is well.
async fn record_batch(
    conn: &mut PgConnection,
    batch: &[Reservation],
    fence: &Fence,
    advance: Option<Advance<'_>>,
) -> Result<BatchResult, sqlx::Error> {
    let Some(advance) = advance else {
        let written = insert_and_count(&mut *conn, batch, fence).await?;
        let fresh: HashSet<&str> = written.inserted.iter().map(String::as_str).collect();
        let stale = fence.stale(batch, &written.latest);
        // Rows never change voucher or customer: reading them after the commit is safe.
        let settled = if written.inserted.len() == batch.len() {
            Settled::default()
        } else {
            let mut tx = conn.begin().await?;
            by_index(&mut tx).await?;
            let settled = classify(&mut tx, batch, &fresh, &stale).await?;
            tx.commit().await?;
            settled
        };
        return Ok(settled.into_result(written.inserted.len(), false));
    };
    let mut tx = conn.begin().await?;
    by_index(&mut tx).await?;
    let written = insert_and_count(&mut tx, batch, fence).await?;
    let fresh: HashSet<&str> = written.inserted.iter().map(String::as_str).collect();
    let stale = fence.stale(batch, &written.latest);
    let settled = classify(&mut tx, batch, &fresh, &stale).await?;
    let offset_stored = settled.refused.is_empty() && settled.stale.is_empty();
    if offset_stored {
        store_offset(&mut tx, advance.key, advance.next_offset, advance.owner).await?;
    }
    tx.commit().await?;
    Ok(settled.into_result(written.inserted.len(), offset_stored))
}

/// What became of the reservations of a batch that were not inserted.
#[derive(Default)]
struct Settled {
    repeats: Vec<(usize, Reservation)>,
    refused: Vec<(usize, String)>,
    stale: Vec<usize>,
}

impl Settled {
    fn into_result(self, inserted: usize, offset_stored: bool) -> BatchResult {
        BatchResult {
            inserted,
            duplicates: self.repeats.len(),
            repeats: self.repeats,
            refused: self.refused,
            stale: self.stale,
            transactions: 1,
            offset_stored,
        }
    }
}

/// Of the reservations not inserted: the stale ones stay stale (a 503 whose retry the new
/// gate answers from what it holds, even when that retry's row is already stored: this
/// attempt's record is not that row); the rest are repeats or refused by
/// [`classify_existing`].
async fn classify(
    conn: &mut PgConnection,
    batch: &[Reservation],
    fresh: &HashSet<&str>,
    stale: &[usize],
) -> Result<Settled, sqlx::Error> {
    let existing = classify_existing(conn, batch, fresh).await?;
    let mut settled = Settled {
        stale: stale.to_vec(),
        ..Settled::default()
    };
    for (i, found) in existing {
        if stale.contains(&i) {
            continue;
        }
        match found {
            Existing::Repeat(row) => settled.repeats.push((i, row)),
            Existing::Conflict => settled.refused.push((i, ORDER_ID_TAKEN.to_owned())),
        }
    }
    Ok(settled)
}

async fn record_one_by_one(
    conn: &mut PgConnection,
    batch: &[Reservation],
    fence: &Fence,
) -> Result<BatchResult> {
    let mut result = BatchResult::default();
    let mut duplicates = vec![];
    for (i, reservation) in batch.iter().enumerate() {
        result.transactions += 1;
        match record_single(conn, reservation, fence.generations[i]).await? {
            Single::Inserted => result.inserted += 1,
            Single::Duplicate => duplicates.push(i),
            Single::Refused(reason) => result.refused.push((i, reason)),
            Single::Stale => result.stale.push(i),
        }
    }
    // A "duplicate" whose stored row is another reservation's is refused.
    let repeated: Vec<Reservation> = duplicates.iter().map(|&i| batch[i].clone()).collect();
    for (k, found) in classify_existing(conn, &repeated, &HashSet::new()).await? {
        match found {
            Existing::Repeat(row) => result.repeats.push((duplicates[k], row)),
            Existing::Conflict => result
                .refused
                .push((duplicates[k], ORDER_ID_TAKEN.to_owned())),
        }
    }
    result.duplicates = result.repeats.len();
    Ok(result)
}

/// One reservation in its own transaction (fenced by `generation` unless 0).
async fn record_single(
    conn: &mut PgConnection,
    r: &Reservation,
    generation: i64,
) -> Result<Single> {
    let mut tx = conn.begin().await?;
    let single = write_single(&mut tx, r, generation).await?;
    // Ended here, either way: a transaction merely dropped leaves its ROLLBACK in the
    // connection's write buffer, and a connection kept between batches (the recorder's)
    // would sit in it, holding its locks, until its next statement.
    match single {
        Single::Inserted => tx.commit().await?,
        _ => tx.rollback().await?,
    }
    Ok(single)
}

/// The writes of [`record_single`] inside its transaction; anything but `Inserted` is
/// rolled back by the caller.
async fn write_single(
    tx: &mut sqlx::Transaction<'_, Postgres>,
    r: &Reservation,
    generation: i64,
) -> Result<Single> {
    if generation != 0 {
        let latest: Option<i64> = sqlx::query_scalar(
            "SELECT generation FROM gate_generations WHERE voucher_code = $1 FOR SHARE",
        )
        .bind(r.voucher_code.as_str())
        .fetch_optional(&mut **tx)
        .await?;
        if latest != Some(generation) {
            return Ok(Single::Stale);
        }
    }
    let insert = sqlx::query(
        "INSERT INTO redemptions (voucher_code, customer_id, order_id, order_amount,
                                  discount_amount, reserved_at, expires_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7)
         ON CONFLICT (order_id) DO NOTHING",
    )
    .bind(r.voucher_code.as_str())
    .bind(r.customer_id.as_str())
    .bind(r.order_id.as_str())
    .bind(r.order_amount.minor_units())
    .bind(r.discount_amount.minor_units())
    .bind(r.reserved_at)
    .bind(r.expires_at)
    .execute(&mut **tx)
    .await;
    let inserted = match insert {
        Ok(done) => done.rows_affected() == 1,
        Err(err) => {
            return match refusal(&err) {
                Some(reason) => Ok(Single::Refused(reason)),
                None => Err(err.into()),
            }
        }
    };
    if !inserted {
        return Ok(Single::Duplicate);
    }
    // The conditional updates say "no" instead of raising; the reason is the constraint
    // that would have refused the same write.
    let (code, customer) = (r.voucher_code.as_str(), r.customer_id.as_str());
    if !take_customer_use(tx, code, customer).await? {
        return Ok(Single::Refused("customer_usage_within_limit".into()));
    }
    if !take_voucher_use(tx, code).await? {
        return Ok(Single::Refused("vouchers_used_within_limit".into()));
    }
    Ok(Single::Inserted)
}

enum Single {
    Inserted,
    Duplicate,
    Refused(String),
    Stale,
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

/// Inserts every row whose orderId is new and adds their uses to each customer's and each
/// voucher's count, in one statement; returns the orderIds inserted. Rows go in in
/// orderId order, so two batches that share orderIds (one orderId sent to two vouchers,
/// through two cores) wait on each other's index entries in the same order instead of
/// deadlocking. PostgreSQL orders the voucher rows' locks itself: a batch spanning several
/// vouchers can still deadlock with another writer's, and one of the two then fails
/// (40P01, a 503 for the recorder's clients, whose retries record again; a writer retries
/// its batch).
///
/// The fence (see [`super::Store::record_decided`]) is in the same statement: the
/// `gate_generations` rows of the fenced vouchers are share-locked and read (a rebuild
/// taking the next generation waits for this transaction), and a fenced reservation is
/// inserted only if its generation is the one read. Returns what was read too.
async fn insert_and_count(
    conn: &mut PgConnection,
    batch: &[Reservation],
    fence: &Fence,
) -> Result<Written, sqlx::Error> {
    let text = |f: fn(&Reservation) -> &str| batch.iter().map(f).collect::<Vec<_>>();
    let rows: Vec<(String, Option<i64>)> = sqlx::query_as(
        "WITH fence AS (
             SELECT voucher_code, generation FROM gate_generations
             WHERE voucher_code = ANY($9::text[])
             FOR SHARE
         ),
         input AS (
             SELECT u.voucher_code, u.customer_id, u.order_id, u.order_amount,
                    u.discount_amount, u.reserved_at, u.expires_at
             FROM unnest($1::text[], $2::text[], $3::text[], $4::int8[], $5::int8[],
                         $6::timestamptz[], $7::timestamptz[], $8::int8[])
                  AS u(voucher_code, customer_id, order_id, order_amount, discount_amount,
                       reserved_at, expires_at, generation)
             LEFT JOIN fence f ON f.voucher_code = u.voucher_code
             WHERE u.generation = 0 OR f.generation = u.generation
         ),
         inserted AS (
             INSERT INTO redemptions (voucher_code, customer_id, order_id, order_amount,
                                      discount_amount, reserved_at, expires_at)
             SELECT * FROM input
             ORDER BY order_id
             ON CONFLICT (order_id) DO NOTHING
             RETURNING voucher_code, customer_id, order_id
         ),
         customers AS (
             INSERT INTO customer_usage AS u (voucher_code, customer_id, active_count,
                                              per_user_limit)
             SELECT i.voucher_code, i.customer_id, count(*)::int4, v.per_user_limit
             FROM inserted i JOIN vouchers v ON v.code = i.voucher_code
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
         SELECT order_id, NULL::int8 FROM inserted
         UNION ALL
         SELECT voucher_code, generation FROM fence",
    )
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
    .bind(batch.iter().map(|r| r.reserved_at).collect::<Vec<_>>())
    .bind(batch.iter().map(|r| r.expires_at).collect::<Vec<_>>())
    .bind(&fence.generations)
    .bind(fence.codes(batch))
    .fetch_all(conn)
    .await?;
    let mut written = Written::default();
    for (value, generation) in rows {
        match generation {
            Some(generation) => {
                written.latest.insert(value, generation);
            }
            None => written.inserted.push(value),
        }
    }
    Ok(written)
}

/// What [`insert_and_count`] did: the orderIds inserted, and the latest generation of
/// each fenced voucher.
#[derive(Default)]
struct Written {
    inserted: Vec<String>,
    latest: HashMap<String, i64>,
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
    let rows: Vec<RedemptionRow> = sqlx::query_as(&format!(
        "SELECT {REDEMPTION_COLUMNS} FROM redemptions WHERE order_id = ANY($1)"
    ))
    .bind(&ids)
    .fetch_all(conn)
    .await?;
    let mut stored: HashMap<String, Reservation> = HashMap::with_capacity(rows.len());
    for row in rows {
        let row = Reservation::try_from(row)
            .map_err(|e| sqlx::Error::Decode(Box::new(std::io::Error::other(e.chain()))))?;
        stored.insert(row.order_id.as_str().to_owned(), row);
    }
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
