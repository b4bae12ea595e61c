//! The consumer group that writes reservation events into PostgreSQL.
//!
//! At least once: offsets are stored and committed only after the database transaction
//! commits, so a crash replays the last batch, and a replay is a no-op (orderId is unique).
//! An event the database refuses goes to the dead-letter topic, so one bad event never
//! blocks its partition and is never lost. A database outage stops progress (the batch is
//! retried) but loses nothing.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::{BorrowedMessage, Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::Message;
use tokio_util::sync::CancellationToken;

use super::VoucherEvent;
use crate::config::KafkaSettings;
use crate::domain::Reservation;
use crate::metrics::Metrics;
use crate::store::{BatchResult, Store};

pub struct EventConsumer {
    consumer: StreamConsumer,
    dead_letters: FutureProducer,
    dlq_topic: String,
    store: Store,
    metrics: Arc<Metrics>,
    batch_max: usize,
    batch_wait: Duration,
}

impl EventConsumer {
    pub fn new(
        settings: &KafkaSettings,
        store: Store,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Self> {
        let consumer: StreamConsumer = ClientConfig::new()
            .set("bootstrap.servers", &settings.brokers)
            .set("group.id", &settings.group)
            // A group that has never committed starts at the beginning: no event is skipped.
            .set("auto.offset.reset", "earliest")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            // Confirm and release wait for the consumer to write a fresh reservation: a
            // fetch that idles for librdkafka's default 500 ms would show in their latency.
            .set("fetch.wait.max.ms", "10")
            .create()?;
        consumer.subscribe(&[&settings.topic])?;
        let dead_letters: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", &settings.brokers)
            .set("acks", "all")
            .set("enable.idempotence", "true")
            .create()?;
        Ok(Self {
            consumer,
            dead_letters,
            dlq_topic: settings.dlq_topic(),
            store,
            metrics,
            batch_max: settings.batch_max.max(1),
            batch_wait: settings.batch_wait,
        })
    }

    /// Runs until `shutdown` is cancelled. A batch in progress is finished or abandoned
    /// before its offsets are committed, so stopping never loses an event.
    pub async fn run(self, shutdown: CancellationToken) {
        loop {
            let first = tokio::select! {
                _ = shutdown.cancelled() => return,
                m = self.consumer.recv() => m,
            };
            let first = match first {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(error = %e, "consumer error");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            let mut batch = vec![first];
            let deadline = tokio::time::Instant::now() + self.batch_wait;
            while batch.len() < self.batch_max {
                match tokio::time::timeout_at(deadline, self.consumer.recv()).await {
                    Ok(Ok(m)) => batch.push(m),
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "consumer error while filling a batch");
                        break;
                    }
                    Err(_) => break,
                }
            }
            // Retry the same batch until it is written: skipping it would lose uses.
            let mut backoff = Duration::from_millis(100);
            loop {
                match self.write(&batch).await {
                    Ok(()) => break,
                    Err(e) => {
                        tracing::warn!(
                            error = format!("{e:#}"),
                            events = batch.len(),
                            "batch not written; retrying"
                        );
                        tokio::select! {
                            _ = shutdown.cancelled() => return,
                            _ = tokio::time::sleep(backoff) => {}
                        }
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                    }
                }
            }
            self.commit(&batch);
        }
    }

    /// Writes one batch: readable events recorded in PostgreSQL, the rest and whatever the
    /// database refuses sent to the dead letters, then counted.
    #[tracing::instrument(name = "consumer.batch", skip_all, fields(events = batch.len()))]
    async fn write(&self, batch: &[BorrowedMessage<'_>]) -> anyhow::Result<()> {
        let (rows, positions, mut dead) = read_batch(batch);
        let result = if rows.is_empty() {
            BatchResult::default()
        } else {
            self.store.record_reserved(&rows).await?
        };
        dead.extend(
            result
                .refused
                .iter()
                .map(|(k, reason)| (positions[*k], reason.clone())),
        );
        for (i, reason) in &dead {
            self.dead_letter(&batch[*i], reason).await?;
        }
        self.count(batch.len(), &result, dead.len());
        Ok(())
    }

    fn count(&self, events: usize, result: &BatchResult, dead_lettered: usize) {
        let m = &self.metrics;
        m.consumer_batch_size.observe(events as f64);
        m.consumer_transactions.inc_by(result.transactions as u64);
        for (label, n) in [
            ("inserted", result.inserted),
            ("duplicate", result.duplicates),
            ("dead_lettered", dead_lettered),
        ] {
            m.consumer_events
                .with_label_values(&[label])
                .inc_by(n as u64);
        }
    }

    async fn dead_letter(&self, message: &BorrowedMessage<'_>, reason: &str) -> anyhow::Result<()> {
        tracing::error!(
            reason,
            partition = message.partition(),
            offset = message.offset(),
            "event refused; sent to the dead-letter topic"
        );
        let origin = format!(
            "{}/{}/{}",
            message.topic(),
            message.partition(),
            message.offset()
        );
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "reason",
                value: Some(reason),
            })
            .insert(Header {
                key: "origin",
                value: Some(origin.as_str()),
            });
        let mut record = FutureRecord::to(&self.dlq_topic)
            .payload(message.payload().unwrap_or_default())
            .headers(headers);
        if let Some(key) = message.key() {
            record = record.key(key);
        }
        self.dead_letters
            .send(record, Duration::from_secs(5))
            .await
            .map_err(|(e, _)| anyhow::anyhow!("dead-letter send failed: {e}"))?;
        Ok(())
    }

    /// Offsets are stored only for written batches, then committed synchronously so that
    /// `Progress` sees them promptly. A failed commit is retried with the next batch.
    fn commit(&self, batch: &[BorrowedMessage<'_>]) {
        for message in batch {
            if let Err(e) = self.consumer.store_offset_from_message(message) {
                tracing::warn!(error = %e, "cannot store offset");
            }
        }
        if let Err(e) = self.consumer.commit_consumer_state(CommitMode::Sync) {
            tracing::warn!(error = %e, "offset commit failed; will be retried with the next batch");
        }
    }
}

/// The rows a batch asks for, each with its position in the batch, and the positions of
/// unreadable events with the reason.
fn read_batch(
    batch: &[BorrowedMessage<'_>],
) -> (Vec<Reservation>, Vec<usize>, Vec<(usize, String)>) {
    let mut rows = Vec::with_capacity(batch.len());
    let mut positions = Vec::with_capacity(batch.len());
    let mut dead = Vec::new();
    for (i, message) in batch.iter().enumerate() {
        match parse(message) {
            Ok(row) => {
                rows.push(row);
                positions.push(i);
            }
            Err(reason) => dead.push((i, reason)),
        }
    }
    (rows, positions, dead)
}

fn parse(message: &BorrowedMessage<'_>) -> Result<Reservation, String> {
    let payload = message
        .payload()
        .ok_or_else(|| "empty payload".to_owned())?;
    match serde_json::from_slice::<VoucherEvent>(payload) {
        Ok(VoucherEvent::Reserved(event)) => {
            Reservation::try_from(&event).map_err(|e| format!("unreadable event: {e}"))
        }
        Err(e) => Err(format!("unreadable event: {e}")),
    }
}
