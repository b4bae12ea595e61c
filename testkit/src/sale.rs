//! Many customers reserving one voucher at once, the way a flash sale's checkouts do.

use std::time::Duration;

use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::ApiClient;
use crate::invariants::Accepted;

/// What one reservation attempt ended with.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub voucher: String,
    pub customer: String,
    pub order: String,
    pub status: StatusCode,
    pub body: Value,
}

impl Attempt {
    pub fn code(&self) -> &str {
        self.body["error"].as_str().unwrap_or("")
    }

    pub fn accepted(&self) -> Accepted {
        Accepted::new(&self.voucher, &self.customer, &self.order)
    }
}

/// A sale: `customers` distinct customers (`{tag}-c{i}`, order `{tag}-o{i}`) reserve
/// `code` once each, at most `in_flight` at a time. A 503 is retried with the same orderId
/// (as a checkout would), up to `retries_503` times, `pause` apart.
#[derive(Debug, Clone)]
pub struct Sale<'a> {
    pub code: &'a str,
    pub tag: &'a str,
    pub customers: usize,
    pub in_flight: usize,
    pub retries_503: usize,
    pub pause: Duration,
    pub order_amount: i64,
}

impl<'a> Sale<'a> {
    /// `customers` customers, 50 in flight, five retries of a 503 50 ms apart.
    pub fn new(code: &'a str, tag: &'a str, customers: usize) -> Self {
        Self {
            code,
            tag,
            customers,
            in_flight: 50,
            retries_503: 5,
            pause: Duration::from_millis(50),
            order_amount: 100_000,
        }
    }

    /// Runs the sale against `api` (a core, or the edge).
    pub async fn run(&self, api: &ApiClient) -> SaleResult {
        let results: Vec<(Attempt, usize)> = futures::stream::iter(0..self.customers)
            .map(|i| self.customer(api, i))
            .buffer_unordered(self.in_flight.max(1))
            .collect()
            .await;
        SaleResult {
            unavailable: results.iter().map(|(_, u)| u).sum(),
            attempts: results.into_iter().map(|(a, _)| a).collect(),
        }
    }

    /// Customer `i`'s checkout: its final answer, and how many 503s it retried.
    async fn customer(&self, api: &ApiClient, i: usize) -> (Attempt, usize) {
        let (customer, order) = (format!("{}-c{i}", self.tag), format!("{}-o{i}", self.tag));
        let mut unavailable = 0;
        loop {
            let attempt = api
                .attempt(self.code, &customer, &order, self.order_amount)
                .await;
            if attempt.status == StatusCode::SERVICE_UNAVAILABLE && unavailable < self.retries_503 {
                unavailable += 1;
                tokio::time::sleep(self.pause).await;
                continue;
            }
            return (attempt, unavailable);
        }
    }
}

/// Every customer's final answer, and the 503s retried on the way.
#[derive(Debug, Clone, Default)]
pub struct SaleResult {
    pub attempts: Vec<Attempt>,
    pub unavailable: usize,
}

impl SaleResult {
    /// Answers with `status` whose error code is `code` ("" for successes).
    pub fn count(&self, status: StatusCode, code: &str) -> usize {
        count(&self.attempts, status, code)
    }

    pub fn created(&self) -> usize {
        self.count(StatusCode::CREATED, "")
    }

    /// The 201s, as the invariant checker wants them.
    pub fn accepted(&self) -> Vec<Accepted> {
        accepted(&self.attempts)
    }

    pub fn extend(&mut self, other: SaleResult) {
        self.attempts.extend(other.attempts);
        self.unavailable += other.unavailable;
    }
}

/// Answers with `status` whose error code is `code` ("" for successes).
pub fn count(attempts: &[Attempt], status: StatusCode, code: &str) -> usize {
    attempts
        .iter()
        .filter(|a| a.status == status && a.code() == code)
        .count()
}

/// The 201s among `attempts` (each order once), as the invariant checker wants them.
pub fn accepted(attempts: &[Attempt]) -> Vec<Accepted> {
    let mut seen = std::collections::HashSet::new();
    attempts
        .iter()
        .filter(|a| a.status == StatusCode::CREATED && seen.insert(a.order.clone()))
        .map(Attempt::accepted)
        .collect()
}

/// All `attempts` (customer, order) on `code` at once.
pub async fn reserve_concurrently(
    api: &ApiClient,
    code: &str,
    attempts: Vec<(String, String)>,
) -> Vec<Attempt> {
    futures::future::join_all(
        attempts
            .iter()
            .map(|(customer, order)| api.attempt(code, customer, order, 100_000)),
    )
    .await
}
