//! The invariants of `ARCHITECTURE.md`, checked against PostgreSQL once the system is quiet:
//! the oracle every concurrency, load and fault test ends with, and the benchmark too. It
//! lives here, beside the tests, not in the service it judges.
//! It looks at every voucher in the database the pool points to (tests own theirs).
//!
//! 1. rows in RESERVED or CONFIRMED <= total_limit, and `used_count` equals that count;
//! 2. every 201 ever returned has its row (nothing accepted is lost);
//! 3. per customer, rows in RESERVED or CONFIRMED <= per_user_limit (and the
//!    `customer_usage` counter equals that count);
//! 4. no orderId holds more than one use.
//!
//! 5. in flash mode, the gate's remaining count equals total_limit minus the active rows
//!    ([`check_gate`], given the gate).

use std::collections::HashMap;

use sqlx::{FromRow, PgPool};

use voucher_core::domain::VoucherCode;
use voucher_core::flash::gate::Gate;

/// A reservation a client was told succeeded (a 201).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Accepted {
    pub voucher_code: String,
    pub customer_id: String,
    pub order_id: String,
}

impl Accepted {
    pub fn new(voucher_code: &str, customer_id: &str, order_id: &str) -> Self {
        Self {
            voucher_code: voucher_code.to_owned(),
            customer_id: customer_id.to_owned(),
            order_id: order_id.to_owned(),
        }
    }
}

/// What the check found.
#[derive(Debug, Default)]
pub struct Report {
    pub vouchers_checked: usize,
    pub accepted_checked: usize,
    pub violations: Vec<String>,
}

impl Report {
    pub fn holds(&self) -> bool {
        self.violations.is_empty()
    }
}

/// Checks invariants 1 to 4 against the database, given every 201 the clients received.
pub async fn check(pool: &PgPool, accepted: &[Accepted]) -> anyhow::Result<Report> {
    let mut report = Report::default();
    check_totals(pool, &mut report).await?;
    check_accepted(pool, accepted, &mut report).await?;
    check_per_customer(pool, &mut report).await?;
    check_order_ids(pool, &mut report).await?;
    Ok(report)
}

async fn check_totals(pool: &PgPool, report: &mut Report) -> anyhow::Result<()> {
    #[derive(FromRow)]
    struct Row {
        code: String,
        total_limit: i32,
        used_count: i32,
        active: i64,
    }
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT v.code, v.total_limit, v.used_count,
                count(r.id) FILTER (WHERE r.status IN ('RESERVED', 'CONFIRMED')) AS active
         FROM vouchers v LEFT JOIN redemptions r ON r.voucher_code = v.code
         GROUP BY v.code",
    )
    .fetch_all(pool)
    .await?;
    report.vouchers_checked = rows.len();
    for r in rows {
        if r.active > i64::from(r.total_limit) {
            report.violations.push(format!(
                "1: voucher {} holds {} uses, limit {}",
                r.code, r.active, r.total_limit
            ));
        }
        if i64::from(r.used_count) != r.active {
            report.violations.push(format!(
                "1: voucher {} has used_count {} but {} active rows",
                r.code, r.used_count, r.active
            ));
        }
    }
    Ok(())
}

async fn check_accepted(
    pool: &PgPool,
    accepted: &[Accepted],
    report: &mut Report,
) -> anyhow::Result<()> {
    let order_ids: Vec<&str> = accepted.iter().map(|a| a.order_id.as_str()).collect();
    let rows: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT order_id, voucher_code, customer_id FROM redemptions WHERE order_id = ANY($1)",
    )
    .bind(&order_ids)
    .fetch_all(pool)
    .await?;
    let stored: HashMap<String, (String, String)> = rows
        .into_iter()
        .map(|(order, code, customer)| (order, (code, customer)))
        .collect();
    report.accepted_checked = accepted.len();
    for a in accepted {
        match stored.get(&a.order_id) {
            None => report
                .violations
                .push(format!("2: accepted order {} has no row", a.order_id)),
            Some((code, customer)) if *code != a.voucher_code || *customer != a.customer_id => {
                report.violations.push(format!(
                    "2: accepted order {} for {}/{} is stored for {}/{}",
                    a.order_id, a.voucher_code, a.customer_id, code, customer
                ))
            }
            Some(_) => {}
        }
    }
    Ok(())
}

async fn check_per_customer(pool: &PgPool, report: &mut Report) -> anyhow::Result<()> {
    #[derive(FromRow)]
    struct Row {
        voucher_code: String,
        customer_id: String,
        per_user_limit: i32,
        active: i64,
        counter: Option<i32>,
    }
    let rows: Vec<Row> = sqlx::query_as(
        "WITH active AS (
             SELECT voucher_code, customer_id, count(*) AS n FROM redemptions
             WHERE status IN ('RESERVED', 'CONFIRMED') GROUP BY 1, 2
         )
         SELECT coalesce(a.voucher_code, u.voucher_code) AS voucher_code,
                coalesce(a.customer_id, u.customer_id) AS customer_id,
                v.per_user_limit, coalesce(a.n, 0) AS active, u.active_count AS counter
         FROM active a
         FULL JOIN customer_usage u
           ON u.voucher_code = a.voucher_code AND u.customer_id = a.customer_id
         JOIN vouchers v ON v.code = coalesce(a.voucher_code, u.voucher_code)",
    )
    .fetch_all(pool)
    .await?;
    for r in rows {
        if r.active > i64::from(r.per_user_limit) {
            report.violations.push(format!(
                "3: customer {} holds {} uses of {}, per-user limit {}",
                r.customer_id, r.active, r.voucher_code, r.per_user_limit
            ));
        }
        if i64::from(r.counter.unwrap_or(0)) != r.active {
            report.violations.push(format!(
                "3: customer {} on {} has counter {:?} but {} active rows",
                r.customer_id, r.voucher_code, r.counter, r.active
            ));
        }
    }
    Ok(())
}

async fn check_order_ids(pool: &PgPool, report: &mut Report) -> anyhow::Result<()> {
    let doubled: Vec<(String, i64)> = sqlx::query_as(
        "SELECT order_id, count(*) FROM redemptions GROUP BY order_id HAVING count(*) > 1",
    )
    .fetch_all(pool)
    .await?;
    for (order, n) in doubled {
        report
            .violations
            .push(format!("4: order {order} holds {n} rows"));
    }
    Ok(())
}

/// Checks invariants 1 to 5: [`check`], plus every flash voucher's gate against PostgreSQL.
/// Call it once the system is quiet (consumer caught up, give-backs done).
pub async fn check_with_gate(
    pool: &PgPool,
    gate: &Gate,
    accepted: &[Accepted],
) -> anyhow::Result<Report> {
    let mut report = check(pool, accepted).await?;
    check_gates(pool, gate, None, &mut report).await?;
    Ok(report)
}

/// Invariant 5 for the flash voucher `code` alone (or every flash voucher), added to
/// `report`: its gate's remaining count equals total_limit minus the active rows.
pub async fn check_gates(
    pool: &PgPool,
    gate: &Gate,
    code: Option<&str>,
    report: &mut Report,
) -> anyhow::Result<()> {
    let rows: Vec<(String, i32, i64)> = sqlx::query_as(
        "SELECT v.code, v.total_limit,
                count(r.id) FILTER (WHERE r.status IN ('RESERVED', 'CONFIRMED')) AS active
         FROM vouchers v LEFT JOIN redemptions r ON r.voucher_code = v.code
         WHERE v.mode = 'flash' AND ($1::text IS NULL OR v.code = $1)
         GROUP BY v.code",
    )
    .bind(code)
    .fetch_all(pool)
    .await?;
    for (code, total_limit, active) in rows {
        let parsed = VoucherCode::parse(code.clone()).map_err(|e| anyhow::anyhow!("{e:?}"))?;
        let expected = i64::from(total_limit) - active;
        match gate.remaining(&parsed).await? {
            Some(remaining) if remaining == expected => {}
            Some(remaining) => report.violations.push(format!(
                "5: voucher {code}: gate has {remaining} remaining, PostgreSQL says {expected}"
            )),
            None => report
                .violations
                .push(format!("5: voucher {code}: gate not loaded")),
        }
    }
    Ok(())
}
