//! The writers of reservation events into PostgreSQL: one per partition of the events topic,
//! whichever core holds the partition.
//!
//! Partitions are owned through PostgreSQL, not through the broker's consumer group (whose
//! rebalances can leave a partition unread for minutes after a member dies): every core runs
//! a writer per partition, and a writer works only while its database session holds the
//! partition's advisory lock (`store::partitions`). It reads the partition by manual
//! assignment from the offset stored in PostgreSQL and stores the next offset with the rows,
//! on the same session. When a core dies its sessions end, PostgreSQL releases the locks, and
//! a standby writer on another core takes each partition within `kafka.takeover_interval`.
//! A core that stalls longer than `kafka.owner_timeout` loses its session the same way.
//!
//! Exactly once in the common case (rows and offset in one transaction); a batch with an
//! event the database refuses or cannot read stores its offset only after those events are
//! on the dead-letter topic, so a crash in between replays the batch, which changes no row.
//! A database outage stops progress but loses nothing: the writer lets the partition go and
//! tries again.
//!
//! Traced, each event whose record carries a trace context (`traceparent` in its headers,
//! from the publisher) gets a `consumer.write` span in that trace, covering the write of
//! its batch and linked to the batch's span.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{BorrowedMessage, Header, Headers, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Message, Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;

use super::progress::Progress;
use super::VoucherEvent;
use crate::config::KafkaSettings;
use crate::domain::{Reservation, VoucherCode};
use crate::flash::gate::Gate;
use crate::metrics::Metrics;
use crate::store::{BatchResult, OwnedPartition, PartitionKey, Store};

pub struct EventConsumer {
    settings: KafkaSettings,
    dead_letters: FutureProducer,
    store: Store,
    metrics: Arc<Metrics>,
    /// Names this process in logs and in `consumer_offsets.owner`.
    instance: String,
    /// Told which orders now have their row, so reconciliation need not look at them.
    gate: Option<Gate>,
}

impl EventConsumer {
    pub fn new(
        settings: &KafkaSettings,
        store: Store,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Self> {
        let dead_letters: FutureProducer = settings
            .client_config()
            .set("acks", "all")
            // As the publisher's: duplicates are harmless, and tansu's idempotence check
            // breaks after a broker restart.
            .set("enable.idempotence", "false")
            .create()?;
        Ok(Self {
            settings: settings.clone(),
            dead_letters,
            store,
            metrics,
            instance: format!(
                "{}-{}",
                std::process::id(),
                &uuid::Uuid::new_v4().simple().to_string()[..8]
            ),
            gate: None,
        })
    }

    /// Settles the orders it writes in `gate` (drops them from the unsettled set): their
    /// rows are in, so reconciliation's snapshot stays as small as the writers' lag.
    pub fn settling(mut self, gate: Gate) -> Self {
        self.gate = Some(gate);
        self
    }

    /// Runs a writer per partition until `shutdown` is cancelled. A batch in progress is
    /// finished or abandoned before its offset is stored, so stopping never loses an event.
    pub async fn run(self, shutdown: CancellationToken) {
        let this = Arc::new(self);
        let Some(partitions) = this.partitions(&shutdown).await else {
            return;
        };
        // A set: dropping this future (a killed app in a test) stops every writer with it.
        let mut writers = tokio::task::JoinSet::new();
        for p in 0..partitions {
            writers.spawn(this.clone().writer(p, shutdown.clone()));
        }
        while writers.join_next().await.is_some() {}
    }

    /// How many partitions the topic has, once the broker says (retried until it does).
    async fn partitions(&self, shutdown: &CancellationToken) -> Option<i32> {
        loop {
            match Progress::partition_count(&self.settings).await {
                Ok(n) => return Some(n),
                Err(e) => tracing::warn!(
                    error = format!("{e:#}"),
                    "cannot read the topic's partitions; retrying"
                ),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return None,
                _ = tokio::time::sleep(self.settings.takeover_interval) => {}
            }
        }
    }

    /// Competes for partition `partition`; writes it while it is ours.
    async fn writer(self: Arc<Self>, partition: i32, shutdown: CancellationToken) {
        let key = PartitionKey {
            group: self.settings.group.clone(),
            topic: self.settings.topic.clone(),
            partition,
        };
        let label = partition.to_string();
        let owned_gauge = self.metrics.partitions_owned.with_label_values(&[&label]);
        loop {
            let owned = tokio::select! {
                _ = shutdown.cancelled() => return,
                owned = self.store.own_partition(&key, &self.instance, self.settings.owner_timeout) => owned,
            };
            match owned {
                Ok(Some(owned)) => {
                    tracing::info!(partition, instance = %self.instance, "took the partition");
                    owned_gauge.set(1);
                    let why = self.write_while_owner(owned, &shutdown).await;
                    owned_gauge.set(0);
                    tracing::info!(partition, instance = %self.instance, reason = %why, "let the partition go");
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(partition, error = %e.chain(), "cannot compete for the partition")
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(self.settings.takeover_interval) => {}
            }
        }
    }

    /// Reads the partition from its stored offset and writes it, batch by batch, until the
    /// session fails, a batch cannot be written, or `shutdown`. Returns why it stopped.
    async fn write_while_owner(
        &self,
        mut owned: OwnedPartition,
        shutdown: &CancellationToken,
    ) -> String {
        let start = match owned.next_offset().await {
            Ok(Some(n)) => Offset::Offset(n),
            Ok(None) => Offset::Beginning,
            Err(e) => return format!("stored offset unreadable: {}", e.chain()),
        };
        let reader = match self.reader(owned.key.partition, start) {
            Ok(reader) => reader,
            Err(e) => return format!("cannot read the partition: {e:#}"),
        };
        // Well within owner_timeout, so an idle partition keeps its session.
        let heartbeat = self.settings.owner_timeout / 4;
        loop {
            let first = tokio::select! {
                _ = shutdown.cancelled() => return "shutting down".into(),
                m = tokio::time::timeout(heartbeat, reader.recv()) => m,
            };
            let first = match first {
                Err(_idle) => {
                    if let Err(e) = owned.heartbeat().await {
                        return format!("session lost: {}", e.chain());
                    }
                    continue;
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %crate::error::cause_chain(&e), partition = owned.key.partition, "read error");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
                Ok(Ok(m)) => m,
            };
            let batch = self.fill(&reader, first).await;
            if let Err(e) = self.write(&mut owned, &batch).await {
                return format!("batch not written: {e:#}");
            }
        }
    }

    /// A consumer of just this partition from `start`, by manual assignment: it never
    /// subscribes, so it joins no group and takes part in no rebalance, and it commits
    /// nothing to the broker (the offset lives in PostgreSQL). librdkafka still wants a
    /// `group.id` for an assignment; it is never used to coordinate.
    fn reader(&self, partition: i32, start: Offset) -> anyhow::Result<StreamConsumer> {
        let reader: StreamConsumer = self
            .settings
            .client_config()
            .set("group.id", &self.settings.group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            // Confirm and release wait for the consumer to write a fresh reservation: a
            // fetch that idles for librdkafka's default 500 ms would show in their latency.
            .set(
                "fetch.wait.max.ms",
                self.settings.fetch_wait.as_millis().to_string(),
            )
            .create()?;
        let mut assignment = TopicPartitionList::new();
        assignment.add_partition_offset(&self.settings.topic, partition, start)?;
        reader.assign(&assignment)?;
        Ok(reader)
    }

    /// `first` and whatever else arrives within `batch_wait`, up to `batch_max` events.
    async fn fill<'a>(
        &self,
        reader: &'a StreamConsumer,
        first: BorrowedMessage<'a>,
    ) -> Vec<BorrowedMessage<'a>> {
        let mut batch = vec![first];
        let deadline = tokio::time::Instant::now() + self.settings.batch_wait;
        while batch.len() < self.settings.batch_max.max(1) {
            match tokio::time::timeout_at(deadline, reader.recv()).await {
                Ok(Ok(m)) => batch.push(m),
                Ok(Err(e)) => {
                    tracing::warn!(error = %crate::error::cause_chain(&e), "read error while filling a batch");
                    break;
                }
                Err(_) => break,
            }
        }
        batch
    }

    /// Writes one batch: readable events recorded in PostgreSQL, the rest and whatever the
    /// database refuses sent to the dead letters, the next offset stored, then counted.
    #[tracing::instrument(name = "consumer.batch", skip_all, fields(events = batch.len(), partition = owned.key.partition))]
    async fn write(
        &self,
        owned: &mut OwnedPartition,
        batch: &[BorrowedMessage<'_>],
    ) -> anyhow::Result<()> {
        let Some(last) = batch.last() else {
            return Ok(());
        };
        let next_offset = last.offset() + 1;
        // Ended when this write returns, whatever it returns.
        let _traced = event_spans(batch);
        let (rows, positions, mut dead) = read_batch(batch);
        let result = if rows.is_empty() {
            BatchResult::default()
        } else {
            // With an unreadable event in the batch, the offset waits for its dead letter.
            let offset_with_rows = dead.is_empty().then_some(next_offset);
            owned.record_reserved(&rows, offset_with_rows).await?
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
        if !result.offset_stored {
            owned.store_offset(next_offset).await?;
        }
        self.count(batch.len(), &result, dead.len());
        self.settle(&rows, &result).await;
        Ok(())
    }

    /// Best effort: an order left unsettled is settled by the next reconciliation round.
    async fn settle(&self, rows: &[Reservation], result: &BatchResult) {
        let Some(gate) = &self.gate else {
            return;
        };
        let refused: HashSet<usize> = result.refused.iter().map(|(i, _)| *i).collect();
        let mut per_voucher: HashMap<&VoucherCode, Vec<&str>> = HashMap::new();
        for (i, row) in rows.iter().enumerate() {
            if !refused.contains(&i) {
                per_voucher
                    .entry(&row.voucher_code)
                    .or_default()
                    .push(row.order_id.as_str());
            }
        }
        for (code, orders) in per_voucher {
            if let Err(e) = gate.settle(code, &orders).await {
                tracing::debug!(error = %e.chain(), %code, "written orders not settled in the gate");
            }
        }
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
        let dlq_topic = self.settings.dlq_topic();
        let mut record = FutureRecord::to(&dlq_topic)
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
}

/// A `consumer.write` span for each event that carries a trace context, continuing its
/// trace and linked to the current span (the batch's); none while tracing is off.
fn event_spans(batch: &[BorrowedMessage<'_>]) -> Vec<tracing::Span> {
    if !voucher_telemetry::tracing_enabled() {
        return Vec::new();
    }
    let batch_span = tracing::Span::current();
    batch
        .iter()
        .filter_map(|message| {
            let headers = message.headers()?;
            let span = tracing::debug_span!(
                "consumer.write",
                otel.kind = "consumer",
                partition = message.partition(),
                offset = message.offset(),
            );
            voucher_telemetry::trace::continue_from(&span, |name| {
                headers
                    .iter()
                    .find(|header| header.key == name)
                    .and_then(|header| header.value)
                    .and_then(|value| std::str::from_utf8(value).ok())
            });
            voucher_telemetry::trace::link(&span, &batch_span);
            Some(span)
        })
        .collect()
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
