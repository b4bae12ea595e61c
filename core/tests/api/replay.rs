//! A replay tells what PostgreSQL holds: a retry that finds a row is answered from it
//! (status, amount, discount, expiry), whatever the gate's record says, and the record is
//! brought in step. The gate going back in time is what a Redis restored from an older
//! snapshot, or a replica promoted behind its master, does to it.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;
use voucher_core::config::Decision;
use voucher_core::domain::{
    CustomerId, Money, OrderId, Reservation, ReservationStatus, VoucherCode,
};
use voucher_core::flash::gate::RecordState;
use voucher_core::flash::reconcile::VoucherReport;
use voucher_core::store::Store;
use voucher_testkit::assert::assert_error;
use voucher_testkit::wait::eventually;

use crate::flash::{done, reconciler, reservation_held_on_its_row, uses_appear};
use crate::invariants::Accepted;
use crate::sale::Sale;
use crate::stack::{flash_voucher, save_gate, FlashStack};

/// A replay of `order` with its first body: 201, `Idempotent-Replayed: true`, the body.
async fn replay(env: &FlashStack, code: &str, customer: &str, order: &str) -> Value {
    let answer = env.app().reserve(code, customer, order, 100_000).await;
    assert_eq!(answer.status(), StatusCode::CREATED);
    assert_eq!(
        answer
            .headers()
            .get("idempotent-replayed")
            .and_then(|v| v.to_str().ok()),
        Some("true")
    );
    answer.json().await.expect("JSON")
}

async fn record_state(env: &FlashStack, code: &str, order: &str) -> Option<RecordState> {
    let code = VoucherCode::parse(code).expect("code");
    let order = OrderId::parse(order).expect("order");
    env.gate
        .record(&code, &order)
        .await
        .expect("redis")
        .map(|r| r.state)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replay_after_the_gate_went_back_in_time_answers_what_postgresql_holds() {
    let env = FlashStack::builder()
        .start_with(|s| s.flash.decision = Decision::Database)
        .await;
    let app = env.app();
    app.given_voucher(flash_voucher("BACK", 3, 1)).await;
    let code = VoucherCode::parse("BACK").expect("code");
    let before_o3 = save_gate(env.key_prefix(), "BACK").await;
    let o3 = app.attempt("BACK", "c3", "back-3", 100_000).await;
    assert_eq!(o3.status, StatusCode::CREATED);
    let o1 = app.attempt("BACK", "c1", "back-1", 100_000).await;
    let o2 = app.attempt("BACK", "c2", "back-2", 100_000).await;
    assert_eq!(
        (o1.status, o2.status),
        (StatusCode::CREATED, StatusCode::CREATED)
    );
    let held = save_gate(env.key_prefix(), "BACK").await;

    assert_eq!(app.release("BACK", "back-1").await.status(), StatusCode::OK);
    assert_eq!(app.confirm("BACK", "back-2").await.status(), StatusCode::OK);
    assert_eq!(env.gate.remaining(&code).await.expect("redis"), Some(1));

    // The gate goes back to before the release and the confirm: both records say held.
    held.restore().await;
    assert_eq!(env.gate.remaining(&code).await.expect("redis"), Some(0));
    let released = replay(&env, "BACK", "c1", "back-1").await;
    assert_eq!(released["status"], "RELEASED", "{released}");
    let confirmed = replay(&env, "BACK", "c2", "back-2").await;
    assert_eq!(confirmed["status"], "CONFIRMED", "{confirmed}");
    // The records were corrected, not believed: back-1's use is free again.
    assert_eq!(
        record_state(&env, "BACK", "back-1").await,
        Some(RecordState::Released)
    );
    assert_eq!(
        record_state(&env, "BACK", "back-2").await,
        Some(RecordState::Confirmed)
    );
    assert_eq!(env.gate.remaining(&code).await.expect("redis"), Some(1));

    // The same orderId with another amount is another request.
    let other = app.reserve("BACK", "c2", "back-2", 100_001).await;
    assert_error(other, StatusCode::CONFLICT, "ORDER_ID_CONFLICT").await;

    // Further back, to before back-3 existed at all: the gate takes a new use for it, and
    // PostgreSQL's row (released here first) is the answer; that use goes back.
    assert_eq!(app.release("BACK", "back-3").await.status(), StatusCode::OK);
    before_o3.restore().await;
    let again = replay(&env, "BACK", "c3", "back-3").await;
    assert_eq!(again["status"], "RELEASED", "{again}");
    assert_eq!(
        record_state(&env, "BACK", "back-3").await,
        Some(RecordState::Released)
    );
    assert_eq!(env.rows("BACK").await, 3);
    // That gate never counted back-2's confirmed use: reconciliation takes it off (the
    // second round that finds the shortfall).
    let reconciler = reconciler(&env);
    reconciler.run_once().await.expect("round runs");
    let reports = reconciler.run_once().await.expect("round runs");
    let report = reports[0].1.clone().expect("caught up and loaded");
    assert_eq!((report.repaired, report.drift), (1, 0), "{report:?}");

    let accepted: Vec<Accepted> = [&o1, &o2, &o3].iter().map(|a| a.accepted()).collect();
    env.finish(&accepted).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_order_id_twice_in_a_batch_is_one_use_whatever_order_the_rows_come_back_in() {
    let env = FlashStack::start().await;
    let app = env.app();
    app.given_voucher(flash_voucher("TWA", 5, 1)).await;
    app.given_voucher(flash_voucher("TWB", 5, 1)).await;
    let store = Store::new(env.pool.clone());
    let use_of = |code: &str, customer: &str, amount: i64| Reservation {
        order_id: OrderId::parse("twice").expect("order"),
        voucher_code: VoucherCode::parse(code).expect("code"),
        customer_id: CustomerId::parse(customer).expect("customer"),
        order_amount: Money::positive("orderAmount", amount).expect("money"),
        discount_amount: Money::positive("discountAmount", 100_000).expect("money"),
        status: ReservationStatus::Reserved,
        reserved_at: chrono::Utc::now(),
        expires_at: chrono::Utc::now() + chrono::Duration::minutes(15),
    };
    // Both orders of the batch, in both orders: one is inserted, the other refused, and
    // which is which is read from the stored row.
    for batch in [
        [use_of("TWA", "c1", 200_000), use_of("TWB", "c1", 200_000)],
        [use_of("TWB", "c1", 200_000), use_of("TWA", "c1", 200_000)],
    ] {
        // Each pass starts from no row and no use counted.
        sqlx::raw_sql(
            "DELETE FROM redemptions WHERE order_id = 'twice';
             UPDATE vouchers SET used_count = 0;
             DELETE FROM customer_usage;",
        )
        .execute(&env.pool)
        .await
        .expect("reset");
        let result = store
            .record_decided(&batch, &[0, 0])
            .await
            .map(done)
            .expect("recorded");
        assert_eq!(result.inserted, 1, "{result:?}");
        assert_eq!(result.refused.len(), 1, "{result:?}");
        let stored: String =
            sqlx::query_scalar("SELECT voucher_code FROM redemptions WHERE order_id = 'twice'")
                .fetch_one(&env.pool)
                .await
                .expect("row");
        let (refused, _) = &result.refused[0];
        assert_ne!(batch[*refused].voucher_code.as_str(), stored, "{result:?}");
    }
    // A repeat is answered with the stored row (its status included); another amount for
    // the same orderId is refused.
    sqlx::query(
        "UPDATE redemptions SET status = 'RELEASED', released_at = now() WHERE order_id = 'twice'",
    )
    .execute(&env.pool)
    .await
    .expect("release");
    let stored: String =
        sqlx::query_scalar("SELECT voucher_code FROM redemptions WHERE order_id = 'twice'")
            .fetch_one(&env.pool)
            .await
            .expect("row");
    let again = store
        .record_decided(
            &[
                use_of(&stored, "c1", 200_000),
                use_of(&stored, "c1", 200_001),
            ],
            &[0, 0],
        )
        .await
        .map(done)
        .expect("recorded");
    assert_eq!(again.inserted, 0, "{again:?}");
    assert_eq!(again.repeats.len(), 1, "{again:?}");
    assert_eq!(again.repeats[0].1.status, ReservationStatus::Released);
    assert_eq!(again.refused.len(), 1, "{again:?}");
    assert_eq!(again.refused[0].0, 1, "{again:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn uses_a_gate_holds_beyond_postgresql_are_given_back_and_the_stock_sells_out() {
    let env = FlashStack::builder()
        .start_with(|s| s.flash.decision = Decision::Database)
        .await;
    let app = env.app();
    app.given_voucher(flash_voucher("SURP", 10, 1)).await;
    let first = Sale::new("SURP", "first", 7).run(app).await;
    assert_eq!(first.created(), 7);
    // The gate loses three uses with no record behind them (what a snapshot older than
    // three releases does to its count): it says sold out with three unsold.
    uses_appear(&env, "SURP", -3).await;
    let refused = Sale::new("SURP", "refused", 3).run(app).await;
    assert_eq!(refused.count(StatusCode::CONFLICT, "OUT_OF_STOCK"), 3);

    let reconciler = reconciler(&env);
    let round = || async {
        let reports = reconciler.run_once().await.expect("round runs");
        reports[0].1.clone().expect("caught up and loaded")
    };
    let report = round().await;
    assert_eq!(
        (report.repaired_surplus, report.drift),
        (0, 3),
        "{report:?}"
    );
    // A release between two rounds: the voucher was not quiet, so nothing is given back
    // yet (on a busy voucher a release in flight looks like a surplus for a round).
    let released = first.accepted()[0].order_id.clone();
    assert_eq!(
        app.release("SURP", &released).await.status(),
        StatusCode::OK
    );
    let report = round().await;
    assert_eq!(
        (report.repaired_surplus, report.drift),
        (0, 3),
        "{report:?}"
    );
    // Quiet since: the surplus is given back.
    let report = round().await;
    assert_eq!(
        (report.repaired_surplus, report.drift),
        (3, 0),
        "{report:?}"
    );

    let last = Sale::new("SURP", "last", 5).run(app).await;
    assert_eq!(last.created(), 4);
    assert_eq!(last.count(StatusCode::CONFLICT, "OUT_OF_STOCK"), 1);
    assert_eq!(env.rows("SURP").await, 11);
    let mut accepted = first.accepted();
    accepted.extend(last.accepted());
    env.finish(&accepted).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_order_postgresql_refused_is_free_for_another_voucher() {
    let env = FlashStack::builder()
        .start_with(|s| s.flash.decision = Decision::Database)
        .await;
    let app = env.app();
    app.given_voucher(flash_voucher("UNA", 2, 1)).await;
    app.given_voucher(flash_voucher("UNB", 5, 1)).await;
    let sale = Sale::new("UNA", "una", 2).run(app).await;
    assert_eq!(sale.created(), 2);
    // A gate back in time lets one more through; PostgreSQL refuses it, and nothing of
    // the order is held anywhere (no claim key: PostgreSQL decides).
    uses_appear(&env, "UNA", 1).await;
    let refused = app.attempt("UNA", "x1", "free-order", 100_000).await;
    assert_eq!(
        (refused.status, refused.code()),
        (StatusCode::CONFLICT, "OUT_OF_STOCK")
    );
    let elsewhere = app.attempt("UNB", "x1", "free-order", 100_000).await;
    assert_eq!(
        elsewhere.status,
        StatusCode::CREATED,
        "{:?}",
        elsewhere.body
    );

    let reconciler = reconciler(&env);
    reconciler.run_once().await.expect("round runs");
    reconciler.run_once().await.expect("round runs");
    let mut accepted = sale.accepted();
    accepted.push(elsewhere.accepted());
    env.finish(&accepted).await;
}

/// Reconciliation rounds until one reports no drift (at most `rounds`); the reports.
async fn rounds_until_in_step(env: &FlashStack, rounds: usize) -> Vec<VoucherReport> {
    let reconciler = reconciler(env);
    let mut reports = Vec::new();
    for _ in 0..rounds {
        let all = reconciler.run_once().await.expect("round runs");
        let report = all[0].1.clone().expect("caught up and loaded");
        let in_step = report.drift == 0;
        reports.push(report);
        if in_step {
            break;
        }
    }
    reports
}

/// A core paused (or a commit held up) longer than the grace: reconciliation gives back
/// the pending use it finds without a row, and then the commit lands — a 201 the gate no
/// longer counts. Reconciliation takes that use off again (the gate counts fewer uses than
/// PostgreSQL), the later release finds no record to give back, which leaves the gate a
/// use short, and reconciliation gives that back too. The stock still sells out exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_commit_that_lands_after_reconciliation_forgot_its_use_is_counted_and_its_release_given_back(
) {
    let env = FlashStack::builder()
        .start_with(|s| {
            s.flash.decision = Decision::Database;
            s.flash.reconcile_grace = Duration::from_secs(1);
        })
        .await;
    let app = env.app();
    app.given_voucher(flash_voucher("LATE", 3, 1)).await;
    let code = VoucherCode::parse("LATE").expect("code");
    eventually(
        Duration::from_secs(30),
        "the gate of LATE loaded",
        || async { env.gate.remaining(&code).await.ok().flatten() },
    )
    .await;

    // The voucher's row held: the recorder's statement is sent and waits on it, as the
    // statement of a core paused right after sending it would be.
    let (mut blocker, held) = reservation_held_on_its_row(&env, "LATE", "late", "late-1").await;

    // Past the grace with no row: reconciliation gives the pending use back.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let reconciler = reconciler(&env);
    let reports = reconciler.run_once().await.expect("round runs");
    let report = reports[0].1.clone().expect("caught up and loaded");
    assert_eq!(report.forgotten, 1, "{report:?}");
    assert_eq!(env.gate.remaining(&code).await.expect("redis"), Some(3));

    // The commit lands after all (the gate's generation is unchanged: the fence lets it).
    sqlx::query("COMMIT")
        .execute(&mut blocker)
        .await
        .expect("row let go");
    let first = held.await.expect("request ran");
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    assert_eq!(env.rows("LATE").await, 1);
    // A 201 the gate no longer counts.
    assert_eq!(env.gate.remaining(&code).await.expect("redis"), Some(3));

    // The gate counts a use fewer than PostgreSQL: taken off.
    let reports = rounds_until_in_step(&env, 5).await;
    assert_eq!(reports.last().map(|r| r.drift), Some(0), "{reports:?}");
    assert_eq!(
        reports.iter().map(|r| r.repaired).sum::<i64>(),
        1,
        "{reports:?}"
    );
    assert_eq!(env.gate.remaining(&code).await.expect("redis"), Some(2));
    // The holder's retry is told the row and takes no second use.
    let told = replay(&env, "LATE", "late", "late-1").await;
    assert_eq!(told["status"], "RESERVED", "{told}");
    assert_eq!(env.gate.remaining(&code).await.expect("redis"), Some(2));

    // Its release gives the use back in PostgreSQL; the gate has no record of it (ABSENT)
    // and keeps the use: a use too many, which reconciliation gives back.
    assert_eq!(record_state(&env, "LATE", "late-1").await, None);
    assert_eq!(app.release("LATE", "late-1").await.status(), StatusCode::OK);
    assert_eq!(env.gate.remaining(&code).await.expect("redis"), Some(2));
    let reports = rounds_until_in_step(&env, 5).await;
    assert_eq!(reports.last().map(|r| r.drift), Some(0), "{reports:?}");
    assert_eq!(
        reports.iter().map(|r| r.repaired_surplus).sum::<i64>(),
        1,
        "{reports:?}"
    );
    assert_eq!(env.gate.remaining(&code).await.expect("redis"), Some(3));

    let sale = Sale::new("LATE", "after", 4).run(app).await;
    assert_eq!(sale.created(), 3);
    assert_eq!(sale.count(StatusCode::CONFLICT, "OUT_OF_STOCK"), 1);
    let mut accepted = sale.accepted();
    accepted.push(Accepted::new("LATE", "late", "late-1"));
    env.finish(&accepted).await;
}

/// A gate restored from an older snapshot is open, so a load that starts then (a core
/// that found it missing a moment before) adopts it instead of reading PostgreSQL
/// (`load_begin.lua` answers LOADED and the gate takes the new generation). What it holds
/// wrongly is corrected all the same: reconciliation gives back the use of an order
/// PostgreSQL released, replays answer PostgreSQL's rows, and the stock sells out exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restored_gate_that_a_load_adopts_is_brought_in_step() {
    let env = FlashStack::builder()
        .start_with(|s| s.flash.decision = Decision::Database)
        .await;
    let app = env.app();
    app.given_voucher(flash_voucher("ADOPT", 5, 1)).await;
    let code = VoucherCode::parse("ADOPT").expect("code");
    let first = Sale::new("ADOPT", "first", 3).run(app).await;
    assert_eq!(first.created(), 3);
    let orders: Vec<String> = first
        .accepted()
        .iter()
        .map(|a| a.order_id.clone())
        .collect();
    let customers: Vec<String> = first
        .accepted()
        .iter()
        .map(|a| a.customer_id.clone())
        .collect();
    let saved = save_gate(env.key_prefix(), "ADOPT").await;
    assert_eq!(
        app.release("ADOPT", &orders[0]).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        app.confirm("ADOPT", &orders[1]).await.status(),
        StatusCode::OK
    );

    // Back to before the release and the confirm, and a load finds it open.
    saved.restore().await;
    assert_eq!(env.gate.remaining(&code).await.expect("redis"), Some(2));
    let store = Store::new(env.pool.clone());
    let voucher = store.voucher(&code).await.expect("voucher");
    let outcome = crate::gate_load::flash_path(&env)
        .load_from_database(&voucher)
        .await
        .expect("load ran");
    assert_eq!(outcome, voucher_core::flash::Rebuild::AlreadyLoaded);
    assert_eq!(
        env.gate.remaining(&code).await.expect("redis"),
        Some(2),
        "adopted, not reloaded"
    );

    // Reconciliation: the released order's use comes back (two quiet rounds agree).
    let reports = rounds_until_in_step(&env, 5).await;
    assert_eq!(reports.last().map(|r| r.drift), Some(0), "{reports:?}");
    assert_eq!(env.gate.remaining(&code).await.expect("redis"), Some(3));
    let released = replay(&env, "ADOPT", &customers[0], &orders[0]).await;
    assert_eq!(released["status"], "RELEASED", "{released}");
    let confirmed = replay(&env, "ADOPT", &customers[1], &orders[1]).await;
    assert_eq!(confirmed["status"], "CONFIRMED", "{confirmed}");
    let held = replay(&env, "ADOPT", &customers[2], &orders[2]).await;
    assert_eq!(held["status"], "RESERVED", "{held}");

    let last = Sale::new("ADOPT", "last", 4).run(app).await;
    assert_eq!(last.created(), 3);
    assert_eq!(last.count(StatusCode::CONFLICT, "OUT_OF_STOCK"), 1);
    assert_eq!(env.rows("ADOPT").await, 6);
    let mut accepted = first.accepted();
    accepted.extend(last.accepted());
    env.finish(&accepted).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refusals_and_retries_looked_up_together_each_get_their_own_row() {
    let env = FlashStack::builder()
        .start_with(|s| s.flash.decision = Decision::Database)
        .await;
    let app = env.app();
    app.given_voucher(flash_voucher("LOOK", 20, 1)).await;
    let mut accepted = Vec::new();
    for i in 0..20 {
        let sold = app
            .attempt("LOOK", &format!("c{i}"), &format!("look-{i}"), 100_000)
            .await;
        assert_eq!(sold.status, StatusCode::CREATED, "{:?}", sold.body);
        accepted.push(sold.accepted());
    }
    // Sold out. Twenty retries and twenty new orders at once: each is checked against
    // PostgreSQL, the lookups grouped into shared statements. Each retry gets its own row,
    // each new order the refusal.
    let (env_ref, app_ref) = (&env, &app);
    let retries = (0..20).map(|i| async move {
        let body = replay(env_ref, "LOOK", &format!("c{i}"), &format!("look-{i}")).await;
        (i, body)
    });
    let newcomers = (0..20).map(|i| async move {
        let app = app_ref;
        let answer = app
            .reserve("LOOK", &format!("n{i}"), &format!("new-{i}"), 100_000)
            .await;
        assert_error(answer, StatusCode::CONFLICT, "OUT_OF_STOCK").await;
    });
    let (replayed, _) = tokio::join!(
        futures::future::join_all(retries),
        futures::future::join_all(newcomers)
    );
    for (i, body) in replayed {
        assert_eq!(body["orderId"], format!("look-{i}"), "{body}");
        assert_eq!(body["customerId"], format!("c{i}"), "{body}");
        assert_eq!(body["status"], "RESERVED", "{body}");
    }
    assert_eq!(env.rows("LOOK").await, 20);
    env.finish(&accepted).await;
}
