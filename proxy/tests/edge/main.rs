//! End-to-end tests through the real edge binary, in front of two real cores, on the real
//! PostgreSQL, Redis and a tansu broker of each test's own (the testkit's flash stack).

mod dashboards;

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};
use voucher_contract::headers;
use voucher_testkit::assert::assert_error;
use voucher_testkit::helpers::{run_all, voucher_body, TestApp, ADMIN_TOKEN};
use voucher_testkit::invariants::Accepted;
use voucher_testkit::sale::{reserve_concurrently, Attempt, Sale};
use voucher_testkit::stack::{flash_voucher, FlashStack};
use voucher_testkit::wait::eventually;

/// Two cores (flash mode available) behind the edge binary, flags living `ttl`.
async fn stack(ttl: Duration) -> FlashStack {
    stack_with(ttl, |_| {}).await
}

async fn stack_with(
    ttl: Duration,
    tweak: impl FnOnce(&mut voucher_core::config::Settings),
) -> FlashStack {
    FlashStack::builder()
        .cores(2)
        .edge(env!("CARGO_BIN_EXE_voucher-edge"), ttl)
        .start_with(tweak)
        .await
}

/// Reservation requests one core answered, from its metrics.
async fn reservations_at(core: &TestApp) -> f64 {
    core.metrics().await.sum(
        "http_requests_total",
        &[("route", "/vouchers/{code}/reservations")],
    )
}

/// Reservation requests that reached any core.
async fn core_reservations(stack: &FlashStack) -> f64 {
    let mut total = 0.0;
    for core in &stack.cores {
        total += reservations_at(core).await;
    }
    total
}

/// Waits until the edge answers for `code` itself (its flag and order list are in).
async fn until_edge_answers(stack: &FlashStack, code: &str) {
    let mut probe = 0;
    eventually(Duration::from_secs(10), "the edge to answer alone", || {
        probe += 1;
        let order = format!("probe-{probe}");
        async move {
            let resp = stack
                .edge()
                .api
                .reserve(code, "probe", &order, 100_000)
                .await;
            resp.headers().get(headers::SERVED_BY).map(|_| ())
        }
    })
    .await;
}

async fn sale_of_2000_on_50_uses(mode: &str) {
    let stack = stack(Duration::from_secs(30)).await;
    let body = if mode == "flash" {
        flash_voucher("HOT", 50, 1)
    } else {
        voucher_body("HOT", 50, 1)
    };
    stack.app().given_voucher(body).await;

    let sale = Sale {
        in_flight: 200,
        ..Sale::new("HOT", "race", 2000)
    }
    .run(&stack.edge().api)
    .await;

    assert_eq!(sale.created(), 50, "{mode}");
    assert_eq!(
        sale.count(StatusCode::CONFLICT, "OUT_OF_STOCK"),
        1950,
        "{mode}"
    );
    stack.finish(&sale.accepted()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_thousand_through_the_edge_on_fifty_flash_uses() {
    sale_of_2000_on_50_uses("flash").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_thousand_through_the_edge_on_fifty_standard_uses() {
    sale_of_2000_on_50_uses("standard").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn after_the_sell_out_the_edge_answers_alone_and_holders_still_get_their_201() {
    // A long TTL: this test is about what happens while the flag holds, not about timing.
    let stack = stack(Duration::from_secs(60)).await;
    stack
        .app()
        .given_voucher(flash_voucher("GONE", 20, 1))
        .await;
    let edge = &stack.edge().api;
    let sale = Sale::new("GONE", "first", 100).run(edge).await;
    assert_eq!(sale.created(), 20);
    let holder = sale
        .attempts
        .iter()
        .find(|a| a.status == StatusCode::CREATED)
        .expect("a holder")
        .clone();
    until_edge_answers(&stack, "GONE").await;
    let at_core_before = core_reservations(&stack).await;

    let late: Vec<Attempt> = reserve_concurrently(
        edge,
        "GONE",
        (0..5000)
            .map(|i| (format!("late-c{i}"), format!("late-o{i}")))
            .collect(),
    )
    .await;
    let retry = edge
        .reserve("GONE", &holder.customer, &holder.order, 100_000)
        .await;

    assert_eq!(
        voucher_testkit::sale::count(&late, StatusCode::CONFLICT, "OUT_OF_STOCK"),
        5000
    );
    assert_eq!(
        core_reservations(&stack).await - at_core_before,
        1.0,
        "only the holder's retry reached a core"
    );
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(
        retry.json::<Value>().await.expect("json"),
        holder.body,
        "the original 201 body"
    );
    let metrics = stack.edge().metrics().await;
    assert!(
        metrics.sum(
            "edge_requests_total",
            &[("outcome", "sold_out"), ("route", "reserve")]
        ) >= 5000.0
    );
    stack.finish(&sale.accepted()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_released_use_is_taken_again_through_the_edge_within_the_ttl() {
    let stack = stack(Duration::from_secs(60)).await;
    stack.app().given_voucher(flash_voucher("BACK", 1, 1)).await;
    let edge = &stack.edge().api;
    let first = edge.reserve("BACK", "alice", "a-1", 100_000).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    until_edge_answers(&stack, "BACK").await;

    stack.caught_up().await;
    let released = edge.release("BACK", "a-1").await;
    assert_eq!(
        released.status(),
        StatusCode::OK,
        "release passes through the edge"
    );
    // The core announces the give-back; the edge drops its flag on that signal, long
    // before the 60 s TTL.
    eventually(
        Duration::from_secs(2),
        "the released use through the edge",
        || async {
            let resp = edge.reserve("BACK", "bob", "b-1", 100_000).await;
            (resp.status() == StatusCode::CREATED).then_some(())
        },
    )
    .await;
    let metrics = stack.edge().metrics().await;
    assert_eq!(metrics.sum("edge_availability_signals_total", &[]), 1.0);
    let accepted = [("alice", "a-1"), ("bob", "b-1")].map(|(c, o)| Accepted::new("BACK", c, o));
    stack.finish(&accepted).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_core_killed_mid_run_the_other_takes_its_share() {
    let mut stack = stack(Duration::from_secs(30)).await;
    stack
        .app()
        .given_voucher(voucher_body("HALF", 400, 1))
        .await;
    let plan = Sale {
        in_flight: 20,
        retries_503: 0,
        ..Sale::new("HALF", "half", 800)
    };
    let dead = stack.cores.remove(0);
    let selling = plan.run(&stack.edge().api);
    let kill = async {
        // Mid-run: once the doomed core has served part of the sale.
        eventually(
            Duration::from_secs(60),
            "the doomed core to serve",
            || async { (reservations_at(&dead).await >= 100.0).then_some(()) },
        )
        .await;
        let survivor_before = reservations_at(&stack.cores[0]).await;
        dead.stop().await;
        survivor_before
    };
    let (sale, survivor_before) = tokio::join!(selling, kill);

    assert!(
        reservations_at(&stack.cores[0]).await > survivor_before + 100.0,
        "the surviving core took the rest of the sale"
    );
    let refused = sale.count(StatusCode::CONFLICT, "OUT_OF_STOCK");
    let failed: Vec<&Attempt> = sale
        .attempts
        .iter()
        .filter(|a| a.status.is_server_error())
        .collect();
    assert!(failed.is_empty(), "no request failed: {failed:#?}");
    assert_eq!((sale.created(), refused), (400, 400));
    stack.finish(&sale.accepted()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn admin_calls_oversized_bodies_and_no_cores_are_refused_at_the_edge() {
    let mut stack = stack(Duration::from_secs(30)).await;
    let edge = &stack.edge().api;

    let admin = edge
        .client
        .post(format!("{}/vouchers", edge.base))
        .bearer_auth(ADMIN_TOKEN)
        .json(&voucher_body("ADM", 5, 1))
        .send()
        .await
        .expect("sent");
    let reload = edge
        .client
        .post(format!("{}/vouchers/ADM/gate/reload", edge.base))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("sent");
    let big =
        json!({"customerId": "c", "orderId": "o", "orderAmount": 1, "pad": "x".repeat(10_000)});
    let too_large = edge.post_json("/vouchers/ADM/reservations", &big).await;
    let stream = futures::stream::iter(vec![Ok::<_, std::io::Error>(big.to_string().into_bytes())]);
    let chunked = edge
        .client
        .post(format!("{}/vouchers/ADM/reservations", edge.base))
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(stream))
        .send()
        .await
        .expect("sent");

    assert_error(admin, StatusCode::FORBIDDEN, "FORBIDDEN").await;
    assert_error(reload, StatusCode::FORBIDDEN, "FORBIDDEN").await;
    assert_error(
        too_large,
        StatusCode::PAYLOAD_TOO_LARGE,
        "PAYLOAD_TOO_LARGE",
    )
    .await;
    assert_error(chunked, StatusCode::PAYLOAD_TOO_LARGE, "PAYLOAD_TOO_LARGE").await;
    assert_eq!(
        stack.app().get_voucher("ADM").await.status(),
        StatusCode::NOT_FOUND,
        "nothing was created"
    );

    // Every core down: a prompt 503 in the API's format, not a hang.
    for core in std::mem::take(&mut stack.cores) {
        core.stop().await;
    }
    tokio::time::sleep(Duration::from_millis(400)).await; // health checks notice
    let started = std::time::Instant::now();
    let down = stack.edge().api.reserve("ADM", "c", "o", 100_000).await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "answered in {:?}",
        started.elapsed()
    );
    assert_error(down, StatusCode::SERVICE_UNAVAILABLE, "SERVICE_UNAVAILABLE").await;
    stack.tear_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn confirm_release_and_get_pass_through_untouched_by_the_flag() {
    let stack = stack(Duration::from_secs(60)).await;
    stack.app().given_voucher(voucher_body("PASS", 2, 1)).await;
    let edge = &stack.edge().api;
    let holders = run_all(
        [("c1", "o1"), ("c2", "o2")]
            .map(|(c, o)| async move { edge.reserve("PASS", c, o, 100_000).await.status() }),
    )
    .await;
    assert!(holders.iter().all(|s| *s == StatusCode::CREATED));
    until_edge_answers(&stack, "PASS").await;

    let got = edge.get_voucher("PASS").await;
    let confirmed = edge.confirm("PASS", "o1").await;

    assert_eq!(got.status(), StatusCode::OK);
    assert_eq!(got.json::<Value>().await.expect("json")["remaining"], 0);
    assert_eq!(confirmed.status(), StatusCode::OK);
    assert!(confirmed.headers().get(headers::SERVED_BY).is_none());
    let accepted = [("c1", "o1"), ("c2", "o2")].map(|(c, o)| Accepted::new("PASS", c, o));
    stack.finish(&accepted).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_core_that_cannot_reach_its_broker_gets_no_traffic() {
    // Core A on the stack's broker; core B on a broker of its own, which then dies: B says
    // it is not ready (`/readyz` 503 once it has not read a broker for 15 s) and the edge,
    // which checks readiness, must stop sending it anything.
    let stack = FlashStack::start().await;
    let mut lonely_broker = voucher_testkit::stack::Broker::start().await;
    let mut settings = stack.settings.clone();
    if let Some(kafka) = settings.kafka.as_mut() {
        kafka.brokers = lonely_broker.address();
    }
    let b = TestApp::start(&settings).await;
    let edge = voucher_testkit::stack::EdgeProcess::start(
        std::path::Path::new(env!("CARGO_BIN_EXE_voucher-edge")),
        &[stack.app().address(), b.address()],
        stack.key_prefix(),
        Duration::from_secs(2),
    )
    .await;
    stack
        .app()
        .given_voucher(voucher_body("READY", 1000, 1))
        .await;
    // Both cores serve while both are ready.
    let warm = Sale::new("READY", "warm", 100).run(&edge.api).await;
    assert_eq!(warm.created(), 100);
    assert!(reservations_at(&b).await > 0.0, "B served while ready");

    lonely_broker.kill();
    eventually(
        Duration::from_secs(40),
        "core B to say it is not ready",
        || async {
            let ready = b
                .client
                .get(format!("{}/readyz", b.base))
                .send()
                .await
                .ok()?;
            (ready.status() == StatusCode::SERVICE_UNAVAILABLE).then_some(())
        },
    )
    .await;
    // A few health checks of the edge (every 100 ms here).
    tokio::time::sleep(Duration::from_millis(500)).await;

    let b_before = reservations_at(&b).await;
    let after = Sale::new("READY", "after", 200).run(&edge.api).await;
    assert_eq!(after.created(), 200, "core A took every request");
    assert_eq!(
        reservations_at(&b).await,
        b_before,
        "nothing reached the core that is not ready"
    );
    drop(edge);
    b.stop().await;
    let mut accepted = warm.accepted();
    accepted.extend(after.accepted());
    stack.finish(&accepted).await;
}

/// Series of a metrics text: every sample line.
fn series(text: &str) -> usize {
    text.lines().filter(|l| !l.starts_with('#')).count()
}

/// Made-up methods and paths through the edge: whatever the edge forwards or answers, the
/// series of the edge and of the cores stay as many (labels come from closed sets).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn made_up_methods_and_paths_through_the_edge_add_no_metric_series() {
    let stack = stack(Duration::from_secs(2)).await;
    let edge = &stack.edge().api;
    let send = |method: String, path: String| {
        let request = edge.client.request(
            reqwest::Method::from_bytes(method.as_bytes()).expect("a method token"),
            format!("{}{path}", edge.base),
        );
        async move {
            let status = request.send().await.expect("answered").status();
            assert!(status.is_client_error(), "{method} {path}: {status}");
        }
    };
    let paths = |i: u32| match i % 3 {
        0 => format!("/nowhere-{i}/{}", i.wrapping_mul(7_919) % 1_000),
        1 => "/vouchers".to_owned(),
        _ => format!("/vouchers/{i}/reservations/{i}/x"),
    };
    // One of each kind first, on every core (the edge balances round-robin).
    for i in 0..6 {
        send(format!("XW{i}"), paths(i)).await;
    }
    let count = || async {
        let mut total = series(&stack.edge().metrics_text().await);
        for core in &stack.cores {
            total += series(&core.metrics_text().await);
        }
        total
    };
    let before = count().await;

    for i in 6..2_006u32 {
        send(format!("XW{i}"), paths(i)).await;
    }

    assert_eq!(count().await, before);
    stack.finish(&[]).await;
}
