//! Ownership of event partitions through PostgreSQL, and their stored offsets.
//!
//! A partition of the events topic is written by whichever core's session holds its
//! advisory lock. Everything that core writes for the partition (rows and next offset) goes
//! through that one session, so a core that lost the lock (its session ended: the process
//! died, or stalled past `idle_session_timeout`) can write nothing more: the session is the
//! fence. The lock is released by PostgreSQL the moment the session ends.

use std::collections::HashMap;
use std::time::Duration;

use sqlx::{Connection, PgConnection};

use super::batch::{self, BatchResult};
use super::Store;
use crate::domain::Reservation;
use crate::Result;

/// One partition of one topic, as written by one group of writers.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PartitionKey {
    pub group: String,
    pub topic: String,
    pub partition: i32,
}

impl PartitionKey {
    /// The advisory lock's first key: one namespace per group and topic.
    fn namespace(&self) -> String {
        format!("voucher-writer/{}/{}", self.group, self.topic)
    }
}

/// A database session that owns a partition. Dropping it ends the session and with it the
/// ownership.
pub struct OwnedPartition {
    conn: PgConnection,
    pub key: PartitionKey,
    owner: String,
}

impl Store {
    /// Takes `key`'s partition for `owner` unless another session holds it. The session
    /// ends itself after `idle_timeout` without a statement, so a stalled owner cannot keep
    /// the partition: callers run [`OwnedPartition::heartbeat`] well within it.
    pub async fn own_partition(
        &self,
        key: &PartitionKey,
        owner: &str,
        idle_timeout: Duration,
    ) -> Result<Option<OwnedPartition>> {
        let mut conn = self.pool().acquire().await?.detach();
        sqlx::query(&format!(
            "SET idle_session_timeout = {}",
            idle_timeout.as_millis().max(1)
        ))
        .execute(&mut conn)
        .await?;
        let owned: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock(hashtext($1), $2)")
            .bind(key.namespace())
            .bind(key.partition)
            .fetch_one(&mut conn)
            .await?;
        if !owned {
            let _ = conn.close().await;
            return Ok(None);
        }
        Ok(Some(OwnedPartition {
            conn,
            key: key.clone(),
            owner: owner.to_owned(),
        }))
    }

    /// The next offset to write of every partition of `group` on `topic` that has one.
    pub async fn next_offsets(&self, group: &str, topic: &str) -> Result<HashMap<i32, i64>> {
        let rows: Vec<(i32, i64)> = sqlx::query_as(
            "SELECT partition, next_offset FROM consumer_offsets
             WHERE group_name = $1 AND topic = $2",
        )
        .bind(group)
        .bind(topic)
        .fetch_all(self.pool())
        .await?;
        Ok(rows.into_iter().collect())
    }
}

impl OwnedPartition {
    /// Where writing resumes: the stored next offset, `None` for a partition never written.
    pub async fn next_offset(&mut self) -> Result<Option<i64>> {
        Ok(sqlx::query_scalar(
            "SELECT next_offset FROM consumer_offsets
             WHERE group_name = $1 AND topic = $2 AND partition = $3",
        )
        .bind(&self.key.group)
        .bind(&self.key.topic)
        .bind(self.key.partition)
        .fetch_optional(&mut self.conn)
        .await?)
    }

    /// Records a batch of RESERVED reservations; when `next_offset` is given and nothing in
    /// the batch is refused, the offset is stored in the same transaction (exactly once).
    /// Otherwise `offset_stored` is false: the caller sets the refused events aside, then
    /// calls [`Self::store_offset`] (a replay after a crash in between changes no row).
    pub async fn record_reserved(
        &mut self,
        batch: &[Reservation],
        next_offset: Option<i64>,
    ) -> Result<BatchResult> {
        let advance = next_offset.map(|next_offset| batch::Advance {
            key: &self.key,
            next_offset,
            owner: &self.owner,
        });
        batch::record_reserved(&mut self.conn, batch, &[], advance, batch::Terms::Decided).await
    }

    /// Stores `next_offset` as the partition's; never moves it back.
    pub async fn store_offset(&mut self, next_offset: i64) -> Result<()> {
        store_offset(&mut self.conn, &self.key, next_offset, &self.owner).await?;
        Ok(())
    }

    /// Proves the session is alive (and keeps it from timing out).
    pub async fn heartbeat(&mut self) -> Result<()> {
        sqlx::query("SELECT 1").execute(&mut self.conn).await?;
        Ok(())
    }
}

pub(super) async fn store_offset(
    conn: &mut PgConnection,
    key: &PartitionKey,
    next_offset: i64,
    owner: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO consumer_offsets AS o (group_name, topic, partition, next_offset, owner)
         VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (group_name, topic, partition) DO UPDATE
         SET next_offset = GREATEST(o.next_offset, excluded.next_offset),
             owner = excluded.owner, updated_at = now()",
    )
    .bind(&key.group)
    .bind(&key.topic)
    .bind(key.partition)
    .bind(next_offset)
    .bind(owner)
    .execute(conn)
    .await?;
    Ok(())
}
