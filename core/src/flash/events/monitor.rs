//! The consumer monitor: every core, every `interval`, compares each partition's high
//! watermark with the offset written to PostgreSQL, exports the lag and how long the oldest
//! unwritten event has waited, and keeps what readiness reports about it.
//!
//! It runs whether or not this core writes: a partition nobody writes (every writer dead or
//! stalled) shows as a growing age on every core, which is what an alert needs. Where the
//! deployment writes no events at all (`flash.decision = "database"` without
//! `kafka.consume`: PostgreSQL holds every row before its 201, and the topic is for
//! consumers elsewhere), there is nothing to be behind on: it only reads the broker (what
//! readiness needs) and exports no lag, or every sale would page `VoucherEventsNotWritten`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::progress::{PartitionLag, Progress};
use crate::metrics::Metrics;

/// What the monitor saw last, for readiness.
#[derive(Debug, Clone, Default, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConsumerStatus {
    /// Seconds since the monitor last read the broker and PostgreSQL; `None` before it has.
    pub last_read_secs_ago: Option<f64>,
    pub partitions: Vec<PartitionStatus>,
    /// Why the last round failed, if it did.
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PartitionStatus {
    pub partition: i32,
    pub lag: i64,
    pub unwritten_age_secs: f64,
}

/// Shared between the monitor and the readiness endpoint.
#[derive(Debug, Default)]
pub struct ConsumerHealth {
    inner: Mutex<Health>,
}

#[derive(Debug, Default)]
struct Health {
    last_read: Option<Instant>,
    partitions: Vec<PartitionStatus>,
    error: Option<String>,
}

impl ConsumerHealth {
    pub fn status(&self) -> ConsumerStatus {
        let h = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        ConsumerStatus {
            last_read_secs_ago: h.last_read.map(|t| t.elapsed().as_secs_f64()),
            partitions: h.partitions.clone(),
            error: h.error.clone(),
        }
    }

    /// Whether this core can reach the broker: the monitor read it within `within`.
    pub fn broker_reachable(&self, within: Duration) -> bool {
        let h = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        h.last_read.is_some_and(|t| t.elapsed() <= within)
    }
}

pub struct ConsumerMonitor {
    progress: Progress,
    metrics: Arc<Metrics>,
    health: Arc<ConsumerHealth>,
    interval: Duration,
    /// Whether the deployment writes its events to PostgreSQL (`events_are_written`).
    writes: bool,
    /// When each partition was first seen waiting at its current offset.
    waiting: Mutex<HashMap<i32, (i64, Instant)>>,
}

impl ConsumerMonitor {
    pub fn new(
        progress: Progress,
        metrics: Arc<Metrics>,
        health: Arc<ConsumerHealth>,
        interval: Duration,
        writes: bool,
    ) -> Self {
        Self {
            progress,
            metrics,
            health,
            interval,
            writes,
            waiting: Mutex::default(),
        }
    }

    pub async fn run(self, shutdown: CancellationToken) {
        crate::periodic::every(self.interval, &shutdown, || self.round()).await;
    }

    async fn round(&self) {
        let read = async {
            let marks = self.progress.high_watermarks().await?;
            if !self.writes {
                return Ok(Vec::new());
            }
            self.progress.against(&marks).await
        };
        match read.await {
            Ok(partitions) => {
                let statuses: Vec<PartitionStatus> =
                    partitions.iter().map(|p| self.observe(p)).collect();
                let mut h = self.health.inner.lock().unwrap_or_else(|e| e.into_inner());
                h.last_read = Some(Instant::now());
                h.partitions = statuses;
                h.error = None;
            }
            Err(e) => {
                let error = format!("{e:#}");
                tracing::warn!(
                    error,
                    "consumer monitor cannot read the broker or PostgreSQL"
                );
                let mut h = self.health.inner.lock().unwrap_or_else(|e| e.into_inner());
                h.error = Some(error);
            }
        }
    }

    /// Exports one partition's lag and age; the age counts from the first round that saw
    /// the partition waiting at its current offset.
    fn observe(&self, p: &PartitionLag) -> PartitionStatus {
        let lag = p.messages();
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        let age = if lag == 0 {
            waiting.remove(&p.partition);
            0.0
        } else {
            let since = waiting
                .entry(p.partition)
                .and_modify(|(next, since)| {
                    if *next != p.next {
                        *next = p.next;
                        *since = Instant::now();
                    }
                })
                .or_insert((p.next, Instant::now()));
            since.1.elapsed().as_secs_f64()
        };
        let label = p.partition.to_string();
        self.metrics
            .consumer_lag
            .with_label_values(&[&label])
            .set(lag);
        self.metrics
            .consumer_unwritten_age
            .with_label_values(&[&label])
            .set(age);
        PartitionStatus {
            partition: p.partition,
            lag,
            unwritten_age_secs: age,
        }
    }
}
