//! Reserve, confirm and release: every row of the API table, one call at a time.

use crate::invariants::Accepted;
use chrono::{Duration, Utc};
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::{rfc3339, voucher_body, TestEnv};

#[tokio::test]
async fn reserve_returns_201_with_discount_and_expiry() {
    let env = TestEnv::start().await;
    env.app.given_voucher(voucher_body("V", 10, 1)).await;

    let before = Utc::now();
    let resp = env.app.reserve("V", "c1", "o1", 250_000).await;

    assert_eq!(resp.status(), StatusCode::CREATED);
    assert!(resp.headers().get("idempotent-replayed").is_none());
    let body: Value = resp.json().await.expect("json");
    assert_eq!(body["orderId"], "o1");
    assert_eq!(body["voucherCode"], "V");
    assert_eq!(body["customerId"], "c1");
    assert_eq!(body["discountAmount"], 100_000);
    assert_eq!(body["status"], "RESERVED");
    let expires: chrono::DateTime<Utc> = body["expiresAt"]
        .as_str()
        .expect("expiresAt")
        .parse()
        .expect("RFC 3339");
    let ttl = expires - before;
    assert!(
        ttl > Duration::minutes(14) && ttl <= Duration::minutes(15) + Duration::seconds(5),
        "default TTL is 15 minutes, got {ttl}"
    );
    let voucher = env.app.voucher_json("V").await;
    assert_eq!(
        (
            voucher["usedCount"].as_i64(),
            voucher["remaining"].as_i64(),
            voucher["reserved"].as_i64()
        ),
        (Some(1), Some(9), Some(1))
    );
    env.finish(&[Accepted::new("V", "c1", "o1")]).await;
}

/// A client that hangs up as soon as it has sent its reservation does not cut the request
/// short: the core finishes it, so the use is held, and the client's retry gets that
/// reservation back as a replay instead of a second use.
#[tokio::test]
async fn a_client_that_hangs_up_after_sending_still_gets_its_reservation_on_retry() {
    use tokio::io::AsyncWriteExt;
    use voucher_testkit::wait::eventually;

    let env = TestEnv::start().await;
    env.app.given_voucher(voucher_body("HUP", 10, 1)).await;
    let body = json!({"customerId": "c1", "orderId": "hup-1", "orderAmount": 250_000}).to_string();
    let mut stream = tokio::net::TcpStream::connect(env.app.address())
        .await
        .expect("connected");
    let request = format!(
        "POST /vouchers/HUP/reservations HTTP/1.1\r\nHost: core\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.expect("sent");
    drop(stream);

    eventually(
        std::time::Duration::from_secs(5),
        "the abandoned request's use",
        || async {
            let voucher = env.app.voucher_json("HUP").await;
            (voucher["usedCount"].as_i64() == Some(1)).then_some(())
        },
    )
    .await;
    let retry = env.app.reserve("HUP", "c1", "hup-1", 250_000).await;
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(env.app.voucher_json("HUP").await["usedCount"], 1);
    env.finish(&[Accepted::new("HUP", "c1", "hup-1")]).await;
}

#[tokio::test]
async fn discount_never_exceeds_the_order() {
    let env = TestEnv::start().await;
    let mut body = voucher_body("BIG", 10, 1);
    body["minOrderAmount"] = json!(0);
    env.app.given_voucher(body).await;

    let resp = env.app.reserve("BIG", "c1", "o1", 30_000).await;

    assert_eq!(resp.status(), StatusCode::CREATED);
    assert_eq!(
        resp.json::<Value>().await.expect("json")["discountAmount"],
        30_000
    );
    env.finish(&[Accepted::new("BIG", "c1", "o1")]).await;
}

#[tokio::test]
async fn a_retry_gets_the_same_201_and_consumes_nothing_even_after_sell_out() {
    let env = TestEnv::start().await;
    env.app.given_voucher(voucher_body("ONE", 1, 1)).await;
    let first = env.app.reserve("ONE", "c1", "o1", 100_000).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let first: Value = first.json().await.expect("json");

    let sold_out = env.app.reserve("ONE", "c2", "o2", 100_000).await;
    let retry = env.app.reserve("ONE", "c1", "o1", 100_000).await;

    assert_eq!(sold_out.status(), StatusCode::CONFLICT);
    assert_eq!(
        sold_out.json::<Value>().await.expect("json")["error"],
        "OUT_OF_STOCK"
    );
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(retry.json::<Value>().await.expect("json"), first);
    assert_eq!(env.app.voucher_json("ONE").await["usedCount"], 1);
    env.finish(&[Accepted::new("ONE", "c1", "o1")]).await;
}

#[tokio::test]
async fn the_same_order_id_for_another_request_is_a_conflict_not_a_use() {
    let env = TestEnv::start().await;
    env.app.given_voucher(voucher_body("A", 10, 5)).await;
    env.app.given_voucher(voucher_body("B", 10, 5)).await;
    assert_eq!(
        env.app.reserve("A", "c1", "o1", 100_000).await.status(),
        StatusCode::CREATED
    );

    let other_customer = env.app.reserve("A", "c2", "o1", 100_000).await;
    let other_voucher = env.app.reserve("B", "c1", "o1", 100_000).await;
    let other_amount = env.app.reserve("A", "c1", "o1", 100_001).await;

    for resp in [other_customer, other_voucher, other_amount] {
        assert_eq!(resp.status(), StatusCode::CONFLICT);
        assert_eq!(
            resp.json::<Value>().await.expect("json")["error"],
            "ORDER_ID_CONFLICT"
        );
    }
    assert_eq!(env.app.voucher_json("A").await["usedCount"], 1);
    assert_eq!(env.app.voucher_json("B").await["usedCount"], 0);
    env.finish(&[Accepted::new("A", "c1", "o1")]).await;
}

#[tokio::test]
async fn a_customer_at_its_limit_gets_409_already_used() {
    let env = TestEnv::start().await;
    env.app.given_voucher(voucher_body("V", 10, 1)).await;
    assert_eq!(
        env.app.reserve("V", "c1", "o1", 100_000).await.status(),
        StatusCode::CREATED
    );

    let second = env.app.reserve("V", "c1", "o2", 100_000).await;

    assert_eq!(second.status(), StatusCode::CONFLICT);
    assert_eq!(
        second.json::<Value>().await.expect("json")["error"],
        "ALREADY_USED"
    );
    env.finish(&[Accepted::new("V", "c1", "o1")]).await;
}

#[tokio::test]
async fn ineligible_orders_get_422_with_a_reason() {
    let env = TestEnv::start().await;
    let now = Utc::now();
    env.app.given_voucher(voucher_body("NOW", 10, 1)).await;
    let mut later = voucher_body("LATER", 10, 1);
    later["startsAt"] = json!(rfc3339(now + Duration::hours(1)));
    later["endsAt"] = json!(rfc3339(now + Duration::hours(2)));
    env.app.given_voucher(later).await;
    let mut past = voucher_body("PAST", 10, 1);
    past["startsAt"] = json!(rfc3339(now - Duration::hours(2)));
    past["endsAt"] = json!(rfc3339(now - Duration::hours(1)));
    env.app.given_voucher(past).await;

    let cases = [
        (
            env.app.reserve("LATER", "c1", "o1", 100_000).await,
            "NOT_STARTED",
        ),
        (
            env.app.reserve("PAST", "c1", "o2", 100_000).await,
            "EXPIRED",
        ),
        (
            env.app.reserve("NOW", "c1", "o3", 49_999).await,
            "BELOW_MIN_ORDER",
        ),
    ];

    for (resp, reason) in cases {
        assert_eq!(resp.status(), StatusCode::UNPROCESSABLE_ENTITY, "{reason}");
        let err: Value = resp.json().await.expect("json");
        assert_eq!(
            (err["error"].as_str(), err["reason"].as_str()),
            (Some("NOT_ELIGIBLE"), Some(reason))
        );
    }
    assert_eq!(env.app.voucher_json("NOW").await["usedCount"], 0);
    env.finish(&[]).await;
}

#[tokio::test]
async fn reserving_an_unknown_voucher_is_404() {
    let env = TestEnv::start().await;

    let resp = env.app.reserve("GHOST", "c1", "o1", 100_000).await;

    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    assert_eq!(
        resp.json::<Value>().await.expect("json")["error"],
        "VOUCHER_NOT_FOUND"
    );
    env.finish(&[]).await;
}

#[tokio::test]
async fn confirm_is_idempotent_and_a_confirmed_use_cannot_be_released() {
    let env = TestEnv::start().await;
    env.app.given_voucher(voucher_body("V", 10, 1)).await;
    env.app.reserve("V", "c1", "o1", 100_000).await;

    let first = env.app.confirm("V", "o1").await;
    let again = env.app.confirm("V", "o1").await;
    let release = env.app.release("V", "o1").await;

    assert_eq!(first.status(), StatusCode::OK);
    let first: Value = first.json().await.expect("json");
    assert_eq!(first["status"], "CONFIRMED");
    assert_eq!(again.status(), StatusCode::OK);
    assert_eq!(again.json::<Value>().await.expect("json"), first);
    assert_eq!(release.status(), StatusCode::CONFLICT);
    assert_eq!(
        release.json::<Value>().await.expect("json")["error"],
        "ALREADY_CONFIRMED"
    );
    let voucher = env.app.voucher_json("V").await;
    assert_eq!(
        (
            voucher["usedCount"].as_i64(),
            voucher["confirmed"].as_i64(),
            voucher["reserved"].as_i64()
        ),
        (Some(1), Some(1), Some(0))
    );
    env.finish(&[Accepted::new("V", "c1", "o1")]).await;
}

#[tokio::test]
async fn release_is_idempotent_gives_the_use_back_once_and_cannot_be_confirmed() {
    let env = TestEnv::start().await;
    env.app.given_voucher(voucher_body("V", 1, 1)).await;
    env.app.reserve("V", "c1", "o1", 100_000).await;

    let first = env.app.release("V", "o1").await;
    let again = env.app.release("V", "o1").await;
    let confirm = env.app.confirm("V", "o1").await;

    assert_eq!(first.status(), StatusCode::OK);
    let first: Value = first.json().await.expect("json");
    assert_eq!(first["status"], "RELEASED");
    assert_eq!(again.status(), StatusCode::OK);
    assert_eq!(again.json::<Value>().await.expect("json"), first);
    assert_eq!(confirm.status(), StatusCode::CONFLICT);
    assert_eq!(
        confirm.json::<Value>().await.expect("json")["error"],
        "ALREADY_RELEASED"
    );
    let voucher = env.app.voucher_json("V").await;
    assert_eq!(
        (voucher["usedCount"].as_i64(), voucher["remaining"].as_i64()),
        (Some(0), Some(1))
    );
    env.finish(&[Accepted::new("V", "c1", "o1")]).await;
}

#[tokio::test]
async fn a_released_use_is_taken_again_by_another_customer_and_the_first_may_come_back() {
    let env = TestEnv::start().await;
    env.app.given_voucher(voucher_body("ONE", 1, 1)).await;
    env.app.reserve("ONE", "alice", "o1", 100_000).await;
    assert_eq!(
        env.app.reserve("ONE", "bob", "o2", 100_000).await.status(),
        StatusCode::CONFLICT
    );

    env.app.release("ONE", "o1").await;
    let bob = env.app.reserve("ONE", "bob", "o3", 100_000).await;
    env.app.release("ONE", "o3").await;
    // Alice's released order no longer counts against her per-user limit.
    let alice = env.app.reserve("ONE", "alice", "o4", 100_000).await;

    assert_eq!(bob.status(), StatusCode::CREATED);
    assert_eq!(alice.status(), StatusCode::CREATED);
    assert_eq!(env.app.voucher_json("ONE").await["usedCount"], 1);
    env.finish(&[
        Accepted::new("ONE", "alice", "o1"),
        Accepted::new("ONE", "bob", "o3"),
        Accepted::new("ONE", "alice", "o4"),
    ])
    .await;
}

#[tokio::test]
async fn a_retry_of_a_released_order_answers_its_current_state_without_taking_a_use() {
    let env = TestEnv::start().await;
    env.app.given_voucher(voucher_body("V", 5, 1)).await;
    env.app.reserve("V", "c1", "o1", 100_000).await;
    env.app.release("V", "o1").await;

    let retry = env.app.reserve("V", "c1", "o1", 100_000).await;

    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(
        retry.json::<Value>().await.expect("json")["status"],
        "RELEASED"
    );
    assert_eq!(env.app.voucher_json("V").await["usedCount"], 0);
    env.finish(&[Accepted::new("V", "c1", "o1")]).await;
}

#[tokio::test]
async fn confirm_or_release_of_an_unknown_reservation_is_404() {
    let env = TestEnv::start().await;
    env.app.given_voucher(voucher_body("A", 10, 1)).await;
    env.app.given_voucher(voucher_body("B", 10, 1)).await;
    env.app.reserve("A", "c1", "o1", 100_000).await;

    let responses = [
        env.app.confirm("A", "nope").await,
        env.app.release("A", "nope").await,
        // The order exists, but on another voucher.
        env.app.confirm("B", "o1").await,
        env.app.release("B", "o1").await,
    ];

    for resp in responses {
        assert_eq!(resp.status(), StatusCode::NOT_FOUND);
        assert_eq!(
            resp.json::<Value>().await.expect("json")["error"],
            "RESERVATION_NOT_FOUND"
        );
    }
    env.finish(&[Accepted::new("A", "c1", "o1")]).await;
}
