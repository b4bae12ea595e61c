//! The writers of reservation events own their partitions through PostgreSQL: a writer
//! that dies or stalls hands its partitions over within seconds, and every acknowledged
//! reservation reaches PostgreSQL without the broker's group coordinator.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use voucher_core::config::Decision;
use voucher_core::domain::VoucherCode;
use voucher_core::flash::events::consumer::EventConsumer;
use voucher_core::metrics::Metrics;
use voucher_core::store::{PartitionKey, Store};
use voucher_testkit::wait::eventually;

use crate::sale::Sale;
use crate::stack::{flash_voucher, FlashStack};

/// The bound the design promises: every acknowledged event is written this soon after the
/// core that was writing it dies.
const WRITTEN_WITHIN: Duration = Duration::from_secs(15);

async fn owned_by(app: &crate::helpers::TestApp) -> f64 {
    app.metrics()
        .await
        .sum("voucher_consumer_partitions_owned", &[])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_writer_hands_its_partitions_over_and_every_201_gets_its_row() {
    // The broker deciding: the writers are what puts the rows in PostgreSQL.
    let mut stack = FlashStack::builder()
        .cores(2)
        .start_with(|s| s.flash.decision = Decision::Broker)
        .await;
    stack
        .app()
        .given_voucher(flash_voucher("KILL", 150, 1))
        .await;
    let partitions = eventually(Duration::from_secs(30), "every partition owned", || async {
        let (a, b) = (
            owned_by(&stack.cores[0]).await,
            owned_by(&stack.cores[1]).await,
        );
        (a + b == 3.0).then_some((a, b))
    })
    .await;
    // The victim is a core that writes; the sale goes to the other one.
    let victim = if partitions.0 > 0.0 { 0 } else { 1 };
    let victim = stack.cores.remove(victim);
    let code = VoucherCode::parse("KILL").expect("code");

    let plan = Sale {
        in_flight: 20,
        ..Sale::new("KILL", "k", 300)
    };
    let selling = plan.run(stack.app());
    let kill = async {
        // Mid-stream: once part of the stock is sold and being written.
        eventually(
            Duration::from_secs(60),
            "the sale to be under way",
            || async {
                let left = stack.gate.remaining(&code).await.ok().flatten()?;
                (left <= 100).then_some(())
            },
        )
        .await;
        victim.kill().await;
        Instant::now()
    };
    let (sale, killed_at) = tokio::join!(selling, kill);
    assert_eq!(sale.created(), 150);

    let survivor = stack.app();
    eventually(
        WRITTEN_WITHIN,
        "the survivor to own every partition",
        || async { (owned_by(survivor).await == 3.0).then_some(()) },
    )
    .await;
    let rows_by = killed_at + WRITTEN_WITHIN;
    eventually(WRITTEN_WITHIN, "every 201 to have its row", || async {
        (stack.rows("KILL").await == 150).then_some(())
    })
    .await;
    println!(
        "writer killed: every row written {:.1} s after the kill (bound {} s)",
        killed_at.elapsed().as_secs_f64(),
        WRITTEN_WITHIN.as_secs()
    );
    assert!(Instant::now() <= rows_by, "rows written within the bound");
    stack.finish(&sale.accepted()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stalled_writer_loses_its_partitions_after_the_owner_timeout() {
    // The app only serves; the test plays a stalled writer, then a live one. The broker
    // decides, so rows come only from the writers.
    let stack = FlashStack::builder()
        .start_with(|s| {
            s.flash.decision = Decision::Broker;
            if let Some(k) = s.kafka.as_mut() {
                k.consume = Some(false);
            }
        })
        .await;
    let store = Store::new(stack.pool.clone());
    let kafka = stack.kafka().clone();
    // A writer that took every partition, then stopped answering (a paused process): its
    // sessions end after one second without a statement.
    let mut stalled = Vec::new();
    for partition in 0..3 {
        let key = PartitionKey {
            group: kafka.group.clone(),
            topic: kafka.topic.clone(),
            partition,
        };
        let owned = store
            .own_partition(&key, "stalled", Duration::from_secs(1))
            .await
            .expect("database")
            .expect("nobody owns it yet");
        stalled.push(owned);
    }
    let live_metrics = Arc::new(Metrics::new());
    let live = EventConsumer::new(&kafka, store.clone(), live_metrics.clone()).expect("writer");
    let stop = CancellationToken::new();
    let task = tokio::spawn(live.run(stop.clone()));

    stack
        .app()
        .given_voucher(flash_voucher("STALL", 20, 1))
        .await;
    let sale = Sale::new("STALL", "s", 20).run(stack.app()).await;
    assert_eq!(sale.created(), 20);
    let started = Instant::now();
    eventually(
        WRITTEN_WITHIN,
        "the live writer to take over and write",
        || async { (stack.rows("STALL").await == 20).then_some(()) },
    )
    .await;
    println!(
        "stalled writer: rows written {:.1} s after the sale",
        started.elapsed().as_secs_f64()
    );
    for mut owned in stalled {
        assert!(
            owned.heartbeat().await.is_err(),
            "a stalled writer's session is over: it can write nothing more"
        );
    }
    // Readiness says how far writing is, per partition, as the monitor last saw it.
    let app = stack.app();
    eventually(
        Duration::from_secs(10),
        "readyz to report the partitions written",
        || async {
            let body: serde_json::Value = app
                .client
                .get(format!("{}/readyz", app.base))
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            let partitions = body["consumer"]["partitions"].as_array()?.clone();
            let written = partitions.len() == 3 && partitions.iter().all(|p| p["lag"] == 0);
            written.then_some(())
        },
    )
    .await;
    let metrics = app.metrics().await;
    assert_eq!(metrics.sum("voucher_consumer_lag_messages", &[]), 0.0);
    assert_eq!(
        metrics
            .samples()
            .iter()
            .filter(|s| s.name == "voucher_consumer_unwritten_age_seconds")
            .count(),
        3,
        "an age per partition"
    );
    stop.cancel();
    let _ = task.await;
    stack.finish(&sale.accepted()).await;
}

/// With PostgreSQL deciding and no writers (the default), nothing is behind: every row was
/// committed before its 201, and the topic is for consumers elsewhere. The monitor still
/// reads the broker (readiness needs it) but exports no lag, or every sale would page
/// `VoucherEventsNotWritten` 30 s after its first event.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_writers_a_sale_leaves_no_lag_to_page_on() {
    let env = FlashStack::start().await;
    env.app().given_voucher(flash_voucher("NOLAG", 20, 1)).await;
    let sale = Sale::new("NOLAG", "a", 20).run(env.app()).await;
    assert_eq!(sale.created(), 20);
    let sold = Instant::now();
    // A monitor round after the sale: the broker was read since.
    eventually(
        Duration::from_secs(30),
        "a monitor round after the sale",
        || async {
            let ready: serde_json::Value = env
                .app()
                .client
                .get(format!("{}/readyz", env.app().base))
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            let ago = ready["consumer"]["lastReadSecsAgo"].as_f64()?;
            (ago < sold.elapsed().as_secs_f64()
                && ready["consumer"]["partitions"] == serde_json::json!([]))
            .then_some(())
        },
    )
    .await;
    let metrics = env.app().metrics().await;
    assert!(
        !metrics
            .samples()
            .iter()
            .any(|s| s.name == "voucher_consumer_unwritten_age_seconds"
                || s.name == "voucher_consumer_lag_messages"),
        "no lag exported without writers"
    );
    env.finish(&sale.accepted()).await;
}
