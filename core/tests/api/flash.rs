//! Flash mode on the real Redis, a real Kafka-protocol broker and PostgreSQL. Every test
//! ends, once the consumer has caught up, with invariants 1 to 5.

use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use voucher_core::events::consumer::EventConsumer;
use voucher_core::flash::FlashPath;
use voucher_core::invariants::Accepted;
use voucher_core::metrics::Metrics;
use voucher_core::reconcile::Reconciler;
use voucher_core::store::Store;

use crate::helpers::{accepted, count, sale};
use crate::stack::{flash_voucher, FlashEnv};

async fn rows(env: &FlashEnv, code: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM redemptions WHERE voucher_code = $1")
        .bind(code)
        .fetch_one(&env.pool)
        .await
        .expect("count")
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_thousand_customers_race_for_fifty_flash_uses() {
    let env = FlashEnv::start().await;
    env.app.given_voucher(flash_voucher("FLASH50", 50, 1)).await;

    let (results, _) = sale(
        &env.app,
        "FLASH50",
        "race",
        2000,
        200,
        5,
        Duration::from_millis(50),
    )
    .await;

    assert_eq!(count(&results, StatusCode::CREATED, ""), 50);
    assert_eq!(count(&results, StatusCode::CONFLICT, "OUT_OF_STOCK"), 1950);
    env.caught_up().await;
    assert_eq!(rows(&env, "FLASH50").await, 50);
    let voucher = env.app.voucher_json("FLASH50").await;
    assert_eq!(
        (
            voucher["usedCount"].as_i64(),
            voucher["gateRemaining"].as_i64()
        ),
        (Some(50), Some(0))
    );
    env.finish(&accepted("FLASH50", &results)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn flash_reservations_follow_the_same_api_rules() {
    let env = FlashEnv::start().await;
    env.app.given_voucher(flash_voucher("FA", 2, 1)).await;
    env.app.given_voucher(flash_voucher("FB", 5, 1)).await;

    let first = env.app.reserve("FA", "alice", "o1", 100_000).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let first: Value = first.json().await.expect("json");
    let retry = env.app.reserve("FA", "alice", "o1", 100_000).await;
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(
        retry.json::<Value>().await.expect("json"),
        first,
        "a retry gets the same body"
    );
    let other_customer = env.app.reserve("FA", "bob", "o1", 100_000).await;
    let other_voucher = env.app.reserve("FB", "alice", "o1", 100_000).await;
    let again_alice = env.app.reserve("FA", "alice", "o2", 100_000).await;
    let below_min = env.app.reserve("FA", "carol", "o3", 10).await;
    assert_eq!(
        env.app.reserve("FA", "bob", "o4", 100_000).await.status(),
        StatusCode::CREATED
    );
    let sold_out = env.app.reserve("FA", "dave", "o5", 100_000).await;
    let retry_after_sell_out = env.app.reserve("FA", "alice", "o1", 100_000).await;

    for (resp, status, code) in [
        (other_customer, StatusCode::CONFLICT, "ORDER_ID_CONFLICT"),
        (other_voucher, StatusCode::CONFLICT, "ORDER_ID_CONFLICT"),
        (again_alice, StatusCode::CONFLICT, "ALREADY_USED"),
        (below_min, StatusCode::UNPROCESSABLE_ENTITY, "NOT_ELIGIBLE"),
        (sold_out, StatusCode::CONFLICT, "OUT_OF_STOCK"),
    ] {
        assert_eq!(resp.status(), status, "{code}");
        assert_eq!(resp.json::<Value>().await.expect("json")["error"], code);
    }
    assert_eq!(retry_after_sell_out.status(), StatusCode::CREATED);
    assert_eq!(
        retry_after_sell_out.json::<Value>().await.expect("json"),
        first
    );

    // Confirm and release reach PostgreSQL once the consumer wrote the rows (they wait a
    // moment for it, then answer 503; a consumer that just joined its group may take
    // longer); a use given back is available again at the gate.
    env.caught_up().await;
    let confirmed = env.app.confirm("FA", "o1").await;
    assert_eq!(confirmed.status(), StatusCode::OK);
    assert_eq!(
        confirmed.json::<Value>().await.expect("json")["status"],
        "CONFIRMED"
    );
    assert_eq!(
        env.app.release("FA", "o1").await.status(),
        StatusCode::CONFLICT
    );
    let released = env.app.release("FA", "o4").await;
    assert_eq!(released.status(), StatusCode::OK);
    assert_eq!(
        env.app.release("FA", "o4").await.status(),
        StatusCode::OK,
        "release is idempotent"
    );
    assert_eq!(
        env.app.confirm("FA", "o4").await.status(),
        StatusCode::CONFLICT
    );
    let dave = env.app.reserve("FA", "dave", "o6", 100_000).await;
    assert_eq!(
        dave.status(),
        StatusCode::CREATED,
        "the released use is taken again"
    );
    let retry_released = env.app.reserve("FA", "bob", "o4", 100_000).await;
    assert_eq!(
        retry_released.json::<Value>().await.expect("json")["status"],
        "RELEASED"
    );
    assert_eq!(
        env.app.confirm("FA", "nope").await.status(),
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        env.app.reserve("NOPE", "x", "o9", 100_000).await.status(),
        StatusCode::NOT_FOUND
    );

    let accepted = [("alice", "o1"), ("bob", "o4"), ("dave", "o6")].map(|(c, o)| Accepted {
        voucher_code: "FA".into(),
        customer_id: c.into(),
        order_id: o.into(),
    });
    env.finish(&accepted).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn events_replayed_from_offset_zero_change_nothing() {
    let env = FlashEnv::start().await;
    env.app.given_voucher(flash_voucher("REPLAY", 30, 1)).await;
    let (results, _) = sale(
        &env.app,
        "REPLAY",
        "rp",
        100,
        50,
        5,
        Duration::from_millis(50),
    )
    .await;
    env.caught_up().await;
    let before: Vec<(String, String, i64)> =
        sqlx::query_as("SELECT order_id, status, (SELECT used_count FROM vouchers WHERE code = 'REPLAY')::int8 FROM redemptions ORDER BY order_id")
            .fetch_all(&env.pool)
            .await
            .expect("rows");
    assert_eq!(before.len(), 30);

    // A new group reads the topic from the beginning into the same database.
    let mut kafka = env.kafka().clone();
    kafka.group = format!("{}-replay", kafka.group);
    let metrics = Arc::new(Metrics::new());
    let replayer = EventConsumer::new(&kafka, Store::new(env.pool.clone()), metrics.clone())
        .expect("consumer");
    let stop = CancellationToken::new();
    let task = tokio::spawn(replayer.run(stop.clone()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while metrics
        .consumer_events
        .with_label_values(&["duplicate"])
        .get()
        < 30
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "replay did not finish"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    let _ = task.await;

    let after: Vec<(String, String, i64)> =
        sqlx::query_as("SELECT order_id, status, (SELECT used_count FROM vouchers WHERE code = 'REPLAY')::int8 FROM redemptions ORDER BY order_id")
            .fetch_all(&env.pool)
            .await
            .expect("rows");
    assert_eq!(after, before, "a replay changes nothing");
    assert_eq!(
        metrics
            .consumer_events
            .with_label_values(&["inserted"])
            .get(),
        0
    );
    env.finish(&accepted("REPLAY", &results)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_consumer_killed_mid_stream_and_restarted_loses_and_doubles_nothing() {
    // The app only serves; the test runs the consumers so it can kill one.
    let env = FlashEnv::start_with(|s| {
        if let Some(k) = s.kafka.as_mut() {
            k.consume = false;
            k.batch_max = 10;
        }
    })
    .await;
    env.app.given_voucher(flash_voucher("CRASH", 200, 1)).await;
    let store = Store::new(env.pool.clone());
    let first_metrics = Arc::new(Metrics::new());
    let first =
        EventConsumer::new(env.kafka(), store.clone(), first_metrics.clone()).expect("consumer");
    let first_task = tokio::spawn(first.run(CancellationToken::new()));

    let app = &env.app;
    let selling = sale(app, "CRASH", "cr", 400, 40, 5, Duration::from_millis(50));
    let crash = async {
        // Kill the first consumer as soon as it has written something, mid-sale.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while first_metrics
            .consumer_events
            .with_label_values(&["inserted"])
            .get()
            < 20
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the first consumer wrote nothing"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        first_task.abort();
        let _ = first_task.await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let second = EventConsumer::new(env.kafka(), store.clone(), Arc::new(Metrics::new()))
            .expect("consumer");
        let stop = CancellationToken::new();
        (tokio::spawn(second.run(stop.clone())), stop)
    };
    let ((results, _), (second_task, stop)) = tokio::join!(selling, crash);

    assert_eq!(count(&results, StatusCode::CREATED, ""), 200);
    env.caught_up().await;
    assert_eq!(rows(&env, "CRASH").await, 200);
    stop.cancel();
    let _ = second_task.await;
    env.finish(&accepted("CRASH", &results)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_keys_lost_mid_sale_give_503s_then_the_sale_goes_on_without_oversell() {
    let env = FlashEnv::start().await;
    env.app.given_voucher(flash_voucher("LOST", 100, 1)).await;
    let code = voucher_core::domain::VoucherCode::parse("LOST").expect("code");

    let app = &env.app;
    let selling = sale(app, "LOST", "lo", 500, 20, 200, Duration::from_millis(50));
    let loss = async {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while env
            .gate
            .remaining(&code)
            .await
            .ok()
            .flatten()
            .unwrap_or(100)
            > 60
        {
            assert!(tokio::time::Instant::now() < deadline, "sale did not start");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        env.gate.unload(&code).await.expect("keys deleted");
    };
    let ((results, unavailable), ()) = tokio::join!(selling, loss);

    assert!(unavailable > 0, "requests during the rebuild got 503");
    assert_eq!(
        count(&results, StatusCode::CREATED, ""),
        100,
        "the sale went on to the limit, no further"
    );
    assert_eq!(count(&results, StatusCode::CONFLICT, "OUT_OF_STOCK"), 400);
    env.caught_up().await;
    assert_eq!(rows(&env, "LOST").await, 100);
    let text = env.app.metrics_text().await;
    assert!(
        text.contains(r#"voucher_gate_rebuilds_total{result="loaded"} 1"#),
        "{text}"
    );
    env.finish(&accepted("LOST", &results)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_broker_down_for_seconds_mid_sale_loses_no_201_and_oversells_nothing() {
    let mut env = FlashEnv::start().await;
    env.app.given_voucher(flash_voucher("OUTAGE", 150, 1)).await;
    let code = voucher_core::domain::VoucherCode::parse("OUTAGE").expect("code");

    // Patient clients retry a 503 for a while; impatient ones give up at once, leaving
    // uses held whose events may or may not have been written.
    // Field by field, so the broker below can be borrowed mutably meanwhile.
    let app = &env.env.app;
    let selling = async {
        let patient = sale(
            app,
            "OUTAGE",
            "pat",
            300,
            30,
            60,
            Duration::from_millis(100),
        );
        let impatient = sale(app, "OUTAGE", "imp", 100, 30, 0, Duration::ZERO);
        let ((mut results, u1), (more, u2)) = tokio::join!(patient, impatient);
        results.extend(more);
        (results, u1 + u2)
    };
    let gate = env.gate.clone();
    let broker = &mut env.broker;
    let outage = async move {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while gate.remaining(&code).await.ok().flatten().unwrap_or(150) > 120 {
            assert!(tokio::time::Instant::now() < deadline, "sale did not start");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        broker.kill();
        tokio::time::sleep(Duration::from_secs(3)).await;
        broker.resume().await;
    };
    let ((results, unavailable), ()) = tokio::join!(selling, outage);

    let won = count(&results, StatusCode::CREATED, "");
    let abandoned = count(
        &results,
        StatusCode::SERVICE_UNAVAILABLE,
        "SERVICE_UNAVAILABLE",
    );
    assert!(unavailable > 0, "the outage was felt");
    assert!(won <= 150, "never more than the limit: {won}");
    // Reconciliation, after the grace period, gives back what clients abandoned.
    tokio::time::sleep(Duration::from_millis(
        env.settings.flash.reconcile_grace_ms + 500,
    ))
    .await;
    env.caught_up().await;
    let reconciler = Reconciler {
        flash: FlashPath::new(
            env.gate.clone(),
            env.kafka(),
            Store::new(env.pool.clone()),
            Arc::new(Metrics::new()),
            env.settings.flash.clone(),
        )
        .expect("flash path"),
        store: Store::new(env.pool.clone()),
        metrics: Arc::new(Metrics::new()),
        interval: Duration::from_secs(60),
        grace: chrono::Duration::milliseconds(env.settings.flash.reconcile_grace_ms as i64),
        catch_up_timeout: Duration::from_secs(30),
    };
    let reports = reconciler.run_once().await.expect("reconciliation runs");
    let report = reports[0].1.clone().expect("caught up and loaded");
    let rows = rows(&env, "OUTAGE").await as usize;
    println!(
        "broker outage: {won} accepted, {unavailable} answers were 503, {abandoned} clients gave up, \
         {rows} rows, reconciliation: {report:?}"
    );
    assert_eq!(report.drift, 0, "{report:?}");
    assert!(rows >= won, "every 201 has its row");
    // A use held for a client that gave up was either recorded (its event had been written)
    // or given back by reconciliation: none is stranded.
    assert_eq!((rows - won) + report.forgotten, abandoned, "{report:?}");
    assert!(abandoned > 0, "some clients gave up during the outage");
    env.finish(&accepted("OUTAGE", &results)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_use_sale_under_twenty_thousand_requests_costs_few_transactions() {
    let env = FlashEnv::start().await;
    env.app.given_voucher(flash_voucher("BIG", 1000, 1)).await;
    let commits_before: i64 = xact_commit(&env).await;

    let (results, _) = sale(
        &env.app,
        "BIG",
        "big",
        20_000,
        200,
        5,
        Duration::from_millis(50),
    )
    .await;

    assert_eq!(count(&results, StatusCode::CREATED, ""), 1000);
    assert_eq!(
        count(&results, StatusCode::CONFLICT, "OUT_OF_STOCK"),
        19_000
    );
    env.caught_up().await;
    assert_eq!(rows(&env, "BIG").await, 1000);
    let text = env.app.metrics_text().await;
    let transactions = metric(&text, "voucher_consumer_transactions_total");
    let commits = xact_commit(&env).await - commits_before;
    println!(
        "flash sale: 1000 uses from 20000 requests, {transactions} consumer transactions \
         ({:.1} uses per transaction); database-wide commits meanwhile: {commits}",
        1000.0 / transactions.max(1.0)
    );
    assert!(
        transactions > 0.0 && transactions * 4.0 <= 1000.0,
        "{transactions} transactions for 1000 uses"
    );
    env.finish(&accepted("BIG", &results)).await;
}

async fn xact_commit(env: &FlashEnv) -> i64 {
    // Statistics are flushed lazily; ask for a fresh snapshot.
    let _ = sqlx::query("SELECT pg_stat_clear_snapshot()")
        .execute(&env.pool)
        .await;
    sqlx::query_scalar(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
    )
    .fetch_one(&env.pool)
    .await
    .expect("stats")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn expired_flash_reservations_give_their_uses_back_to_the_gate() {
    let env = FlashEnv::start_with(|s| {
        s.reservations.ttl_secs = 1;
        s.reservations.expiry_enabled = true;
        s.reservations.expiry_interval_ms = 50;
    })
    .await;
    env.app.given_voucher(flash_voucher("EXPF", 10, 1)).await;
    let (results, _) = sale(&env.app, "EXPF", "ex", 10, 10, 5, Duration::from_millis(50)).await;
    assert_eq!(count(&results, StatusCode::CREATED, ""), 10);

    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let v = env.app.voucher_json("EXPF").await;
        if v["usedCount"] == json!(0) && v["gateRemaining"] == json!(10) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "uses not given back: {v}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        env.app
            .reserve("EXPF", "late", "late-1", 100_000)
            .await
            .status(),
        StatusCode::CREATED
    );
    let mut all = accepted("EXPF", &results);
    all.push(Accepted {
        voucher_code: "EXPF".into(),
        customer_id: "late".into(),
        order_id: "late-1".into(),
    });
    env.finish(&all).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn events_the_database_refuses_go_to_the_dead_letter_topic_without_blocking() {
    use rdkafka::config::ClientConfig;
    use rdkafka::consumer::Consumer;
    use rdkafka::producer::{FutureProducer, FutureRecord};

    // A standard voucher: the events below bypass any gate, as a bug upstream would.
    let env = FlashEnv::start().await;
    env.app
        .given_voucher(crate::helpers::voucher_body("DLQ", 2, 1))
        .await;
    let event = |code: &str, customer: &str, order: &str| {
        let now = chrono::Utc::now().timestamp_millis();
        json!({"type": "reserved", "voucherCode": code, "orderId": order, "customerId": customer,
               "orderAmount": 100000, "discountAmount": 100000,
               "reservedAtMs": now, "expiresAtMs": now + 900_000})
        .to_string()
    };
    let payloads = [
        "not an event".to_owned(),
        event("GHOST", "c9", "o9"), // no such voucher
        event("DLQ", "c1", "o1"),
        event("DLQ", "c1", "o2"), // past the per-user limit
        event("DLQ", "c2", "o3"),
        event("DLQ", "c3", "o4"), // past the total limit
    ];
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", env.kafka().brokers.as_str())
        .create()
        .expect("producer");
    for payload in &payloads {
        producer
            .send(
                FutureRecord::to(&env.kafka().topic)
                    .key("DLQ")
                    .payload(payload),
                Duration::from_secs(5),
            )
            .await
            .map_err(|(e, _)| e)
            .expect("sent");
    }
    env.caught_up().await;

    let stored: Vec<String> =
        sqlx::query_scalar("SELECT order_id FROM redemptions ORDER BY order_id")
            .fetch_all(&env.pool)
            .await
            .expect("rows");
    assert_eq!(
        stored,
        ["o1", "o3"],
        "valid events after refused ones were written"
    );
    let text = env.app.metrics_text().await;
    assert!(
        text.contains(r#"voucher_consumer_events_total{result="dead_lettered"} 4"#),
        "{text}"
    );
    // The four refused events are on the dead-letter topic.
    let reader: rdkafka::consumer::BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", env.kafka().brokers.as_str())
        .create()
        .expect("consumer");
    let (low, high) = reader
        .fetch_watermarks(&env.kafka().dlq_topic(), 0, Duration::from_secs(10))
        .expect("watermarks");
    assert_eq!(high - low, 4, "dead letters on {}", env.kafka().dlq_topic());
    let accepted = [("c1", "o1"), ("c2", "o3")].map(|(c, o)| Accepted {
        voucher_code: "DLQ".into(),
        customer_id: c.into(),
        order_id: o.into(),
    });
    env.finish(&accepted).await;
}
