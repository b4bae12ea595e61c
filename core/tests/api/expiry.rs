//! The expiry job: reservations past their TTL are released exactly once, whatever number
//! of instances run the job.

use std::time::Duration;

use chrono::Utc;
use reqwest::StatusCode;
use sqlx::postgres::PgPoolOptions;
use voucher_core::store::Store;

use crate::helpers::{settings_for, voucher_body, TestApp, TestDb, TestEnv};
use crate::invariants::{self, Accepted};
use crate::sale::{accepted, count, reserve_concurrently, Attempt};
use voucher_testkit::wait::eventually;

/// `voucher_expired_releases_total` of an app.
async fn expired_releases(app: &TestApp) -> f64 {
    app.metrics()
        .await
        .sum("voucher_expired_releases_total", &[])
}

/// A voucher `code` of `n` uses, 1 per customer, every use held at once by a customer and
/// order of its own (`c{i}`, `o{i}`), each a 201.
async fn hold_every_use(app: &TestApp, code: &str, n: usize) -> Vec<Attempt> {
    app.given_voucher(voucher_body(code, n as i64, 1)).await;
    let attempts = (0..n).map(|i| (format!("c{i}"), format!("o{i}"))).collect();
    let held = reserve_concurrently(app, code, attempts).await;
    assert_eq!(count(&held, StatusCode::CREATED, ""), n);
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_running_the_job_release_each_expired_reservation_once() {
    // Arrange: two instances on one database, both running the job often, TTL of 1 s.
    let db = TestDb::create().await;
    let mut settings = settings_for(&db.url);
    settings.reservations.ttl = Duration::from_secs(1);
    settings.reservations.expiry_enabled = true;
    settings.reservations.expiry_interval = Duration::from_millis(20);
    settings.reservations.expiry_batch = 7; // several batches, so the workers interleave
    let a = TestApp::start(&settings).await;
    let b = TestApp::start(&settings).await;
    let held = hold_every_use(&a, "EXP", 40).await;

    // Act: wait (bounded) until the jobs have given every use back.
    eventually(Duration::from_secs(60), "every use given back", || async {
        (b.voucher_json("EXP").await["usedCount"].as_i64() == Some(0)).then_some(())
    })
    .await;

    // Assert: 40 releases in all, split between the two instances however it fell.
    let (by_a, by_b) = (expired_releases(&a).await, expired_releases(&b).await);
    assert_eq!(by_a + by_b, 40.0, "a released {by_a}, b released {by_b}");
    let voucher = a.voucher_json("EXP").await;
    assert_eq!(
        (voucher["remaining"].as_i64(), voucher["reserved"].as_i64()),
        (Some(40), Some(0))
    );
    let confirm = a.confirm("EXP", "o0").await;
    assert_eq!(
        confirm.status(),
        StatusCode::CONFLICT,
        "an expired reservation cannot be confirmed"
    );
    let again = a.reserve("EXP", "c0", "o-new", 100_000).await;
    assert_eq!(
        again.status(),
        StatusCode::CREATED,
        "an expired use is available again"
    );

    let pool = PgPoolOptions::new().connect(&db.url).await.expect("pool");
    let mut all = accepted(&held);
    all.push(Accepted::new("EXP", "c0", "o-new"));
    let report = invariants::check(&pool, &all).await.expect("check runs");
    assert!(report.holds(), "{:#?}", report.violations);
    a.stop().await;
    b.stop().await;
    pool.close().await;
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_expiry_batches_partition_the_due_rows() {
    // Deterministic: no waiting for a clock; the job is asked about a moment past the TTL.
    let env = TestEnv::start().await;
    let held = hold_every_use(&env.app, "EXP", 60).await;
    env.app.confirm("EXP", "o0").await;
    env.app.release("EXP", "o1").await;
    let store = Store::new(env.pool.clone());
    let later = Utc::now() + chrono::Duration::minutes(16);

    let runs = crate::helpers::run_all((0..6).map(|_| {
        let store = store.clone();
        async move {
            let mut mine = Vec::new();
            loop {
                let batch = store
                    .release_expired(Some(later), 4)
                    .await
                    .expect("expiry runs");
                if batch.is_empty() {
                    return mine;
                }
                mine.extend(batch.into_iter().map(|r| r.order_id.to_string()));
            }
        }
    }))
    .await;

    let mut released: Vec<String> = runs.into_iter().flatten().collect();
    let total = released.len();
    released.sort();
    released.dedup();
    assert_eq!(
        total, 58,
        "every open reservation but the confirmed and the released one"
    );
    assert_eq!(released.len(), total, "no reservation released twice");
    assert!(!released.contains(&"o0".to_owned()) && !released.contains(&"o1".to_owned()));
    assert_eq!(
        env.app.voucher_json("EXP").await["usedCount"],
        1,
        "only the confirmed use is held"
    );
    env.finish(&accepted(&held)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reservations_not_yet_due_are_left_alone() {
    let env = TestEnv::start().await;
    env.app.given_voucher(voucher_body("EXP", 5, 1)).await;
    let held = reserve_concurrently(&env.app, "EXP", vec![("c1".into(), "o1".into())]).await;
    let store = Store::new(env.pool.clone());

    let released = store.release_expired(None, 100).await.expect("expiry runs");

    assert!(released.is_empty());
    assert_eq!(env.app.voucher_json("EXP").await["usedCount"], 1);
    env.finish(&accepted(&held)).await;
}

/// A core stopped while it works through a backlog of expired reservations stops after the
/// batch it is on, not after the backlog (which once took a core's shutdown past its
/// deadline); another instance releases the rest, each reservation once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_core_stopped_during_an_expiry_backlog_stops_after_its_batch() {
    let db = TestDb::create().await;
    let mut settings = settings_for(&db.url);
    settings.reservations.ttl = Duration::from_secs(1);
    settings.reservations.expiry_enabled = false;
    let holder = TestApp::start(&settings).await;
    let held = hold_every_use(&holder, "BACKLOG", 300).await;
    let pool = PgPoolOptions::new().connect(&db.url).await.expect("pool");
    // The whole backlog due before the job starts: every batch then finds one to release.
    eventually(Duration::from_secs(10), "every reservation due", || async {
        let not_due: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM redemptions WHERE status = 'RESERVED' AND expires_at > now()",
        )
        .fetch_one(&pool)
        .await
        .expect("count");
        (not_due == 0).then_some(())
    })
    .await;

    // One reservation per batch: the backlog is 300 transactions.
    settings.reservations.expiry_enabled = true;
    settings.reservations.expiry_interval = Duration::from_millis(20);
    settings.reservations.expiry_batch = 1;
    let stopped = TestApp::start(&settings).await;
    eventually(
        Duration::from_secs(30),
        "the first expired release",
        || async { (expired_releases(&stopped).await >= 1.0).then_some(()) },
    )
    .await;
    stopped.stop().await;
    let left = holder.voucher_json("BACKLOG").await["usedCount"]
        .as_i64()
        .expect("usedCount");
    assert!(
        left > 0,
        "the stopped core released the whole backlog before it stopped"
    );

    let next = TestApp::start(&settings).await;
    eventually(Duration::from_secs(60), "the rest given back", || async {
        (holder.voucher_json("BACKLOG").await["usedCount"].as_i64() == Some(0)).then_some(())
    })
    .await;
    assert_eq!(expired_releases(&next).await, left as f64);

    let report = invariants::check(&pool, &accepted(&held))
        .await
        .expect("check runs");
    assert!(report.holds(), "{:#?}", report.violations);
    holder.stop().await;
    next.stop().await;
    pool.close().await;
    db.drop_db().await;
}
