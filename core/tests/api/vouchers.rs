//! POST /vouchers (admin) and GET /vouchers/{code}.

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::{voucher_body, TestEnv, ADMIN_TOKEN, ORDERS_TOKEN};

#[tokio::test]
async fn create_returns_the_voucher_with_zero_counts() {
    let env = TestEnv::start().await;

    let created = env
        .app
        .given_voucher(voucher_body("FLASH100", 1000, 1))
        .await;

    assert_eq!(created["code"], "FLASH100");
    assert_eq!(created["discountAmount"], 100_000);
    assert_eq!(created["minOrderAmount"], 50_000);
    assert_eq!(created["totalLimit"], 1000);
    assert_eq!(created["perUserLimit"], 1);
    assert_eq!(created["mode"], "standard");
    assert_eq!(created["usedCount"], 0);
    assert_eq!(created["remaining"], 1000);
    let fetched = env.app.voucher_json("FLASH100").await;
    assert_eq!(fetched, created);
    env.finish(&[]).await;
}

#[tokio::test]
async fn optional_fields_take_their_defaults() {
    let env = TestEnv::start().await;
    let mut body = voucher_body("DEFAULTS", 5, 1);
    let obj = body.as_object_mut().expect("object");
    obj.remove("minOrderAmount");
    obj.remove("perUserLimit");
    obj.remove("mode");

    let created = env.app.given_voucher(body).await;

    assert_eq!(created["minOrderAmount"], 0);
    assert_eq!(created["perUserLimit"], 1);
    assert_eq!(created["mode"], "standard");
    env.finish(&[]).await;
}

#[tokio::test]
async fn create_needs_the_admin_token() {
    let env = TestEnv::start().await;
    let url = format!("{}/vouchers", env.app.base);
    let body = voucher_body("SECRET", 10, 1);

    let without = env
        .app
        .client
        .post(&url)
        .json(&body)
        .send()
        .await
        .expect("sent");
    let wrong = env
        .app
        .client
        .post(&url)
        .bearer_auth("guess")
        .json(&body)
        .send()
        .await
        .expect("sent");
    let basic = env
        .app
        .client
        .post(&url)
        .basic_auth("admin", Some(ADMIN_TOKEN))
        .json(&body)
        .send()
        .await
        .expect("sent");

    assert_eq!(without.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        without.json::<Value>().await.expect("json")["error"],
        "UNAUTHORIZED"
    );
    assert_eq!(wrong.status(), StatusCode::FORBIDDEN);
    assert_eq!(
        wrong.json::<Value>().await.expect("json")["error"],
        "FORBIDDEN"
    );
    assert_eq!(basic.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        env.app.get_voucher("SECRET").await.status(),
        StatusCode::NOT_FOUND
    );
    env.finish(&[]).await;
}

#[tokio::test]
async fn an_empty_configured_token_is_no_token_at_all() {
    let env = TestEnv::start_with(|s| s.admin.token = "".into()).await;
    // The empty string is never a token, presented or not.
    let empty = env
        .app
        .client
        .post(format!("{}/vouchers", env.app.base))
        .header("authorization", "Bearer ")
        .json(&voucher_body("NOPE", 10, 1))
        .send()
        .await
        .expect("sent");
    assert_eq!(empty.status(), StatusCode::UNAUTHORIZED);

    let resp = env
        .app
        .client
        .post(format!("{}/vouchers", env.app.base))
        .bearer_auth("anything")
        .json(&voucher_body("NOPE", 10, 1))
        .send()
        .await
        .expect("sent");
    // Not a token the core knows (named tokens may still be made, `voucher-core tokens`).
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    env.finish(&[]).await;
}

#[tokio::test]
async fn a_taken_code_is_409_voucher_exists() {
    let env = TestEnv::start().await;
    env.app.given_voucher(voucher_body("TWICE", 10, 1)).await;

    let again = env.app.create_voucher(&voucher_body("TWICE", 99, 1)).await;

    assert_eq!(again.status(), StatusCode::CONFLICT);
    assert_eq!(
        again.json::<Value>().await.expect("json")["error"],
        "VOUCHER_EXISTS"
    );
    assert_eq!(
        env.app.voucher_json("TWICE").await["totalLimit"],
        10,
        "first one kept"
    );
    env.finish(&[]).await;
}

#[tokio::test]
async fn invalid_vouchers_get_400_naming_the_field() {
    let env = TestEnv::start().await;
    let cases: Vec<(&str, Value, &str)> = vec![
        ("empty code", json!(""), "code"),
        ("overlong code", json!("C".repeat(33)), "code"),
        ("code with space", json!("A B"), "code"),
    ];
    for (what, code, field) in cases {
        let mut body = voucher_body("X", 10, 1);
        body["code"] = code;
        assert_invalid(&env, body, field, what).await;
    }
    let field_cases: Vec<(&str, &str, Value)> = vec![
        ("zero discount", "discountAmount", json!(0)),
        ("negative discount", "discountAmount", json!(-1)),
        ("fractional discount", "discountAmount", json!(1.5)),
        ("discount as string", "discountAmount", json!("100")),
        ("negative minimum", "minOrderAmount", json!(-1)),
        ("zero total limit", "totalLimit", json!(0)),
        ("huge total limit", "totalLimit", json!(10_000_000_000_i64)),
        ("per-user over total", "perUserLimit", json!(11)),
        ("zero per-user", "perUserLimit", json!(0)),
        ("bad date", "startsAt", json!("yesterday")),
        ("unknown mode", "mode", json!("turbo")),
        ("null total limit", "totalLimit", Value::Null),
    ];
    for (what, field, value) in field_cases {
        let mut body = voucher_body("X", 10, 1);
        body[field] = value;
        assert_invalid(&env, body, field, what).await;
    }
    let mut reversed = voucher_body("X", 10, 1);
    reversed["endsAt"] = reversed["startsAt"].clone();
    assert_invalid(&env, reversed, "endsAt", "empty window").await;
    let mut missing = voucher_body("X", 10, 1);
    missing
        .as_object_mut()
        .expect("object")
        .remove("totalLimit");
    assert_invalid(&env, missing, "totalLimit", "missing totalLimit").await;
    let mut unknown = voucher_body("X", 10, 1);
    unknown["totalLimt"] = json!(5);
    assert_invalid(&env, unknown, "totalLimt", "misspelt field").await;

    assert_eq!(
        env.app.get_voucher("X").await.status(),
        StatusCode::NOT_FOUND
    );
    env.finish(&[]).await;
}

async fn assert_invalid(env: &TestEnv, body: Value, field: &str, what: &str) {
    let resp = env.app.create_voucher(&body).await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{what}");
    let err: Value = resp.json().await.expect("json");
    assert_eq!(err["error"], "INVALID_REQUEST", "{what}: {err}");
    assert_eq!(err["field"], field, "{what}: {err}");
    assert!(
        err["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{what}"
    );
}

#[tokio::test]
async fn flash_mode_is_refused_until_the_gate_exists() {
    let env = TestEnv::start().await;
    let mut body = voucher_body("FLASHY", 10, 1);
    body["mode"] = json!("flash");

    let resp = env.app.create_voucher(&body).await;

    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let err: Value = resp.json().await.expect("json");
    assert_eq!(
        (err["error"].as_str(), err["field"].as_str()),
        (Some("INVALID_REQUEST"), Some("mode"))
    );
    env.finish(&[]).await;
}

#[tokio::test]
async fn unknown_voucher_is_404_and_bad_code_400() {
    let env = TestEnv::start().await;

    let missing = env.app.get_voucher("NOSUCH").await;
    let bad = env.app.get_voucher(&"Z".repeat(40)).await;

    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    assert_eq!(
        missing.json::<Value>().await.expect("json")["error"],
        "VOUCHER_NOT_FOUND"
    );
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    assert_eq!(bad.json::<Value>().await.expect("json")["field"], "code");
    env.finish(&[]).await;
}

/// The edge's token reads order lists and nothing else; the admin token reads them too.
#[tokio::test]
async fn the_orders_token_reads_order_lists_and_nothing_else() {
    let env = TestEnv::start().await;
    env.app.given_voucher(voucher_body("OTK", 10, 1)).await;
    let base = &env.app.base;
    let client = &env.app.client;
    let orders = |token: Option<&'static str>| {
        let mut request = client.get(format!("{base}/vouchers/OTK/orders"));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        async move { request.send().await.expect("sent").status() }
    };
    assert_eq!(orders(Some(ORDERS_TOKEN)).await, StatusCode::OK);
    assert_eq!(orders(Some(ADMIN_TOKEN)).await, StatusCode::OK);
    assert_eq!(orders(Some("guess")).await, StatusCode::FORBIDDEN);
    assert_eq!(
        orders(Some(&ORDERS_TOKEN[..ORDERS_TOKEN.len() - 1])).await,
        StatusCode::FORBIDDEN,
        "a prefix is not the token"
    );
    assert_eq!(orders(None).await, StatusCode::UNAUTHORIZED);

    let create = client
        .post(format!("{base}/vouchers"))
        .bearer_auth(ORDERS_TOKEN)
        .json(&voucher_body("OTK2", 10, 1))
        .send()
        .await
        .expect("sent");
    assert_eq!(create.status(), StatusCode::FORBIDDEN);
    let reload = client
        .post(format!("{base}/vouchers/OTK/gate/reload"))
        .bearer_auth(ORDERS_TOKEN)
        .send()
        .await
        .expect("sent");
    assert_eq!(reload.status(), StatusCode::FORBIDDEN);
    env.finish(&[]).await;
}
