//! A flash voucher changed while its sale runs: the gate takes a new limit or a pause in
//! one step (`amend.lua`), PostgreSQL holds a pause for every commit after it, and a
//! change whose amend was lost reaches the gate by reconciliation.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;
use voucher_core::domain::VoucherCode;
use voucher_testkit::wait::eventually;

use crate::flash::reconciler;
use crate::invariants::Accepted;
use crate::sale::Sale;
use crate::stack::{flash_voucher, FlashStack};

async fn gate_remaining(env: &FlashStack, code: &str) -> Option<i64> {
    let code = VoucherCode::parse(code).expect("code");
    env.gate.remaining(&code).await.expect("redis")
}

/// Waits until the gate of `code` has at most `remaining` uses left.
async fn gate_down_to(env: &FlashStack, code: &str, remaining: i64) {
    eventually(
        Duration::from_secs(60),
        "the sale to get under way",
        || async {
            let left = gate_remaining(env, code).await?;
            (left <= remaining).then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_limit_raised_during_a_sale_sells_out_exactly_at_the_new_limit() {
    let env = FlashStack::start().await;
    env.app()
        .given_voucher(flash_voucher("RAISE", 100, 1))
        .await;
    let sale = Sale {
        in_flight: 100,
        ..Sale::new("RAISE", "a", 600)
    };
    let (first, changed) = tokio::join!(sale.run(env.app()), async {
        gate_down_to(&env, "RAISE", 50).await;
        env.app()
            .change("RAISE", 1, &json!({ "totalLimit": 150 }))
            .await
    });
    assert_eq!(changed.status(), StatusCode::OK);
    // Whatever the first sale left, customers enough come after it to take the rest.
    let second = Sale::new("RAISE", "b", 200).run(env.app()).await;
    assert_eq!(
        first.created() + second.created(),
        150,
        "exactly the new limit, never both"
    );
    assert_eq!(gate_remaining(&env, "RAISE").await, Some(0));
    let mut accepted = first.accepted();
    accepted.extend(second.accepted());
    env.finish(&accepted).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sold_out_gate_sells_again_when_the_limit_goes_up_and_stops_at_the_uses_held() {
    let env = FlashStack::start().await;
    env.app().given_voucher(flash_voucher("MORE", 2, 1)).await;
    let first = Sale::new("MORE", "a", 5).run(env.app()).await;
    assert_eq!(first.created(), 2);
    let resp = env
        .app()
        .change("MORE", 1, &json!({ "totalLimit": 4 }))
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        gate_remaining(&env, "MORE").await,
        Some(2),
        "the gate moved with the limit"
    );
    let second = Sale::new("MORE", "b", 5).run(env.app()).await;
    assert_eq!(second.created(), 2);
    // Down to the uses held and no further.
    let below = env
        .app()
        .change("MORE", 2, &json!({ "totalLimit": 3 }))
        .await;
    assert_eq!(below.status(), StatusCode::CONFLICT);
    let mut accepted = first.accepted();
    accepted.extend(second.accepted());
    env.finish(&accepted).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_new_use_is_taken_after_a_flash_pause_was_acknowledged() {
    let env = FlashStack::start().await;
    env.app()
        .given_voucher(flash_voucher("STOP", 1000, 1))
        .await;
    let run = Sale {
        in_flight: 100,
        ..Sale::new("STOP", "a", 1500)
    };
    let (sale, rows_at_pause) = tokio::join!(run.run(env.app()), async {
        gate_down_to(&env, "STOP", 900).await;
        env.app().given_lifecycle("STOP", "pause").await;
        env.rows("STOP").await
    });
    // Every use was committed before the pause answered; the sale went on against a paused
    // voucher and took nothing more.
    assert_eq!(env.rows("STOP").await, rows_at_pause);
    assert_eq!(i64::try_from(sale.created()).expect("small"), rows_at_pause);
    assert!(sale.count(StatusCode::CONFLICT, "VOUCHER_PAUSED") > 0);
    let newcomer = env.app().attempt("STOP", "late", "late-o", 100_000).await;
    assert_eq!(newcomer.code(), "VOUCHER_PAUSED");
    // A holder's retry still gets its 201.
    let holder = sale.accepted().into_iter().next().expect("a holder");
    let retry = env
        .app()
        .reserve("STOP", &holder.customer_id, &holder.order_id, 100_000)
        .await;
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    // Resumed, the gate sells again.
    env.app().given_lifecycle("STOP", "resume").await;
    assert_eq!(
        env.app()
            .reserve("STOP", "late", "late-o", 100_000)
            .await
            .status(),
        StatusCode::CREATED
    );
    let mut accepted = sale.accepted();
    accepted.push(Accepted::new("STOP", "late", "late-o"));
    env.finish(&accepted).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_change_whose_gate_amend_was_lost_reaches_the_gate_by_reconciliation() {
    let env = FlashStack::start().await;
    env.app().given_voucher(flash_voucher("LOST", 3, 1)).await;
    let first = Sale::new("LOST", "a", 2).run(env.app()).await;
    assert_eq!(first.created(), 2);
    // Committed as a change would be, with no core left to hand it to the gate.
    sqlx::query(
        "UPDATE vouchers SET total_limit = 5, state = 'paused', version = version + 1
         WHERE code = 'LOST'",
    )
    .execute(&env.pool)
    .await
    .expect("update");
    assert_eq!(gate_remaining(&env, "LOST").await, Some(1));
    // PostgreSQL holds the pause before the gate knows of it: the gate takes its last use,
    // the commit is refused, the use goes back.
    let refused = env.app().attempt("LOST", "x", "x-o", 100_000).await;
    assert_eq!(refused.code(), "VOUCHER_PAUSED");
    assert_eq!(env.rows("LOST").await, 2);
    eventually(
        Duration::from_secs(10),
        "the refused use to go back",
        || async { (gate_remaining(&env, "LOST").await == Some(1)).then_some(()) },
    )
    .await;
    reconciler(&env).run_once().await.expect("round");
    assert_eq!(
        gate_remaining(&env, "LOST").await,
        Some(3),
        "the new limit, in one step"
    );
    let paused = env.app().attempt("LOST", "y", "y-o", 100_000).await;
    assert_eq!(paused.code(), "VOUCHER_PAUSED");
    env.finish(&first.accepted()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_the_broker_deciding_a_flash_limit_only_goes_up() {
    let env = FlashStack::builder()
        .start_with(|s| s.flash.decision = voucher_core::config::Decision::Broker)
        .await;
    env.app()
        .given_voucher(flash_voucher("UPONLY", 10, 1))
        .await;
    let lower = env
        .app()
        .change("UPONLY", 1, &json!({ "totalLimit": 5 }))
        .await;
    assert_eq!(lower.status(), StatusCode::CONFLICT);
    let body: serde_json::Value = lower.json().await.expect("json");
    assert_eq!(body["field"], "totalLimit");
    let raise = env
        .app()
        .change("UPONLY", 1, &json!({ "totalLimit": 20 }))
        .await;
    assert_eq!(raise.status(), StatusCode::OK);
    assert_eq!(gate_remaining(&env, "UPONLY").await, Some(20));
    env.finish(&[]).await;
}
