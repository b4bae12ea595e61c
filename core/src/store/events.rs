//! Writing reservation events from Kafka into PostgreSQL: in batches, idempotently.

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, TimeZone, Utc};
use sqlx::PgConnection;

use super::reservations::{take_customer_use, take_voucher_use};
use super::Store;
use crate::events::ReservedEvent;
use crate::Result;

/// What a batch did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BatchResult {
    /// New rows: uses recorded.
    pub inserted: usize,
    /// Events whose row already existed (redelivery, replay): no-ops.
    pub duplicates: usize,
    /// Events the database refuses (by index in the batch, with the reason): they go to
    /// the dead-letter topic.
    pub refused: Vec<(usize, String)>,
    /// Transactions spent, for the "far fewer transactions than uses" figure.
    pub transactions: usize,
}

fn at(ms: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ms).single().unwrap_or_default()
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

impl Store {
    /// Records a batch of reservation events.
    ///
    /// Fast path: one transaction for the whole batch. If the database refuses any of it
    /// (a constraint: the last guard caught something the gate let through), the batch is
    /// replayed one event per transaction, so that only the refused events are set aside.
    #[tracing::instrument(name = "db.record_reserved", skip_all, fields(events = events.len()))]
    pub async fn record_reserved(&self, events: &[ReservedEvent]) -> Result<BatchResult> {
        match self.record_batch(events).await {
            Ok(result) => Ok(result),
            Err(e) if refusal(&e).is_some() => {
                tracing::warn!(error = %e, "batch refused; recording its events one by one");
                self.record_one_by_one(events).await
            }
            Err(e) => Err(e.into()),
        }
    }

    async fn record_batch(&self, events: &[ReservedEvent]) -> Result<BatchResult, sqlx::Error> {
        let mut tx = self.pool().begin().await?;
        let column = |f: fn(&ReservedEvent) -> String| events.iter().map(f).collect::<Vec<_>>();
        let inserted: Vec<(String, String, String)> = sqlx::query_as(
            "INSERT INTO redemptions (voucher_code, customer_id, order_id, order_amount,
                                      discount_amount, reserved_at, expires_at)
             SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::int8[], $5::int8[],
                                  $6::timestamptz[], $7::timestamptz[])
             ON CONFLICT (order_id) DO NOTHING
             RETURNING voucher_code, customer_id, order_id",
        )
        .bind(column(|e| e.voucher_code.clone()))
        .bind(column(|e| e.customer_id.clone()))
        .bind(column(|e| e.order_id.clone()))
        .bind(events.iter().map(|e| e.order_amount).collect::<Vec<_>>())
        .bind(events.iter().map(|e| e.discount_amount).collect::<Vec<_>>())
        .bind(
            events
                .iter()
                .map(|e| at(e.reserved_at_ms))
                .collect::<Vec<_>>(),
        )
        .bind(
            events
                .iter()
                .map(|e| at(e.expires_at_ms))
                .collect::<Vec<_>>(),
        )
        .fetch_all(&mut *tx)
        .await?;

        // Count the new uses per customer and per voucher, in lock order (sorted).
        let mut per_customer: BTreeMap<(&str, &str), i32> = BTreeMap::new();
        let mut per_voucher: BTreeMap<&str, i32> = BTreeMap::new();
        for (code, customer, _) in &inserted {
            *per_customer.entry((code, customer)).or_default() += 1;
            *per_voucher.entry(code).or_default() += 1;
        }
        let (codes, customers, counts): (Vec<&str>, Vec<&str>, Vec<i32>) = per_customer
            .iter()
            .map(|((code, customer), n)| (*code, *customer, *n))
            .fold((vec![], vec![], vec![]), |mut acc, (a, b, c)| {
                acc.0.push(a);
                acc.1.push(b);
                acc.2.push(c);
                acc
            });
        // CHECK customer_usage_within_limit refuses a customer pushed past its limit.
        sqlx::query(
            "INSERT INTO customer_usage AS u (voucher_code, customer_id, active_count, per_user_limit)
             SELECT c.code, c.customer, c.n, v.per_user_limit
             FROM unnest($1::text[], $2::text[], $3::int4[]) WITH ORDINALITY AS c(code, customer, n, i)
             JOIN vouchers v ON v.code = c.code
             ORDER BY c.i
             ON CONFLICT (voucher_code, customer_id)
             DO UPDATE SET active_count = u.active_count + excluded.active_count",
        )
        .bind(&codes)
        .bind(&customers)
        .bind(&counts)
        .execute(&mut *tx)
        .await?;
        // CHECK vouchers_used_within_limit refuses a voucher pushed past its limit.
        for (code, n) in &per_voucher {
            sqlx::query("UPDATE vouchers SET used_count = used_count + $2 WHERE code = $1")
                .bind(code)
                .bind(n)
                .execute(&mut *tx)
                .await?;
        }
        let fresh: HashSet<&str> = inserted.iter().map(|(_, _, o)| o.as_str()).collect();
        let refused = self.classify_existing(&mut tx, events, &fresh).await?;
        tx.commit().await?;
        Ok(BatchResult {
            inserted: inserted.len(),
            duplicates: events.len() - inserted.len() - refused.len(),
            refused,
            transactions: 1,
        })
    }

    /// Events not inserted either repeat a stored reservation (a no-op) or carry an orderId
    /// that belongs to a different reservation (refused).
    async fn classify_existing(
        &self,
        conn: &mut PgConnection,
        events: &[ReservedEvent],
        fresh: &HashSet<&str>,
    ) -> Result<Vec<(usize, String)>, sqlx::Error> {
        // The first event of each inserted orderId is its row; every other event repeats one.
        let mut first_seen = HashSet::new();
        let to_check: Vec<(usize, &ReservedEvent)> = events
            .iter()
            .enumerate()
            .filter(|(_, e)| {
                !(fresh.contains(e.order_id.as_str()) && first_seen.insert(e.order_id.as_str()))
            })
            .collect();
        if to_check.is_empty() {
            return Ok(vec![]);
        }
        let ids: Vec<&str> = to_check.iter().map(|(_, e)| e.order_id.as_str()).collect();
        let rows: Vec<(String, String, String)> = sqlx::query_as(
            "SELECT order_id, voucher_code, customer_id FROM redemptions WHERE order_id = ANY($1)",
        )
        .bind(&ids)
        .fetch_all(conn)
        .await?;
        let stored: HashMap<String, (String, String)> =
            rows.into_iter().map(|(o, v, c)| (o, (v, c))).collect();
        Ok(to_check
            .into_iter()
            .filter(|(_, e)| {
                !matches!(stored.get(&e.order_id), Some((v, c)) if *v == e.voucher_code && *c == e.customer_id)
            })
            .map(|(i, _)| (i, "redemptions_order_id_key".to_owned()))
            .collect())
    }

    async fn record_one_by_one(&self, events: &[ReservedEvent]) -> Result<BatchResult> {
        let mut result = BatchResult::default();
        let mut duplicates = vec![];
        for (i, event) in events.iter().enumerate() {
            result.transactions += 1;
            match self.record_single(event).await? {
                Single::Inserted => result.inserted += 1,
                Single::Duplicate => duplicates.push(i),
                Single::Refused(reason) => result.refused.push((i, reason)),
            }
        }
        // A "duplicate" whose stored row is another reservation's is a refused event.
        let dup_events: Vec<ReservedEvent> =
            duplicates.iter().map(|&i| events[i].clone()).collect();
        let mut conn = self.pool().acquire().await?;
        let conflicts = self
            .classify_existing(&mut conn, &dup_events, &HashSet::new())
            .await?;
        result.duplicates = duplicates.len() - conflicts.len();
        result.refused.extend(
            conflicts
                .into_iter()
                .map(|(k, reason)| (duplicates[k], reason)),
        );
        Ok(result)
    }

    /// One event in its own transaction.
    async fn record_single(&self, e: &ReservedEvent) -> Result<Single> {
        let mut tx = self.pool().begin().await?;
        let insert = sqlx::query(
            "INSERT INTO redemptions (voucher_code, customer_id, order_id, order_amount,
                                      discount_amount, reserved_at, expires_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7)
             ON CONFLICT (order_id) DO NOTHING",
        )
        .bind(&e.voucher_code)
        .bind(&e.customer_id)
        .bind(&e.order_id)
        .bind(e.order_amount)
        .bind(e.discount_amount)
        .bind(at(e.reserved_at_ms))
        .bind(at(e.expires_at_ms))
        .execute(&mut *tx)
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
        if !take_customer_use(&mut tx, &e.voucher_code, &e.customer_id).await? {
            return Ok(Single::Refused("customer_usage_within_limit".into()));
        }
        if !take_voucher_use(&mut tx, &e.voucher_code).await? {
            return Ok(Single::Refused("vouchers_used_within_limit".into()));
        }
        tx.commit().await?;
        Ok(Single::Inserted)
    }
}

enum Single {
    Inserted,
    Duplicate,
    Refused(String),
}
