//! "Has the consumer group written everything published so far?"
//!
//! Rebuilding a gate and giving back uses both depend on the answer: only when the
//! group's committed offsets reach the high watermarks sampled *now* does PostgreSQL hold
//! every event published before now (offsets are committed only after the database commit).

use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use crate::config::KafkaSettings;

const CALL_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Clone)]
pub struct Progress {
    /// A consumer of the writers' group that never subscribes: it only reads the group's
    /// committed offsets, so it does not join the group or trigger a rebalance.
    consumer: std::sync::Arc<BaseConsumer>,
    topic: String,
}

/// How far behind the group was at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lag {
    /// Events published but not yet committed by the group, over all partitions.
    pub messages: i64,
}

impl Progress {
    pub fn new(settings: &KafkaSettings) -> anyhow::Result<Self> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &settings.brokers)
            .set("group.id", &settings.group)
            .set("enable.auto.commit", "false")
            .create()?;
        Ok(Self {
            consumer: std::sync::Arc::new(consumer),
            topic: settings.topic.clone(),
        })
    }

    /// High watermarks now, then the group's committed offsets: lag per that sample.
    pub async fn lag_now(&self) -> anyhow::Result<(Vec<(i32, i64)>, Lag)> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || {
            let marks = this.high_watermarks()?;
            let lag = this.lag_against(&marks)?;
            Ok((marks, lag))
        })
        .await?
    }

    /// Waits until the group has committed everything published before this call, or
    /// `timeout` passes. `Ok(true)` when caught up.
    pub async fn wait_caught_up(&self, timeout: Duration) -> anyhow::Result<bool> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || {
            let deadline = Instant::now() + timeout;
            let marks = this.high_watermarks()?;
            loop {
                if this.lag_against(&marks)?.messages == 0 {
                    return Ok(true);
                }
                if Instant::now() >= deadline {
                    return Ok(false);
                }
                std::thread::sleep(Duration::from_millis(25));
            }
        })
        .await?
    }

    fn high_watermarks(&self) -> anyhow::Result<Vec<(i32, i64)>> {
        let metadata = self
            .consumer
            .fetch_metadata(Some(&self.topic), CALL_TIMEOUT)?;
        let topic = metadata
            .topics()
            .iter()
            .find(|t| t.name() == self.topic)
            .ok_or_else(|| anyhow::anyhow!("topic {} not found", self.topic))?;
        topic
            .partitions()
            .iter()
            .map(|p| {
                let (_, high) =
                    self.consumer
                        .fetch_watermarks(&self.topic, p.id(), CALL_TIMEOUT)?;
                Ok((p.id(), high))
            })
            .collect()
    }

    fn lag_against(&self, marks: &[(i32, i64)]) -> anyhow::Result<Lag> {
        let mut tpl = TopicPartitionList::new();
        for (partition, _) in marks {
            tpl.add_partition(&self.topic, *partition);
        }
        let committed = self.consumer.committed_offsets(tpl, CALL_TIMEOUT)?;
        let mut messages = 0;
        for (partition, high) in marks {
            let done = match committed
                .find_partition(&self.topic, *partition)
                .map(|e| e.offset())
            {
                Some(Offset::Offset(n)) => n,
                // Nothing committed yet: behind by everything in the partition. (A
                // partition whose start was deleted by retention would count too much
                // here; that errs towards waiting, never towards giving back.)
                _ => 0,
            };
            messages += (high - done).max(0);
        }
        Ok(Lag { messages })
    }
}
