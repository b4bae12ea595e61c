//! An operator's changes of vouchers, each with its audit row in the same transaction, and
//! the reads of the lists and of the audit trail.
//!
//! A change locks the voucher's row (`FOR NO KEY UPDATE`, the lock every statement that
//! takes a use holds while it counts, see `batch`): it waits for the writes of uses in
//! flight, then judges itself against the uses held as committed, and a write of uses
//! that comes after it reads the new state and limit from the row. So a pause committed
//! is in force for every later commit, and a limit lowered to the uses held cannot be
//! overtaken by a use committed meanwhile.

use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use sqlx::{FromRow, PgConnection};

use super::vouchers::{VoucherRow, VOUCHER_COLUMNS};
use super::Store;
use crate::domain::{
    ChangeRefused, Lowering, Phase, Voucher, VoucherChange, VoucherCode, VoucherMode, VoucherState,
};
use crate::{Error, Result};

/// Who asked for a change: the credential's name and the request's id.
#[derive(Debug, Clone)]
pub struct Actor {
    pub name: String,
    pub request_id: Option<String>,
}

/// What a change of state asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateChange {
    Pause,
    Resume,
    Archive,
}

impl StateChange {
    pub fn action(self) -> &'static str {
        match self {
            Self::Pause => "pause",
            Self::Resume => "resume",
            Self::Archive => "archive",
        }
    }
}

/// Which vouchers a list holds. Archived vouchers are listed only when asked for by state.
#[derive(Debug, Clone, Default)]
pub struct VoucherFilter {
    pub mode: Option<VoucherMode>,
    pub state: Option<VoucherState>,
    pub phase: Option<Phase>,
    /// Codes after this one (byte order): the cursor of the previous page.
    pub after: Option<String>,
    pub limit: i64,
}

/// One row of the audit trail.
#[derive(Debug, Clone, FromRow)]
pub struct AuditEvent {
    pub id: i64,
    pub at: DateTime<Utc>,
    pub actor: String,
    pub action: String,
    pub voucher_code: String,
    /// The voucher before and after, as JSON text (`jsonb` in PostgreSQL).
    pub before: Option<String>,
    pub after: Option<String>,
    pub request_id: Option<String>,
}

/// A voucher's definition as the audit trail keeps it.
fn snapshot(v: &Voucher) -> Value {
    json!({
        "code": v.code.as_str(),
        "discountAmount": v.discount_amount.minor_units(),
        "minOrderAmount": v.min_order_amount.minor_units(),
        "totalLimit": v.total_limit,
        "perUserLimit": v.per_user_limit,
        "startsAt": v.starts_at,
        "endsAt": v.ends_at,
        "mode": v.mode.as_str(),
        "state": v.state.as_str(),
        "version": v.version,
    })
}

/// Writes the audit row of a change, on the change's own transaction.
pub(super) async fn audit(
    conn: &mut PgConnection,
    by: &Actor,
    action: &str,
    before: Option<&Voucher>,
    after: &Voucher,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO audit_events (actor, action, voucher_code, before, after, request_id)
         VALUES ($1, $2, $3, $4::jsonb, $5::jsonb, $6)",
    )
    .bind(&by.name)
    .bind(action)
    .bind(after.code.as_str())
    .bind(before.map(|v| snapshot(v).to_string()))
    .bind(snapshot(after).to_string())
    .bind(&by.request_id)
    .execute(conn)
    .await?;
    Ok(())
}

/// The voucher's row locked for a change, with the uses it holds, whether it has an active
/// reservation, and PostgreSQL's clock (the one the sale window is judged by).
struct Locked {
    voucher: Voucher,
    used_count: i32,
    has_active: bool,
    now: DateTime<Utc>,
}

async fn lock_voucher(conn: &mut PgConnection, code: &VoucherCode) -> Result<Locked> {
    #[derive(FromRow)]
    struct Row {
        #[sqlx(flatten)]
        voucher: VoucherRow,
        used_count: i32,
    }
    let row: Option<Row> = sqlx::query_as(&format!(
        "SELECT {VOUCHER_COLUMNS}, v.used_count FROM vouchers v WHERE v.code = $1
         FOR NO KEY UPDATE"
    ))
    .bind(code.as_str())
    .fetch_optional(&mut *conn)
    .await?;
    let row = row.ok_or(Error::VoucherNotFound)?;
    // A statement of its own, after the lock: its snapshot sees the rows of every write
    // the lock waited for (a subquery of the locking statement would not), and the clock
    // is read after the wait, not at the transaction's start.
    let (has_active, now): (bool, DateTime<Utc>) = sqlx::query_as(
        "SELECT EXISTS (SELECT 1 FROM redemptions
                        WHERE voucher_code = $1 AND status = 'RESERVED'),
                clock_timestamp()",
    )
    .bind(code.as_str())
    .fetch_one(&mut *conn)
    .await?;
    Ok(Locked {
        voucher: row.voucher.try_into()?,
        used_count: row.used_count,
        has_active,
        now,
    })
}

/// Writes `next` over the locked row as the next version.
async fn store_next(conn: &mut PgConnection, next: &Voucher) -> Result<Voucher> {
    let row: VoucherRow = sqlx::query_as(&format!(
        "UPDATE vouchers AS v
         SET discount_amount = $2, min_order_amount = $3, total_limit = $4, starts_at = $5,
             ends_at = $6, state = $7, version = v.version + 1, updated_at = now()
         WHERE v.code = $1
         RETURNING {VOUCHER_COLUMNS}"
    ))
    .bind(next.code.as_str())
    .bind(next.discount_amount.minor_units())
    .bind(next.min_order_amount.minor_units())
    .bind(next.total_limit)
    .bind(next.starts_at)
    .bind(next.ends_at)
    .bind(next.state.as_str())
    .fetch_one(conn)
    .await?;
    row.try_into()
}

/// `expected`, when given, must be the version the row holds.
fn check_version(current: &Voucher, expected: Option<i64>) -> Result<()> {
    match expected {
        Some(v) if v != current.version => Err(Error::PreconditionFailed),
        _ => Ok(()),
    }
}

impl Store {
    /// Changes `code`'s definition if it is still at version `expected`
    /// (`PreconditionFailed` otherwise), as [`VoucherChange::apply`] allows against the
    /// uses held now (and `limits` allows); one audit row. An empty change changes nothing and writes no row.
    #[tracing::instrument(name = "db.change_voucher", skip_all, fields(code = %code))]
    pub async fn change_voucher(
        &self,
        code: &VoucherCode,
        expected: i64,
        change: &VoucherChange,
        limits: Lowering,
        by: &Actor,
    ) -> Result<Voucher> {
        let mut tx = self.pool().begin().await?;
        let locked = lock_voucher(&mut tx, code).await?;
        check_version(&locked.voucher, Some(expected))?;
        if change.is_empty() {
            return Ok(locked.voucher);
        }
        let next = change
            .apply(&locked.voucher, locked.now, locked.used_count, limits)
            .map_err(|refused| match refused {
                ChangeRefused::NotAllowed(e) => Error::ChangeNotAllowed(e),
                ChangeRefused::Invalid(e) => Error::InvalidRequest(e),
            })?;
        let stored = store_next(&mut tx, &next).await?;
        audit(&mut tx, by, "change", Some(&locked.voucher), &stored).await?;
        tx.commit().await?;
        Ok(stored)
    }

    /// Pauses, resumes or archives `code` (at version `expected`, when given). Asking for
    /// the state it is in changes nothing and writes no row; an archived voucher stays
    /// archived; one with an active reservation is not archived.
    #[tracing::instrument(name = "db.change_state", skip_all, fields(code = %code, action = change.action()))]
    pub async fn change_state(
        &self,
        code: &VoucherCode,
        change: StateChange,
        expected: Option<i64>,
        by: &Actor,
    ) -> Result<Voucher> {
        let mut tx = self.pool().begin().await?;
        let locked = lock_voucher(&mut tx, code).await?;
        let current = &locked.voucher;
        check_version(current, expected)?;
        let not_allowed = |reason: &str| {
            Err(Error::ChangeNotAllowed(crate::domain::FieldError::new(
                "state",
                reason.to_owned(),
            )))
        };
        let target = match (change, current.state) {
            (_, VoucherState::Archived) if change == StateChange::Archive => {
                return Ok(locked.voucher)
            }
            (_, VoucherState::Archived) => return not_allowed("the voucher is archived"),
            (StateChange::Archive, _) if locked.has_active => return not_allowed(
                "the voucher has active reservations: confirm, release or let them expire first",
            ),
            (StateChange::Pause, _) => VoucherState::Paused,
            (StateChange::Resume, _) => VoucherState::Active,
            (StateChange::Archive, _) => VoucherState::Archived,
        };
        if target == current.state {
            return Ok(locked.voucher);
        }
        let next = Voucher {
            state: target,
            ..current.clone()
        };
        let stored = store_next(&mut tx, &next).await?;
        audit(&mut tx, by, change.action(), Some(current), &stored).await?;
        tx.commit().await?;
        Ok(stored)
    }

    /// Writes the audit row of an operator command that changes no row (a gate reload).
    pub async fn audit_command(&self, voucher: &Voucher, action: &str, by: &Actor) -> Result<()> {
        let mut conn = self.pool().acquire().await?;
        audit(&mut conn, by, action, Some(voucher), voucher).await
    }

    /// How many vouchers are in each state (the metrics' census).
    pub async fn vouchers_by_state(&self) -> Result<Vec<(String, i64)>> {
        Ok(
            sqlx::query_as("SELECT state, count(*) FROM vouchers GROUP BY state")
                .fetch_all(self.pool())
                .await?,
        )
    }

    /// One page of vouchers in code order (byte by byte), as `filter` says.
    #[tracing::instrument(name = "db.list_vouchers", skip_all)]
    pub async fn list_vouchers(&self, filter: &VoucherFilter) -> Result<Vec<(Voucher, i32)>> {
        #[derive(FromRow)]
        struct Row {
            #[sqlx(flatten)]
            voucher: VoucherRow,
            used_count: i32,
        }
        let rows: Vec<Row> = sqlx::query_as(&format!(
            "SELECT {VOUCHER_COLUMNS}, v.used_count FROM vouchers v
             WHERE ($1::text IS NULL OR v.code COLLATE \"C\" > $1::text COLLATE \"C\")
               AND ($2::text IS NULL OR v.mode = $2)
               AND (CASE WHEN $3::text IS NULL THEN v.state <> 'archived'
                         ELSE v.state = $3 END)
               AND (CASE $4::text
                        WHEN 'scheduled' THEN now() < v.starts_at
                        WHEN 'live' THEN now() >= v.starts_at AND now() < v.ends_at
                        WHEN 'ended' THEN now() >= v.ends_at
                        ELSE true END)
             ORDER BY v.code COLLATE \"C\"
             LIMIT $5"
        ))
        .bind(filter.after.as_deref())
        .bind(filter.mode.map(VoucherMode::as_str))
        .bind(filter.state.map(VoucherState::as_str))
        .bind(filter.phase.map(Phase::as_str))
        .bind(filter.limit)
        .fetch_all(self.pool())
        .await?;
        rows.into_iter()
            .map(|r| Ok((r.voucher.try_into()?, r.used_count)))
            .collect()
    }

    /// One page of `code`'s audit trail, oldest first, after the event `after`.
    #[tracing::instrument(name = "db.audit_events", skip_all, fields(code = %code))]
    pub async fn audit_events(
        &self,
        code: &VoucherCode,
        after: Option<i64>,
        limit: i64,
    ) -> Result<Vec<AuditEvent>> {
        let events: Vec<AuditEvent> = sqlx::query_as(
            "SELECT id, at, actor, action, voucher_code, before::text AS before,
                    after::text AS after, request_id
             FROM audit_events
             WHERE voucher_code = $1 AND id > $2
             ORDER BY id LIMIT $3",
        )
        .bind(code.as_str())
        .bind(after.unwrap_or(0))
        .bind(limit)
        .fetch_all(self.pool())
        .await?;
        Ok(events)
    }
}
