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
    #[tracing::instrument(skip(self))]
    pub async fn release_expired(
        &self,
        at: Option<DateTime<Utc>>,
        batch: i64,
    ) -> Result<Vec<Reservation>> {
        let mut tx = self.pool().begin().await?;
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
