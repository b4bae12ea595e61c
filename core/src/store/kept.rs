//! A connection of the pool that one worker keeps between its statements (the recorder's
//! and standard mode's writers, the order lookups): the pool tests a connection it hands
//! out with a round trip of its own (`test_before_acquire`), which a worker under load
//! would pay before every batch.
//!
//! A kept connection is not idle in the pool, so when the primary moves (`super::primary`)
//! it is not among the connections closed then: it is dropped at its next use instead,
//! when the pool's server is no longer the one it was opened to.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::postgres::PgConnectOptions;
use sqlx::{PgConnection, PgPool, Postgres};

/// A kept connection idle longer than this goes back to the pool before the next statement,
/// and the pool's test (acquire's ping, bounded by its timeout) vets the one taken then:
/// under load statements follow each other and nothing is tested; after a lull, a
/// connection that a restart, a failover or a middlebox dropped meanwhile is found before a
/// statement is sent on it.
const KEEP_IDLE: Duration = Duration::from_secs(1);

pub struct KeptConnection {
    pool: PgPool,
    /// The connection, and the pool's server options when it was taken.
    conn: Option<(PoolConnection<Postgres>, Arc<PgConnectOptions>)>,
    /// When the kept connection last finished a statement.
    last_used: Instant,
}

impl KeptConnection {
    pub fn new(pool: PgPool) -> Self {
        Self {
            pool,
            conn: None,
            last_used: Instant::now(),
        }
    }

    /// The kept connection, or one from the pool when none is kept, the kept one has been
    /// idle past [`KEEP_IDLE`], or the pool now opens its connections to another server (the
    /// primary moved). An error means no connection could be had: nothing was sent.
    pub async fn get(&mut self) -> Result<&mut PgConnection, sqlx::Error> {
        let server = self.pool.connect_options();
        let kept = match self.conn.take() {
            // The old primary's: detached from the pool and dropped (its socket closed
            // without a goodbye, which a frozen server would never answer).
            Some((conn, opened_to)) if !Arc::ptr_eq(&opened_to, &server) => {
                drop(conn.detach());
                None
            }
            // Handed back (not closed): the pool tests it before anyone uses it again.
            Some(_) if self.last_used.elapsed() > KEEP_IDLE => None,
            kept => kept,
        };
        let kept = match kept {
            Some(kept) => kept,
            None => (self.pool.acquire().await?, server),
        };
        Ok(&mut *self.conn.insert(kept).0)
    }

    /// Ends a use of the connection [`Self::get`] gave. One whose work failed (an error,
    /// a deadline passed) is closed, not handed back: it may be broken, mid-statement on a
    /// peer that vanished, or inside a failed transaction; closing a dead one is bounded by
    /// `close_within`.
    pub async fn finish(&mut self, succeeded: bool, close_within: Duration) {
        if !succeeded {
            if let Some((conn, _)) = self.conn.take() {
                let _ = tokio::time::timeout(close_within, conn.close()).await;
            }
        }
        self.last_used = Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use voucher_testkit::helpers::TestDb;

    use super::*;

    async fn backend(conn: &mut PgConnection) -> i32 {
        sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(conn)
            .await
            .expect("a statement on the kept connection")
    }

    #[tokio::test]
    async fn the_next_statement_goes_on_the_kept_connection_and_a_failed_one_is_closed() {
        let db = TestDb::create().await;
        let pool = PgPool::connect(&db.url).await.expect("pool");
        let mut kept = KeptConnection::new(pool.clone());
        let first = backend(kept.get().await.expect("a connection")).await;
        kept.finish(true, Duration::from_secs(2)).await;
        let again = backend(kept.get().await.expect("the kept one")).await;
        assert_eq!(again, first, "kept between statements");
        kept.finish(false, Duration::from_secs(2)).await;
        assert_eq!(pool.size(), 0, "closed after a failure, not handed back");
        let fresh = backend(kept.get().await.expect("a new connection")).await;
        assert_ne!(fresh, first);
        drop(kept);
        pool.close().await;
        db.drop_db().await;
    }

    #[tokio::test]
    async fn a_kept_connection_is_left_once_the_pool_connects_elsewhere() {
        let db = TestDb::create().await;
        let pool = PgPool::connect(&db.url).await.expect("pool");
        let mut kept = KeptConnection::new(pool.clone());
        let first = backend(kept.get().await.expect("a connection")).await;
        kept.finish(true, Duration::from_secs(2)).await;
        // What `primary::Servers::locate` does when the primary moves (here to the same
        // server under new options: the test has one).
        pool.set_connect_options((*pool.connect_options()).clone());
        let after = backend(kept.get().await.expect("a connection to the new server")).await;
        assert_ne!(
            after, first,
            "the old server's connection is not used again"
        );
        assert_eq!(pool.size(), 1, "and it is out of the pool, not handed back");
        drop(kept);
        pool.close().await;
        db.drop_db().await;
    }
}
