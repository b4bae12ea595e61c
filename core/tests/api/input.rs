//! Nothing a client sends can cause a 500 or take a use: every bad request is a 4xx with
//! a stable code.

use reqwest::header::CONTENT_TYPE;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::{voucher_body, TestEnv};
use voucher_testkit::invariants::Accepted;

async fn send_raw(
    env: &TestEnv,
    path: &str,
    content_type: Option<&str>,
    body: impl Into<reqwest::Body>,
) -> (StatusCode, Value) {
    let mut req = env
        .app
        .client
        .post(format!("{}{path}", env.app.base))
        .body(body);
    if let Some(ct) = content_type {
        req = req.header(CONTENT_TYPE, ct);
    }
    let resp = req.send().await.expect("sent");
    let status = resp.status();
    (status, resp.json().await.expect("every answer is JSON"))
}

#[tokio::test]
async fn bad_reservation_bodies_get_4xx_with_a_code_and_take_nothing() {
    let env = TestEnv::start().await;
    env.app.given_voucher(voucher_body("V", 10, 1)).await;
    let path = "/vouchers/V/reservations";
    let cases: Vec<(&str, String, StatusCode, &str, Option<&str>)> = vec![
        (
            "truncated",
            r#"{"customerId":"c1","#.into(),
            StatusCode::BAD_REQUEST,
            "MALFORMED_JSON",
            None,
        ),
        (
            "not json",
            "customerId=c1".into(),
            StatusCode::BAD_REQUEST,
            "MALFORMED_JSON",
            None,
        ),
        (
            "empty",
            "".into(),
            StatusCode::BAD_REQUEST,
            "MALFORMED_JSON",
            None,
        ),
        (
            "trailing",
            r#"{"customerId":"c1","orderId":"o1","orderAmount":100000} {}"#.into(),
            StatusCode::BAD_REQUEST,
            "MALFORMED_JSON",
            None,
        ),
        (
            "array",
            "[]".into(),
            StatusCode::BAD_REQUEST,
            "INVALID_REQUEST",
            Some("body"),
        ),
        (
            "missing orderId",
            json!({"customerId":"c1","orderAmount":100000}).to_string(),
            StatusCode::BAD_REQUEST,
            "INVALID_REQUEST",
            Some("orderId"),
        ),
        (
            "amount as string",
            json!({"customerId":"c1","orderId":"o1","orderAmount":"100000"}).to_string(),
            StatusCode::BAD_REQUEST,
            "INVALID_REQUEST",
            Some("orderAmount"),
        ),
        (
            "negative amount",
            json!({"customerId":"c1","orderId":"o1","orderAmount":-5}).to_string(),
            StatusCode::BAD_REQUEST,
            "INVALID_REQUEST",
            Some("orderAmount"),
        ),
        (
            "zero amount",
            json!({"customerId":"c1","orderId":"o1","orderAmount":0}).to_string(),
            StatusCode::BAD_REQUEST,
            "INVALID_REQUEST",
            Some("orderAmount"),
        ),
        (
            "amount beyond i64",
            r#"{"customerId":"c1","orderId":"o1","orderAmount":99999999999999999999}"#.into(),
            StatusCode::BAD_REQUEST,
            "INVALID_REQUEST",
            Some("orderAmount"),
        ),
        (
            "amount as float",
            json!({"customerId":"c1","orderId":"o1","orderAmount":10.5}).to_string(),
            StatusCode::BAD_REQUEST,
            "INVALID_REQUEST",
            Some("orderAmount"),
        ),
        (
            "null customer",
            json!({"customerId":null,"orderId":"o1","orderAmount":100000}).to_string(),
            StatusCode::BAD_REQUEST,
            "INVALID_REQUEST",
            Some("customerId"),
        ),
        (
            "negative numeric customer",
            json!({"customerId":-42,"orderId":"o1","orderAmount":100000}).to_string(),
            StatusCode::BAD_REQUEST,
            "INVALID_REQUEST",
            Some("customerId"),
        ),
        (
            "fractional customer",
            json!({"customerId":4.2,"orderId":"o1","orderAmount":100000}).to_string(),
            StatusCode::BAD_REQUEST,
            "INVALID_REQUEST",
            Some("customerId"),
        ),
        (
            "customer beyond u64",
            r#"{"customerId":184467440737095516160,"orderId":"o1","orderAmount":100000}"#.into(),
            StatusCode::BAD_REQUEST,
            "INVALID_REQUEST",
            Some("customerId"),
        ),
        (
            "empty orderId",
            json!({"customerId":"c1","orderId":"","orderAmount":100000}).to_string(),
            StatusCode::BAD_REQUEST,
            "INVALID_REQUEST",
            Some("orderId"),
        ),
        (
            "overlong orderId",
            json!({"customerId":"c1","orderId":"o".repeat(65),"orderAmount":100000}).to_string(),
            StatusCode::BAD_REQUEST,
            "INVALID_REQUEST",
            Some("orderId"),
        ),
        (
            "overlong customerId",
            json!({"customerId":"c".repeat(65),"orderId":"o1","orderAmount":100000}).to_string(),
            StatusCode::BAD_REQUEST,
            "INVALID_REQUEST",
            Some("customerId"),
        ),
        (
            "control characters",
            json!({"customerId":"c1\u{0}","orderId":"o1","orderAmount":100000}).to_string(),
            StatusCode::BAD_REQUEST,
            "INVALID_REQUEST",
            Some("customerId"),
        ),
        (
            "sql-ish orderId",
            json!({"customerId":"c1","orderId":"o1'; DROP TABLE vouchers;--","orderAmount":100000})
                .to_string(),
            StatusCode::BAD_REQUEST,
            "INVALID_REQUEST",
            Some("orderId"),
        ),
        (
            "unknown field",
            json!({"customerId":"c1","orderId":"o1","orderAmount":100000,"discount":1}).to_string(),
            StatusCode::BAD_REQUEST,
            "INVALID_REQUEST",
            Some("discount"),
        ),
    ];
    for (what, body, status, code, field) in cases {
        let (got, err) = send_raw(&env, path, Some("application/json"), body).await;
        assert_eq!(got, status, "{what}: {err}");
        assert_eq!(err["error"], code, "{what}: {err}");
        if let Some(field) = field {
            assert_eq!(err["field"], field, "{what}: {err}");
        }
    }
    assert_eq!(
        env.app.voucher_json("V").await["usedCount"],
        0,
        "no bad request took a use"
    );
    env.finish(&[]).await;
}

#[tokio::test]
async fn wrong_content_type_is_415_and_oversized_body_is_413() {
    let env = TestEnv::start().await;
    env.app.given_voucher(voucher_body("V", 10, 1)).await;
    let valid = json!({"customerId":"c1","orderId":"o1","orderAmount":100000}).to_string();
    let huge = json!({"customerId":"c1","orderId":"o1","orderAmount":100000, "pad": "x".repeat(64 * 1024)}).to_string();

    let (no_type, e1) = send_raw(&env, "/vouchers/V/reservations", None, valid.clone()).await;
    let (text, e2) = send_raw(&env, "/vouchers/V/reservations", Some("text/plain"), valid).await;
    let (too_big, e3) = send_raw(
        &env,
        "/vouchers/V/reservations",
        Some("application/json"),
        huge.clone(),
    )
    .await;
    // Without a Content-Length (chunked), the limit still holds.
    let stream = futures::stream::iter(vec![Ok::<_, std::io::Error>(huge.into_bytes())]);
    let (chunked, e4) = send_raw(
        &env,
        "/vouchers/V/reservations",
        Some("application/json"),
        reqwest::Body::wrap_stream(stream),
    )
    .await;

    assert_eq!(
        (no_type, e1["error"].as_str()),
        (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Some("UNSUPPORTED_MEDIA_TYPE")
        )
    );
    assert_eq!(
        (text, e2["error"].as_str()),
        (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Some("UNSUPPORTED_MEDIA_TYPE")
        )
    );
    assert_eq!(
        (too_big, e3["error"].as_str()),
        (StatusCode::PAYLOAD_TOO_LARGE, Some("PAYLOAD_TOO_LARGE"))
    );
    assert_eq!(
        (chunked, e4["error"].as_str()),
        (StatusCode::PAYLOAD_TOO_LARGE, Some("PAYLOAD_TOO_LARGE"))
    );
    assert_eq!(env.app.voucher_json("V").await["usedCount"], 0);
    env.finish(&[]).await;
}

#[tokio::test]
async fn bad_path_parameters_are_400_and_unknown_routes_404_json() {
    let env = TestEnv::start().await;
    env.app.given_voucher(voucher_body("V", 10, 1)).await;
    let long_order = "o".repeat(65);

    let bad_code = env.app.reserve(&"C".repeat(33), "c1", "o1", 100_000).await;
    let bad_order = env.app.confirm("V", &long_order).await;
    let bad_release = env.app.release("V", "a%20b").await;
    let unknown = env
        .app
        .client
        .get(format!("{}/no/such/route", env.app.base))
        .send()
        .await
        .expect("sent");
    let wrong_method = env
        .app
        .client
        .put(format!("{}/vouchers/V", env.app.base))
        .send()
        .await
        .expect("sent");

    assert_eq!(bad_code.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        bad_code.json::<Value>().await.expect("json")["field"],
        "code"
    );
    assert_eq!(bad_order.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        bad_order.json::<Value>().await.expect("json")["field"],
        "orderId"
    );
    assert_eq!(bad_release.status(), StatusCode::BAD_REQUEST);
    assert_eq!(unknown.status(), StatusCode::NOT_FOUND);
    assert_eq!(
        unknown.json::<Value>().await.expect("json")["error"],
        "ROUTE_NOT_FOUND"
    );
    assert_eq!(wrong_method.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(
        wrong_method.json::<Value>().await.expect("json")["error"],
        "METHOD_NOT_ALLOWED"
    );
    env.finish(&[]).await;
}

/// The source article's client sends `customerId` as a number (a Java `long`): accepted,
/// and the same customer as its digits written as a string.
#[tokio::test]
async fn a_numeric_customer_id_is_the_same_customer_as_its_digits() {
    let env = TestEnv::start().await;
    env.app.given_voucher(voucher_body("NUM", 10, 1)).await;
    let path = "/vouchers/NUM/reservations";
    let (status, body) = send_raw(
        &env,
        path,
        Some("application/json"),
        json!({"customerId":42,"orderId":"n1","orderAmount":100000}).to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["customerId"], "42", "stored and shown as text");

    let (status, body) = send_raw(
        &env,
        path,
        Some("application/json"),
        json!({"customerId":"42","orderId":"n2","orderAmount":100000}).to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"], "ALREADY_USED", "the same customer: {body}");
    // The retry of the first order, with the id as a string, is that order's retry.
    let (status, _) = send_raw(
        &env,
        path,
        Some("application/json"),
        json!({"customerId":"42","orderId":"n1","orderAmount":100000}).to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let accepted = [crate::invariants::Accepted::new("NUM", "42", "n1")];
    env.finish(&accepted).await;
}

/// Dates chrono reads but PostgreSQL (or the gate's millisecond times) cannot hold are
/// refused at the edge of the API, never a 500.
#[tokio::test]
async fn voucher_dates_outside_1970_to_9999_are_400() {
    let env = TestEnv::start().await;
    for (field, at) in [
        ("startsAt", "-5000-01-01T00:00:00Z"),
        ("startsAt", "1969-12-31T23:59:59Z"),
        ("endsAt", "+10000-01-01T00:00:00Z"),
    ] {
        let mut body = voucher_body("DATES", 10, 1);
        body[field] = at.into();
        let resp = env.app.create_voucher(&body).await;
        let status = resp.status();
        let answer: Value = resp.json().await.expect("json");
        assert_eq!(status, StatusCode::BAD_REQUEST, "{field}={at}: {answer}");
        assert_eq!(answer["error"], "INVALID_REQUEST", "{answer}");
        assert_eq!(answer["field"], field, "{answer}");
    }
    env.finish(&[]).await;
}

/// Bodies no API fuzzer generates: nesting past any sane depth, numbers past i64 and u64,
/// duplicate keys, invalid UTF-8, escapes, a byte-order mark. Each gets a 4xx with a code,
/// or is taken; and the edge's reading of a body (`ReserveBody::read_checked`, which
/// decides whether the edge may answer for a core) takes exactly the bodies the core takes.
#[tokio::test]
async fn hostile_bodies_get_a_4xx_and_the_edge_reads_bodies_as_the_core_does() {
    use voucher_contract::request::ReserveBody;

    let env = TestEnv::start().await;
    env.app
        .given_voucher(voucher_body("AGREE", 1000, 1000))
        .await;
    let deep = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    let body = |customer: &str, order: &str, amount: &str| {
        format!(r#"{{"customerId":{customer},"orderId":{order},"orderAmount":{amount}}}"#)
    };
    let mut cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "plain",
            body(r#""c1""#, r#""o-plain""#, "100000").into_bytes(),
        ),
        (
            "numeric customer",
            body("42", r#""o-num""#, "100000").into_bytes(),
        ),
        (
            "customer past u64",
            body("18446744073709551616", r#""o-u64""#, "1").into_bytes(),
        ),
        (
            "negative customer",
            body("-1", r#""o-neg""#, "1").into_bytes(),
        ),
        (
            "float customer",
            body("4.2", r#""o-float""#, "1").into_bytes(),
        ),
        (
            "amount past i64",
            body(r#""c1""#, r#""o-big""#, "9223372036854775808").into_bytes(),
        ),
        (
            "amount past money",
            body(r#""c1""#, r#""o-money""#, "1000000000000000001").into_bytes(),
        ),
        (
            "amount 1e3",
            body(r#""c1""#, r#""o-exp""#, "1e3").into_bytes(),
        ),
        ("amount -0", body(r#""c1""#, r#""o-m0""#, "-0").into_bytes()),
        (
            "escaped order id",
            body(r#""c1""#, r#""o-\u0041""#, "1").into_bytes(),
        ),
        (
            "escaped NUL",
            body(r#""c1""#, r#""o-\u0000""#, "1").into_bytes(),
        ),
        (
            "lone surrogate",
            body(r#""c1""#, r#""o-\ud800""#, "1").into_bytes(),
        ),
        (
            "nested customer",
            body(&deep(100), r#""o-deep1""#, "1").into_bytes(),
        ),
        (
            "nested past serde's limit",
            body(&deep(2_000), r#""o-deep2""#, "1").into_bytes(),
        ),
        (
            "deep unknown field",
            format!(r#"{{"x":{}}}"#, deep(2_000)).into_bytes(),
        ),
        (
            "duplicate key",
            br#"{"customerId":"c1","orderId":"o-dup","orderId":"o-dup2","orderAmount":1}"#.to_vec(),
        ),
        (
            "byte-order mark",
            [
                b"\xef\xbb\xbf".as_slice(),
                body(r#""c1""#, r#""o-bom""#, "1").as_bytes(),
            ]
            .concat(),
        ),
        ("null", b"null".to_vec()),
        (
            "whitespace around",
            format!("\n\t {} \n", body(r#""c1""#, r#""o-ws""#, "1")).into_bytes(),
        ),
    ];
    let mut invalid_utf8 = body(r#""c1""#, r#""o-XX""#, "1").into_bytes();
    let at = invalid_utf8.len() - 20;
    invalid_utf8[at] = 0xff;
    cases.push(("invalid UTF-8 in a string", invalid_utf8));
    let mut overlong = body(r#""c1""#, r#""o-YY""#, "1").into_bytes();
    let at = overlong.len() - 20;
    overlong[at..at + 2].copy_from_slice(&[0xc0, 0xaf]);
    cases.push(("overlong UTF-8", overlong));

    let path = "/vouchers/AGREE/reservations";
    let mut accepted = Vec::new();
    for (name, bytes) in cases {
        let (status, answer) = send_raw(&env, path, Some("application/json"), bytes.clone()).await;
        assert!(
            status == StatusCode::CREATED || status.is_client_error(),
            "{name}: {status} {answer}"
        );
        if status.is_client_error() {
            assert!(answer["error"].is_string(), "{name}: {answer}");
        } else {
            let field = |f: &str| answer[f].as_str().unwrap_or_default().to_owned();
            accepted.push(Accepted::new(
                "AGREE",
                &field("customerId"),
                &field("orderId"),
            ));
        }
        let edge_takes = ReserveBody::read_checked(&bytes).is_some();
        assert_eq!(
            edge_takes,
            status != StatusCode::BAD_REQUEST,
            "{name}: the core answered {status} {answer}, the edge would {}take it",
            if edge_takes { "" } else { "not " }
        );
    }
    env.finish(&accepted).await;
}
