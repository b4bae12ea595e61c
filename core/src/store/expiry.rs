use chrono::{DateTime, Utc};

use super::reservations::{give_back_uses, RedemptionRow, REDEMPTION_COLUMNS};
use super::Store;
use crate::domain::Reservation;
use crate::Result;

impl Store {
    /// Releases up to `batch` reservations whose TTL ended at or before `at` (PostgreSQL's
    /// `now()` when `None`: the one clock every instance shares), and gives their uses back,
    /// in one transaction. Returns them as released.
    ///
    /// Exactly once, with any number of instances running this at the same time: the rows
    /// are claimed with `FOR UPDATE SKIP LOCKED` (two workers never wait on each other,
    /// they take different rows) and the status change from RESERVED is what gives a use
    /// back, so a row a confirm or release got to first is not released again.
    ///
    /// The batch is claimed along the open reservations' expiry index whatever the
    /// planner's statistics say (`batch::along_index`). Measured with a million reservations
    /// due in a database never analyzed (autovacuum off): the planner expected 383 rows,
    /// read all 994,000 with a bitmap scan and sorted them on disk for every batch of 500,
    /// 500-650 ms a batch; along the index, about 13 ms. (After a benchmark left 1.1
    /// million unconfirmed reservations, statements of this batch were seen running for
    /// minutes each; that was not reproduced.)
    #[tracing::instrument(skip(self))]
    pub async fn release_expired(
        &self,
        at: Option<DateTime<Utc>>,
        batch: i64,
    ) -> Result<Vec<Reservation>> {
        let mut tx = self.pool().begin().await?;
        super::batch::along_index(&mut tx).await?;
        let rows: Vec<RedemptionRow> = sqlx::query_as(&format!(
            "WITH due AS (
                 SELECT id FROM redemptions
                 WHERE status = 'RESERVED' AND expires_at <= coalesce($1, now())
                 ORDER BY expires_at
                 LIMIT $2
                 FOR UPDATE SKIP LOCKED
             )
             -- `due` has only `id`, so the returned columns are unambiguous.
             UPDATE redemptions r SET status = 'RELEASED', released_at = coalesce($1, now())
             FROM due WHERE r.id = due.id AND r.status = 'RESERVED'
             RETURNING {REDEMPTION_COLUMNS}"
        ))
        .bind(at)
        .bind(batch)
        .fetch_all(&mut *tx)
        .await?;
        let released = rows
            .into_iter()
            .map(Reservation::try_from)
            .collect::<Result<Vec<_>>>()?;
        give_back_uses(&mut tx, &released).await?;
        tx.commit().await?;
        Ok(released)
    }
}
