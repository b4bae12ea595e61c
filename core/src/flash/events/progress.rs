//! "Has every event published so far been written to PostgreSQL?"
//!
//! Rebuilding a gate and giving back uses both depend on the answer: only when each
//! partition's next offset stored in PostgreSQL (`consumer_offsets`, written with the rows)
//! reaches the partition's high watermark sampled *now* does PostgreSQL hold every event
//! published before now.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};

use crate::config::KafkaSettings;
use crate::store::Store;

const CALL_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Clone)]
pub struct Progress {
    /// Reads metadata and watermarks only: it never subscribes, joins or commits.
    client: Arc<BaseConsumer>,
    topic: String,
    group: String,
    store: Store,
}

/// One partition at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionLag {
    pub partition: i32,
    /// The broker's high watermark: the offset the next event will get.
    pub high: i64,
    /// The first offset not yet written to PostgreSQL.
    pub next: i64,
}

impl PartitionLag {
    /// Events published but not written. (A partition whose start was deleted by retention
    /// counts too much here; that errs towards waiting, never towards giving back.)
    pub fn messages(&self) -> i64 {
        (self.high - self.next).max(0)
    }
}

/// How far behind the writers were at one moment, over all partitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lag {
    pub messages: i64,
}

fn client(settings: &KafkaSettings) -> anyhow::Result<BaseConsumer> {
    Ok(settings.client_config().create()?)
}

impl Progress {
    pub fn new(settings: &KafkaSettings, store: Store) -> anyhow::Result<Self> {
        Ok(Self {
            client: Arc::new(client(settings)?),
            topic: settings.topic.clone(),
            group: settings.group.clone(),
            store,
        })
    }

    /// The number of partitions of the events topic.
    pub async fn partition_count(settings: &KafkaSettings) -> anyhow::Result<i32> {
        let (client, topic) = (client(settings)?, settings.topic.clone());
        tokio::task::spawn_blocking(move || {
            let metadata = client.fetch_metadata(Some(&topic), CALL_TIMEOUT)?;
            let partitions = metadata
                .topics()
                .iter()
                .find(|t| t.name() == topic)
                .map_or(0, |t| t.partitions().len());
            anyhow::ensure!(partitions > 0, "topic {topic} has no partitions");
            Ok(i32::try_from(partitions)?)
        })
        .await?
    }

    /// High watermarks now, per partition.
    pub async fn high_watermarks(&self) -> anyhow::Result<Vec<(i32, i64)>> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || {
            let metadata = this
                .client
                .fetch_metadata(Some(&this.topic), CALL_TIMEOUT)?;
            let topic = metadata
                .topics()
                .iter()
                .find(|t| t.name() == this.topic)
                .ok_or_else(|| anyhow::anyhow!("topic {} not found", this.topic))?;
            topic
                .partitions()
                .iter()
                .map(|p| {
                    let (_, high) =
                        this.client
                            .fetch_watermarks(&this.topic, p.id(), CALL_TIMEOUT)?;
                    Ok((p.id(), high))
                })
                .collect()
        })
        .await?
    }

    /// Each partition against the given watermarks: what is written of them.
    pub async fn against(&self, marks: &[(i32, i64)]) -> anyhow::Result<Vec<PartitionLag>> {
        let next = self.store.next_offsets(&self.group, &self.topic).await?;
        Ok(marks
            .iter()
            .map(|&(partition, high)| PartitionLag {
                partition,
                high,
                next: next.get(&partition).copied().unwrap_or(0),
            })
            .collect())
    }

    /// High watermarks now, then what is written of them.
    pub async fn lag_now(&self) -> anyhow::Result<(Vec<(i32, i64)>, Lag)> {
        let marks = self.high_watermarks().await?;
        let messages = self
            .against(&marks)
            .await?
            .iter()
            .map(PartitionLag::messages)
            .sum();
        Ok((marks, Lag { messages }))
    }

    /// Waits until everything published before this call is written, or `timeout` passes.
    /// `Ok(true)` when caught up.
    pub async fn wait_caught_up(&self, timeout: Duration) -> anyhow::Result<bool> {
        let deadline = Instant::now() + timeout;
        let marks = self.high_watermarks().await?;
        loop {
            let behind: i64 = self
                .against(&marks)
                .await?
                .iter()
                .map(PartitionLag::messages)
                .sum();
            if behind == 0 {
                return Ok(true);
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}
