//! The queue the grouped statements take their batches from (flash mode's recorder and
//! order lookups, standard mode's grouper): each of their workers takes whatever has queued, waits up to a linger
//! for more, up to a most per batch. Under load the queue fills while the previous batch's
//! statement runs, so batches grow with the load; the linger bounds what a lone request
//! waits for company. What waits is counted (`voucher_group_queued`), and so is the size of
//! every batch taken (`voucher_group_size`), per mode.

use std::sync::Arc;
use std::time::Duration;

use prometheus::{Histogram, IntGauge};

use crate::metrics::Metrics;
use tokio::sync::{mpsc, Mutex};

/// The sending side: jobs queued and not yet taken into a batch are counted in `queued`.
pub struct Queue<T> {
    sender: mpsc::Sender<T>,
    queued: IntGauge,
}

impl<T> Clone for Queue<T> {
    fn clone(&self) -> Self {
        Self {
            sender: self.sender.clone(),
            queued: self.queued.clone(),
        }
    }
}

/// Every worker is gone: the job was not queued.
#[derive(Debug)]
pub struct Stopped;

impl<T> Queue<T> {
    /// Queues `job`, waiting while the queue is full.
    pub async fn send(&self, job: T) -> Result<(), Stopped> {
        self.queued.inc();
        let sent = self.sender.send(job).await;
        if sent.is_err() {
            self.queued.dec();
        }
        sent.map_err(|_| Stopped)
    }
}

/// The receiving side, shared by the workers (one takes a batch at a time).
pub struct Batches<T> {
    jobs: Arc<Mutex<mpsc::Receiver<T>>>,
    batch_max: usize,
    linger: Duration,
    queued: IntGauge,
    sizes: Histogram,
}

impl<T> Clone for Batches<T> {
    fn clone(&self) -> Self {
        Self {
            jobs: self.jobs.clone(),
            batch_max: self.batch_max,
            linger: self.linger,
            queued: self.queued.clone(),
            sizes: self.sizes.clone(),
        }
    }
}

/// A queue for `workers` workers taking up to `batch_max` jobs at a time, counted in
/// `metrics` under `mode`. Its bound (four batches per worker) makes senders wait instead
/// of queueing without end; the admission limit in front of it bounds how many wait.
pub fn queue<T>(
    workers: usize,
    batch_max: usize,
    linger: Duration,
    metrics: &Metrics,
    mode: &str,
) -> (Queue<T>, Batches<T>) {
    let queued = metrics.group_queued.with_label_values(&[mode]);
    let sizes = metrics.group_size.with_label_values(&[mode]);
    let batch_max = batch_max.max(1);
    let (sender, receiver) = mpsc::channel(batch_max * workers.max(1) * 4);
    let batches = Batches {
        jobs: Arc::new(Mutex::new(receiver)),
        batch_max,
        linger,
        queued: queued.clone(),
        sizes,
    };
    (Queue { sender, queued }, batches)
}

impl<T> Batches<T> {
    /// What has queued (waiting for the first), then what arrives within the linger, up to
    /// `batch_max`. `None` once every sender is gone.
    pub async fn next(&self) -> Option<Vec<T>> {
        let mut batch = Vec::new();
        let mut jobs = self.jobs.lock().await;
        if jobs.recv_many(&mut batch, self.batch_max).await == 0 {
            return None;
        }
        if !self.linger.is_zero() {
            let until = tokio::time::Instant::now() + self.linger;
            while batch.len() < self.batch_max {
                let room = self.batch_max - batch.len();
                match tokio::time::timeout_at(until, jobs.recv_many(&mut batch, room)).await {
                    Ok(n) if n > 0 => {}
                    _ => break,
                }
            }
        }
        self.queued.sub(batch.len() as i64);
        self.sizes.observe(batch.len() as f64);
        Some(batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queued(metrics: &Metrics) -> IntGauge {
        metrics.group_queued.with_label_values(&["test"])
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_holds_what_queued_and_what_came_within_the_linger_up_to_its_most() {
        let metrics = Metrics::new();
        let (sender, batches) = queue(1, 3, Duration::from_millis(5), &metrics, "test");
        for i in 0..2 {
            sender.send(i).await.expect("queued");
        }
        let late = sender.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(2)).await;
            for i in 2..5 {
                late.send(i).await.expect("queued");
            }
        });
        assert_eq!(batches.next().await, Some(vec![0, 1, 2]));
        assert_eq!(queued(&metrics).get(), 2, "two still queued");
        assert_eq!(batches.next().await, Some(vec![3, 4]));
        assert_eq!(queued(&metrics).get(), 0);
        let sizes = metrics.group_size.with_label_values(&["test"]);
        assert_eq!((sizes.get_sample_count(), sizes.get_sample_sum()), (2, 5.0));
        drop(sender);
        assert_eq!(batches.next().await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_job_waits_no_longer_than_the_linger() {
        let (sender, batches) = queue(1, 10, Duration::from_millis(5), &Metrics::new(), "test");
        sender.send(1).await.expect("queued");
        let started = tokio::time::Instant::now();
        assert_eq!(batches.next().await, Some(vec![1]));
        assert_eq!(started.elapsed(), Duration::from_millis(5));
    }
}
