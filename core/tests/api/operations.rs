//! What operators rely on: health, readiness, metrics on their own port, the OpenAPI
//! document, and a clear 503 when the database is down.

use std::collections::BTreeSet;

use reqwest::StatusCode;
use serde_json::Value;
use sqlx::Connection;

use crate::helpers::{settings_for, voucher_body, TestApp, TestEnv};

#[tokio::test]
async fn health_and_readiness_answer_when_the_database_is_up() {
    let env = TestEnv::start().await;

    let health = env
        .app
        .client
        .get(format!("{}/healthz", env.app.base))
        .send()
        .await
        .expect("sent");
    let ready = env
        .app
        .client
        .get(format!("{}/readyz", env.app.base))
        .send()
        .await
        .expect("sent");

    assert_eq!(health.status(), StatusCode::OK);
    assert_eq!(ready.status(), StatusCode::OK);
    env.finish(&[]).await;
}

#[tokio::test]
async fn a_database_that_cannot_be_reached_gives_503_with_retry_after() {
    // A port nothing listens on: the service still starts (lazy pool) and says why it cannot serve.
    let mut settings = settings_for("postgres://postgres@127.0.0.1:1/none");
    settings.database.migrate = false;
    settings.database.acquire_timeout = std::time::Duration::from_millis(500);
    let app = TestApp::start(&settings).await;

    let ready = app
        .client
        .get(format!("{}/readyz", app.base))
        .send()
        .await
        .expect("sent");
    let reserve = app.reserve("ANY", "c1", "o1", 100_000).await;
    let health = app
        .client
        .get(format!("{}/healthz", app.base))
        .send()
        .await
        .expect("sent");

    assert_eq!(ready.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reserve.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reserve.headers()["retry-after"], "1");
    let err: Value = reserve.json().await.expect("json");
    assert_eq!(err["error"], "SERVICE_UNAVAILABLE");
    assert!(
        !err["message"].as_str().unwrap_or("").contains("127.0.0.1"),
        "no internals leak: {err}"
    );
    assert_eq!(
        health.status(),
        StatusCode::OK,
        "liveness does not depend on the database"
    );
    app.stop().await;
}

#[tokio::test]
async fn metrics_are_served_on_their_own_port_by_route_template() {
    let env = TestEnv::start().await;
    env.app.given_voucher(voucher_body("M", 1, 1)).await;
    env.app.reserve("M", "c1", "o1", 100_000).await;
    env.app.reserve("M", "c2", "o2", 100_000).await;

    let text = env.app.metrics_text().await;
    let public = env
        .app
        .client
        .get(format!("{}/metrics", env.app.base))
        .send()
        .await
        .expect("sent");

    assert_eq!(
        public.status(),
        StatusCode::NOT_FOUND,
        "metrics are not on the public port"
    );
    assert!(text.contains(r#"http_requests_total{code="OK",method="POST",route="/vouchers/{code}/reservations",status="201"} 1"#), "{text}");
    assert!(text.contains(r#"http_requests_total{code="OUT_OF_STOCK",method="POST",route="/vouchers/{code}/reservations",status="409"} 1"#), "{text}");
    assert!(
        text.contains(r#"voucher_reservations_total{mode="standard",outcome="reserved"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"voucher_reservations_total{mode="standard",outcome="OUT_OF_STOCK"} 1"#),
        "{text}"
    );
    assert!(
        text.contains("http_request_duration_seconds_bucket"),
        "{text}"
    );
    assert!(
        !text.contains("route=\"/vouchers/M"),
        "raw paths never become labels"
    );
    env.finish(&[crate::invariants::Accepted::new("M", "c1", "o1")])
        .await;
}

/// Series of the metrics text: every sample line.
fn series(text: &str) -> usize {
    text.lines().filter(|l| !l.starts_with('#')).count()
}

/// A client may send any token as a method and any path: labels come from closed sets
/// (unknown methods are OTHER, unknown routes `unmatched`), so the series stay as many.
#[tokio::test]
async fn made_up_methods_and_paths_add_no_metric_series() {
    let env = TestEnv::start().await;
    let send = |method: String, path: String| {
        let request = env.app.client.request(
            reqwest::Method::from_bytes(method.as_bytes()).expect("a method token"),
            format!("{}{path}", env.app.base),
        );
        async move {
            let status = request.send().await.expect("answered").status();
            assert!(status.is_client_error(), "{method} {path}: {status}");
        }
    };
    // One of each kind first: an unknown method on an unknown path (404) and on a known
    // one (405), a known method on an unknown path.
    send("XM0".into(), "/nowhere".into()).await;
    send("XM0".into(), "/vouchers".into()).await;
    send("GET".into(), "/nowhere".into()).await;
    let before = series(&env.app.metrics_text().await);

    for i in 1..=2_000u32 {
        let method = format!("XM{i}");
        let path = match i % 3 {
            0 => format!("/nowhere-{i}/{}", i.wrapping_mul(7_919) % 1_000),
            1 => "/vouchers".to_owned(),
            _ => format!("/vouchers/{i}/reservations/{i}/x"),
        };
        send(method, path).await;
    }

    let text = env.app.metrics_text().await;
    assert_eq!(series(&text), before, "{text}");
    assert!(text.contains(r#"method="OTHER""#), "{text}");
    assert!(!text.contains("XM1"), "{text}");
    env.finish(&[]).await;
}

#[tokio::test]
async fn the_openapi_document_describes_exactly_the_served_routes() {
    let env = TestEnv::start().await;

    let doc: Value = env
        .app
        .client
        .get(format!("{}/openapi.json", env.app.base))
        .send()
        .await
        .expect("sent")
        .json()
        .await
        .expect("json");

    let mut operations = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in item.as_object().expect("path item").keys() {
            operations.insert(format!("{} {path}", method.to_uppercase()));
        }
    }
    // The edge's route table (the wire contract) plus health: nothing more, nothing less,
    // so the edge and the core cannot disagree on what a path is.
    let expected: BTreeSet<String> = voucher_contract::Route::TEMPLATES
        .iter()
        .map(|(method, path)| format!("{} {path}", method.to_uppercase()))
        .chain(["GET /healthz".to_owned(), "GET /readyz".to_owned()])
        .collect();
    assert_eq!(operations, expected);
    let documented = |path: &str, method: &str| -> BTreeSet<String> {
        doc["paths"][path][method]["responses"]
            .as_object()
            .expect("responses")
            .keys()
            .cloned()
            .collect()
    };
    let set = |codes: &[&str]| codes.iter().map(|c| c.to_string()).collect::<BTreeSet<_>>();
    // The core's answers and the edge's own (400, 413, 429, 431, 503; 403 on admin calls).
    assert_eq!(
        documented("/vouchers/{code}/reservations", "post"),
        set(&["201", "400", "404", "409", "413", "415", "422", "429", "431", "503"])
    );
    assert_eq!(
        documented("/vouchers", "post"),
        set(&["201", "400", "401", "403", "409", "413", "415", "429", "431", "503"])
    );
    assert_eq!(
        documented("/vouchers/{code}/reservations/{orderId}/confirm", "post"),
        set(&["200", "400", "404", "409", "413", "429", "431", "503"])
    );
    assert_eq!(
        documented("/vouchers/{code}/reservations/{orderId}", "delete"),
        set(&["200", "400", "404", "409", "413", "429", "431", "503"])
    );
    // The edge answers its own /healthz: nothing of its own to add there.
    assert_eq!(documented("/healthz", "get"), set(&["200"]));

    // `error` is an enum of every code; headers are declared on every answer; every JSON
    // answer has an example, errors one with the code its description names first.
    let codes: BTreeSet<String> = doc["components"]["schemas"]["ErrorBody"]["properties"]["error"]
        ["enum"]
        .as_array()
        .expect("error is an enum")
        .iter()
        .filter_map(|v| v.as_str().map(String::from))
        .collect();
    let all: BTreeSet<String> = voucher_contract::ErrorCode::ALL
        .iter()
        .map(|c| c.as_str().to_owned())
        .collect();
    assert_eq!(codes, all);
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, operation) in item.as_object().expect("path item") {
            for (status, response) in operation["responses"].as_object().expect("responses") {
                let at = format!("{method} {path} {status}");
                let headers = response["headers"].as_object().expect("headers");
                assert!(headers.contains_key("x-request-id"), "{at}");
                let status: u16 = status.parse().expect("numeric status");
                assert_eq!(headers.contains_key("x-error-code"), status >= 400, "{at}");
                assert_eq!(
                    headers.contains_key("Retry-After"),
                    status == 503 || status == 429,
                    "{at}"
                );
                if let Some(json) = response["content"].get("application/json") {
                    let example = &json["example"];
                    assert!(example.is_object(), "{at}: no example in {response}");
                    if status >= 400 {
                        let code = example["error"].as_str().expect("an error example");
                        assert!(all.contains(code), "{at}: {code}");
                    }
                }
            }
        }
    }
    assert_eq!(
        doc["paths"]["/vouchers/{code}/reservations"]["post"]["responses"]["201"]["headers"]
            ["idempotent-replayed"]["$ref"],
        "#/components/headers/IdempotentReplayed"
    );
    assert_eq!(
        doc["paths"]["/vouchers/{code}/reservations"]["post"]["responses"]["409"]["content"]
            ["application/json"]["example"]["error"],
        "OUT_OF_STOCK"
    );
    assert!(doc["components"]["securitySchemes"]["token"].is_object());
    // Every admin call names the scope its token needs.
    for (path, method, scope) in [
        ("/vouchers", "post", "vouchers:write"),
        ("/vouchers", "get", "vouchers:read"),
        ("/vouchers/{code}", "patch", "vouchers:write"),
        ("/vouchers/{code}/pause", "post", "vouchers:write"),
        ("/vouchers/{code}/audit", "get", "audit:read"),
        ("/vouchers/{code}/orders/filter", "get", "orders:read"),
    ] {
        assert_eq!(
            doc["paths"][path][method]["security"][0]["token"][0], scope,
            "{method} {path}"
        );
    }
    for schema in [
        "CreateVoucher",
        "Reserve",
        "ReservationView",
        "VoucherView",
        "ErrorBody",
        "GateReload",
        "OrderIds",
        "Health",
        "Readiness",
    ] {
        assert!(
            doc["components"]["schemas"][schema].is_object(),
            "{schema} documented"
        );
    }
    // Request schemas say which fields are required, as the service enforces.
    let required: BTreeSet<String> = doc["components"]["schemas"]["Reserve"]["required"]
        .as_array()
        .expect("required")
        .iter()
        .filter_map(|v| v.as_str().map(String::from))
        .collect();
    assert_eq!(required, set(&["customerId", "orderId", "orderAmount"]));
    env.finish(&[]).await;
}

#[tokio::test]
async fn a_database_closed_to_new_connections_gives_503_not_500() {
    // What an operator's maintenance (or the fault campaign's database outage) looks like:
    // the database refuses new connections and ends the open ones. Every answer says
    // "try again" (503), none says "broken" (500).
    let env = TestEnv::start().await;
    env.app.given_voucher(voucher_body("CLOSED", 10, 1)).await;
    let first = env.app.attempt("CLOSED", "c1", "closed-1", 100_000).await;
    assert_eq!(first.status, StatusCode::CREATED);

    let (server, _) = env.db.url.rsplit_once('/').expect("url with a name");
    let mut admin = sqlx::PgConnection::connect(&format!("{server}/postgres"))
        .await
        .expect("admin connection");
    let allow = |on: bool| format!("ALTER DATABASE {} ALLOW_CONNECTIONS {on}", env.db.name);
    sqlx::query(&allow(false))
        .execute(&mut admin)
        .await
        .expect("closed");
    sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1")
        .bind(&env.db.name)
        .execute(&mut admin)
        .await
        .expect("sessions ended");

    let ready = env
        .app
        .client
        .get(format!("{}/readyz", env.app.base))
        .send()
        .await
        .expect("sent");
    let confirm = env.app.confirm("CLOSED", "closed-1").await;
    let reserve = env.app.reserve("CLOSED", "c2", "closed-2", 100_000).await;
    for (what, status) in [
        ("readyz", ready.status()),
        ("confirm", confirm.status()),
        ("reserve", reserve.status()),
    ] {
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{what}");
    }

    sqlx::query(&allow(true))
        .execute(&mut admin)
        .await
        .expect("opened");
    env.finish(&[first.accepted()]).await;
}

/// SIGTERM, as an orchestrator sends it: `readyz` turns 503 at once (the edge's health
/// checks stop sending), requests are still served through the drain delay, then the
/// process stops on its own.
#[tokio::test]
async fn sigterm_turns_readyz_to_503_keeps_serving_through_the_drain_then_exits() {
    use voucher_testkit::helpers::TestDb;
    use voucher_testkit::stack::CoreProcess;
    use voucher_testkit::wait::eventually;

    let db = TestDb::create().await;
    let settings = settings_for(&db.url);
    let mut core = CoreProcess::start(
        std::path::Path::new(env!("CARGO_BIN_EXE_voucher-core")),
        &settings,
        &[
            ("VOUCHER__HTTP__DRAIN_DELAY", "3s"),
            ("VOUCHER__HTTP__SHUTDOWN_DEADLINE", "5s"),
        ],
    )
    .await;
    let ready = |api: &voucher_testkit::helpers::ApiClient| {
        let request = api.client.get(format!("{}/readyz", api.base));
        async move { request.send().await.map(|r| r.status()).ok() }
    };
    assert_eq!(ready(&core.api).await, Some(StatusCode::OK));

    core.terminate();
    eventually(
        std::time::Duration::from_secs(2),
        "readyz to turn 503",
        || async {
            (ready(&core.api).await == Some(StatusCode::SERVICE_UNAVAILABLE)).then_some(())
        },
    )
    .await;
    // Draining, not stopped: the API still answers.
    let during = core.api.get_voucher("NOSUCH").await.status();
    assert_eq!(during, StatusCode::NOT_FOUND);
    assert!(!core.exited(), "still running during the drain");

    eventually(
        std::time::Duration::from_secs(10),
        "the process to exit",
        || {
            let exited = core.exited();
            async move { exited.then_some(()) }
        },
    )
    .await;
    db.drop_db().await;
}

/// A core run as a container would (environment only, `VOUCHER__LOG__FORMAT=json`, its
/// access log turned on) writes one JSON access line per request, in the span of the request's id: the id it was sent
/// (the edge's) when valid, else one of its own; the answer echoes it.
#[tokio::test]
async fn each_request_is_one_json_access_line_with_the_request_id_it_echoes() {
    use voucher_testkit::helpers::TestDb;
    use voucher_testkit::stack::CoreProcess;
    use voucher_testkit::wait::eventually;

    let db = TestDb::create().await;
    let settings = settings_for(&db.url);
    let core = CoreProcess::start(
        std::path::Path::new(env!("CARGO_BIN_EXE_voucher-core")),
        &settings,
        &[
            ("VOUCHER__LOG__FORMAT", "json"),
            ("VOUCHER__LOG__ACCESS", "true"),
        ],
    )
    .await;
    let get = |id: Option<&'static str>| {
        let mut request = core
            .api
            .client
            .get(format!("{}/vouchers/NOPE", core.api.base));
        if let Some(id) = id {
            request = request.header("x-request-id", id);
        }
        request.send()
    };
    let echoed = |r: &reqwest::Response| {
        r.headers()
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .expect("x-request-id on the answer")
    };
    let given = get(Some("edge-5b1d.9")).await.expect("sent");
    assert_eq!(given.status(), StatusCode::NOT_FOUND);
    assert_eq!(echoed(&given), "edge-5b1d.9");
    let made = get(Some("not valid: spaces")).await.expect("sent");
    let made_id = echoed(&made);
    assert!(
        made_id.len() == 32 && made_id.bytes().all(|b| b.is_ascii_hexdigit()),
        "{made_id}"
    );

    for (id, status) in [("edge-5b1d.9", 404), (made_id.as_str(), 404)] {
        let line = eventually(
            std::time::Duration::from_secs(5),
            "the access line",
            || async {
                std::fs::read_to_string(&core.log)
                    .unwrap_or_default()
                    .lines()
                    .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                    .find(|l| l["target"] == "access" && l["span"]["request_id"] == id)
            },
        )
        .await;
        assert_eq!(line["level"], "INFO", "{line}");
        assert_eq!(line["fields"]["status"], status, "{line}");
        assert_eq!(line["fields"]["route"], "/vouchers/{code}", "{line}");
        assert_eq!(line["span"]["path"], "/vouchers/NOPE", "{line}");
    }
    drop(core);
    db.drop_db().await;
}

/// Connections cost a core little memory: 300 kept-alive connections, each with a request
/// answered, add a few megabytes to its resident memory (its own process metric). A
/// handler holding the OpenAPI document as a JSON tree once cost every connection a deep
/// copy of it (axum clones handlers per connection): 660 KB each, 200 MB here.
#[tokio::test]
async fn three_hundred_connections_cost_a_core_a_few_megabytes() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use voucher_testkit::helpers::TestDb;
    use voucher_testkit::stack::CoreProcess;

    let db = TestDb::create().await;
    let settings = settings_for(&db.url);
    let core = CoreProcess::start(
        std::path::Path::new(env!("CARGO_BIN_EXE_voucher-core")),
        &settings,
        &[("VOUCHER__LOG__ACCESS", "false")],
    )
    .await;
    let resident = |m: voucher_testkit::metrics::Metrics| {
        m.sum("process_resident_memory_bytes", &[]) / (1024.0 * 1024.0)
    };
    let address = core.api.base.trim_start_matches("http://").to_owned();
    // Warm up: the first requests allocate what every later one reuses.
    for _ in 0..20 {
        let _ = core
            .api
            .client
            .get(format!("{}/healthz", core.api.base))
            .send()
            .await;
    }
    let before = resident(core.metrics().await);
    let mut held = Vec::new();
    for _ in 0..300 {
        let mut stream = tokio::net::TcpStream::connect(&address)
            .await
            .expect("connected");
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: core\r\n\r\n")
            .await
            .expect("sent");
        let mut answer = [0u8; 512];
        let n = stream.read(&mut answer).await.expect("answered");
        assert!(
            answer[..n].starts_with(b"HTTP/1.1 200"),
            "{:?}",
            String::from_utf8_lossy(&answer[..n])
        );
        held.push(stream);
    }
    let after = resident(core.metrics().await);
    assert!(
        after - before < 40.0,
        "300 connections took the core from {before:.1} MiB to {after:.1} MiB"
    );
    drop(held);
    drop(core);
    db.drop_db().await;
}
