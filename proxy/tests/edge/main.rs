//! End-to-end tests through the real edge binary, in front of two real cores, on the real
//! PostgreSQL, Redis and a tansu broker of each test's own.

mod dashboards;

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};
use voucher_core::invariants::{self, Accepted};
use voucher_testkit::helpers::{
    accepted, count, run_all, sale, voucher_body, ApiClient, Attempt, TestApp, TestDb, ADMIN_TOKEN,
};
use voucher_testkit::stack::{delete_keys, flash_settings, flash_voucher, Broker};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The edge binary, configured by a YAML file of the test's own. Killed when dropped.
struct EdgeProcess {
    child: Child,
    api: ApiClient,
    metrics_base: String,
    _dir: TempDir,
}

struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl EdgeProcess {
    async fn start(upstreams: &[&str], channel: &str, ttl_ms: u64) -> Self {
        let (port, metrics_port) = (free_port(), free_port());
        let dir = TempDir(
            std::env::temp_dir().join(format!("vt-edge-{}", uuid::Uuid::new_v4().simple())),
        );
        std::fs::create_dir_all(&dir.0).expect("edge dir");
        let config = json!({
            "listen": format!("127.0.0.1:{port}"),
            "metrics_listen": format!("127.0.0.1:{metrics_port}"),
            "upstreams": upstreams,
            "admin_token": ADMIN_TOKEN,
            "sold_out_ttl_ms": ttl_ms,
            "max_body_bytes": 4096,
            "health_check_interval_ms": 100,
            "upstream_connect_timeout_ms": 300,
            "client_timeout_ms": 1000,
            "redis_url": voucher_testkit::stack::REDIS_URL,
            "availability_channel": channel,
            "threads": 2,
        });
        // JSON is YAML.
        let path = dir.0.join("edge.yaml");
        std::fs::write(&path, config.to_string()).expect("config written");
        let child = Command::new(env!("CARGO_BIN_EXE_voucher-edge"))
            .env("EDGE_CONFIG", &path)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("edge starts");
        // Owned at once, so that a failed start still kills and reaps the process.
        let edge = Self {
            child,
            api: ApiClient::new(format!("http://127.0.0.1:{port}")),
            metrics_base: format!("http://127.0.0.1:{metrics_port}"),
            _dir: dir,
        };
        for _ in 0..200 {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                // Let the first health check mark the cores up.
                tokio::time::sleep(Duration::from_millis(300)).await;
                return edge;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the edge did not start");
    }

    async fn metrics_text(&self) -> String {
        self.api
            .client
            .get(format!("{}/metrics", self.metrics_base))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("text")
    }
}

impl Drop for EdgeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reservation requests one core answered, from its metrics.
async fn reservations_at(core: &TestApp) -> u64 {
    core.metrics_text()
        .await
        .lines()
        .filter(|l| {
            l.starts_with("http_requests_total{")
                && l.contains(r#"route="/vouchers/{code}/reservations""#)
        })
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<u64>().ok()))
        .sum()
}

/// Two cores (flash mode available) behind one edge.
struct Stack {
    db: TestDb,
    _broker: Broker,
    cores: Vec<TestApp>,
    edge: EdgeProcess,
    prefix: String,
    pool: sqlx::PgPool,
    gate: voucher_core::gate::Gate,
    progress: voucher_core::events::progress::Progress,
}

impl Stack {
    async fn start(ttl_ms: u64) -> Self {
        Self::start_with(ttl_ms, |_| {}).await
    }

    async fn start_with(
        ttl_ms: u64,
        tweak: impl FnOnce(&mut voucher_core::config::Settings),
    ) -> Self {
        let db = TestDb::create().await;
        let broker = Broker::start().await;
        let tag = uuid::Uuid::new_v4().simple().to_string();
        let mut settings = flash_settings(&db.url, &broker, &tag);
        tweak(&mut settings);
        let cores = vec![
            TestApp::start(&settings).await,
            TestApp::start(&settings).await,
        ];
        let redis = settings.redis.clone().expect("redis settings");
        let channel = format!("{}available", redis.key_prefix);
        let addrs: Vec<&str> = cores.iter().map(|c| c.address()).collect();
        let edge = EdgeProcess::start(&addrs, &channel, ttl_ms).await;
        let pool = sqlx::PgPool::connect(&db.url).await.expect("pool");
        let gate = voucher_core::gate::Gate::connect(
            &redis.url,
            &redis.key_prefix,
            Duration::from_secs(2),
        )
        .await
        .expect("redis");
        let progress =
            voucher_core::events::progress::Progress::new(settings.kafka.as_ref().expect("kafka"))
                .expect("progress");
        Self {
            db,
            _broker: broker,
            cores,
            edge,
            prefix: redis.key_prefix,
            pool,
            gate,
            progress,
        }
    }

    /// Waits until the cores' consumer group wrote everything published so far (a group
    /// that just formed may take seconds to get its partitions).
    async fn caught_up(&self) {
        let ok = self
            .progress
            .wait_caught_up(Duration::from_secs(60))
            .await
            .unwrap_or(false);
        assert!(ok, "the consumer did not catch up within 60 s");
    }

    /// Reservation requests that reached any core.
    async fn core_reservations(&self) -> u64 {
        let mut total = 0;
        for core in &self.cores {
            total += reservations_at(core).await;
        }
        total
    }

    /// Waits until the edge answers for `code` itself (its flag and order list are in).
    async fn until_edge_answers(&self, code: &str) {
        for i in 0..200 {
            let resp = self
                .edge
                .api
                .reserve(code, "probe", &format!("probe-{i}"), 100_000)
                .await;
            if resp.headers().get("x-served-by").is_some() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("the edge never answered for {code}");
    }

    async fn finish(self, accepted: &[Accepted]) {
        let kafka_ok = tokio::time::timeout(Duration::from_secs(60), async {
            loop {
                let report = invariants::check_with_gate(&self.pool, &self.gate, accepted)
                    .await
                    .expect("check runs");
                if report.holds() {
                    return;
                }
                // The consumer may still be writing the last batch.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await;
        if kafka_ok.is_err() {
            let report = invariants::check_with_gate(&self.pool, &self.gate, accepted)
                .await
                .expect("check runs");
            panic!("invariants violated: {:#?}", report.violations);
        }
        drop(self.edge);
        for core in self.cores {
            core.stop().await;
        }
        self.pool.close().await;
        self.db.drop_db().await;
        delete_keys(&self.prefix).await;
    }
}

async fn sale_of_2000_on_50_uses(mode: &str) {
    let stack = Stack::start(30_000).await;
    let body = if mode == "flash" {
        flash_voucher("HOT", 50, 1)
    } else {
        voucher_body("HOT", 50, 1)
    };
    stack.cores[0].given_voucher(body).await;

    let (results, _) = sale(
        &stack.edge.api,
        "HOT",
        "race",
        2000,
        200,
        5,
        Duration::from_millis(50),
    )
    .await;

    assert_eq!(count(&results, StatusCode::CREATED, ""), 50, "{mode}");
    assert_eq!(
        count(&results, StatusCode::CONFLICT, "OUT_OF_STOCK"),
        1950,
        "{mode}"
    );
    stack.finish(&accepted("HOT", &results)).await;
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
    let stack = Stack::start(60_000).await;
    stack.cores[0]
        .given_voucher(flash_voucher("GONE", 20, 1))
        .await;
    let (results, _) = sale(
        &stack.edge.api,
        "GONE",
        "first",
        100,
        50,
        5,
        Duration::from_millis(50),
    )
    .await;
    assert_eq!(count(&results, StatusCode::CREATED, ""), 20);
    let holder = results
        .iter()
        .find(|a| a.status == StatusCode::CREATED)
        .expect("a holder")
        .clone();
    stack.until_edge_answers("GONE").await;
    let at_core_before = stack.core_reservations().await;

    let late: Vec<Attempt> = voucher_testkit::helpers::reserve_concurrently(
        &stack.edge.api,
        "GONE",
        (0..5000)
            .map(|i| (format!("late-c{i}"), format!("late-o{i}")))
            .collect(),
    )
    .await;
    let retry = stack
        .edge
        .api
        .reserve("GONE", &holder.customer, &holder.order, 100_000)
        .await;

    assert_eq!(count(&late, StatusCode::CONFLICT, "OUT_OF_STOCK"), 5000);
    assert_eq!(
        stack.core_reservations().await - at_core_before,
        1,
        "only the holder's retry reached a core"
    );
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(
        retry.json::<Value>().await.expect("json"),
        holder.body,
        "the original 201 body"
    );
    let text = stack.edge.metrics_text().await;
    assert!(
        text.contains(r#"edge_requests_total{outcome="sold_out",route="reserve"}"#),
        "{text}"
    );
    stack.finish(&accepted("GONE", &results)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_released_use_is_taken_again_through_the_edge_within_the_ttl() {
    let stack = Stack::start(60_000).await;
    stack.cores[0]
        .given_voucher(flash_voucher("BACK", 1, 1))
        .await;
    let first = stack
        .edge
        .api
        .reserve("BACK", "alice", "a-1", 100_000)
        .await;
    assert_eq!(first.status(), StatusCode::CREATED);
    stack.until_edge_answers("BACK").await;

    stack.caught_up().await;
    let released = stack.edge.api.release("BACK", "a-1").await;
    assert_eq!(
        released.status(),
        StatusCode::OK,
        "release passes through the edge"
    );
    // The core announces the give-back; the edge drops its flag on that signal, long
    // before the 60 s TTL. Bounded wait for the asynchronous signal.
    let mut taken = None;
    for _ in 0..100 {
        let resp = stack.edge.api.reserve("BACK", "bob", "b-1", 100_000).await;
        if resp.status() == StatusCode::CREATED {
            taken = Some(resp);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    assert!(
        taken.is_some(),
        "the released use was not available through the edge"
    );
    let text = stack.edge.metrics_text().await;
    assert!(text.contains("edge_availability_signals_total 1"), "{text}");
    let accepted = [("alice", "a-1"), ("bob", "b-1")].map(|(c, o)| Accepted {
        voucher_code: "BACK".into(),
        customer_id: c.into(),
        order_id: o.into(),
    });
    stack.finish(&accepted).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_core_killed_mid_run_the_other_takes_its_share() {
    let mut stack = Stack::start(30_000).await;
    stack.cores[0]
        .given_voucher(voucher_body("HALF", 400, 1))
        .await;
    let selling = sale(&stack.edge.api, "HALF", "half", 800, 20, 0, Duration::ZERO);
    let dead = stack.cores.remove(0);
    let kill = async {
        // Mid-run: once the doomed core has served part of the sale.
        while reservations_at(&dead).await < 100 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let survivor_before = reservations_at(&stack.cores[0]).await;
        dead.stop().await;
        survivor_before
    };
    let ((results, _), survivor_before) = tokio::join!(selling, kill);

    assert!(
        reservations_at(&stack.cores[0]).await > survivor_before + 100,
        "the surviving core took the rest of the sale"
    );
    let won = count(&results, StatusCode::CREATED, "");
    let refused = count(&results, StatusCode::CONFLICT, "OUT_OF_STOCK");
    let failed: Vec<&Attempt> = results
        .iter()
        .filter(|a| a.status.is_server_error())
        .collect();
    assert!(failed.is_empty(), "no request failed: {failed:#?}");
    assert_eq!((won, refused), (400, 400));
    stack.finish(&accepted("HALF", &results)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn admin_calls_oversized_bodies_and_no_cores_are_refused_at_the_edge() {
    let stack = Stack::start(30_000).await;
    let edge = &stack.edge.api;

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

    assert_eq!(admin.status(), StatusCode::FORBIDDEN);
    assert_eq!(
        admin.json::<Value>().await.expect("json")["error"],
        "FORBIDDEN"
    );
    assert_eq!(reload.status(), StatusCode::FORBIDDEN);
    assert_eq!(too_large.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        too_large.json::<Value>().await.expect("json")["error"],
        "PAYLOAD_TOO_LARGE"
    );
    assert_eq!(chunked.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        stack.cores[0].get_voucher("ADM").await.status(),
        StatusCode::NOT_FOUND,
        "nothing was created"
    );

    // Every core down: a prompt 503 in the API's format, not a hang.
    let Stack {
        db,
        _broker,
        cores,
        edge,
        prefix,
        pool,
        ..
    } = stack;
    for core in cores {
        core.stop().await;
    }
    tokio::time::sleep(Duration::from_millis(400)).await; // health checks notice
    let started = std::time::Instant::now();
    let down = edge.api.reserve("ADM", "c", "o", 100_000).await;
    assert_eq!(down.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "answered in {:?}",
        started.elapsed()
    );
    assert_eq!(
        down.json::<Value>().await.expect("json")["error"],
        "SERVICE_UNAVAILABLE"
    );
    drop(edge);
    pool.close().await;
    db.drop_db().await;
    delete_keys(&prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn confirm_release_and_get_pass_through_untouched_by_the_flag() {
    let stack = Stack::start(60_000).await;
    stack.cores[0]
        .given_voucher(voucher_body("PASS", 2, 1))
        .await;
    let holders = run_all([("c1", "o1"), ("c2", "o2")].map(|(c, o)| {
        let edge = &stack.edge.api;
        async move { edge.reserve("PASS", c, o, 100_000).await.status() }
    }))
    .await;
    assert!(holders.iter().all(|s| *s == StatusCode::CREATED));
    stack.until_edge_answers("PASS").await;

    let got = stack.edge.api.get_voucher("PASS").await;
    let confirmed = stack.edge.api.confirm("PASS", "o1").await;

    assert_eq!(got.status(), StatusCode::OK);
    assert_eq!(got.json::<Value>().await.expect("json")["remaining"], 0);
    assert_eq!(confirmed.status(), StatusCode::OK);
    assert!(confirmed.headers().get("x-served-by").is_none());
    let accepted = [("c1", "o1"), ("c2", "o2")].map(|(c, o)| Accepted {
        voucher_code: "PASS".into(),
        customer_id: c.into(),
        order_id: o.into(),
    });
    stack.finish(&accepted).await;
}
