//! Races: many requests at once on one hot voucher. Each test ends with the invariants.

use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::{voucher_body, TestEnv};
use crate::sale::{accepted, count, reserve_concurrently};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_customers_race_for_ten_uses() {
    let env = TestEnv::start().await;
    env.app.given_voucher(voucher_body("HOT", 10, 1)).await;
    let attempts = (0..200)
        .map(|i| (format!("c{i}"), format!("o{i}")))
        .collect();

    let results = reserve_concurrently(&env.app, "HOT", attempts).await;

    assert_eq!(count(&results, StatusCode::CREATED, ""), 10, "{results:#?}");
    assert_eq!(count(&results, StatusCode::CONFLICT, "OUT_OF_STOCK"), 190);
    let voucher = env.app.voucher_json("HOT").await;
    assert_eq!(
        (voucher["usedCount"].as_i64(), voucher["remaining"].as_i64()),
        (Some(10), Some(0))
    );
    env.finish(&accepted(&results)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_retries_of_one_order_take_one_use_and_get_one_body() {
    let env = TestEnv::start().await;
    env.app.given_voucher(voucher_body("HOT", 10, 1)).await;
    let attempts = (0..50)
        .map(|_| ("c1".to_owned(), "o1".to_owned()))
        .collect();

    let results = reserve_concurrently(&env.app, "HOT", attempts).await;

    assert!(
        results.iter().all(|r| r.status == StatusCode::CREATED),
        "{results:#?}"
    );
    let first: &Value = &results[0].body;
    assert!(
        results.iter().all(|r| r.body == *first),
        "every retry gets the same body"
    );
    assert_eq!(env.app.voucher_json("HOT").await["usedCount"], 1);
    env.finish(&accepted(&results)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_customer_with_per_user_limit_two_racing_ten_orders_gets_exactly_two() {
    let env = TestEnv::start().await;
    env.app.given_voucher(voucher_body("HOT", 100, 2)).await;
    let attempts = (0..10)
        .map(|i| ("greedy".to_owned(), format!("o{i}")))
        .collect();

    let results = reserve_concurrently(&env.app, "HOT", attempts).await;

    assert_eq!(count(&results, StatusCode::CREATED, ""), 2, "{results:#?}");
    assert_eq!(count(&results, StatusCode::CONFLICT, "ALREADY_USED"), 8);
    env.finish(&accepted(&results)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_customers_with_limit_three_racing_on_a_small_voucher() {
    // Both limits bind at once: 20 customers x 6 orders each against 25 uses, 3 per customer.
    let env = TestEnv::start().await;
    env.app.given_voucher(voucher_body("MIX", 25, 3)).await;
    let attempts = (0..120)
        .map(|i| (format!("c{}", i % 20), format!("o{i}")))
        .collect();

    let results = reserve_concurrently(&env.app, "MIX", attempts).await;

    assert_eq!(count(&results, StatusCode::CREATED, ""), 25, "{results:#?}");
    assert_eq!(
        count(&results, StatusCode::CONFLICT, "OUT_OF_STOCK")
            + count(&results, StatusCode::CONFLICT, "ALREADY_USED"),
        95
    );
    env.finish(&accepted(&results)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn releases_racing_new_reservations_never_oversell() {
    // Ten holders release while forty newcomers race for the freed uses.
    let env = TestEnv::start().await;
    env.app.given_voucher(voucher_body("CHURN", 10, 1)).await;
    let holders = (0..10)
        .map(|i| (format!("h{i}"), format!("h-o{i}")))
        .collect();
    let held = reserve_concurrently(&env.app, "CHURN", holders).await;
    assert_eq!(count(&held, StatusCode::CREATED, ""), 10);

    let app = &env.app;
    let releases = async {
        crate::helpers::run_all(
            (0..10).map(|i| async move { app.release("CHURN", &format!("h-o{i}")).await.status() }),
        )
        .await
    };
    let newcomers = reserve_concurrently(
        app,
        "CHURN",
        (0..40)
            .map(|i| (format!("n{i}"), format!("n-o{i}")))
            .collect(),
    );
    let (released, raced) = tokio::join!(releases, newcomers);

    assert!(released.iter().all(|s| *s == StatusCode::OK));
    let won = count(&raced, StatusCode::CREATED, "");
    assert!(
        won <= 10,
        "at most the ten released uses can be taken, got {won}"
    );
    assert_eq!(
        won + count(&raced, StatusCode::CONFLICT, "OUT_OF_STOCK"),
        40
    );
    assert_eq!(
        env.app.voucher_json("CHURN").await["usedCount"].as_i64(),
        Some(won as i64)
    );
    let mut all = accepted(&held);
    all.extend(accepted(&raced));
    env.finish(&all).await;
}
