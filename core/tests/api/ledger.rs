//! A voucher's reservations for finance: pages by status, one order, the CSV export.

use reqwest::{Method, StatusCode};
use serde_json::Value;

use crate::helpers::{voucher_body, TestEnv, ADMIN_TOKEN, ORDERS_TOKEN};
use crate::invariants::Accepted;

async fn get(env: &TestEnv, path: &str) -> reqwest::Response {
    get_with(env, path, ADMIN_TOKEN).await
}

async fn get_with(env: &TestEnv, path: &str, token: &str) -> reqwest::Response {
    env.app
        .client
        .request(Method::GET, format!("{}{path}", env.app.base))
        .bearer_auth(token)
        .send()
        .await
        .expect("sent")
}

#[tokio::test]
async fn reservations_page_by_status_and_one_order_is_looked_up() {
    let env = TestEnv::start().await;
    env.app.given_voucher(voucher_body("BOOKS", 10, 1)).await;
    let mut accepted = Vec::new();
    for i in 0..5 {
        let (c, o) = (format!("c{i}"), format!("o{i}"));
        assert_eq!(
            env.app.reserve("BOOKS", &c, &o, 100_000 + i).await.status(),
            StatusCode::CREATED
        );
        accepted.push(Accepted::new("BOOKS", &c, &o));
    }
    for o in ["o1", "o3"] {
        assert_eq!(env.app.confirm("BOOKS", o).await.status(), StatusCode::OK);
    }
    assert_eq!(
        env.app.release("BOOKS", "o4").await.status(),
        StatusCode::OK
    );

    let mut reserved = Vec::new();
    let mut path = "/vouchers/BOOKS/reservations?status=RESERVED&limit=1".to_owned();
    loop {
        let page: Value = get(&env, &path).await.json().await.expect("json");
        reserved.extend(
            page["items"]
                .as_array()
                .expect("items")
                .iter()
                .map(|r| r["orderId"].clone()),
        );
        match page["nextCursor"].as_str() {
            Some(c) => {
                path = format!("/vouchers/BOOKS/reservations?status=RESERVED&limit=1&cursor={c}")
            }
            None => break,
        }
    }
    assert_eq!(reserved, ["o0", "o2"], "in the order they were taken");
    let confirmed: Value = get(&env, "/vouchers/BOOKS/reservations?status=CONFIRMED")
        .await
        .json()
        .await
        .expect("json");
    let items = confirmed["items"].as_array().expect("items");
    assert_eq!(items.len(), 2);
    assert_eq!(items[0]["orderId"], "o1");
    assert_eq!(items[0]["orderAmount"], 100_001);
    assert_eq!(items[0]["discountAmount"], 100_000);
    assert!(items[0]["confirmedAt"].is_string());

    let one: Value = get(&env, "/vouchers/BOOKS/reservations/o4")
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(
        (one["status"].as_str(), one["customerId"].as_str()),
        (Some("RELEASED"), Some("c4"))
    );
    assert!(one["releasedAt"].is_string());
    let missing = get(&env, "/vouchers/BOOKS/reservations/nope").await;
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    for bad in [
        "?status=LOST",
        "",
        "?status=RESERVED&limit=0",
        "?status=RESERVED&cursor=x",
    ] {
        let resp = get(&env, &format!("/vouchers/BOOKS/reservations{bad}")).await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{bad}");
    }
    assert_eq!(
        get(&env, "/vouchers/NOPE/reservations?status=RESERVED")
            .await
            .status(),
        StatusCode::NOT_FOUND
    );
    let anonymous = env
        .app
        .client
        .get(format!("{}/vouchers/BOOKS/reservations/o1", env.app.base))
        .send()
        .await
        .expect("sent");
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    // The edge's token reads order filters and nothing else: not customers and amounts.
    for path in [
        "/vouchers/BOOKS/reservations?status=RESERVED",
        "/vouchers/BOOKS/reservations/o1",
        "/vouchers/BOOKS/export",
    ] {
        assert_eq!(
            get_with(&env, path, ORDERS_TOKEN).await.status(),
            StatusCode::FORBIDDEN,
            "{path}"
        );
    }
    env.finish(&accepted).await;
}

#[tokio::test]
async fn the_export_streams_every_reservation_as_csv_in_the_order_taken() {
    let env = TestEnv::start().await;
    env.app.given_voucher(voucher_body("LEDGER", 5000, 1)).await;
    // Rows of a sale, written as the grouped statement would (counts kept in step).
    sqlx::query(
        "WITH made AS (
             INSERT INTO redemptions (voucher_code, customer_id, order_id, order_amount,
                                      discount_amount, status, expires_at, confirmed_at)
             SELECT 'LEDGER', 'c' || i, 'o' || lpad(i::text, 5, '0'), 200000, 100000,
                    CASE WHEN i % 3 = 0 THEN 'CONFIRMED' ELSE 'RESERVED' END,
                    now() + interval '1 hour',
                    CASE WHEN i % 3 = 0 THEN now() END
             FROM generate_series(1, 3000) i
             RETURNING customer_id
         ),
         usage AS (
             INSERT INTO customer_usage (voucher_code, customer_id, active_count, per_user_limit)
             SELECT 'LEDGER', customer_id, 1, 1 FROM made
         )
         UPDATE vouchers SET used_count = 3000 WHERE code = 'LEDGER'",
    )
    .execute(&env.pool)
    .await
    .expect("rows");

    let resp = get(&env, "/vouchers/LEDGER/export").await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["content-type"], "text/csv; charset=utf-8");
    assert!(resp.headers()["content-disposition"]
        .to_str()
        .expect("ascii")
        .contains("LEDGER-reservations.csv"));
    let text = resp.text().await.expect("body");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3001, "a header and every row");
    assert!(lines[0].starts_with("order_id,customer_id,status,order_amount,discount_amount"));
    assert!(lines[1].starts_with("o00001,c1,RESERVED,200000,100000,"));
    assert!(lines[3].starts_with("o00003,c3,CONFIRMED,"));
    let orders: Vec<&str> = lines[1..]
        .iter()
        .map(|l| l.split(',').next().unwrap_or(""))
        .collect();
    let mut sorted = orders.clone();
    sorted.sort_unstable();
    assert_eq!(orders, sorted, "in the order taken");

    let confirmed = get(&env, "/vouchers/LEDGER/export?status=CONFIRMED")
        .await
        .text()
        .await
        .expect("body");
    assert_eq!(confirmed.lines().count(), 1 + 1000);
    assert_eq!(
        get(&env, "/vouchers/LEDGER/export?status=GONE")
            .await
            .status(),
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        get(&env, "/vouchers/NOPE/export").await.status(),
        StatusCode::NOT_FOUND
    );
    // An empty voucher exports its header.
    env.app.given_voucher(voucher_body("EMPTY", 5, 1)).await;
    let empty = get(&env, "/vouchers/EMPTY/export")
        .await
        .text()
        .await
        .expect("body");
    assert_eq!(empty.lines().count(), 1);
    let accepted: Vec<Accepted> = (1..=3000)
        .map(|i| Accepted::new("LEDGER", &format!("c{i}"), &format!("o{i:05}")))
        .collect();
    env.finish(&accepted).await;
}
