//! PostgreSQL access: every SQL statement of the service lives under this module.
//!
//! - `vouchers`: create and read vouchers with their counts;
//! - `lifecycle`: an operator's changes (definition, pause, resume, archive), each with its
//!   audit row in the same transaction; the lists and the audit trail;
//! - `reservations`: the standard-mode reservation transaction, confirm, release, reads
//!   (the order lookups' one statement among them);
//! - `batch`: reservations decided by the flash gate, recorded many per transaction;
//! - `partitions`: which core writes which event partition, and where each one is;
//! - `expiry`: the batch that releases reservations past their TTL;
//! - `gate_state`: what a flash gate is loaded from and reconciled against;
//! - `tokens`: the named API tokens, by digest;
//! - `ledger`: a voucher's reservations for finance: pages by status, one order, the
//!   export's stream;
//! - `primary`: which server the pool connects to, when the URL names a primary and its
//!   standbys;
//! - `kept`: a pool connection one worker keeps between its statements (the grouped
//!   writers', the order lookups'), untested while in use, dropped when the primary moves.
//!
//! Lock order, to keep transactions free of deadlocks: a redemption row, then the
//! `customer_usage` rows (sorted), then the `vouchers` rows (sorted). Every transaction
//! that changes counts takes its locks in that order.

mod batch;
mod expiry;
mod gate_state;
mod kept;
mod ledger;
mod lifecycle;
mod partitions;
mod primary;
mod reservations;
mod tokens;
mod vouchers;

use std::sync::Arc;

use secrecy::ExposeSecret;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

pub use batch::{BatchResult, DecidedWriter, Recording, Written};
pub use gate_state::{GateRead, ReconcileView};
pub use ledger::LedgerRow;
pub use lifecycle::{Actor, AuditEvent, StateChange, VoucherFilter};
pub use partitions::{OwnedPartition, PartitionKey};
pub use primary::Servers;
pub use reservations::{OrderReader, ReserveOutcome};
pub use tokens::TokenRow;

use crate::config::DatabaseSettings;

/// The migrations of `migrations/`, embedded in the binary and applied at start-up.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");

/// Handle on the database; cheap to clone.
#[derive(Debug, Clone)]
pub struct Store {
    pool: PgPool,
    /// The servers of the URL; several when it names a primary and its standbys.
    servers: Option<Arc<Servers>>,
}

impl Store {
    pub fn new(pool: PgPool) -> Self {
        Self {
            pool,
            servers: None,
        }
    }

    /// Connects lazily: the service starts (and answers 503) even while PostgreSQL is down.
    /// A URL with several hosts is followed to its primary ([`Self::follow_primary`]).
    pub fn connect_lazy(settings: &DatabaseSettings) -> anyhow::Result<Self> {
        let idle = settings
            .idle_in_transaction_timeout
            .as_millis()
            .max(1)
            .to_string();
        let servers = Servers::parse(settings.url.expose_secret())?
            .map(|o| o.options([("idle_in_transaction_session_timeout", idle.as_str())]));
        let servers = Arc::new(servers);
        let checked = servers.clone();
        let pool = PgPoolOptions::new()
            .max_connections(settings.max_connections)
            .acquire_timeout(settings.acquire_timeout)
            .after_connect(move |conn, _| {
                let servers = checked.clone();
                Box::pin(async move { servers.is_writable(conn).await })
            })
            .connect_lazy_with(servers.current());
        Ok(Self {
            pool,
            servers: Some(servers),
        })
    }

    /// [`Self::connect_lazy`], then [`Self::locate_primary`] within `acquire_timeout`: what
    /// every entry point does before its first statement.
    pub async fn connect_to_primary(settings: &DatabaseSettings) -> anyhow::Result<Self> {
        let store = Self::connect_lazy(settings)?;
        store.locate_primary(settings.acquire_timeout).await;
        Ok(store)
    }

    /// With several servers: points the pool at the primary now (before migrations at
    /// start-up, say). Returns whether one was found; with one server, true.
    pub async fn locate_primary(&self, timeout: std::time::Duration) -> bool {
        match &self.servers {
            Some(servers) if servers.several() => servers.locate(&self.pool, timeout).await,
            _ => true,
        }
    }

    /// With several servers, follows the primary every `interval` until `shutdown`
    /// (`primary`); with one, returns at once.
    pub async fn follow_primary(&self, interval: std::time::Duration, shutdown: CancellationToken) {
        if let Some(servers) = &self.servers {
            servers.follow(self.pool.clone(), interval, shutdown).await;
        }
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Applies the migrations on a connection of its own, closed afterwards, with no
    /// idle-in-transaction limit: a migration may take long, and its session never goes
    /// back to the pool with that setting changed.
    pub async fn migrate(&self) -> anyhow::Result<()> {
        let mut conn = self.pool.acquire().await?.detach();
        sqlx::query("SET idle_in_transaction_session_timeout = 0")
            .execute(&mut conn)
            .await?;
        MIGRATOR.run(&mut conn).await?;
        Ok(())
    }

    /// A turn of a job that only one instance may run at a time: a transaction holding
    /// the advisory lock of `job` (released when the transaction ends, or its session
    /// does). `None` when another instance holds it now.
    pub async fn exclusive_turn(
        &self,
        job: &str,
    ) -> crate::Result<Option<sqlx::Transaction<'static, sqlx::Postgres>>> {
        let mut tx = self.pool.begin().await?;
        // A stalled instance must not hold the turn for ever: its session ends after a
        // minute of silence, and the lock with it (a round takes seconds).
        sqlx::query("SET LOCAL idle_in_transaction_session_timeout = '60s'")
            .execute(&mut *tx)
            .await?;
        let ours: bool = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock(hashtext($1), 0)")
            .bind(format!("voucher-job/{job}"))
            .fetch_one(&mut *tx)
            .await?;
        Ok(ours.then_some(tx))
    }

    /// Readiness: can we run a statement right now?
    pub async fn ping(&self) -> crate::Result<()> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }
}
