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
    assert_eq!(result.transactions, 1, "{result:?}");
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
    // The same batch again: the three written are repeats, answered from their rows; the
    // rest are still refused; nothing more is counted.
    let again = store
        .record_decided(&batch, &[])
        .await
        .map(done)
        .expect("recorded");
    assert_eq!((again.inserted, again.duplicates), (0, 3), "{again:?}");
    let mut repeated: Vec<usize> = again.repeats.iter().map(|(i, _)| *i).collect();
    repeated.sort_unstable();
    assert_eq!(repeated, vec![0, 1, 3], "{again:?}");
    assert_eq!(again.refused.len(), 3, "{again:?}");
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
            &[use_of("GUARDED", "h-2", "c1"), use_of("GUARDED", "h-3", "c2")],
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
    // Three statements that the CHECK refused, then one transaction per reservation.
    assert_eq!(result.transactions, 5, "{result:?}");
    assert_eq!(used_count(&env, "GUARDED").await, 2);
    env.finish(&[]).await;
}
