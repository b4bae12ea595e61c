//! Named tokens with scopes: each call needs its scope, several tokens are valid at once,
//! a revoked or expired one is refused without a restart, the audit trail names the token,
//! and `voucher-core tokens` makes, lists and revokes them.

use std::process::Command;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use secrecy::ExposeSecret;
use serde_json::Value;
use voucher_core::auth::{create_token, Scope};
use voucher_core::store::Store;
use voucher_testkit::wait::eventually;

use crate::helpers::{voucher_body, TestEnv, ORDERS_TOKEN};

async fn env() -> TestEnv {
    TestEnv::start_with(|s| s.admin.token_refresh = Duration::from_millis(100)).await
}

async fn call(env: &TestEnv, method: Method, path: &str, token: &str) -> reqwest::Response {
    env.app
        .client
        .request(method, format!("{}{path}", env.app.base))
        .bearer_auth(token)
        .send()
        .await
        .expect("sent")
}

async fn token(env: &TestEnv, name: &str, scopes: &[Scope]) -> String {
    let secret = create_token(&Store::new(env.pool.clone()), name, scopes, None)
        .await
        .expect("token made");
    secret.expose_secret().to_owned()
}

/// Waits until `token` is accepted for `GET path` (the core re-read its tokens).
async fn accepted(env: &TestEnv, path: &str, token: &str) {
    eventually(
        Duration::from_secs(10),
        "the token to be accepted",
        || async {
            (call(env, Method::GET, path, token).await.status() == StatusCode::OK).then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn each_call_needs_its_scope_and_the_audit_trail_names_the_token() {
    let env = env().await;
    env.app.given_voucher(voucher_body("SCOPE", 10, 1)).await;
    let reader = token(&env, "dash-reader", &[Scope::VouchersRead]).await;
    let writer = token(&env, "ops-alice", &[Scope::VouchersWrite]).await;
    let auditor = token(&env, "sec-audit", &[Scope::AuditRead]).await;
    accepted(&env, "/vouchers", &reader).await;

    let paused = call(&env, Method::POST, "/vouchers/SCOPE/pause", &reader).await;
    assert_eq!(paused.status(), StatusCode::FORBIDDEN);
    let body: Value = paused.json().await.expect("json");
    assert_eq!(body["error"], "FORBIDDEN");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("vouchers:write")),
        "{body}"
    );
    assert_eq!(
        call(&env, Method::GET, "/vouchers", &writer).await.status(),
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        call(&env, Method::POST, "/vouchers/SCOPE/pause", &writer)
            .await
            .status(),
        StatusCode::OK
    );
    // The edge's configured token reads order filters and nothing else.
    assert_eq!(
        call(
            &env,
            Method::GET,
            "/vouchers/SCOPE/orders/filter",
            ORDERS_TOKEN
        )
        .await
        .status(),
        StatusCode::OK
    );
    for (method, path) in [
        (Method::GET, "/vouchers"),
        (Method::POST, "/vouchers/SCOPE/resume"),
        (Method::GET, "/vouchers/SCOPE/audit"),
    ] {
        assert_eq!(
            call(&env, method, path, ORDERS_TOKEN).await.status(),
            StatusCode::FORBIDDEN,
            "{path}"
        );
    }
    assert_eq!(
        call(&env, Method::GET, "/vouchers/SCOPE/audit", &reader)
            .await
            .status(),
        StatusCode::FORBIDDEN
    );
    let audit = call(&env, Method::GET, "/vouchers/SCOPE/audit", &auditor).await;
    assert_eq!(audit.status(), StatusCode::OK);
    let page: Value = audit.json().await.expect("json");
    let pause = page["items"]
        .as_array()
        .and_then(|i| i.last())
        .expect("a row");
    assert_eq!(
        (pause["action"].as_str(), pause["actor"].as_str()),
        (Some("pause"), Some("ops-alice"))
    );
    assert_eq!(
        call(&env, Method::GET, "/vouchers", "vgt_made-up")
            .await
            .status(),
        StatusCode::FORBIDDEN
    );
    env.finish(&[]).await;
}

#[tokio::test]
async fn a_token_rotates_without_a_restart() {
    let env = env().await;
    let store = Store::new(env.pool.clone());
    let old = token(&env, "ops-2026-11", &[Scope::VouchersRead]).await;
    accepted(&env, "/vouchers", &old).await;
    // The successor is valid beside it; then the old one is revoked.
    let new = token(&env, "ops-2026-12", &[Scope::VouchersRead]).await;
    accepted(&env, "/vouchers", &new).await;
    assert_eq!(
        call(&env, Method::GET, "/vouchers", &old).await.status(),
        StatusCode::OK
    );
    assert!(store.revoke_token("ops-2026-11").await.expect("revoked"));
    eventually(
        Duration::from_secs(10),
        "the revoked token refused",
        || async {
            (call(&env, Method::GET, "/vouchers", &old).await.status() == StatusCode::FORBIDDEN)
                .then_some(())
        },
    )
    .await;
    assert_eq!(
        call(&env, Method::GET, "/vouchers", &new).await.status(),
        StatusCode::OK
    );
    // An expired token is refused at once, whatever the refresh.
    let short = create_token(
        &store,
        "ci-short",
        &[Scope::VouchersRead],
        Some(chrono::Utc::now() - chrono::Duration::seconds(1)),
    )
    .await
    .expect("made");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        call(&env, Method::GET, "/vouchers", short.expose_secret())
            .await
            .status(),
        StatusCode::FORBIDDEN
    );
    // Stored as digests only.
    let stored: Vec<Vec<u8>> = sqlx::query_scalar("SELECT secret_sha256 FROM api_tokens")
        .fetch_all(&env.pool)
        .await
        .expect("read");
    assert!(stored
        .iter()
        .all(|d| d.len() == 32 && !new.as_bytes().windows(32).any(|w| w == d.as_slice())));
    env.finish(&[]).await;
}

#[tokio::test]
async fn voucher_core_tokens_makes_lists_and_revokes_tokens() {
    let env = env().await;
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_voucher-core"))
            .args(args)
            .env("VOUCHER__DATABASE__URL", &env.db.url)
            .env_remove("VOUCHER_CONFIG")
            .env_remove("VOUCHER__ADMIN__TOKEN")
            .output()
            .expect("runs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, secret, err) = run(&[
        "tokens",
        "create",
        "ops-bob",
        "--scopes",
        "vouchers:read,audit:read",
    ]);
    assert!(ok, "{err}");
    let secret = secret.trim().to_owned();
    assert!(secret.starts_with("vgt_"), "{secret}");
    accepted(&env, "/vouchers", &secret).await;
    let (ok, listed, _) = run(&["tokens", "list"]);
    assert!(ok);
    assert!(
        listed.contains("ops-bob") && listed.contains("vouchers:read,audit:read"),
        "{listed}"
    );
    assert!(!listed.contains(&secret), "the secret is shown once only");
    let (ok, _, err) = run(&["tokens", "create", "ops-bob", "--scopes", "vouchers:read"]);
    assert!(!ok && err.contains("exists"), "{err}");
    let (ok, _, err) = run(&["tokens", "create", "x", "--scopes", "root"]);
    assert!(!ok && err.contains("unknown scope"), "{err}");
    let (ok, _, err) = run(&["tokens", "revoke", "ops-bob"]);
    assert!(ok, "{err}");
    eventually(
        Duration::from_secs(10),
        "the revoked token refused",
        || async {
            (call(&env, Method::GET, "/vouchers", &secret).await.status() == StatusCode::FORBIDDEN)
                .then_some(())
        },
    )
    .await;
    env.finish(&[]).await;
}
