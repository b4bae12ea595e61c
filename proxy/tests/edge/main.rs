//! End-to-end tests through the real edge binary, in front of two real cores, on the real
//! PostgreSQL, Redis and a tansu broker of each test's own (the testkit's flash stack).

mod cluster;
mod dashboards;
mod fuzz;
mod redis_cluster;
mod traces;

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};
use voucher_contract::headers;
use voucher_testkit::assert::assert_error;
use voucher_testkit::helpers::{run_all, voucher_body, TestApp, ADMIN_TOKEN};
use voucher_testkit::invariants::Accepted;
use voucher_testkit::sale::{reserve_concurrently, Attempt, Sale, SaleResult};
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

/// A flash voucher of `uses` (1 per customer) sold out through the edge by `customers`,
/// and the edge answering for it alone; returns the sale and one holder.
async fn sold_out_through_the_edge(
    stack: &FlashStack,
    code: &str,
    uses: usize,
    customers: usize,
) -> (SaleResult, Attempt) {
    stack
        .app()
        .given_voucher(flash_voucher(code, uses as i64, 1))
        .await;
    let sale = Sale::new(code, "first", customers)
        .run(&stack.edge().api)
        .await;
    assert_eq!(sale.created(), uses);
    let holder = sale
        .attempts
        .iter()
        .find(|a| a.status == StatusCode::CREATED)
        .expect("a holder")
        .clone();
    until_edge_answers(stack, code).await;
    (sale, holder)
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
    let (sale, holder) = sold_out_through_the_edge(&stack, "GONE", 20, 100).await;
    let edge = &stack.edge().api;
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
    // The holder's retry, and the filter's false positives (sized for 1%): forwarded to a
    // core, which answers them OUT_OF_STOCK too.
    let reached = core_reservations(&stack).await - at_core_before;
    assert!(
        (1.0..=1.0 + 5000.0 * 0.02).contains(&reached),
        "only the holder's retry and a few false positives reached a core: {reached}"
    );
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(
        retry.json::<Value>().await.expect("json"),
        holder.body,
        "the original 201 body"
    );
    let metrics = stack.edge().metrics().await;
    // Every late request the edge did not forward (the filter's false positives) it
    // answered itself.
    let false_positives = reached - 1.0;
    assert!(
        metrics.sum(
            "edge_requests_total",
            &[("outcome", "sold_out"), ("route", "reserve")]
        ) >= 5000.0 - false_positives
    );
    stack.finish(&sale.accepted()).await;
}

/// The gate's last use taken at a core, with no request through the edge at all: the
/// reserve script announces it on the sold-out channel, the edge sets the flag and
/// fetches the order filter on its own, and the very first late request through the edge
/// is answered there; a holder's retry still reaches a core and gets its 201.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_last_use_taken_at_a_core_flags_the_voucher_at_the_edge_before_any_refusal() {
    let stack = stack(Duration::from_secs(60)).await;
    let prefix = stack
        .settings
        .redis
        .as_ref()
        .expect("flash settings have Redis")
        .key_prefix
        .clone();
    let channel = voucher_contract::sold_out_channel(&prefix);
    // The announcement is not kept for a late subscriber: wait for the edge's subscription.
    voucher_testkit::stack::until_subscribed(voucher_testkit::stack::REDIS_URL, &channel).await;

    stack.app().given_voucher(flash_voucher("LAST", 3, 1)).await;
    let core = stack.app();
    let mut accepted = Vec::new();
    let mut bodies = Vec::new();
    for i in 0..3 {
        let (customer, order) = (format!("c{i}"), format!("o{i}"));
        let resp = core.reserve("LAST", &customer, &order, 100_000).await;
        assert_eq!(resp.status(), StatusCode::CREATED);
        bodies.push(resp.json::<Value>().await.expect("json"));
        accepted.push(Accepted::new("LAST", &customer, &order));
    }
    let edge = stack.edge();
    eventually(
        Duration::from_secs(10),
        "the edge's filter stored",
        || async {
            let m = edge.metrics().await;
            (m.sum("edge_order_filter_fetches_total", &[("outcome", "stored")]) >= 1.0)
                .then_some(())
        },
    )
    .await;
    let metrics = edge.metrics().await;
    assert_eq!(metrics.sum("edge_sold_out_signals_total", &[]), 1.0);
    assert_eq!(
        metrics.sum("edge_requests_total", &[("route", "reserve")]),
        0.0,
        "nothing went through the edge"
    );

    let at_core_before = core_reservations(&stack).await;
    let late = edge.api.reserve("LAST", "late", "late-1", 100_000).await;
    assert!(
        late.headers().get(headers::SERVED_BY).is_some(),
        "answered by the edge"
    );
    assert_error(late, StatusCode::CONFLICT, "OUT_OF_STOCK").await;
    assert_eq!(core_reservations(&stack).await, at_core_before);
    let retry = edge.api.reserve("LAST", "c1", "o1", 100_000).await;
    assert_eq!(
        retry.status(),
        StatusCode::CREATED,
        "a holder's retry reaches a core"
    );
    assert!(retry.headers().get(headers::SERVED_BY).is_none());
    assert_eq!(
        retry.json::<Value>().await.expect("json"),
        bodies[1],
        "the original 201 body"
    );
    stack.finish(&accepted).await;
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

/// A code of `prefix` and a number whose reservations go to `core` of `cores`.
fn code_going_to(cores: &[impl AsRef<str>], core: &str, prefix: &str) -> String {
    (0..10_000)
        .map(|i| format!("{prefix}{i}"))
        .find(|code| voucher_edge::routing::voucher_core(cores, code).as_deref() == Some(core))
        .expect("a code for every core among 10,000")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_vouchers_reservations_go_to_one_core_and_the_next_takes_them_when_it_dies() {
    let mut stack = stack(Duration::from_secs(30)).await;
    let addresses: Vec<&str> = stack.cores.iter().map(TestApp::address).collect();
    // The voucher's core is the first core, so that the one left is `stack.cores[0]`.
    let code = code_going_to(&addresses, addresses[0], "HALF");
    stack.app().given_voucher(voucher_body(&code, 400, 1)).await;
    let plan = Sale {
        in_flight: 20,
        retries_503: 0,
        ..Sale::new(&code, "half", 800)
    };
    let doomed = stack.cores.remove(0);
    let selling = plan.run(&stack.edge().api);
    let kill = async {
        // Mid-run: once the voucher's core has served part of the sale, and the other
        // core none of it.
        eventually(
            Duration::from_secs(60),
            "the voucher's core to serve",
            || async { (reservations_at(&doomed).await >= 100.0).then_some(()) },
        )
        .await;
        let other_before = reservations_at(&stack.cores[0]).await;
        doomed.stop().await;
        other_before
    };
    let (sale, other_before) = tokio::join!(selling, kill);

    assert_eq!(
        other_before, 0.0,
        "the voucher's reservations all went to its core"
    );
    assert!(
        reservations_at(&stack.cores[0]).await > 100.0,
        "the next core took the rest of the sale"
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
async fn every_core_takes_the_vouchers_of_its_part_of_the_ring() {
    let stack = stack(Duration::from_secs(30)).await;
    let addresses: Vec<&str> = stack.cores.iter().map(TestApp::address).collect();
    let mut accepted = Vec::new();
    for (i, core) in addresses.iter().enumerate() {
        let code = code_going_to(&addresses, core, &format!("SPREAD{i}X"));
        stack.app().given_voucher(voucher_body(&code, 50, 1)).await;
        let before: Vec<f64> = run_all(stack.cores.iter().map(reservations_at)).await;
        let sale = Sale::new(&code, &format!("spread{i}"), 20)
            .run(&stack.edge().api)
            .await;
        assert_eq!(sale.created(), 20);
        let after: Vec<f64> = run_all(stack.cores.iter().map(reservations_at)).await;
        for (j, (b, a)) in before.iter().zip(&after).enumerate() {
            let served = a - b;
            if i == j {
                assert!(
                    served >= 20.0,
                    "voucher {code}: its core {j} served {served}"
                );
            } else {
                assert_eq!(served, 0.0, "voucher {code}: core {j} served {served}");
            }
        }
        accepted.extend(sale.accepted());
    }
    stack.finish(&accepted).await;
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
    // A voucher whose core is B while B is ready.
    let code = code_going_to(&[stack.app().address(), b.address()], b.address(), "READY");
    stack
        .app()
        .given_voucher(voucher_body(&code, 1000, 1))
        .await;
    let warm = Sale::new(&code, "warm", 100).run(&edge.api).await;
    assert_eq!(warm.created(), 100);
    assert!(
        reservations_at(&b).await >= 100.0,
        "B served its voucher while ready"
    );
    assert_eq!(reservations_at(stack.app()).await, 0.0, "and A none of it");

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
    let after = Sale::new(&code, "after", 200).run(&edge.api).await;
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

/// A reservation sent to the edge as raw bytes with a Content-Type.
async fn post_raw(
    stack: &FlashStack,
    path: &str,
    content_type: &str,
    body: &str,
) -> reqwest::Response {
    let edge = &stack.edge().api;
    edge.client
        .post(format!("{}{path}", edge.base))
        .header("content-type", content_type)
        .body(body.to_owned())
        .send()
        .await
        .expect("answered")
}

/// The edge reads a code as the core does: `%53PELL` is `SPELL`, one voucher with one flag,
/// and a holder's retry under any spelling still reaches a core. A body a core would refuse
/// is never answered 409 by the edge (the API's precedence: 415 and 400 before stock).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_spelling_of_a_code_meets_its_one_flag_and_bad_bodies_keep_their_400() {
    let stack = stack(Duration::from_secs(60)).await;
    let (sale, holder) = sold_out_through_the_edge(&stack, "SPELL", 2, 10).await;
    let edge = &stack.edge().api;

    // Other spellings of the same code, new orders: answered at the edge from the one flag.
    for (i, spelling) in ["%53PELL", "SP%45LL", "%53%50%45%4C%4C"].iter().enumerate() {
        let resp = edge
            .reserve(spelling, &format!("s{i}"), &format!("s-o{i}"), 100_000)
            .await;
        assert_eq!(resp.status(), StatusCode::CONFLICT, "{spelling}");
        assert!(
            resp.headers().get(headers::SERVED_BY).is_some(),
            "{spelling}: answered by the edge"
        );
    }
    // The holder's retry under another spelling: its original 201, from a core.
    let retry = edge
        .reserve("%53PELL", &holder.customer, &holder.order, 100_000)
        .await;
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert!(retry.headers().get(headers::SERVED_BY).is_none());

    let path = "/vouchers/SPELL/reservations";
    let valid = r#"{"customerId":"n1","orderId":"n-1","orderAmount":100000}"#;
    for (content_type, body, status, code) in [
        (
            "application/json",
            r#"{"customerId":"n1","#,
            400,
            "MALFORMED_JSON",
        ),
        (
            "application/json",
            r#"{"customerId":"n1","orderId":"n-1","orderAmount":0}"#,
            400,
            "INVALID_REQUEST",
        ),
        (
            "application/json",
            r#"{"customerId":"n1","orderId":"n-1","orderAmount":1,"x":1}"#,
            400,
            "INVALID_REQUEST",
        ),
        ("text/plain", valid, 415, "UNSUPPORTED_MEDIA_TYPE"),
        ("application/json", valid, 409, "OUT_OF_STOCK"),
    ] {
        let resp = post_raw(&stack, path, content_type, body).await;
        assert_eq!(resp.status().as_u16(), status, "{content_type} {body}");
        assert_error(resp, StatusCode::from_u16(status).expect("status"), code).await;
    }

    // A trailing '/' is no route at a core (404), so not at the edge either.
    let slash = post_raw(
        &stack,
        "/vouchers/SPELL/reservations/",
        "application/json",
        valid,
    )
    .await;
    assert_eq!(slash.status(), StatusCode::NOT_FOUND);
    assert!(slash.headers().get(headers::SERVED_BY).is_none());

    let metrics = stack.edge().metrics().await;
    assert_eq!(
        metrics.sum("edge_sold_out_flags_set_total", &[]),
        1.0,
        "one voucher, one flag"
    );
    assert!(
        metrics.sum("edge_order_filter_fetches_total", &[("outcome", "stored")]) >= 1.0,
        "the flag carries a filter fetched from a core"
    );
    stack.finish(&sale.accepted()).await;
}

/// Bots: a client over its rate gets 429 RATE_LIMITED with Retry-After at the edge (by
/// customerId from the body, and by address), counted in a metric; a customer who waits
/// their turn is never refused, and no refused request took a use.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bot_over_its_rate_gets_429_and_a_patient_customer_does_not() {
    let stack = FlashStack::builder()
        .cores(2)
        .edge(env!("CARGO_BIN_EXE_voucher-edge"), Duration::from_secs(2))
        .edge_env("EDGE__RATE_LIMIT__PER_CUSTOMER", "5")
        .edge_env("EDGE__RATE_LIMIT__PER_IP", "300")
        .start()
        .await;
    stack
        .app()
        .given_voucher(flash_voucher("BOTS", 100, 100))
        .await;
    let edge = &stack.edge().api;

    // Fixed one-second windows: a burst that lasted `elapsed` spans at most
    // ceil(elapsed) + 1 of them, and each admits at most the limit.
    let at_most_admitted =
        |limit: usize, elapsed: Duration| limit * (elapsed.as_secs_f64().ceil() as usize + 1);

    // The bot: 40 reservations for one customer, as fast as it can.
    let started = std::time::Instant::now();
    let bot: Vec<Attempt> = reserve_concurrently(
        edge,
        "BOTS",
        (0..40)
            .map(|i| ("4242".to_owned(), format!("bot-{i}")))
            .collect(),
    )
    .await;
    let bound = at_most_admitted(5, started.elapsed());
    let limited: Vec<&Attempt> = bot
        .iter()
        .filter(|a| a.status == StatusCode::TOO_MANY_REQUESTS)
        .collect();
    assert!(
        limited.len() >= 40usize.saturating_sub(bound),
        "{} refused",
        limited.len()
    );
    assert!(!limited.is_empty());
    assert!(limited.iter().all(|a| a.code() == "RATE_LIMITED"));

    // 4242 as a number is the same customer as "4242": its count goes on.
    let mut numeric = Vec::new();
    for i in 0..11 {
        let body = format!(r#"{{"customerId":4242,"orderId":"bot-n{i}","orderAmount":100000}}"#);
        let resp = post_raw(
            &stack,
            "/vouchers/BOTS/reservations",
            "application/json",
            &body,
        )
        .await;
        numeric.push((format!("bot-n{i}"), resp.status()));
        if resp.status() == StatusCode::TOO_MANY_REQUESTS {
            assert_eq!(
                resp.headers()
                    .get(headers::RETRY_AFTER)
                    .map(|v| v.as_bytes()),
                Some(&b"1"[..])
            );
        }
    }
    assert!(numeric
        .iter()
        .any(|(_, s)| *s == StatusCode::TOO_MANY_REQUESTS));

    // A flood from one address, any route: refused by address.
    let started = std::time::Instant::now();
    let flood = futures::future::join_all((0..1_500).map(|_| async {
        edge.client
            .get(format!("{}/vouchers/BOTS", edge.base))
            .send()
            .await
            .expect("answered")
            .status()
    }))
    .await;
    let bound = at_most_admitted(300, started.elapsed());
    let by_ip = flood
        .iter()
        .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS)
        .count();
    assert!(
        by_ip > 0 && by_ip >= 1_500usize.saturating_sub(bound),
        "{by_ip} of 1,500 refused"
    );

    // A patient customer: one reservation, then the next after 300 ms (never more than 4
    // in any second, under its 5), from the same address once the flood's second is over.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let mut patient = Vec::new();
    for i in 0..8 {
        let attempt = edge
            .attempt("BOTS", "patient", &format!("patient-{i}"), 100_000)
            .await;
        assert_eq!(attempt.status, StatusCode::CREATED, "{attempt:?}");
        patient.push(attempt);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    let metrics = stack.edge().metrics().await;
    assert!(metrics.sum("edge_rate_limited_total", &[("by", "customer")]) >= limited.len() as f64);
    assert!(metrics.sum("edge_rate_limited_total", &[("by", "ip")]) >= by_ip as f64);
    let mut accepted: Vec<Accepted> = bot
        .iter()
        .chain(&patient)
        .filter(|a| a.status == StatusCode::CREATED)
        .map(|a| Accepted::new("BOTS", &a.customer, &a.order))
        .collect();
    accepted.extend(
        numeric
            .iter()
            .filter(|(_, s)| *s == StatusCode::CREATED)
            .map(|(order, _)| Accepted::new("BOTS", "4242", order)),
    );
    stack.finish(&accepted).await;
}

/// Writes `request` on a fresh connection to `addr` and reads until the peer answers or
/// closes (bounded by `within`); `Some(status)` when it answered, `None` when it closed
/// without an answer. Panics if it neither answers nor closes in time.
async fn raw_exchange(
    addr: &str,
    request: &[u8],
    pause_after: Option<Duration>,
    within: Duration,
) -> Option<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connects");
    // A peer that stops reading may refuse the rest: what it answers then is what counts.
    let _ = stream.write_all(request).await;
    if let Some(pause) = pause_after {
        tokio::time::sleep(pause).await;
    }
    let mut answer = Vec::new();
    let read = tokio::time::timeout(within, async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    answer.extend_from_slice(&buf[..n]);
                    if answer.windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
            }
        }
    })
    .await;
    assert!(
        read.is_ok(),
        "neither answered nor closed within {within:?}"
    );
    let line = String::from_utf8_lossy(&answer);
    line.split_whitespace().nth(1).and_then(|s| s.parse().ok())
}

/// Requests no fuzzer sends: a 64 KiB header, 2,000 headers, a body that stops halfway and
/// one sent a byte at a time. Each gets a 4xx or is cut off in bounded time, at the edge and
/// at a core; never a 5xx, and the edge keeps serving everyone else meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn huge_headers_and_stalled_bodies_get_a_4xx_or_are_cut_off() {
    let stack = stack(Duration::from_secs(2)).await;
    stack.app().given_voucher(flash_voucher("RAW", 10, 1)).await;
    let edge = stack
        .edge()
        .api
        .base
        .trim_start_matches("http://")
        .to_owned();
    let core = stack
        .app()
        .api
        .base
        .trim_start_matches("http://")
        .to_owned();
    let big_header = |size: usize| {
        format!(
            "GET /vouchers/RAW HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
            "a".repeat(size)
        )
    };
    let many_headers = format!(
        "GET /vouchers/RAW HTTP/1.1\r\nHost: x\r\n{}\r\n",
        (0..2_000)
            .map(|i| format!("X-H{i}: v\r\n"))
            .collect::<String>()
    );
    let stalled_body = "POST /vouchers/RAW/reservations HTTP/1.1\r\nHost: x\r\n\
        Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"customerId\":";
    // The edge takes 16 KiB of headers (431 HEADERS_TOO_LARGE above); a core, behind it,
    // takes what hyper takes (about 400 KiB, 100 headers) and answers 431 above that.
    let cases = [
        (&edge, "64 KiB header", big_header(64 * 1024)),
        (&edge, "2,000 headers", many_headers.clone()),
        (&core, "1 MiB header", big_header(1024 * 1024)),
        (&core, "2,000 headers", many_headers),
    ];
    for (addr, name, request) in cases {
        let status = raw_exchange(addr, request.as_bytes(), None, Duration::from_secs(10)).await;
        assert!(
            status.is_none_or(|s| (400..500).contains(&s)),
            "{addr} {name}: {status:?}"
        );
    }
    let resp = stack
        .edge()
        .api
        .client
        .get(format!("{}/vouchers/RAW", stack.edge().api.base))
        .header("x-big", "a".repeat(20 * 1024))
        .send()
        .await
        .expect("answered");
    assert_error(
        resp,
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        "HEADERS_TOO_LARGE",
    )
    .await;
    // At the edge, a body that stops is cut off after client_timeout (1 s in the tests),
    // while other clients are served.
    let (stalled, served) = tokio::join!(
        raw_exchange(
            &edge,
            stalled_body.as_bytes(),
            None,
            Duration::from_secs(10)
        ),
        async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            stack.edge().api.get_voucher("RAW").await.status()
        }
    );
    assert!(
        stalled.is_none_or(|s| (400..500).contains(&s)),
        "stalled body: {stalled:?}"
    );
    assert_eq!(served, StatusCode::OK, "others are served meanwhile");
    // A body sent a byte every 300 ms: every read succeeds, so only a deadline on the
    // whole body ends it. The edge answers (400) or closes within client_timeout of the
    // headers, not after the 20 minutes the body would take.
    let started = std::time::Instant::now();
    let dribbled = {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let stream = tokio::net::TcpStream::connect(&edge)
            .await
            .expect("connects");
        let (mut read, mut write) = stream.into_split();
        let head = "POST /vouchers/RAW/reservations HTTP/1.1\r\nHost: x\r\n\
            Content-Type: application/json\r\nContent-Length: 4000\r\n\r\n";
        let _ = write.write_all(head.as_bytes()).await;
        let dribble = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(300)).await;
                if write.write_all(b" ").await.is_err() {
                    break;
                }
            }
        });
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), read.read_to_end(&mut answer)).await;
        dribble.abort();
        String::from_utf8_lossy(&answer)
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse::<u16>().ok())
    };
    let lasted = started.elapsed();
    assert!(lasted < Duration::from_secs(5), "held for {lasted:?}");
    assert!(
        dribbled.is_none_or(|s| (400..500).contains(&s)),
        "dribbled body: {dribbled:?}"
    );
    stack.finish(&[]).await;
}

/// The edge's access log lines (JSON) for `request_id`.
fn access_lines(stack: &FlashStack, request_id: &str) -> Vec<Value> {
    std::fs::read_to_string(&stack.edge().log)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| line["fields"]["request_id"] == request_id)
        .collect()
}

/// A request id travels edge to core and back: a client's valid id is kept, echoed and
/// logged; without one (or with one that could carry text into the logs) the edge makes
/// one, the core answers with that same id (so it received it), and the edge's own answers
/// carry theirs too. Each request is one JSON access-log line at the edge.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_id_goes_from_edge_to_core_and_back_and_into_the_access_log() {
    let stack = stack(Duration::from_secs(2)).await;
    stack.app().given_voucher(flash_voucher("RID", 5, 1)).await;
    let edge = &stack.edge().api;
    let reserve = |id: Option<&str>| {
        let mut request = edge
            .client
            .post(format!("{}/vouchers/RID/reservations", edge.base))
            .json(&json!({"customerId": "c1", "orderId": "rid-o1", "orderAmount": 250000}));
        if let Some(id) = id {
            request = request.header(headers::REQUEST_ID, id);
        }
        request.send()
    };
    let id_of = |r: &reqwest::Response| {
        r.headers()
            .get(headers::REQUEST_ID)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .expect("every answer carries x-request-id")
    };

    let kept = reserve(Some("checkout-7f3a.1:retry-0"))
        .await
        .expect("sent");
    assert_eq!(kept.status(), StatusCode::CREATED);
    assert_eq!(id_of(&kept), "checkout-7f3a.1:retry-0");

    let made = reserve(None).await.expect("sent");
    assert_eq!(made.status(), StatusCode::CREATED, "the retry's 201");
    let made_id = id_of(&made);
    assert!(
        made_id.len() == 32 && made_id.bytes().all(|b| b.is_ascii_hexdigit()),
        "{made_id}"
    );

    // Text a client would like to see in the logs: replaced by an id of the edge's.
    let hostile = r#"{"level":"ERROR","forged":true}"#;
    let replaced = edge
        .client
        .get(format!("{}/vouchers/RID", edge.base))
        .header(headers::REQUEST_ID, hostile)
        .send()
        .await
        .expect("sent");
    assert_eq!(replaced.status(), StatusCode::OK);
    assert_ne!(id_of(&replaced), hostile);

    // The edge's own answer (an admin call refused) carries an id as well.
    let refused = edge
        .client
        .post(format!("{}/vouchers", edge.base))
        .json(&json!({}))
        .send()
        .await
        .expect("sent");
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    let refused_id = id_of(&refused);

    // One access line each, with what was answered. The core answered the made-up id's
    // request with the edge's id: it got it from the edge.
    for (id, status, outcome) in [
        ("checkout-7f3a.1:retry-0", 201, "forwarded"),
        (made_id.as_str(), 201, "forwarded"),
        (refused_id.as_str(), 403, "admin_refused"),
    ] {
        let lines = eventually(Duration::from_secs(5), "the access log line", || async {
            let lines = access_lines(&stack, id);
            (!lines.is_empty()).then_some(lines)
        })
        .await;
        assert_eq!(lines.len(), 1, "{lines:?}");
        let fields = &lines[0]["fields"];
        assert_eq!(fields["status"], status, "{fields}");
        assert_eq!(fields["outcome"], outcome, "{fields}");
        assert_eq!(lines[0]["target"], "access");
        assert!(fields["duration_ms"].as_f64().is_some(), "{fields}");
    }
    let log = std::fs::read_to_string(&stack.edge().log).unwrap_or_default();
    assert!(!log.contains("forged"), "a client's text reached the log");
    stack.finish(&[Accepted::new("RID", "c1", "rid-o1")]).await;
}

/// Admission at the edge: with its limit of reservations at the cores in flight (one here,
/// held by a lock on the voucher's row), the next is answered `503 OVERLOADED` by the edge
/// itself (after its 50 ms queue timeout), and never reaches a core; its retry, once the first is answered, is a
/// new reservation like any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn at_its_admission_limit_the_edge_refuses_a_reservation_itself_with_503_overloaded() {
    let stack = FlashStack::builder()
        .cores(2)
        .edge(env!("CARGO_BIN_EXE_voucher-edge"), Duration::from_secs(2))
        .edge_env("EDGE__ADMISSION__ENABLED", "true")
        .edge_env("EDGE__ADMISSION__INITIAL_LIMIT", "1")
        .edge_env("EDGE__ADMISSION__MIN_LIMIT", "1")
        .edge_env("EDGE__ADMISSION__MAX_LIMIT", "1")
        .start()
        .await;
    stack.app().given_voucher(voucher_body("HELD", 10, 1)).await;
    let blocker = voucher_testkit::locks::lock_voucher_row(&stack.db.url, "HELD").await;
    let held = tokio::spawn({
        let edge = voucher_testkit::helpers::ApiClient::new(stack.edge().api.base.clone());
        async move { edge.attempt("HELD", "c1", "o1", 100_000).await }
    });
    voucher_testkit::locks::until_waiting_on_locks(&stack.pool, 1, "the held reservation to wait")
        .await;
    let at_cores = core_reservations(&stack).await;

    let refused = stack.edge().api.reserve("HELD", "c2", "o2", 100_000).await;
    assert_eq!(
        refused
            .headers()
            .get(headers::SERVED_BY)
            .map(|v| v.as_bytes()),
        Some(&b"edge"[..])
    );
    assert_eq!(
        refused
            .headers()
            .get(headers::RETRY_AFTER)
            .map(|v| v.as_bytes()),
        Some(&b"1"[..])
    );
    assert_error(refused, StatusCode::SERVICE_UNAVAILABLE, "OVERLOADED").await;
    // Counted when the request's logging phase ends, which may come after the client has
    // its answer: wait for the count, then check it is exactly one.
    let metrics = voucher_testkit::wait::eventually(
        Duration::from_secs(5),
        "the refusal counted",
        || async {
            let metrics = stack.edge().metrics().await;
            (metrics.sum("edge_requests_total", &[("outcome", "overloaded")]) >= 1.0)
                .then_some(metrics)
        },
    )
    .await;
    assert_eq!(metrics.sum("edge_admission_refused_total", &[]), 1.0);
    assert_eq!(
        metrics.sum("edge_requests_total", &[("outcome", "overloaded")]),
        1.0
    );

    sqlx::Connection::close(blocker)
        .await
        .expect("lock released");
    let first = held.await.expect("held reservation");
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    // The refused request reached no core (the held one was counted when it answered).
    assert_eq!(core_reservations(&stack).await, at_cores + 1.0);
    let retry = stack.edge().api.attempt("HELD", "c2", "o2", 100_000).await;
    assert_eq!(retry.status, StatusCode::CREATED, "{retry:?}");
    // The place is given back when the retry's logging phase ends, which may come after
    // the client has its answer (a CI run read 1 here): wait for it to be given back.
    voucher_testkit::wait::eventually(
        Duration::from_secs(5),
        "the retry's place given back",
        || async {
            let metrics = stack.edge().metrics().await;
            (metrics.sum("edge_admission_in_flight", &[]) == 0.0).then_some(())
        },
    )
    .await;
    stack.finish(&[first.accepted(), retry.accepted()]).await;
}

/// Sessions of the test's database waiting on a lock now.
async fn waiting_on_locks(stack: &FlashStack) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
         AND datname = current_database()",
    )
    .fetch_one(&stack.pool)
    .await
    .expect("pg_stat_activity")
}

/// How the client of [`a_reservation_left_at_its_core`] leaves.
enum Leaves {
    /// Closes its connection: nobody is left to answer.
    Closes,
    /// Shuts only its sending side and waits for the answer.
    HalfCloses,
}

/// A client leaves while its reservation waits at its core (held there by a row lock):
/// that is no core's failure, so the edge neither counts an upstream error nor sends the
/// request on to the other core (each attempt there was counted as one, and would cost the
/// cores every abandoned request of a sale's peak twice). The client's retry then gets the
/// one reservation.
async fn a_reservation_left_at_its_core(leaves: Leaves) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let stack = stack(Duration::from_secs(2)).await;
    stack.app().given_voucher(voucher_body("GONE", 10, 1)).await;
    let blocker = voucher_testkit::locks::lock_voucher_row(&stack.db.url, "GONE").await;
    // Sent by hand, so the client leaves exactly when its request waits at its core.
    let body = r#"{"customerId":"c1","orderId":"gone-1","orderAmount":100000}"#;
    let request = format!(
        "POST /vouchers/GONE/reservations HTTP/1.1\r\nHost: x\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut client =
        tokio::net::TcpStream::connect(stack.edge().api.base.trim_start_matches("http://"))
            .await
            .expect("connects");
    client.write_all(request.as_bytes()).await.expect("sent");
    voucher_testkit::locks::until_waiting_on_locks(&stack.pool, 1, "the reservation at its core")
        .await;
    match leaves {
        Leaves::Closes => drop(client),
        Leaves::HalfCloses => {
            client.shutdown().await.expect("sending side shut");
            let mut answer = Vec::new();
            tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut answer))
                .await
                .expect("answered and closed within 10 s")
                .expect("read");
            let answer = String::from_utf8_lossy(&answer).to_lowercase();
            // Not a 400: it did nothing wrong, and the same request again is its remedy.
            assert!(answer.starts_with("http/1.1 503"), "{answer}");
            assert!(answer.contains("retry-after: 1"), "{answer}");
            assert!(answer.contains("service_unavailable"), "{answer}");
        }
    }
    // The edge logs the request once it has seen the client go.
    let metrics = eventually(
        Duration::from_secs(10),
        "the left request logged",
        || async {
            let metrics = stack.edge().metrics().await;
            (metrics.sum("edge_requests_total", &[("route", "reserve")]) >= 1.0).then_some(metrics)
        },
    )
    .await;
    assert_eq!(
        metrics.sum("edge_requests_total", &[("outcome", "client_error")]),
        1.0
    );
    assert_eq!(metrics.sum("edge_upstream_errors_total", &[]), 0.0);
    let waiting = waiting_on_locks(&stack).await;
    assert!(
        waiting <= 1,
        "only the first core's attempt may wait for the voucher: {waiting} waiting"
    );

    sqlx::Connection::close(blocker)
        .await
        .expect("lock released");
    let retry = stack
        .edge()
        .api
        .attempt("GONE", "c1", "gone-1", 100_000)
        .await;
    assert_eq!(retry.status, StatusCode::CREATED, "{retry:?}");
    stack.finish(&[retry.accepted()]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_that_gives_up_mid_request_is_not_sent_on_to_another_core() {
    a_reservation_left_at_its_core(Leaves::Closes).await;
}

/// A client that shuts only its sending side still reads: it gets 503 with Retry-After.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_that_half_closes_mid_request_is_told_to_retry() {
    a_reservation_left_at_its_core(Leaves::HalfCloses).await;
}

/// The kill switch at the edge: once a core has answered VOUCHER_PAUSED, the edge answers
/// newcomers itself with the same code, a holder's retry still reaches a core and gets its
/// 201, and the resume is announced: the edge drops its flag at once (its TTL is 60 s) and
/// newcomers are served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_voucher_is_answered_at_the_edge_until_it_is_resumed() {
    let stack = stack(Duration::from_secs(60)).await;
    stack
        .app()
        .given_voucher(flash_voucher("HALT", 100, 1))
        .await;
    let edge = &stack.edge().api;
    let first = edge.reserve("HALT", "holder", "h-1", 100_000).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let original: Value = first.json().await.expect("json");
    stack.app().given_lifecycle("HALT", "pause").await;

    let mut probe = 0;
    eventually(
        Duration::from_secs(10),
        "the edge to answer the pause",
        || {
            probe += 1;
            let order = format!("probe-{probe}");
            async move {
                let resp = edge.reserve("HALT", &order, &order, 100_000).await;
                let by_edge = resp.headers().get(headers::SERVED_BY).is_some();
                let code = resp.headers().get(headers::ERROR_CODE).cloned();
                (by_edge && code.is_some_and(|c| c == "VOUCHER_PAUSED")).then_some(())
            }
        },
    )
    .await;
    let at_core = core_reservations(&stack).await;
    let late = edge.reserve("HALT", "late", "late-1", 100_000).await;
    assert!(late.headers().get(headers::SERVED_BY).is_some());
    assert_error(late, StatusCode::CONFLICT, "VOUCHER_PAUSED").await;
    assert_eq!(
        core_reservations(&stack).await,
        at_core,
        "answered at the edge"
    );
    let retry = edge.reserve("HALT", "holder", "h-1", 100_000).await;
    assert_eq!(
        retry.status(),
        StatusCode::CREATED,
        "a holder's retry reaches a core"
    );
    assert_eq!(retry.json::<Value>().await.expect("json"), original);

    stack.app().given_lifecycle("HALT", "resume").await;
    eventually(
        Duration::from_secs(2),
        "a newcomer served after the resume",
        || async {
            let resp = edge.reserve("HALT", "after", "after-1", 100_000).await;
            (resp.status() == StatusCode::CREATED).then_some(())
        },
    )
    .await;
    stack
        .finish(&[
            Accepted::new("HALT", "holder", "h-1"),
            Accepted::new("HALT", "after", "after-1"),
        ])
        .await;
}

/// Marketing raises the limit of a sold-out voucher: the gate takes the new uses in one
/// step and announces them, every edge drops its sold-out flag at once (its TTL is 60 s),
/// and newcomers through the edge are served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_raised_limit_drops_the_sold_out_flag_at_the_edge_at_once() {
    let stack = stack(Duration::from_secs(60)).await;
    stack
        .app()
        .given_voucher(flash_voucher("UPLIFT", 1, 1))
        .await;
    let edge = &stack.edge().api;
    let first = edge.reserve("UPLIFT", "alice", "a-1", 100_000).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    until_edge_answers(&stack, "UPLIFT").await;

    let raised = stack
        .app()
        .change("UPLIFT", 1, &serde_json::json!({ "totalLimit": 2 }))
        .await;
    assert_eq!(raised.status(), StatusCode::OK);
    eventually(
        Duration::from_secs(2),
        "a newcomer served after the raise",
        || async {
            let resp = edge.reserve("UPLIFT", "bob", "b-1", 100_000).await;
            (resp.status() == StatusCode::CREATED).then_some(())
        },
    )
    .await;
    stack
        .finish(&[
            Accepted::new("UPLIFT", "alice", "a-1"),
            Accepted::new("UPLIFT", "bob", "b-1"),
        ])
        .await;
}

/// A reservation that meets a new flag while its order filter is being fetched waits for
/// the filter and is answered by it, at the edge, instead of going on to a core: at a
/// sell-out those would all be refusals for the cores to look up while they are busiest.
/// The fetch is held up by PostgreSQL itself (a lock on the table the filter reads, as a
/// migration would take), so the order of events is the test's, not the clock's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reservation_waits_for_the_filter_being_fetched_and_is_answered_at_the_edge() {
    let stack = FlashStack::builder()
        .cores(2)
        .edge(
            env!("CARGO_BIN_EXE_voucher-edge"),
            Duration::from_millis(500),
        )
        .edge_env("EDGE__ORDER_FETCH_INTERVAL", "100ms")
        .edge_env("EDGE__SOLD_OUT_WAIT", "30s")
        .start()
        .await;
    let channel = voucher_contract::sold_out_channel(stack.key_prefix());
    voucher_testkit::stack::until_subscribed(voucher_testkit::stack::REDIS_URL, &channel).await;
    stack.app().given_voucher(flash_voucher("HELD", 1, 1)).await;
    let core = stack.app();
    let first = core.reserve("HELD", "c0", "o0", 100_000).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let edge = stack.edge();
    // The flag its announcement set lapses (nothing renews it): the edge knows nothing of
    // the voucher again.
    eventually(
        Duration::from_secs(10),
        "the first filter stored",
        || async {
            let m = edge.metrics().await;
            (m.sum("edge_order_filter_fetches_total", &[("outcome", "stored")]) >= 1.0)
                .then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(700)).await;

    let lock = redemptions_locked(&stack).await;
    // The gate's announcement again, as its reserve script sends it: a new flag, whose
    // fetch now waits on the lock.
    let signals = edge.metrics().await.sum("edge_sold_out_signals_total", &[]);
    let mut redis = redis::Client::open(voucher_testkit::stack::REDIS_URL)
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
    let _: i64 = redis::cmd("PUBLISH")
        .arg(&channel)
        .arg("HELD")
        .query_async(&mut redis)
        .await
        .expect("publish");
    eventually(
        Duration::from_secs(10),
        "the announcement heard",
        || async {
            let m = edge.metrics().await;
            (m.sum("edge_sold_out_signals_total", &[]) > signals).then_some(())
        },
    )
    .await;
    let at_core_before = core_reservations(&stack).await;
    let late = {
        let api = edge.api.clone();
        tokio::spawn(async move { api.reserve("HELD", "late", "late-1", 100_000).await })
    };
    eventually(
        Duration::from_secs(10),
        "the late order waiting",
        || async {
            let m = edge.metrics().await;
            (m.sum("edge_flag_waiting", &[]) >= 1.0).then_some(())
        },
    )
    .await;
    lock.commit().await.expect("unlock");

    let late = late.await.expect("request task");
    assert!(
        late.headers().get(headers::SERVED_BY).is_some(),
        "answered by the edge, from the filter it waited for"
    );
    assert_error(late, StatusCode::CONFLICT, "OUT_OF_STOCK").await;
    assert_eq!(
        core_reservations(&stack).await,
        at_core_before,
        "no core saw it"
    );
    let m = edge.metrics().await;
    assert_eq!(
        m.sum("edge_flag_waits_total", &[("outcome", "answered")]),
        1.0
    );
    assert_eq!(m.sum("edge_flag_waiting", &[]), 0.0);
    stack.finish(&[Accepted::new("HELD", "c0", "o0")]).await;
}

/// A reservation that waited for a place among its voucher's at the cores asks the flag
/// again once it has one: the voucher sold out while it waited, so the edge answers it and
/// no core sees it. One place per voucher; the one at the core is held up by PostgreSQL
/// (a lock on the table its commit writes), so the order of events is the test's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reservation_that_waited_for_its_place_meets_the_sell_out_at_the_edge() {
    let stack = FlashStack::builder()
        .cores(2)
        .edge(env!("CARGO_BIN_EXE_voucher-edge"), Duration::from_secs(60))
        .edge_env("EDGE__VOUCHER_IN_FLIGHT", "1")
        .edge_env("EDGE__ADMISSION__QUEUE_TIMEOUT", "30s")
        .edge_env("EDGE__SOLD_OUT_WAIT", "30s")
        .start()
        .await;
    let channel = voucher_contract::sold_out_channel(stack.key_prefix());
    voucher_testkit::stack::until_subscribed(voucher_testkit::stack::REDIS_URL, &channel).await;
    stack
        .app()
        .given_voucher(flash_voucher("PLACE", 2, 1))
        .await;
    let edge = stack.edge();
    let metric = |name: &'static str| async move { edge.metrics().await.sum(name, &[]) };

    let lock = redemptions_locked(&stack).await;
    let send = |customer: &'static str, order: &'static str| {
        let api = edge.api.clone();
        tokio::spawn(async move { api.reserve("PLACE", customer, order, 100_000).await })
    };
    // The first use, taken by the gate; its commit waits on the lock, holding the place.
    let first = send("c1", "o1");
    eventually(Duration::from_secs(10), "the first at a core", || async {
        (metric("edge_admission_in_flight").await >= 1.0).then_some(())
    })
    .await;
    let second = send("c2", "o2");
    eventually(Duration::from_secs(10), "the second waiting", || async {
        (metric("edge_voucher_place_waiting").await >= 1.0).then_some(())
    })
    .await;
    // The last use, taken at a core directly: the gate announces the sell-out, and the
    // edge's new flag fetches its filter (which waits on the lock too).
    let last = {
        let core = stack.app().api.clone();
        tokio::spawn(async move { core.reserve("PLACE", "c3", "o3", 100_000).await })
    };
    eventually(Duration::from_secs(10), "the sell-out heard", || async {
        (metric("edge_sold_out_signals_total").await >= 1.0).then_some(())
    })
    .await;
    lock.commit().await.expect("unlock");

    for held in [first, last] {
        let resp = held.await.expect("task");
        assert_eq!(resp.status(), StatusCode::CREATED);
    }
    let second = second.await.expect("task");
    assert!(
        second.headers().get(headers::SERVED_BY).is_some(),
        "answered by the edge once it had its place"
    );
    assert_error(second, StatusCode::CONFLICT, "OUT_OF_STOCK").await;
    assert_eq!(
        core_reservations(&stack).await,
        2.0,
        "the cores saw the first and the last, not the second"
    );
    let m = edge.metrics().await;
    assert_eq!(
        m.sum("edge_voucher_place_waits_total", &[("outcome", "answered")]),
        1.0
    );
    assert_eq!(m.sum("edge_voucher_place_waiting", &[]), 0.0);
    stack
        .finish(&[
            Accepted::new("PLACE", "c1", "o1"),
            Accepted::new("PLACE", "c3", "o3"),
        ])
        .await;
}

/// The stack's reservation rows locked against every reader and writer (as a migration's
/// `ALTER TABLE` would), until the returned transaction commits: what reads or writes them
/// (a commit, an order filter, a lookup) waits, and the test decides when it goes on.
async fn redemptions_locked(stack: &FlashStack) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let pool = sqlx::PgPool::connect(&stack.db.url).await.expect("db");
    let mut lock = pool.begin().await.expect("begin");
    sqlx::query("LOCK TABLE redemptions IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .expect("lock");
    lock
}
