//! Bounded sessions: a core paused or stuck inside a transaction holds a hot voucher's row
//! no longer than `database.idle_in_transaction_timeout` (PostgreSQL ends its session),
//! while a gate load's long read, which holds no row lock, is exempt.

use std::time::{Duration, Instant};

use voucher_core::domain::VoucherCode;
use voucher_core::store::Store;
use voucher_testkit::helpers::{settings_for, TestDb};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_stalled_in_a_transaction_holding_a_voucher_row_is_ended_by_postgresql() {
    let db = TestDb::create().await;
    let mut settings = settings_for(&db.url);
    settings.database.idle_in_transaction_timeout = Duration::from_secs(1);
    let store = Store::connect_lazy(&settings.database).expect("store");
    store.migrate().await.expect("migrations");
    sqlx::query(
        "INSERT INTO vouchers (code, discount_amount, min_order_amount, total_limit,
                               per_user_limit, starts_at, ends_at, mode)
         VALUES ('HOT', 1000, 0, 10, 1, now(), now() + interval '1 day', 'standard')",
    )
    .execute(store.pool())
    .await
    .expect("voucher");

    // A writer takes the hot row's lock, then its process stalls (it never comes back).
    let mut stalled = store.pool().begin().await.expect("begin");
    sqlx::query("UPDATE vouchers SET used_count = used_count + 1 WHERE code = 'HOT'")
        .execute(&mut *stalled)
        .await
        .expect("row locked");

    // Another writer wants the same row: it gets it once PostgreSQL ends the stalled
    // session, not when (if ever) the stalled process resumes.
    let started = Instant::now();
    let waited = tokio::time::timeout(
        Duration::from_secs(30),
        sqlx::query("UPDATE vouchers SET used_count = used_count WHERE code = 'HOT'")
            .execute(store.pool()),
    )
    .await
    .expect("the row is free well before 30 s")
    .expect("updated");
    assert_eq!(waited.rows_affected(), 1);
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
    // The stalled transaction was ended: its use was never counted.
    assert!(stalled.commit().await.is_err(), "its session is gone");
    let used: i32 = sqlx::query_scalar("SELECT used_count FROM vouchers WHERE code = 'HOT'")
        .fetch_one(store.pool())
        .await
        .expect("read");
    assert_eq!(used, 0);

    // A gate load's read sits idle in its transaction while Redis fills: exempt.
    let code = VoucherCode::parse("HOT").expect("code");
    let mut read = store.read_gate(&code, 1).await.expect("read begins");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let customers: Vec<_> = futures::StreamExt::collect(read.customers()).await;
    assert!(
        customers.iter().all(Result::is_ok),
        "the load's read outlives the bound"
    );
    read.finish()
        .await
        .expect("the load's read outlives the bound");
    store.pool().close().await;
    db.drop_db().await;
}
