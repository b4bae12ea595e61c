//! Starting and renewing flags (`sold_out`): a flag starts when a core answers
//! OUT_OF_STOCK, VOUCHER_PAUSED or VOUCHER_ARCHIVED (`edge`'s response filter) or when a
//! core announces that a voucher stopped taking new reservations (`signals`); either way
//! its order filter is fetched from a core, with the voucher's state, and only once it is
//! stored does the edge answer for the voucher: VOUCHER_PAUSED (VOUCHER_ARCHIVED) when the
//! state says so, OUT_OF_STOCK when it is active and no use was left.
//!
//! The announcement is what makes a flag early: a core's first OUT_OF_STOCK answer
//! reaches the edge only after the core looked the order up in PostgreSQL, at the moment
//! of a sale when the cores are busiest with its accepts, and every request the edge
//! forwards meanwhile is answered by a core too. A lost announcement costs only that: the
//! next OUT_OF_STOCK starts the flag as before.

use std::sync::Arc;

use pingora::lb::LoadBalancer;
use secrecy::{ExposeSecret, SecretString};
use voucher_contract::order_filter::{OrderFilter, MAX_BITS};
use voucher_contract::Route;

use crate::metrics::EdgeMetrics;
use crate::routing::CoreChoice;
use crate::sold_out::{Fetch, Refusal, SoldOutCache};

/// What a flag needs to start or be renewed: the flags, a core to ask, and how to ask it.
#[derive(Clone)]
pub struct Flagger {
    pub sold_out: SoldOutCache,
    pub upstreams: Arc<LoadBalancer<CoreChoice>>,
    /// For the order filter of a sold-out voucher.
    pub http: reqwest::Client,
    /// The cores' `admin.orders_token`.
    pub orders_token: SecretString,
    pub metrics: Arc<EdgeMetrics>,
}

impl Flagger {
    /// Sets the flag of `code` and fetches its order filter from a core (one fetch per
    /// voucher at a time, and at most one per `order_fetch_interval`); the filter's answer
    /// says what the flag refuses with, or that it is none.
    pub fn flag(&self, code: &str) {
        let Some(fetch) = self.sold_out.begin(code) else {
            return;
        };
        self.metrics.flags_set.inc();
        self.fetch_filter(code, fetch.id, Some(fetch));
    }

    /// Renews `code`'s flag `id`, whose answer claimed its renewal (see `sold_out`).
    pub fn renew(&self, code: &str, id: u64) {
        self.fetch_filter(code, id, None);
    }

    /// Fetches `code`'s order filter from a core for flag `id` and stores it. A flag being
    /// renewed (`new: None`) keeps answering meanwhile, and a failed renewal leaves it to
    /// its TTL; a new flag whose fetch failed is dropped. A new flag's `Fetch` is dropped
    /// last, once the flag is stored or dropped: that releases the reservations waiting
    /// for it.
    fn fetch_filter(&self, code: &str, id: u64, new: Option<Fetch>) {
        let renewal = new.is_none();
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
            let started = std::time::Instant::now();
            let filter = match upstream {
                Some(addr) => fetch_filter(&http, &addr, &code, &token).await,
                None => Err("no healthy core".into()),
            };
            let outcome = match filter {
                Ok((filter, state)) => match refusal(state.as_deref(), filter.remaining) {
                    Some(refusal) => {
                        if cache.complete(&code, id, filter, refusal) {
                            "stored"
                        } else {
                            "dropped"
                        }
                    }
                    // Active and read while uses were left: a stale 409, no flag.
                    None => {
                        cache.abandon(&code, id);
                        "not_sold_out"
                    }
                },
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
            metrics
                .order_fetch_seconds
                .observe(started.elapsed().as_secs_f64());
            drop(new);
        });
    }
}

/// What a filter read with the voucher's `state` (its `x-voucher-state`; a core without
/// the header has no states: active) and `remaining` uses answers for newcomers: `None`
/// when they may still be served.
fn refusal(state: Option<&str>, remaining: u64) -> Option<Refusal> {
    match state {
        Some("paused") => Some(Refusal::Paused),
        Some("archived") => Some(Refusal::Archived),
        _ if remaining == 0 => Some(Refusal::SoldOut),
        _ => None,
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
) -> Result<(OrderFilter, Option<String>), String> {
    let mut resp = http
        .get(format!("http://{addr}{}", Route::order_filter_path(code)))
        .bearer_auth(token.expose_secret())
        .send()
        .await
        .map_err(cause_chain)?;
    if !resp.status().is_success() {
        return Err(format!("core answered {}", resp.status()));
    }
    let state = resp
        .headers()
        .get(voucher_contract::headers::VOUCHER_STATE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let mut body = Vec::with_capacity(resp.content_length().unwrap_or(0).min(1 << 24) as usize);
    while let Some(chunk) = resp.chunk().await.map_err(cause_chain)? {
        body.extend_from_slice(&chunk);
        if body.len() > MAX_FILTER_BYTES {
            return Err(format!("filter larger than {MAX_FILTER_BYTES} bytes"));
        }
    }
    let filter = OrderFilter::decode(&body).ok_or_else(|| "not an order filter".to_owned())?;
    Ok((filter, state))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_read_with_the_filter_decides_the_answer() {
        assert_eq!(refusal(Some("paused"), 10), Some(Refusal::Paused));
        assert_eq!(refusal(Some("archived"), 0), Some(Refusal::Archived));
        assert_eq!(refusal(Some("active"), 0), Some(Refusal::SoldOut));
        assert_eq!(refusal(None, 0), Some(Refusal::SoldOut));
        assert_eq!(refusal(Some("active"), 3), None);
    }
}
