//! Traces across the path, with the real binaries exporting to an OTLP receiver: a
//! reservation's spans, from the edge through the core's gate call, the recorder's commit
//! and the event's publish to the writer that reads the event, form one trace that
//! continues the client's `traceparent`; and a collector that stalls changes no answer.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;
use voucher_core::config::Settings;
use voucher_core::flash::gate::Gate;
use voucher_testkit::helpers::TestDb;
use voucher_testkit::invariants::{self, Accepted};
use voucher_testkit::otlp::{OtlpReceiver, ReceivedSpan};
use voucher_testkit::stack::{
    delete_keys, flash_settings, flash_voucher, Broker, CoreProcess, EdgeProcess, REDIS_URL,
};

/// The core's span of a reservation's request: method and route template.
const RESERVE_SPAN: &str = "POST /vouchers/{code}/reservations";

fn edge_binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_voucher-edge"))
}

/// The core's binary beside the edge's (`cargo test --workspace` builds both).
fn core_binary() -> PathBuf {
    let core = edge_binary().with_file_name("voucher-core");
    assert!(
        core.exists(),
        "{} not found: build voucher-core first (cargo test --workspace does)",
        core.display()
    );
    core
}

/// The spans of one reservation are one trace under the client's span: every span's
/// parent is in the trace or is the client's; the edge's span is the core's request's
/// parent, the gate call and the recorder's commit are within the request, and the writer's
/// span is the child of the publish, across the broker. The grouped transaction, a span of
/// its own, links to the reservation's commit. A request without a `traceparent` starts its
/// trace at the edge.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reservation_is_one_trace_from_the_edge_to_the_writer() {
    let receiver = OtlpReceiver::start().await;
    let TracedStack {
        db,
        broker: _broker,
        settings,
        core,
        edge,
    } = TracedStack::start(&receiver.endpoint).await;
    core.api.given_voucher(flash_voucher("TRACED", 10, 1)).await;

    let trace_id = uuid::Uuid::new_v4().simple().to_string();
    let client_span = &uuid::Uuid::new_v4().simple().to_string()[..16];
    let resp = edge
        .api
        .client
        .post(format!("{}/vouchers/TRACED/reservations", edge.api.base))
        .header("traceparent", format!("00-{trace_id}-{client_span}-01"))
        .json(&json!({ "customerId": "c1", "orderId": "o-traced-1", "orderAmount": 250_000 }))
        .send()
        .await
        .expect("the edge answers");
    assert_eq!(resp.status(), StatusCode::CREATED);

    let expected = [
        ("voucher-edge", "edge.request"),
        ("voucher-core", RESERVE_SPAN),
        ("voucher-core", "reserve"),
        ("voucher-core", "gate.reserve"),
        ("voucher-core", "recorder.commit"),
        ("voucher-core", "kafka.announce"),
        ("voucher-core", "consumer.write"),
    ];
    receiver
        .until(
            Duration::from_secs(30),
            "the reservation's spans",
            |spans| {
                let names: Vec<(&str, &str)> = spans
                    .iter()
                    .filter(|s| s.trace_id == trace_id)
                    .map(|s| (s.service.as_str(), s.name.as_str()))
                    .collect();
                expected.iter().all(|e| names.contains(e))
            },
        )
        .await;
    let trace = receiver.trace(&trace_id);
    let by_name = |name: &str| -> &ReceivedSpan {
        let found: Vec<&ReceivedSpan> = trace.iter().filter(|s| s.name == name).collect();
        assert_eq!(found.len(), 1, "one {name} span in {trace:#?}");
        found[0]
    };
    let ids: HashMap<&str, &ReceivedSpan> = trace.iter().map(|s| (s.span_id.as_str(), s)).collect();
    for span in &trace {
        assert!(
            span.parent_span_id == client_span || ids.contains_key(span.parent_span_id.as_str()),
            "{} has a parent outside the trace: {trace:#?}",
            span.name
        );
    }
    let within = |span: &ReceivedSpan, ancestor: &ReceivedSpan| {
        let mut at = span;
        while let Some(parent) = ids.get(at.parent_span_id.as_str()) {
            if parent.span_id == ancestor.span_id {
                return true;
            }
            at = parent;
        }
        false
    };
    let edge_span = by_name("edge.request");
    assert_eq!(
        edge_span.parent_span_id, client_span,
        "the client's trace continues"
    );
    assert_eq!(
        edge_span
            .attributes
            .get("http.response.status_code")
            .map(String::as_str),
        Some("201")
    );
    assert_eq!(
        edge_span.attributes.get("outcome").map(String::as_str),
        Some("forwarded")
    );
    let request = by_name(RESERVE_SPAN);
    assert_eq!(
        request.parent_span_id, edge_span.span_id,
        "the core continues the edge's span"
    );
    for name in [
        "reserve",
        "gate.reserve",
        "recorder.commit",
        "kafka.announce",
    ] {
        assert!(
            within(by_name(name), request),
            "{name} is within the request"
        );
    }
    let announce = by_name("kafka.announce");
    assert_eq!(
        by_name("consumer.write").parent_span_id,
        announce.span_id,
        "the writer continues the event's publish, across the broker"
    );
    let commit = by_name("recorder.commit");
    let transaction = receiver
        .until(Duration::from_secs(10), "the transaction's span", |spans| {
            spans.iter().any(|s| s.name == "recorder.transaction")
        })
        .await
        .into_iter()
        .find(|s| {
            s.name == "recorder.transaction"
                && s.links
                    .contains(&(trace_id.clone(), commit.span_id.clone()))
        });
    assert!(
        transaction.is_some(),
        "the grouped transaction links to the reservation's commit"
    );

    // No traceparent: the edge starts the trace, and the core's request is its child.
    let resp = edge
        .api
        .client
        .post(format!("{}/vouchers/TRACED/reservations", edge.api.base))
        .header("x-request-id", "untraced-client-1")
        .json(&json!({ "customerId": "c2", "orderId": "o-traced-2", "orderAmount": 250_000 }))
        .send()
        .await
        .expect("the edge answers");
    assert_eq!(resp.status(), StatusCode::CREATED);
    // The edge's span ends after its answer and the core's before it: the two come in
    // separate exports, in either order, so wait for both.
    let second = |s: &ReceivedSpan, name: &str| {
        s.name == name
            && s.attributes.get("request_id").map(String::as_str) == Some("untraced-client-1")
    };
    let spans = receiver
        .until(
            Duration::from_secs(30),
            "the second reservation's spans",
            |spans| {
                spans.iter().any(|s| second(s, RESERVE_SPAN))
                    && spans.iter().any(|s| second(s, "edge.request"))
            },
        )
        .await;
    let root = spans
        .iter()
        .find(|s| second(s, "edge.request"))
        .expect("the edge's span of the second request");
    assert!(
        root.parent_span_id.is_empty(),
        "a new trace starts at the edge: {root:?}"
    );
    let request = spans
        .iter()
        .find(|s| second(s, RESERVE_SPAN))
        .expect("the core's span of the second request");
    assert_eq!(
        (&request.trace_id, &request.parent_span_id),
        (&root.trace_id, &root.span_id)
    );

    // The edge's readiness checks of the core (every 500 ms) are not traced.
    assert!(
        receiver.spans().iter().all(|s| s
            .attributes
            .get("path")
            .is_none_or(|p| !p.contains("readyz"))),
        "probes are not traced"
    );

    let accepted = [
        Accepted::new("TRACED", "c1", "o-traced-1"),
        Accepted::new("TRACED", "c2", "o-traced-2"),
    ];
    drop(edge);
    drop(core);
    finish(&db, &settings, &accepted).await;
}

/// A collector that takes connections and never answers changes no answer: its exports
/// wait on the exporters' own threads, never on a request, and the sale through the edge
/// sells out exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stalled_collector_changes_no_answer() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a free port");
    let endpoint = format!("http://{}", listener.local_addr().expect("bound"));
    let stalled = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let TracedStack {
        db,
        broker: _broker,
        settings,
        core,
        edge,
    } = TracedStack::start(&endpoint).await;
    core.api.given_voucher(flash_voucher("STALLED", 5, 1)).await;
    let mut accepted = Vec::new();
    for i in 0..12 {
        let (customer, order) = (format!("c{i}"), format!("o-stalled-{i}"));
        let resp = edge
            .api
            .reserve("STALLED", &customer, &order, 250_000)
            .await;
        match resp.status() {
            StatusCode::CREATED => accepted.push(Accepted::new("STALLED", &customer, &order)),
            StatusCode::CONFLICT => {}
            other => panic!("reservation {i} answered {other}"),
        }
    }
    assert_eq!(accepted.len(), 5, "the sale sells out exactly");
    drop(edge);
    drop(core);
    stalled.abort();
    finish(&db, &settings, &accepted).await;
}

/// A core (PostgreSQL deciding, its writers on) and an edge in front, both exporting to
/// `endpoint` every 100 ms, on a database, broker and Redis prefix of the test's own.
struct TracedStack {
    db: TestDb,
    broker: Broker,
    settings: Settings,
    core: CoreProcess,
    edge: EdgeProcess,
}

impl TracedStack {
    async fn start(endpoint: &str) -> Self {
        let db = TestDb::create().await;
        let broker = Broker::start().await;
        let tag = uuid::Uuid::new_v4().simple().to_string();
        let mut settings = flash_settings(&db.url, &broker, &tag);
        // PostgreSQL decides (the default) and this core writes events too, as a fleet
        // moving between decisions does: the event's trace context reaches a writer.
        if let Some(kafka) = settings.kafka.as_mut() {
            kafka.consume = Some(true);
        }
        settings.tracing.otlp_endpoint = Some(endpoint.to_owned());
        settings.tracing.export_interval = Duration::from_millis(100);
        let core = CoreProcess::start(&core_binary(), &settings, &[]).await;
        let edge = EdgeProcess::start_with_env(
            edge_binary(),
            &[core.address().as_str()],
            REDIS_URL,
            &prefix(&settings),
            Duration::from_secs(1),
            &[
                ("EDGE__TRACING__OTLP_ENDPOINT", endpoint),
                ("EDGE__TRACING__EXPORT_INTERVAL", "100ms"),
            ],
        )
        .await;
        Self {
            db,
            broker,
            settings,
            core,
            edge,
        }
    }
}

fn prefix(settings: &Settings) -> String {
    settings
        .redis
        .as_ref()
        .map(|r| r.key_prefix.clone())
        .unwrap_or_default()
}

/// Invariants 1 to 5 against PostgreSQL and the gate (once the processes are stopped),
/// then the test's database and Redis keys go.
async fn finish(db: &TestDb, settings: &Settings, accepted: &[Accepted]) {
    let pool = sqlx::PgPool::connect(&db.url).await.expect("database");
    let redis = settings.redis.as_ref().expect("flash settings have redis");
    let gate = Gate::connect(redis).await.expect("gate");
    let report = invariants::check_with_gate(&pool, &gate, accepted)
        .await
        .expect("invariant queries run");
    assert!(
        report.holds(),
        "invariants violated: {:#?}",
        report.violations
    );
    pool.close().await;
    delete_keys(&prefix(settings)).await;
    db.drop_db().await;
}
