//! PostgreSQL is the last guard: even SQL that bypasses the service cannot oversell.

use sqlx::PgPool;

use crate::helpers::{voucher_body, TestEnv};

async fn violated_constraint(pool: &PgPool, sql: &str) -> Option<String> {
    refused_by(sqlx::query(sql).execute(pool).await)
}

/// The constraint a statement's error names (`None` if it ran).
fn refused_by(result: Result<sqlx::postgres::PgQueryResult, sqlx::Error>) -> Option<String> {
    match result {
        Ok(_) => None,
        Err(sqlx::Error::Database(e)) => e.constraint().map(str::to_owned),
        Err(e) => panic!("unexpected error: {e}"),
    }
}

#[tokio::test]
async fn used_count_cannot_be_pushed_past_the_limit_in_sql() {
    let env = TestEnv::start().await;
    env.app.given_voucher(voucher_body("GUARD", 3, 1)).await;

    let past_limit = violated_constraint(
        &env.pool,
        "UPDATE vouchers SET used_count = total_limit + 1 WHERE code = 'GUARD'",
    )
    .await;
    let one_by_one = violated_constraint(
        &env.pool,
        "UPDATE vouchers SET used_count = used_count + 4 WHERE code = 'GUARD'",
    )
    .await;
    let negative = violated_constraint(
        &env.pool,
        "UPDATE vouchers SET used_count = -1 WHERE code = 'GUARD'",
    )
    .await;

    assert_eq!(past_limit.as_deref(), Some("vouchers_used_within_limit"));
    assert_eq!(one_by_one.as_deref(), Some("vouchers_used_within_limit"));
    assert_eq!(negative.as_deref(), Some("vouchers_used_not_negative"));
    assert_eq!(env.app.voucher_json("GUARD").await["usedCount"], 0);
    env.finish(&[]).await;
}

#[tokio::test]
async fn an_order_id_cannot_hold_two_rows_nor_a_customer_exceed_its_limit_in_sql() {
    let env = TestEnv::start().await;
    env.app.given_voucher(voucher_body("GUARD", 3, 1)).await;
    env.app.reserve("GUARD", "c1", "o1", 100_000).await;

    let second_row = violated_constraint(
        &env.pool,
        "INSERT INTO redemptions (voucher_code, customer_id, order_id, order_amount, discount_amount, expires_at)
         VALUES ('GUARD', 'c2', 'o1', 100000, 100000, now())",
    )
    .await;
    let customer_over = violated_constraint(
        &env.pool,
        "UPDATE customer_usage SET active_count = active_count + 1 WHERE voucher_code = 'GUARD' AND customer_id = 'c1'",
    )
    .await;

    assert_eq!(second_row.as_deref(), Some("redemptions_order_id_key"));
    assert_eq!(
        customer_over.as_deref(),
        Some("customer_usage_within_limit")
    );
    env.finish(&[crate::invariants::Accepted::new("GUARD", "c1", "o1")])
        .await;
}

#[tokio::test]
async fn the_invariant_checker_catches_a_drifted_counter() {
    // The checker must be able to fail, or every test that ends with it proves nothing.
    let env = TestEnv::start().await;
    env.app.given_voucher(voucher_body("DRIFT", 3, 1)).await;
    env.app.reserve("DRIFT", "c1", "o1", 100_000).await;
    sqlx::query("UPDATE vouchers SET used_count = 2 WHERE code = 'DRIFT'")
        .execute(&env.pool)
        .await
        .expect("update");
    let lost = crate::invariants::Accepted::new("DRIFT", "c9", "never-stored");

    let report = crate::invariants::check(&env.pool, &[lost])
        .await
        .expect("check runs");

    assert_eq!(report.violations.len(), 2, "{:#?}", report.violations);
    assert!(report.violations[0].contains("used_count 2 but 1 active"));
    assert!(report.violations[1].contains("never-stored has no row"));
    sqlx::query("UPDATE vouchers SET used_count = 1 WHERE code = 'DRIFT'")
        .execute(&env.pool)
        .await
        .expect("repair");
    env.finish(&[]).await;
}

#[tokio::test]
async fn a_row_cannot_name_an_unknown_voucher_nor_a_voucher_with_rows_go_in_sql() {
    // The foreign keys to vouchers cost a query per inserted row of a grouped write
    // (reports/bench/ACCEPT-foreign-keys.md); whatever replaces them must refuse this.
    let env = TestEnv::start().await;
    env.app.given_voucher(voucher_body("HELD", 3, 1)).await;
    env.app.reserve("HELD", "c1", "o1", 100_000).await;

    let unknown_row = violated_constraint(
        &env.pool,
        "INSERT INTO redemptions (voucher_code, customer_id, order_id, order_amount, discount_amount, expires_at)
         VALUES ('HELD', 'c2', 'o2', 100000, 100000, now()), ('NOPE', 'c3', 'o3', 100000, 100000, now())",
    )
    .await;
    let moved_row = violated_constraint(
        &env.pool,
        "UPDATE redemptions SET voucher_code = 'NOPE' WHERE order_id = 'o1'",
    )
    .await;
    let unknown_usage = violated_constraint(
        &env.pool,
        "INSERT INTO customer_usage (voucher_code, customer_id, active_count, per_user_limit)
         VALUES ('NOPE', 'c9', 1, 1)",
    )
    .await;
    // Its audit trail names it too (and refuses the delete by its own key): each key is
    // tried alone, the other rows removed first in a transaction rolled back after.
    let deleted_with = |keep: &'static str| {
        let pool = env.pool.clone();
        async move {
            let mut tx = pool.begin().await.expect("begin");
            for table in ["audit_events", "redemptions", "customer_usage"] {
                if table != keep {
                    sqlx::query(&format!("DELETE FROM {table} WHERE voucher_code = 'HELD'"))
                        .execute(&mut *tx)
                        .await
                        .expect("delete");
                }
            }
            let refused = refused_by(
                sqlx::query("DELETE FROM vouchers WHERE code = 'HELD'")
                    .execute(&mut *tx)
                    .await,
            );
            tx.rollback().await.expect("rollback");
            refused
        }
    };
    let held_by_row = deleted_with("redemptions").await;
    let held_by_usage = deleted_with("customer_usage").await;

    assert_eq!(unknown_row.as_deref(), Some("redemptions_voucher_fkey"));
    assert_eq!(moved_row.as_deref(), Some("redemptions_voucher_fkey"));
    assert_eq!(
        unknown_usage.as_deref(),
        Some("customer_usage_voucher_fkey")
    );
    assert_eq!(held_by_row.as_deref(), Some("redemptions_voucher_fkey"));
    assert_eq!(
        held_by_usage.as_deref(),
        Some("customer_usage_voucher_fkey")
    );
    // Nothing of the refused statements stayed: the voucher still holds its one row.
    let rows: i64 =
        sqlx::query_scalar("SELECT count(*) FROM redemptions WHERE voucher_code = 'HELD'")
            .fetch_one(&env.pool)
            .await
            .expect("count");
    assert_eq!(rows, 1);
    env.finish(&[crate::invariants::Accepted::new("HELD", "c1", "o1")])
        .await;
}
