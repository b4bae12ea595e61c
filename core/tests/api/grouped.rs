//! A group of reservations decided by one statement (`Store::record_decided`): the
//! voucher's and each customer's limits are applied in arrival order inside it, so a batch
//! that holds more than fits is never replayed one reservation per transaction; the CHECKs
//! stay the last guard when that decision and a constraint disagree.

use voucher_core::domain::{
    CustomerId, Money, OrderId, Reservation, ReservationStatus, VoucherCode,
};
use voucher_core::store::Store;

use crate::flash::done;
use crate::helpers::{voucher_body, TestEnv};

fn use_of(code: &str, order: &str, customer: &str) -> Reservation {
    Reservation {
        order_id: OrderId::parse(order).expect("order"),
        voucher_code: VoucherCode::parse(code).expect("code"),
        customer_id: CustomerId::parse(customer).expect("customer"),
        order_amount: Money::positive("orderAmount", 200_000).expect("money"),
        discount_amount: Money::positive("discountAmount", 100_000).expect("money"),
        status: ReservationStatus::Reserved,
        reserved_at: chrono::Utc::now(),
        expires_at: chrono::Utc::now() + chrono::Duration::minutes(15),
    }
}

async fn used_count(env: &TestEnv, code: &str) -> i32 {
    sqlx::query_scalar("SELECT used_count FROM vouchers WHERE code = $1")
        .bind(code)
        .fetch_one(&env.pool)
        .await
        .expect("count")
}

/// Six reservations for three uses, two per customer: the first that fit are written, the
/// customer's third and everything past the limit are refused by the names of the
/// constraints they would break, all in one transaction.
#[tokio::test]
async fn a_batch_past_its_limits_is_decided_in_one_statement_in_arrival_order() {
    let env = TestEnv::start().await;
    env.app.given_voucher(voucher_body("GROUP", 3, 2)).await;
    let store = Store::new(env.pool.clone());
    let batch = [
        use_of("GROUP", "g-1", "c1"),
        use_of("GROUP", "g-2", "c1"),
        use_of("GROUP", "g-3", "c1"),
        use_of("GROUP", "g-4", "c2"),
        use_of("GROUP", "g-5", "c3"),
        use_of("GROUP", "g-6", "c4"),
    ];
    let result = store
        .record_decided(&batch, &[])
        .await
        .map(done)
        .expect("recorded");
    assert_eq!(result.inserted, 3, "{result:?}");
    // The statement that writes the batch as it is (what a flash gate decided fits) is
    // refused by a CHECK; the one that decides it reservation by reservation writes it.
    assert_eq!(result.transactions, 2, "{result:?}");
    let mut refused = result.refused.clone();
    refused.sort();
    assert_eq!(
        refused,
        vec![
            (2, "customer_usage_within_limit".to_owned()),
            (4, "vouchers_used_within_limit".to_owned()),
            (5, "vouchers_used_within_limit".to_owned()),
        ],
        "{result:?}"
    );
    assert_eq!(used_count(&env, "GROUP").await, 3);
    // The same batch again, on a voucher sold out now: the three written are repeats,
    // answered from their rows; the rest are refused as sold out, which the statement that
    // writes the batch as it is sees on the voucher's row (no CHECK refuses it, one
    // transaction); nothing more is counted.
    let again = store
        .record_decided(&batch, &[])
        .await
        .map(done)
        .expect("recorded");
    assert_eq!((again.inserted, again.duplicates), (0, 3), "{again:?}");
    let mut repeated: Vec<usize> = again.repeats.iter().map(|(i, _)| *i).collect();
    repeated.sort_unstable();
    assert_eq!(repeated, vec![0, 1, 3], "{again:?}");
    let mut refused_again = again.refused.clone();
    refused_again.sort();
    assert_eq!(
        refused_again,
        [2, 4, 5].map(|i| (i, "vouchers_used_within_limit".to_owned())),
        "{again:?}"
    );
    assert_eq!(again.transactions, 1, "{again:?}");
    assert_eq!(used_count(&env, "GROUP").await, 3);
    env.finish(&[]).await;
}

/// When the statement's decision and a CHECK disagree (here a customer's row copied a lower
/// limit than the voucher's, as no code path writes), the constraint wins: the batch is
/// decided again, then recorded one by one, and the customer past its row's limit is
/// refused while the others are written.
#[tokio::test]
async fn the_checks_still_refuse_what_the_statement_would_have_let_through() {
    let env = TestEnv::start().await;
    env.app.given_voucher(voucher_body("GUARDED", 5, 2)).await;
    let store = Store::new(env.pool.clone());
    store
        .record_decided(&[use_of("GUARDED", "h-1", "c1")], &[])
        .await
        .map(done)
        .expect("recorded");
    sqlx::query("UPDATE customer_usage SET per_user_limit = 1 WHERE voucher_code = 'GUARDED'")
        .execute(&env.pool)
        .await
        .expect("lower the row's copy");
    let result = store
        .record_decided(
            &[
                use_of("GUARDED", "h-2", "c1"),
                use_of("GUARDED", "h-3", "c2"),
            ],
            &[],
        )
        .await
        .map(done)
        .expect("recorded");
    assert_eq!(result.inserted, 1, "{result:?}");
    assert_eq!(
        result.refused,
        vec![(0, "customer_usage_within_limit".to_owned())],
        "{result:?}"
    );
    // Three statements that the CHECK refused (the batch as it is, then decided twice),
    // then one transaction per reservation.
    assert_eq!(result.transactions, 5, "{result:?}");
    assert_eq!(used_count(&env, "GUARDED").await, 2);
    env.finish(&[]).await;
}

/// Standard mode over HTTP: twenty reservations held behind the voucher's row (the first
/// group's statement waits on it, the rest queue) are decided in two statements, not
/// twenty transactions; exactly the limit is issued, a concurrent retry of one order is
/// one use with one body, and PostgreSQL's clock sets every reservation's times.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_standard_reservations_are_decided_in_groups() {
    use std::time::Duration;

    use reqwest::StatusCode;
    use sqlx::Connection;
    use voucher_testkit::helpers::ApiClient;
    use voucher_testkit::locks::{lock_voucher_row, until_waiting_on_locks};
    use voucher_testkit::sale::accepted;
    use voucher_testkit::wait::eventually;

    let env = TestEnv::start().await;
    env.app.given_voucher(voucher_body("GROUPED", 12, 1)).await;
    let blocker = lock_voucher_row(&env.db.url, "GROUPED").await;
    let send = |customer: String, order: String| {
        let api = ApiClient::new(env.app.api.base.clone());
        tokio::spawn(async move { api.attempt("GROUPED", &customer, &order, 100_000).await })
    };
    // The first group: one reservation, sent alone and held on the row.
    let mut sent = vec![send("gc17".to_owned(), "go17".to_owned())];
    until_waiting_on_locks(&env.pool, 1, "the first group to wait on the row").await;
    // The rest, among them one order sent three times at once (a client's retries).
    let mut orders: Vec<(String, String)> = (0..17)
        .map(|i| (format!("gc{i}"), format!("go{i}")))
        .collect();
    orders.extend((0..2).map(|_| ("gc0".to_owned(), "go0".to_owned())));
    sent.extend(orders.into_iter().map(|(c, o)| send(c, o)));
    eventually(
        Duration::from_secs(20),
        "the other nineteen queued behind the first group",
        || async {
            let m = env.app.metrics().await;
            let queued = m.sum("voucher_group_queued", &[("mode", "standard")]);
            (queued == 19.0).then_some(())
        },
    )
    .await;
    blocker.close().await.expect("row let go");
    let mut attempts = Vec::new();
    for s in sent {
        attempts.push(s.await.expect("reservation"));
    }

    let created: Vec<_> = attempts
        .iter()
        .filter(|a| a.status == StatusCode::CREATED)
        .collect();
    let sold_out: std::collections::BTreeSet<&str> = attempts
        .iter()
        .filter(|a| a.status == StatusCode::CONFLICT && a.body["error"] == "OUT_OF_STOCK")
        .map(|a| a.order.as_str())
        .collect();
    // 18 orders for 12 uses: 12 issued, 6 sold out, every attempt one or the other (the
    // order sent three times is answered alike each time, whichever it is).
    let distinct: std::collections::BTreeSet<&str> = created
        .iter()
        .filter_map(|a| a.body["orderId"].as_str())
        .collect();
    assert_eq!((distinct.len(), sold_out.len()), (12, 6), "{attempts:#?}");
    assert!(distinct.is_disjoint(&sold_out), "{attempts:#?}");
    let first_order: Vec<_> = attempts.iter().filter(|a| a.order == "go0").collect();
    assert!(
        first_order.iter().all(|a| a.body == first_order[0].body),
        "every attempt of one order gets one body: {first_order:#?}"
    );
    assert_eq!(env.app.voucher_json("GROUPED").await["usedCount"], 12);
    // Times are PostgreSQL's: reserved within this test, expiring one TTL later.
    let (reserved, expires): (chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>) =
        sqlx::query_as("SELECT reserved_at, expires_at FROM redemptions WHERE order_id = $1")
            .bind(created[0].order.as_str())
            .fetch_one(&env.pool)
            .await
            .expect("row");
    assert_eq!(expires - reserved, chrono::Duration::minutes(15));
    let metrics = env.app.metrics().await;
    let statements = metrics.sum("voucher_group_size_count", &[("mode", "standard")]);
    assert_eq!(
        metrics.sum("voucher_group_size_sum", &[("mode", "standard")]),
        20.0
    );
    // The first group, and the one that queued behind it.
    assert_eq!(statements, 2.0);
    // The first group (one use of twelve) fits; the second crosses the limit, so it is
    // written as it is, refused by the CHECK, then decided reservation by reservation.
    assert_eq!(
        metrics.sum("voucher_group_transactions_total", &[("mode", "standard")]),
        3.0
    );
    env.finish(&accepted(&attempts)).await;
}

/// The deciding statement judges by its snapshot, taken before it waits for the voucher's
/// row: an order that another core commits meanwhile, taking the last use, is answered
/// from its row (a repeat), never refused as sold out (which, in flash mode, would give
/// back a use PostgreSQL holds). Standard mode's groups are decided by that statement
/// from the start.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_order_committed_elsewhere_while_its_batch_waited_is_a_repeat_not_a_refusal() {
    use sqlx::Connection;
    use voucher_testkit::locks::{lock_voucher_row, until_waiting_on_locks};

    let env = TestEnv::start().await;
    env.app.given_voucher(voucher_body("LAST", 1, 1)).await;
    let store = Store::new(env.pool.clone());
    let order = use_of("LAST", "last-1", "c1");
    // Another core's transaction, holding the voucher's row.
    let mut elsewhere = lock_voucher_row(&env.db.url, "LAST").await;
    let waiting = {
        let (store, order) = (store.clone(), order.clone());
        tokio::spawn(async move {
            let mut writer = store.decided_writer();
            writer
                .reserve_standard(&[order], chrono::Duration::minutes(15))
                .await
        })
    };
    until_waiting_on_locks(&env.pool, 1, "the batch to wait on the voucher's row").await;
    // That transaction commits the same order, and the voucher's last use, first.
    sqlx::raw_sql(
        "INSERT INTO redemptions (voucher_code, customer_id, order_id, order_amount,
                                  discount_amount, expires_at)
         VALUES ('LAST', 'c1', 'last-1', 200000, 100000, now() + interval '15 minutes');
         INSERT INTO customer_usage VALUES ('LAST', 'c1', 1, 1);
         UPDATE vouchers SET used_count = 1 WHERE code = 'LAST';
         COMMIT;",
    )
    .execute(&mut elsewhere)
    .await
    .expect("committed elsewhere");
    elsewhere.close().await.expect("closed");

    let result = waiting.await.expect("batch").map(done).expect("recorded");
    assert_eq!((result.inserted, result.duplicates), (0, 1), "{result:?}");
    assert!(result.refused.is_empty(), "{result:?}");
    assert_eq!(result.repeats[0].1.order_id.as_str(), "last-1");
    assert_eq!(used_count(&env, "LAST").await, 1);
    env.finish(&[]).await;
}

/// PostgreSQL losing a group's session mid-statement (a failover, a killed backend): every
/// reservation of that group gets 503 and took nothing, so its retry is a new reservation;
/// the groups queued behind it are decided on a new connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_group_whose_session_dies_mid_statement_answers_503_and_loses_nothing() {
    use reqwest::StatusCode;
    use sqlx::Connection;
    use voucher_testkit::helpers::ApiClient;
    use voucher_testkit::locks::{lock_voucher_row, until_waiting_on_locks};
    use voucher_testkit::sale::accepted;

    let env = TestEnv::start().await;
    env.app.given_voucher(voucher_body("CUT", 10, 1)).await;
    let blocker = lock_voucher_row(&env.db.url, "CUT").await;
    let sent: Vec<_> = (0..3)
        .map(|i| {
            let api = ApiClient::new(env.app.api.base.clone());
            tokio::spawn(async move {
                api.attempt("CUT", &format!("cut-c{i}"), &format!("cut-o{i}"), 100_000)
                    .await
            })
        })
        .collect();
    until_waiting_on_locks(&env.pool, 1, "the first group to wait on the row").await;
    let killed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE wait_event_type = 'Lock' AND datname = current_database()) t",
    )
    .fetch_one(&env.pool)
    .await
    .expect("terminated");
    assert_eq!(killed, 1);
    blocker.close().await.expect("row let go");
    let mut attempts = Vec::new();
    for s in sent {
        attempts.push(s.await.expect("reservation"));
    }
    assert!(
        attempts
            .iter()
            .all(|a| a.status == StatusCode::CREATED || a.status == StatusCode::SERVICE_UNAVAILABLE),
        "{attempts:#?}"
    );
    let cut: Vec<_> = attempts
        .iter()
        .filter(|a| a.status == StatusCode::SERVICE_UNAVAILABLE)
        .map(|a| (a.customer.clone(), a.order.clone()))
        .collect();
    assert!(
        !cut.is_empty(),
        "the killed group's waiters get 503: {attempts:#?}"
    );
    // Nothing of the killed group was written: no row, no use counted; each retry takes a
    // new use.
    let orders: Vec<&str> = cut.iter().map(|(_, o)| o.as_str()).collect();
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM redemptions WHERE order_id = ANY($1)")
        .bind(&orders)
        .fetch_one(&env.pool)
        .await
        .expect("rows");
    assert_eq!(rows, 0);
    assert_eq!(
        env.app.voucher_json("CUT").await["usedCount"],
        (3 - cut.len()) as i64
    );
    for (customer, order) in &cut {
        let retry = env.app.attempt("CUT", customer, order, 100_000).await;
        assert_eq!(retry.status, StatusCode::CREATED, "{retry:?}");
        attempts.push(retry);
    }
    assert_eq!(env.app.voucher_json("CUT").await["usedCount"], 3);
    env.finish(&accepted(&attempts)).await;
}
