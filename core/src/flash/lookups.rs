//! Orders looked up in PostgreSQL for the gate's answers, in groups.
//!
//! Every refusal the gate gives (sold out, the customer's limit, the sale over) and every
//! retry it recognises is checked against PostgreSQL's row first: a row is the answer,
//! whatever the gate holds (see `reserve.rs`). After a sell-out that is one lookup per
//! request that reaches a core, and one statement each cost a core 136 µs and PostgreSQL
//! 75 µs per 409; grouped, 101 and 24 (`BENCH_ONLY=reject ./loadtest/bench.sh`, a core's
//! reject path, when a group was still a transaction of four statements). Lookups queue
//! (`crate::batching`) and one task takes what has queued and looks it all up with one
//! statement (`OrderReader::rows`, one round trip on a connection the task keeps): under
//! load the queue fills while the previous statement runs, and a lone lookup does not wait
//! (no linger). A statement that
//! does not answer within `DEADLINE` makes its lookups 503s (their retries are new
//! lookups), so one stalled connection cannot hold every refusal of the core.

use std::sync::Arc;

use tokio::sync::oneshot;

use crate::batching::{self, Batches, Queue};
use crate::domain::{OrderId, Reservation};
use crate::metrics::Metrics;
use crate::store::Store;
use crate::{Error, Result};

/// Lookups taken into one statement, at most.
const BATCH_MAX: usize = 200;

/// The longest a group's lookup may take, the wait for a connection (when the task keeps
/// none) and the statement together.
const DEADLINE: std::time::Duration = std::time::Duration::from_secs(2);

struct Job {
    order_id: OrderId,
    answer: oneshot::Sender<Result<Option<Reservation>>>,
}

/// The front door of the grouped lookups.
#[derive(Clone)]
pub struct OrderLookups {
    queue: Queue<Job>,
}

impl OrderLookups {
    /// Starts the lookup task on `store`; it ends when every clone is dropped.
    pub fn start(store: Store, metrics: &Metrics) -> Self {
        let (queue, batches) =
            batching::queue(1, BATCH_MAX, std::time::Duration::ZERO, metrics, "lookup");
        tokio::spawn(run(store, batches));
        Self { queue }
    }

    /// PostgreSQL's row of `order_id`, if it has one.
    pub async fn find(&self, order_id: &OrderId) -> Result<Option<Reservation>> {
        let (answer, answered) = oneshot::channel();
        let job = Job {
            order_id: order_id.clone(),
            answer,
        };
        let stopped = || Error::unavailable("order lookups (stopped)");
        self.queue.send(job).await.map_err(|_| stopped())?;
        answered.await.map_err(|_| stopped())?
    }
}

async fn run(store: Store, batches: Batches<Job>) {
    let mut reader = store.order_reader();
    while let Some(batch) = batches.next().await {
        let ids: Vec<&str> = batch.iter().map(|job| job.order_id.as_str()).collect();
        match reader.rows(&ids, DEADLINE).await {
            Ok(rows) => {
                for job in batch {
                    // One orderId twice in a batch (a concurrent retry) gets its row twice.
                    let row = match rows.get(job.order_id.as_str()) {
                        None => Ok(None),
                        Some(Ok(row)) => Ok(Some(row.clone())),
                        Some(Err(e)) => Err(Error::corrupt(format!(
                            "row of {}: {e}",
                            job.order_id.as_str()
                        ))),
                    };
                    let _ = job.answer.send(row);
                }
            }
            Err(e) => {
                // Each waiter gets the same kind of error: a database that did not answer
                // is a 503, anything else stays an internal error.
                let unavailable = matches!(e, Error::Unavailable { .. });
                let shared = Arc::new(e);
                for job in batch {
                    let cause = shared.clone();
                    let error = if unavailable {
                        Error::unavailable_because("database", cause)
                    } else {
                        Error::internal(cause)
                    };
                    let _ = job.answer.send(Err(error));
                }
            }
        }
    }
}
