//! Starting and renewing sold-out flags (`sold_out`): a flag starts when a core answers
//! OUT_OF_STOCK (`edge`'s response filter) or when a core announces that a voucher's gate
//! took its last use (`signals`); either way its order filter is fetched from a core, and
//! only once it is stored does the edge answer for the voucher.
//!
//! The announcement is what makes a flag early: a core's first OUT_OF_STOCK answer
//! reaches the edge only after the core looked the order up in PostgreSQL, at the moment
//! of a sale when the cores are busiest with its accepts, and every request the edge
//! forwards meanwhile is answered by a core too. A lost announcement costs only that: the
//! next OUT_OF_STOCK starts the flag as before.

use std::sync::Arc;

use pingora::lb::selection::RoundRobin;
use pingora::lb::LoadBalancer;
use secrecy::{ExposeSecret, SecretString};
use voucher_contract::order_filter::{OrderFilter, MAX_BITS};
use voucher_contract::Route;

use crate::metrics::EdgeMetrics;
use crate::sold_out::SoldOutCache;

/// What a flag needs to start or be renewed: the flags, a core to ask, and how to ask it.
#[derive(Clone)]
pub struct Flagger {
    pub sold_out: SoldOutCache,
    pub upstreams: Arc<LoadBalancer<RoundRobin>>,
    /// For the order filter of a sold-out voucher.
    pub http: reqwest::Client,
    /// The cores' `admin.orders_token`.
    pub orders_token: SecretString,
    pub metrics: Arc<EdgeMetrics>,
}

impl Flagger {
    /// Sets the sold-out flag of `code` and fetches its order filter from a core (one
    /// fetch per voucher at a time, and at most one per `order_fetch_interval`).
    pub fn flag_sold_out(&self, code: &str) {
        let Some(id) = self.sold_out.begin(code) else {
            return;
        };
        self.metrics.flags_set.inc();
        self.fetch_filter(code, id, false);
    }

    /// Renews `code`'s flag `id`, whose answer claimed its renewal (see `sold_out`).
    pub fn renew(&self, code: &str, id: u64) {
        self.fetch_filter(code, id, true);
    }

    /// Fetches `code`'s order filter from a core for flag `id` and stores it. A flag being
    /// renewed keeps answering meanwhile, and a failed renewal leaves it to its TTL; a new
    /// flag whose fetch failed is dropped.
    fn fetch_filter(&self, code: &str, id: u64, renewal: bool) {
        let (cache, http, token) = (
            self.sold_out.clone(),
            self.http.clone(),
            self.orders_token.clone(),
        );
        let upstream = self
            .upstreams
            .select(code.as_bytes(), 256)
            .map(|b| b.addr.to_string());
        let code = code.to_owned();
        let metrics = self.metrics.clone();
        tokio::spawn(async move {
            let filter = match upstream {
                Some(addr) => fetch_filter(&http, &addr, &code, &token).await,
                None => Err("no healthy core".into()),
            };
            let outcome = match filter {
                // Read while uses were left: a stale 409, not a sold-out voucher.
                Ok(filter) if filter.remaining > 0 => {
                    cache.abandon(&code, id);
                    "not_sold_out"
                }
                Ok(filter) => {
                    if cache.complete(&code, id, filter) {
                        "stored"
                    } else {
                        "dropped"
                    }
                }
                Err(e) if renewal => {
                    tracing::warn!(%code, error = %e, "order filter not fetched; the flag ends with its TTL");
                    "failed"
                }
                Err(e) => {
                    tracing::warn!(%code, error = %e, "order filter not fetched; not answering for this voucher");
                    cache.abandon(&code, id);
                    "failed"
                }
            };
            metrics.order_fetches.with_label_values(&[outcome]).inc();
        });
    }
}

/// A reqwest error with its causes (a bare `to_string` says "error sending request" and
/// hides why).
fn cause_chain(e: reqwest::Error) -> String {
    format!("{:#}", anyhow::Error::from(e))
}

/// The largest answer a filter can be: its header and `MAX_BITS` bits.
const MAX_FILTER_BYTES: usize = 64 + (MAX_BITS / 8) as usize;

async fn fetch_filter(
    http: &reqwest::Client,
    addr: &str,
    code: &str,
    token: &SecretString,
) -> Result<OrderFilter, String> {
    let mut resp = http
        .get(format!("http://{addr}{}", Route::order_filter_path(code)))
        .bearer_auth(token.expose_secret())
        .send()
        .await
        .map_err(cause_chain)?;
    if !resp.status().is_success() {
        return Err(format!("core answered {}", resp.status()));
    }
    let mut body = Vec::with_capacity(resp.content_length().unwrap_or(0).min(1 << 24) as usize);
    while let Some(chunk) = resp.chunk().await.map_err(cause_chain)? {
        body.extend_from_slice(&chunk);
        if body.len() > MAX_FILTER_BYTES {
            return Err(format!("filter larger than {MAX_FILTER_BYTES} bytes"));
        }
    }
    OrderFilter::decode(&body).ok_or_else(|| "not an order filter".to_owned())
}
