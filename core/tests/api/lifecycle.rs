//! A voucher's lifecycle: list, change (with If-Match), pause, resume, archive, and the
//! audit row of every change. Flash-mode changes at the gate are in `flash_lifecycle`.

use chrono::{Duration, Utc};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::helpers::{rfc3339, voucher_body, TestApp, TestEnv};
use crate::invariants::Accepted;

async fn version_of(app: &TestApp, code: &str) -> i64 {
    let resp = app.get_voucher(code).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let etag = resp.headers()["etag"].to_str().expect("ascii").to_owned();
    let body: Value = resp.json().await.expect("json");
    assert_eq!(
        etag,
        format!("\"{}\"", body["version"]),
        "the ETag is the version"
    );
    body["version"].as_i64().expect("version")
}

async fn audit(app: &TestApp, code: &str) -> Vec<Value> {
    let resp = app
        .admin(Method::GET, &format!("/vouchers/{code}/audit"), None, None)
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let page: Value = resp.json().await.expect("json");
    page["items"].as_array().expect("items").clone()
}

async fn error_of(resp: reqwest::Response) -> (StatusCode, Value) {
    let status = resp.status();
    (status, resp.json().await.expect("json"))
}

#[tokio::test]
async fn a_change_names_the_version_it_read_and_a_stale_one_is_refused() {
    let env = TestEnv::start().await;
    env.app.given_voucher(voucher_body("CHG", 10, 1)).await;
    let v1 = version_of(&env.app, "CHG").await;
    assert_eq!(v1, 1);

    // No If-Match: 428, nothing changed.
    let without = env
        .app
        .admin(
            Method::PATCH,
            "/vouchers/CHG",
            None,
            Some(&json!({ "totalLimit": 20 })),
        )
        .await;
    let (status, body) = error_of(without).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (
            StatusCode::PRECONDITION_REQUIRED,
            Some("PRECONDITION_REQUIRED")
        )
    );

    // Two operators read version 1; the first change wins, the second is told so.
    let first = env
        .app
        .change("CHG", v1, &json!({ "totalLimit": 20 }))
        .await;
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(first.headers()["etag"], "\"2\"");
    let changed: Value = first.json().await.expect("json");
    assert_eq!(
        (changed["totalLimit"].as_i64(), changed["version"].as_i64()),
        (Some(20), Some(2))
    );
    let second = env
        .app
        .change("CHG", v1, &json!({ "totalLimit": 30 }))
        .await;
    let (status, body) = error_of(second).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::PRECONDITION_FAILED, Some("PRECONDITION_FAILED"))
    );
    let now = env.app.voucher_json("CHG").await;
    assert_eq!(
        (now["totalLimit"].as_i64(), now["version"].as_i64()),
        (Some(20), Some(2)),
        "never a silent overwrite"
    );

    // A malformed If-Match is the client's error.
    let resp = env
        .app
        .client
        .patch(format!("{}/vouchers/CHG", env.app.base))
        .bearer_auth(crate::helpers::ADMIN_TOKEN)
        .header("if-match", "version two")
        .json(&json!({ "totalLimit": 30 }))
        .send()
        .await
        .expect("sent");
    let (status, body) = error_of(resp).await;
    assert_eq!(
        (status, body["field"].as_str()),
        (StatusCode::BAD_REQUEST, Some("If-Match"))
    );

    // The audit trail: who, what, before and after, the request's id.
    let entries = audit(&env.app, "CHG").await;
    let actions: Vec<&str> = entries
        .iter()
        .filter_map(|e| e["action"].as_str())
        .collect();
    assert_eq!(
        actions,
        ["create", "change"],
        "one row per change, none for refused ones"
    );
    let change = &entries[1];
    assert_eq!(change["actor"], "admin");
    assert_eq!(change["before"]["totalLimit"], 10);
    assert_eq!(change["after"]["totalLimit"], 20);
    assert_eq!(change["after"]["version"], 2);
    assert!(
        change["requestId"]
            .as_str()
            .is_some_and(|id| !id.is_empty()),
        "{change}"
    );
    assert!(entries[0]["before"].is_null());
    env.finish(&[]).await;
}

#[tokio::test]
async fn the_audit_row_carries_the_request_id_the_caller_sent() {
    let env = TestEnv::start().await;
    env.app.given_voucher(voucher_body("RID", 10, 1)).await;
    let resp = env
        .app
        .client
        .post(format!("{}/vouchers/RID/pause", env.app.base))
        .bearer_auth(crate::helpers::ADMIN_TOKEN)
        .header("x-request-id", "op-change-4711")
        .send()
        .await
        .expect("sent");
    assert_eq!(resp.status(), StatusCode::OK);
    let entries = audit(&env.app, "RID").await;
    let pause = entries.last().expect("a row");
    assert_eq!(
        (pause["action"].as_str(), pause["requestId"].as_str()),
        (Some("pause"), Some("op-change-4711"))
    );
    assert_eq!(
        (
            pause["before"]["state"].as_str(),
            pause["after"]["state"].as_str()
        ),
        (Some("active"), Some("paused"))
    );
    env.finish(&[]).await;
}

#[tokio::test]
async fn the_limit_goes_down_to_the_uses_held_and_no_further() {
    let env = TestEnv::start().await;
    env.app.given_voucher(voucher_body("LOWER", 5, 1)).await;
    let mut accepted = Vec::new();
    for i in 0..3 {
        let (c, o) = (format!("c{i}"), format!("o{i}"));
        assert_eq!(
            env.app.reserve("LOWER", &c, &o, 100_000).await.status(),
            StatusCode::CREATED
        );
        accepted.push(Accepted::new("LOWER", &c, &o));
    }
    let (status, body) = error_of(
        env.app
            .change("LOWER", 1, &json!({ "totalLimit": 2 }))
            .await,
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str(), body["field"].as_str()),
        (
            StatusCode::CONFLICT,
            Some("CHANGE_NOT_ALLOWED"),
            Some("totalLimit")
        )
    );
    let resp = env
        .app
        .change("LOWER", 1, &json!({ "totalLimit": 3 }))
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let after = env.app.attempt("LOWER", "c9", "o9", 100_000).await;
    assert_eq!(
        (after.status, after.code()),
        (StatusCode::CONFLICT, "OUT_OF_STOCK"),
        "the new limit holds at once"
    );
    // Raised again: a use can be taken.
    let resp = env
        .app
        .change("LOWER", 2, &json!({ "totalLimit": 4 }))
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        env.app.reserve("LOWER", "c9", "o9", 100_000).await.status(),
        StatusCode::CREATED
    );
    accepted.push(Accepted::new("LOWER", "c9", "o9"));
    env.finish(&accepted).await;
}

#[tokio::test]
async fn the_start_and_the_terms_change_only_before_the_start() {
    let env = TestEnv::start().await;
    env.app.given_voucher(voucher_body("LIVE", 5, 1)).await;
    for change in [
        json!({ "discountAmount": 5 }),
        json!({ "minOrderAmount": 5 }),
        json!({ "startsAt": rfc3339(Utc::now() - Duration::hours(3)) }),
    ] {
        let (status, body) = error_of(env.app.change("LIVE", 1, &change).await).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (StatusCode::CONFLICT, Some("CHANGE_NOT_ALLOWED")),
            "{change}"
        );
    }
    // The end moves while live; into the past, it ends the sale.
    let resp = env
        .app
        .change(
            "LIVE",
            1,
            &json!({ "endsAt": rfc3339(Utc::now() - Duration::minutes(1)) }),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let late = env.app.attempt("LIVE", "c1", "o1", 100_000).await;
    assert_eq!(
        (late.status, late.body["reason"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("EXPIRED"))
    );

    // Before the start, everything moves; the discount a reservation gets is the new one.
    let mut body = voucher_body("SOON", 5, 1);
    body["startsAt"] = json!(rfc3339(Utc::now() + Duration::hours(1)));
    body["endsAt"] = json!(rfc3339(Utc::now() + Duration::hours(2)));
    env.app.given_voucher(body).await;
    let change = json!({
        "discountAmount": 7_000,
        "minOrderAmount": 10_000,
        "startsAt": rfc3339(Utc::now() - Duration::seconds(1)),
    });
    let resp = env.app.change("SOON", 1, &change).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let resp = env.app.reserve("SOON", "c2", "o2", 20_000).await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    let reservation: Value = resp.json().await.expect("json");
    assert_eq!(reservation["discountAmount"], 7_000);
    // A window out of order is no good whatever the voucher.
    let (status, body) = error_of(
        env.app
            .change(
                "SOON",
                2,
                &json!({ "endsAt": rfc3339(Utc::now() - Duration::hours(5)) }),
            )
            .await,
    )
    .await;
    assert_eq!(
        (status, body["field"].as_str()),
        (StatusCode::BAD_REQUEST, Some("endsAt"))
    );
    env.finish(&[Accepted::new("SOON", "c2", "o2")]).await;
}

#[tokio::test]
async fn a_paused_voucher_refuses_newcomers_and_serves_its_holders() {
    let env = TestEnv::start().await;
    env.app.given_voucher(voucher_body("KILL", 10, 1)).await;
    for order in ["o1", "o2"] {
        assert_eq!(
            env.app
                .reserve("KILL", order, order, 100_000)
                .await
                .status(),
            StatusCode::CREATED
        );
    }
    let paused = env.app.given_lifecycle("KILL", "pause").await;
    assert_eq!(
        (paused["state"].as_str(), paused["version"].as_i64()),
        (Some("paused"), Some(2))
    );

    let newcomer = env.app.attempt("KILL", "c3", "o3", 100_000).await;
    assert_eq!(
        (newcomer.status, newcomer.code()),
        (StatusCode::CONFLICT, "VOUCHER_PAUSED")
    );
    // After 404 and before 422: an order below the minimum hears of the pause first.
    let below = env.app.attempt("KILL", "c4", "o4", 1).await;
    assert_eq!(below.code(), "VOUCHER_PAUSED");
    let unknown = env.app.attempt("NOPE", "c4", "o4", 100_000).await;
    assert_eq!(unknown.code(), "VOUCHER_NOT_FOUND");
    // Holders: a retry gets its 201, a confirm and a release work.
    let retry = env.app.reserve("KILL", "o1", "o1", 100_000).await;
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(env.app.confirm("KILL", "o1").await.status(), StatusCode::OK);
    assert_eq!(env.app.release("KILL", "o2").await.status(), StatusCode::OK);
    // Pausing again changes nothing (no version, no audit row).
    let again = env.app.given_lifecycle("KILL", "pause").await;
    assert_eq!(again["version"], 2);

    let resumed = env.app.given_lifecycle("KILL", "resume").await;
    assert_eq!(
        (resumed["state"].as_str(), resumed["version"].as_i64()),
        (Some("active"), Some(3))
    );
    assert_eq!(
        env.app.reserve("KILL", "c3", "o3", 100_000).await.status(),
        StatusCode::CREATED
    );
    let actions: Vec<String> = audit(&env.app, "KILL")
        .await
        .iter()
        .filter_map(|e| e["action"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(actions, ["create", "pause", "resume"]);
    env.finish(&[
        Accepted::new("KILL", "o1", "o1"),
        Accepted::new("KILL", "c3", "o3"),
    ])
    .await;
}

#[tokio::test]
async fn a_pause_made_on_one_core_holds_at_once_on_another() {
    let env = TestEnv::start().await;
    let other = TestApp::start(&crate::helpers::settings_for(&env.db.url)).await;
    env.app.given_voucher(voucher_body("TWO", 10, 1)).await;
    // The other core has the voucher cached, active.
    assert_eq!(
        other.reserve("TWO", "c1", "o1", 100_000).await.status(),
        StatusCode::CREATED
    );
    env.app.given_lifecycle("TWO", "pause").await;
    // No wait for its cache: the statement that takes the use reads the row.
    let refused = other.attempt("TWO", "c2", "o2", 100_000).await;
    assert_eq!(refused.code(), "VOUCHER_PAUSED");
    let rows: i64 =
        sqlx::query_scalar("SELECT count(*) FROM redemptions WHERE voucher_code = 'TWO'")
            .fetch_one(&env.pool)
            .await
            .expect("count");
    assert_eq!(rows, 1, "no new use after the pause was acknowledged");
    other.stop().await;
    env.finish(&[Accepted::new("TWO", "c1", "o1")]).await;
}

#[tokio::test]
async fn archive_waits_for_active_reservations_then_hides_the_voucher_for_good() {
    let env = TestEnv::start().await;
    env.app.given_voucher(voucher_body("OLD", 10, 1)).await;
    assert_eq!(
        env.app.reserve("OLD", "c1", "o1", 100_000).await.status(),
        StatusCode::CREATED
    );
    let (status, body) = error_of(env.app.lifecycle("OLD", "archive").await).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("CHANGE_NOT_ALLOWED"))
    );
    assert_eq!(env.app.confirm("OLD", "o1").await.status(), StatusCode::OK);
    let archived = env.app.given_lifecycle("OLD", "archive").await;
    assert_eq!(archived["state"], "archived");

    let refused = env.app.attempt("OLD", "c2", "o2", 100_000).await;
    assert_eq!(
        (refused.status, refused.code()),
        (StatusCode::CONFLICT, "VOUCHER_ARCHIVED")
    );
    for action in ["resume", "pause"] {
        let (status, body) = error_of(env.app.lifecycle("OLD", action).await).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (StatusCode::CONFLICT, Some("CHANGE_NOT_ALLOWED")),
            "{action}"
        );
    }
    let (status, _) = error_of(env.app.change("OLD", 2, &json!({ "totalLimit": 20 })).await).await;
    assert_eq!(status, StatusCode::CONFLICT);
    // Gone from the lists, unless asked for.
    let codes = |page: Value| -> Vec<String> {
        page["items"]
            .as_array()
            .expect("items")
            .iter()
            .filter_map(|v| v["code"].as_str().map(str::to_owned))
            .collect()
    };
    let listed = env.app.admin(Method::GET, "/vouchers", None, None).await;
    assert!(codes(listed.json().await.expect("json")).is_empty());
    let archived = env
        .app
        .admin(Method::GET, "/vouchers?state=archived", None, None)
        .await;
    assert_eq!(codes(archived.json().await.expect("json")), ["OLD"]);
    // Its confirmed use is still there to read.
    assert_eq!(env.app.voucher_json("OLD").await["confirmed"], 1);
    env.finish(&[Accepted::new("OLD", "c1", "o1")]).await;
}

#[tokio::test]
async fn the_list_filters_by_state_and_phase_and_pages_with_a_cursor() {
    let env = TestEnv::start().await;
    for code in ["L1", "L2", "L3", "L4", "L5"] {
        env.app.given_voucher(voucher_body(code, 10, 1)).await;
    }
    let mut later = voucher_body("L6", 10, 1);
    later["startsAt"] = json!(rfc3339(Utc::now() + Duration::hours(1)));
    later["endsAt"] = json!(rfc3339(Utc::now() + Duration::hours(2)));
    env.app.given_voucher(later).await;
    env.app.given_lifecycle("L2", "pause").await;

    let page = |query: String| {
        let app = &env.app;
        async move {
            let resp = app
                .admin(Method::GET, &format!("/vouchers{query}"), None, None)
                .await;
            assert_eq!(resp.status(), StatusCode::OK, "{query}");
            resp.json::<Value>().await.expect("json")
        }
    };
    let codes = |page: &Value| -> Vec<String> {
        page["items"]
            .as_array()
            .expect("items")
            .iter()
            .filter_map(|v| v["code"].as_str().map(str::to_owned))
            .collect()
    };
    // Pages of two, in code order, until the last has no cursor.
    let mut seen = Vec::new();
    let mut query = "?limit=2".to_owned();
    loop {
        let p = page(query.clone()).await;
        seen.extend(codes(&p));
        match p["nextCursor"].as_str() {
            Some(cursor) => query = format!("?limit=2&cursor={cursor}"),
            None => break,
        }
    }
    assert_eq!(seen, ["L1", "L2", "L3", "L4", "L5", "L6"]);
    assert_eq!(codes(&page("?state=paused".into()).await), ["L2"]);
    assert_eq!(codes(&page("?phase=scheduled".into()).await), ["L6"]);
    assert_eq!(
        codes(&page("?phase=live&state=active&mode=standard".into()).await),
        ["L1", "L3", "L4", "L5"]
    );
    assert!(codes(&page("?mode=flash".into()).await).is_empty());
    let listed = page("?limit=1".into()).await;
    assert_eq!(listed["items"][0]["state"], "active");
    assert_eq!(listed["items"][0]["phase"], "live");

    for bad in [
        "?state=gone",
        "?limit=0",
        "?limit=501",
        "?cursor=zz",
        "?colour=red",
        "?limit=x",
    ] {
        let resp = env
            .app
            .admin(Method::GET, &format!("/vouchers{bad}"), None, None)
            .await;
        let (status, body) = error_of(resp).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (StatusCode::BAD_REQUEST, Some("INVALID_REQUEST")),
            "{bad}"
        );
    }
    // Without the admin token: refused.
    let resp = env
        .app
        .client
        .get(format!("{}/vouchers", env.app.base))
        .send()
        .await
        .expect("sent");
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    env.finish(&[]).await;
}
