//! Admission: a core at its limit of reservations in flight refuses the next one, after its
//! queue timeout, with 503 OVERLOADED, having done nothing for it, and its limit shrinks after a window
//! of answers slower than the latency target. The requests are held in flight by a lock on
//! the voucher's row, so what is in flight, and for how long, is the test's to decide.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use sqlx::Connection;
use voucher_testkit::helpers::{ApiClient, TestEnv};
use voucher_testkit::locks::{lock_voucher_row, until_waiting_on_locks};
use voucher_testkit::sale::{accepted, Attempt};

use crate::helpers::voucher_body;

/// A core with admission on, between `min` and `max` and starting at `initial`.
async fn core_admitting(initial: usize, min: usize, max: usize) -> TestEnv {
    TestEnv::start_with(|s| {
        s.admission.enabled = true;
        s.admission.initial_limit = initial;
        s.admission.min_limit = min;
        s.admission.max_limit = max;
        s.admission.latency_target = Duration::from_millis(50);
        // Each held reservation in a statement of its own, on a connection of its own, so
        // that every one of them waits on the row (grouped, they would wait as one).
        s.database.max_connections = 20;
        s.standard.group_workers = 16;
        s.standard.group_batch_max = 1;
    })
    .await
}

/// `n` reservations of `code` sent, returned once all of them wait on the row's lock.
async fn held_reservations(
    env: &TestEnv,
    code: &str,
    n: usize,
) -> Vec<tokio::task::JoinHandle<Attempt>> {
    let held = (0..n)
        .map(|i| {
            let api = ApiClient::new(env.app.api.base.clone());
            let code = code.to_owned();
            tokio::spawn(async move {
                api.attempt(&code, &format!("held-c{i}"), &format!("held-o{i}"), 100_000)
                    .await
            })
        })
        .collect();
    until_waiting_on_locks(
        &env.pool,
        n as i64,
        "every held reservation to wait on the voucher's row",
    )
    .await;
    held
}

/// Lets the row go and collects the held reservations, every one of them accepted.
async fn released(
    blocker: sqlx::PgConnection,
    held: Vec<tokio::task::JoinHandle<Attempt>>,
) -> Vec<Attempt> {
    blocker.close().await.expect("lock released");
    let mut attempts = Vec::new();
    for h in held {
        attempts.push(h.await.expect("held reservation"));
    }
    assert!(
        attempts.iter().all(|a| a.status == StatusCode::CREATED),
        "{attempts:#?}"
    );
    attempts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn at_its_limit_a_core_refuses_the_next_reservation_and_takes_nothing_for_it() {
    let env = core_admitting(2, 2, 2).await;
    env.app.given_voucher(voucher_body("HOT", 10, 1)).await;
    let blocker = lock_voucher_row(&env.db.url, "HOT").await;
    let held = held_reservations(&env, "HOT", 2).await;

    let started = Instant::now();
    let refused = env.app.reserve("HOT", "late-c", "late-o", 100_000).await;
    let took = started.elapsed();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.headers()["retry-after"], "1");
    let body: serde_json::Value = refused.json().await.expect("json");
    assert_eq!(body["error"], "OVERLOADED", "{body}");
    // It waited for its queue timeout only: the two held requests still wait on the lock.
    assert!(took < Duration::from_secs(5), "refused after {took:?}");
    let metrics = env.app.metrics().await;
    assert_eq!(metrics.sum("voucher_admission_refused_total", &[]), 1.0);
    assert_eq!(metrics.sum("voucher_admission_in_flight", &[]), 2.0);

    let mut attempts = released(blocker, held).await;
    // The refused order took no use: its retry is a new reservation, not a replay.
    let retry = env.app.attempt("HOT", "late-c", "late-o", 100_000).await;
    assert_eq!(retry.status, StatusCode::CREATED, "{retry:?}");
    attempts.push(retry);
    assert_eq!(env.app.voucher_json("HOT").await["usedCount"], 3);
    env.finish(&accepted(&attempts)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_window_of_answers_slower_than_the_target_shrinks_the_limit() {
    let env = core_admitting(20, 2, 20).await;
    env.app.given_voucher(voucher_body("HOT", 100, 1)).await;
    let blocker = lock_voucher_row(&env.db.url, "HOT").await;
    // Ten requests, the fewest a window decides on, each held past the 50 ms target.
    let held = held_reservations(&env, "HOT", 10).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        env.app.metrics().await.sum("voucher_admission_limit", &[]),
        20.0
    );

    let attempts = released(blocker, held).await;
    let metrics = env.app.metrics().await;
    assert_eq!(
        metrics.sum("voucher_admission_limit", &[]),
        18.0,
        "every answer of the window was slow: the limit keeps 0.9 of itself"
    );
    assert_eq!(metrics.sum("voucher_admission_in_flight", &[]), 0.0);
    env.finish(&accepted(&attempts)).await;
}
