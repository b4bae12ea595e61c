//! Checkouts through a fault: customers reserving one flash voucher at a steady pace, each
//! retrying a 503 with the same orderId, while a fault strikes mid-sale; and the checks every
//! such test ends with (only 201, 409 and 503 answered, the limit issued exactly, every
//! 201's retry answering its reservation, the invariants). Used by the Redis Cluster and the
//! PostgreSQL failover tests.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use voucher_testkit::helpers::ApiClient;
use voucher_testkit::sale::Attempt;

use crate::stack::FlashStack;

/// Every 201 retried with its orderId answers 201 with the same reservation.
pub async fn replays_hold(api: &ApiClient, accepted: &[&Attempt]) {
    for first in accepted {
        let again = api
            .attempt(&first.voucher, &first.customer, &first.order, 100_000)
            .await;
        assert_eq!(again.status, StatusCode::CREATED, "{:?}", again.body);
        assert_eq!(again.body["id"], first.body["id"], "{:?}", again.body);
    }
}

/// Customers reserving `code` at a steady pace, a few at a time, each retrying a 503
/// with the same orderId until it gets an answer (at most `MAX_503` times, so a cluster
/// that never recovers ends the test): every answer (503s too) is kept with the time it
/// came back.
const MAX_503: usize = 200;

struct Checkouts {
    answers: Mutex<Vec<(Instant, Attempt)>>,
    created: AtomicUsize,
    next: AtomicUsize,
}

impl Checkouts {
    async fn run(self: Arc<Self>, api: ApiClient, code: String, customers: usize) {
        loop {
            let i = self.next.fetch_add(1, Ordering::SeqCst);
            if i >= customers {
                return;
            }
            let (customer, order) = (format!("{code}-c{i}"), format!("{code}-o{i}"));
            for _ in 0..=MAX_503 {
                let attempt = api.attempt(&code, &customer, &order, 100_000).await;
                let status = attempt.status;
                self.answers
                    .lock()
                    .expect("answers")
                    .push((Instant::now(), attempt));
                if status == StatusCode::SERVICE_UNAVAILABLE {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                if status == StatusCode::CREATED {
                    self.created.fetch_add(1, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
                break;
            }
        }
    }
}

/// Runs `customers` checkouts of `code` from 8 workers while `fault` strikes once 40 uses
/// are taken; returns every answer, when the fault began and when it was over.
pub async fn sale_through(
    env: &FlashStack,
    code: &str,
    customers: usize,
    fault: impl std::future::Future<Output = ()>,
) -> (Vec<(Instant, Attempt)>, Instant, Instant) {
    let checkouts = Arc::new(Checkouts {
        answers: Mutex::new(Vec::new()),
        created: AtomicUsize::new(0),
        next: AtomicUsize::new(0),
    });
    let workers: Vec<_> = (0..8)
        .map(|_| {
            tokio::spawn(
                checkouts
                    .clone()
                    .run(env.app().api.clone(), code.to_owned(), customers),
            )
        })
        .collect();
    voucher_testkit::wait::eventually(Duration::from_secs(30), "40 uses taken", || async {
        (checkouts.created.load(Ordering::SeqCst) >= 40).then_some(())
    })
    .await;
    let struck = Instant::now();
    fault.await;
    let over = Instant::now();
    for worker in workers {
        worker.await.expect("checkouts");
    }
    let answers = std::mem::take(&mut *checkouts.answers.lock().expect("answers"));
    (answers, struck, over)
}

/// What every fault test of the cluster checks after its sale: only 201, 409 and 503 were
/// answered; exactly the limit was issued and PostgreSQL holds it; every 201's retry
/// answers its reservation; the invariants hold (with reconciliation repairing a gate left
/// behind).
pub async fn sold_out_exactly(
    env: FlashStack,
    code: &str,
    limit: usize,
    answers: &[(Instant, Attempt)],
) {
    for (_, a) in answers {
        assert!(
            matches!(
                a.status,
                StatusCode::CREATED | StatusCode::CONFLICT | StatusCode::SERVICE_UNAVAILABLE
            ),
            "{} {:?}",
            a.status,
            a.body
        );
    }
    let created: Vec<&Attempt> = answers
        .iter()
        .map(|(_, a)| a)
        .filter(|a| a.status == StatusCode::CREATED)
        .collect();
    assert_eq!(created.len(), limit, "every use issued once");
    assert_eq!(env.rows(code).await, limit as i64);
    replays_hold(env.app(), &created).await;
    let accepted: Vec<_> = created.iter().map(|a| a.accepted()).collect();
    env.finish(&accepted).await;
}
