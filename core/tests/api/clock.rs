//! No core's clock decides. Standard mode judges the sale window and the TTL by
//! PostgreSQL's clock: a core whose clock is a minute behind (the real binary run under
//! libfaketime) answers exactly as one on time does. Flash mode judges them by Redis's
//! clock inside the gate's script: the core passes it no time at all, and the records carry
//! Redis's time.

use std::path::Path;

use chrono::{Duration, Utc};
use reqwest::StatusCode;
use voucher_core::domain::{OrderId, VoucherCode};

use crate::helpers::{rfc3339, voucher_body, TestEnv};
use crate::stack::{flash_voucher, CoreProcess, FlashStack, CLOCK_MINUTE_BEHIND};

/// A body for a voucher whose sale started `ago` by the true clock.
fn started(mut body: serde_json::Value, ago: Duration) -> serde_json::Value {
    body["startsAt"] = rfc3339(Utc::now() - ago).into();
    body
}

/// When `expires_at` is, from now by the true clock.
fn expires_in(attempt_body: &serde_json::Value) -> Duration {
    let expires: chrono::DateTime<Utc> = attempt_body["expiresAt"]
        .as_str()
        .and_then(|t| t.parse().ok())
        .expect("expiresAt");
    expires - Utc::now()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_core_whose_clock_is_a_minute_behind_answers_as_one_on_time() {
    let env = TestEnv::start().await;
    let binary = Path::new(env!("CARGO_BIN_EXE_voucher-core"));
    let settings = crate::helpers::settings_for(&env.db.url);
    // libfaketime (Debian's faketime) preloaded: the wall clock a minute behind; monotonic
    // time real, as on a machine whose clock is wrong.
    let skewed = CoreProcess::start(binary, &settings, &CLOCK_MINUTE_BEHIND).await;
    // The skew is real: the skewed core dates its answers a minute back.
    let health = skewed
        .api
        .client
        .get(format!("{}/healthz", skewed.api.base))
        .send()
        .await
        .expect("healthz");
    let dated = health
        .headers()
        .get("date")
        .and_then(|d| d.to_str().ok())
        .and_then(|d| chrono::DateTime::parse_from_rfc2822(d).ok())
        .expect("a Date header");
    let behind = Utc::now() - dated.with_timezone(&Utc);
    assert!(
        behind > Duration::seconds(55) && behind < Duration::seconds(65),
        "the core's clock is {behind} behind"
    );

    // Started 20 s ago: by the skewed core's own clock it starts in 40 s.
    env.app
        .given_voucher(started(voucher_body("CLKS", 10, 1), Duration::seconds(20)))
        .await;
    let attempt = skewed.api.attempt("CLKS", "c1", "o-s1", 100_000).await;

    assert_eq!(attempt.status, StatusCode::CREATED, "{}", attempt.body);
    // The TTL runs from the shared clock too: 15 minutes from now, not from a minute ago.
    let left = expires_in(&attempt.body);
    assert!(
        left > Duration::minutes(14) && left <= Duration::minutes(15),
        "expires in {left}"
    );
    drop(skewed);
    env.finish(&[attempt.accepted()]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn flash_records_carry_the_time_of_redis() {
    let stack = FlashStack::start().await;
    stack
        .app()
        .given_voucher(flash_voucher("CLKF", 10, 1))
        .await;

    let mut conn = crate::stack::redis_connection().await;
    let (secs, micros): (i64, i64) = redis::cmd("TIME")
        .query_async(&mut conn)
        .await
        .expect("time");
    let redis_before = secs * 1000 + micros / 1000;
    let attempt = stack.app().attempt("CLKF", "c1", "o-f1", 100_000).await;
    assert_eq!(attempt.status, StatusCode::CREATED);

    let code = VoucherCode::parse("CLKF").expect("code");
    let order = OrderId::parse("o-f1").expect("order");
    let record = stack
        .gate
        .record(&code, &order)
        .await
        .expect("redis")
        .expect("a record");
    assert!(
        (record.reserved_ms - redis_before).abs() < 5_000,
        "reserved at {} by Redis's clock ({redis_before})",
        record.reserved_ms
    );
    assert_eq!(record.expires_ms - record.reserved_ms, 15 * 60 * 1000);
    stack.finish(&[attempt.accepted()]).await;
}
