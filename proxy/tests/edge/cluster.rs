//! The edge as a cluster runs it: its own readiness, a drain on SIGTERM as the cores
//! drain, cores found from names (a core that comes later is found), and a listener on all
//! interfaces.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::Value;
use voucher_testkit::helpers::{settings_for, voucher_body, TestApp, TestEnv};
use voucher_testkit::invariants::Accepted;
use voucher_testkit::stack::{EdgeProcess, REDIS_URL};
use voucher_testkit::wait::eventually;

fn binary() -> &'static std::path::Path {
    std::path::Path::new(env!("CARGO_BIN_EXE_voucher-edge"))
}

async fn readyz(edge: &EdgeProcess) -> (StatusCode, Value) {
    let resp = edge
        .api
        .client
        .get(format!("{}/readyz", edge.api.base))
        .send()
        .await
        .expect("the edge answers");
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// A core that is not there yet is found once it listens under the name the edge was
/// given (`localhost`, resolved again and again); until then the edge is not ready, and
/// once the core goes it is not ready again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_edge_is_ready_while_a_core_it_finds_by_name_is() {
    let port = voucher_testkit::free_port();
    let upstream = format!("localhost:{port}");
    let edge = EdgeProcess::start_with_env(
        binary(),
        &[upstream.as_str()],
        REDIS_URL,
        "vg-cluster-late:",
        Duration::from_secs(1),
        &[("EDGE__UPSTREAM_RESOLVE_INTERVAL", "200ms")],
    )
    .await;
    let (status, body) = readyz(&edge).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("SERVICE_UNAVAILABLE"))
    );
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("no core is ready")),
        "{body}"
    );

    let env = TestEnv::start().await;
    let late = TestApp::start(&{
        let mut s = settings_for(&env.db.url);
        s.http.listen = format!("127.0.0.1:{port}").parse().expect("addr");
        s
    })
    .await;
    late.given_voucher(voucher_body("LATE", 10, 1)).await;
    eventually(
        Duration::from_secs(10),
        "the edge ready with its core",
        || async { (readyz(&edge).await.0 == StatusCode::OK).then_some(()) },
    )
    .await;
    let resp = edge.api.reserve("LATE", "c1", "o1", 100_000).await;
    assert_eq!(
        resp.status(),
        StatusCode::CREATED,
        "served through the core found by name"
    );
    // The core goes: the edge is not ready again (its readiness check fails).
    late.stop().await;
    eventually(
        Duration::from_secs(10),
        "the edge not ready without its core",
        || async { (readyz(&edge).await.0 == StatusCode::SERVICE_UNAVAILABLE).then_some(()) },
    )
    .await;
    drop(edge);
    env.finish(&[Accepted::new("LATE", "c1", "o1")]).await;
}

/// SIGTERM: `readyz` turns 503 at once while reservations are still served for the drain
/// delay; then the edge stops within the delay and the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_sigterm_the_edge_drains_as_the_cores_do() {
    let env = TestEnv::start().await;
    env.app.given_voucher(voucher_body("DRAIN", 10, 1)).await;
    let mut edge = EdgeProcess::start_with_env(
        binary(),
        &[env.app.address()],
        REDIS_URL,
        "vg-cluster-drain:",
        Duration::from_secs(1),
        &[
            ("EDGE__DRAIN_DELAY", "2s"),
            ("EDGE__SHUTDOWN_DEADLINE", "1s"),
        ],
    )
    .await;
    assert_eq!(
        readyz(&edge).await,
        (StatusCode::OK, serde_json::json!({ "status": "ready" }))
    );
    let asked = Instant::now();
    edge.terminate();
    eventually(
        Duration::from_secs(1),
        "readyz 503 while draining",
        || async {
            let (status, body) = readyz(&edge).await;
            (status == StatusCode::SERVICE_UNAVAILABLE
                && body["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("draining")))
            .then_some(())
        },
    )
    .await;
    // Still serving: the balancer in front is the one to stop sending.
    let served = edge.api.reserve("DRAIN", "c1", "o1", 100_000).await;
    assert_eq!(served.status(), StatusCode::CREATED);
    assert!(
        asked.elapsed() < Duration::from_secs(2),
        "the reservation came within the drain delay"
    );
    eventually(Duration::from_secs(8), "the edge to exit", || {
        let exited = edge.exited();
        async move { exited.then_some(()) }
    })
    .await;
    let took = asked.elapsed();
    assert!(
        took >= Duration::from_secs(2),
        "it drained for the delay: {took:?}"
    );
    assert!(
        took < Duration::from_secs(6),
        "delay 2 s, deadline 1 s, runtimes 1 s: {took:?}"
    );
    env.finish(&[Accepted::new("DRAIN", "c1", "o1")]).await;
}

/// Listeners configured on all interfaces (`0.0.0.0`) are reached on an address other than
/// loopback's own, as a pod's are on its IP.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn listeners_on_all_interfaces_answer_on_any_address() {
    let env = TestEnv::start().await;
    let port = voucher_testkit::free_port();
    let listen = format!("0.0.0.0:{port}");
    let edge = EdgeProcess::start_with_env(
        binary(),
        &[env.app.address()],
        REDIS_URL,
        "vg-cluster-any:",
        Duration::from_secs(1),
        &[("EDGE__LISTEN", listen.as_str())],
    )
    .await;
    // 127.0.0.2 is loopback too, but not the address 127.0.0.1 a loopback-only listener binds.
    let resp = reqwest::get(format!("http://127.0.0.2:{port}/healthz"))
        .await
        .expect("answered on 127.0.0.2");
    assert_eq!(resp.status(), StatusCode::OK);
    // The core likewise (`http.listen`).
    let core_port = voucher_testkit::free_port();
    let core = TestApp::start(&{
        let mut s = settings_for(&env.db.url);
        s.http.listen = format!("0.0.0.0:{core_port}").parse().expect("addr");
        s
    })
    .await;
    let resp = reqwest::get(format!("http://127.0.0.2:{core_port}/healthz"))
        .await
        .expect("answered on 127.0.0.2");
    assert_eq!(resp.status(), StatusCode::OK);
    core.stop().await;
    drop(edge);
    env.finish(&[]).await;
}
