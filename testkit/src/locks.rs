//! Holding a voucher's row as a slow disk, a long transaction or a core paused after
//! sending its statement would, so that the requests that need the row stay in flight for
//! exactly as long as a test decides.

use std::time::Duration;

use sqlx::{Connection, PgConnection, PgPool};

use crate::wait::eventually;

/// Locks voucher `code`'s row on the database at `url` in an open transaction of its own;
/// closing (or dropping) the connection lets the row go.
pub async fn lock_voucher_row(url: &str, code: &str) -> PgConnection {
    let mut blocker = PgConnection::connect(url).await.expect("connection");
    sqlx::query("BEGIN")
        .execute(&mut blocker)
        .await
        .expect("begin");
    sqlx::query("SELECT 1 FROM vouchers WHERE code = $1 FOR UPDATE")
        .bind(code)
        .execute(&mut blocker)
        .await
        .expect("row locked");
    blocker
}

/// Returns once at least `n` sessions of `pool`'s database wait on a lock.
pub async fn until_waiting_on_locks(pool: &PgPool, n: i64, what: &str) {
    eventually(Duration::from_secs(20), what, || async {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
             AND datname = current_database()",
        )
        .fetch_one(pool)
        .await
        .ok()?;
        (waiting >= n).then_some(())
    })
    .await;
}
