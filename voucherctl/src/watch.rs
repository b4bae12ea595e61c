//! `voucherctl watch CODE`: a sale at a glance, redrawn every interval from the voucher's
//! counts (the admin API) and the metrics of the cores and edges it is pointed at.
//!
//! Counts are the voucher's own. Rates, p99 and rejections come from the metrics, which
//! are labelled by route and code, never by voucher (labels stay bounded): they are every
//! reservation at those processes, which during a flash sale is the sale's.

use std::time::{Duration, Instant};

use voucher_contract::exposition::Scrape;

use crate::api::{Api, Result};

/// The route label of reservations in the core's metrics.
const RESERVE_ROUTE: &str = "/vouchers/{code}/reservations";

/// One sample of everything the view shows.
struct Sample {
    at: Instant,
    voucher: serde_json::Value,
    cores: Vec<Scrape>,
    edges: Vec<Scrape>,
}

async fn sample(api: &Api, code: &str, cores: &[String], edges: &[String]) -> Result<Sample> {
    let voucher = api.get(code, &format!("/vouchers/{code}")).await?.body;
    let read = |urls: &[String]| {
        let urls = urls.to_vec();
        let api = api.clone();
        async move {
            let mut scrapes = Vec::with_capacity(urls.len());
            for url in urls {
                let text = api.metrics_text(&url).await?;
                // A line we cannot read spoils only that scrape's figures, not the view.
                scrapes.push(Scrape::parse(&text).unwrap_or_default());
            }
            Ok::<_, crate::api::CtlError>(scrapes)
        }
    };
    let cores = read(cores).await?;
    let edges = read(edges).await?;
    Ok(Sample {
        at: Instant::now(),
        voucher,
        cores,
        edges,
    })
}

fn total(scrapes: &[Scrape], name: &str, labels: &[(&str, &str)]) -> f64 {
    scrapes.iter().map(|s| s.sum(name, labels)).sum()
}

/// The label values of `label` that `name` has under `labels`, in any scrape.
fn values_of(scrapes: &[Scrape], name: &str, labels: &[(&str, &str)], label: &str) -> Vec<String> {
    let mut values: Vec<String> = scrapes
        .iter()
        .flat_map(|s| s.matching(name, labels))
        .filter_map(|s| s.labels.get(label).cloned())
        .collect();
    values.sort();
    values.dedup();
    values
}

/// The p99 of a histogram between two scrapes, by linear interpolation within the bucket
/// it falls in (as Prometheus's `histogram_quantile`); `None` without observations.
fn p99(before: &[Scrape], after: &[Scrape], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let bucket = format!("{name}_bucket");
    // Bounds as the exporter wrote them (looked up as text), ordered by value.
    let mut bounds: Vec<(f64, String)> = values_of(after, &bucket, labels, "le")
        .into_iter()
        .filter_map(|le| {
            let value = if le == "+Inf" {
                Some(f64::INFINITY)
            } else {
                le.parse().ok()
            };
            value.map(|v| (v, le))
        })
        .collect();
    bounds.sort_by(|a, b| a.0.total_cmp(&b.0));
    let count = |scrapes: &[Scrape], le: &str| {
        let mut with_le: Vec<(&str, &str)> = labels.to_vec();
        with_le.push(("le", le));
        total(scrapes, &bucket, &with_le)
    };
    let cumulative: Vec<(f64, f64)> = bounds
        .iter()
        .map(|(value, le)| (*value, count(after, le) - count(before, le)))
        .collect();
    let all = cumulative.last()?.1;
    if all <= 0.0 {
        return None;
    }
    let rank = 0.99 * all;
    let mut lower = (0.0, 0.0);
    for &(le, n) in &cumulative {
        if n >= rank {
            if le.is_infinite() {
                return Some(lower.0);
            }
            let within = (rank - lower.1) / (n - lower.1).max(f64::MIN_POSITIVE);
            return Some(lower.0 + (le - lower.0) * within);
        }
        lower = (le, n);
    }
    None
}

fn bar(done: f64, of: f64, width: usize) -> String {
    let share = if of > 0.0 {
        (done / of).clamp(0.0, 1.0)
    } else {
        0.0
    };
    let full = (share * width as f64).round() as usize;
    format!("[{}{}]", "█".repeat(full), "░".repeat(width - full))
}

fn ms(seconds: Option<f64>) -> String {
    seconds.map_or_else(|| "-".to_owned(), |s| format!("{:.1} ms", s * 1000.0))
}

/// One frame: what changed between `before` and `after`.
fn frame(code: &str, before: &Sample, after: &Sample) -> String {
    let dt = after.at.duration_since(before.at).as_secs_f64().max(1e-3);
    let v = &after.voucher;
    let used = v["usedCount"].as_f64().unwrap_or(0.0);
    let limit = v["totalLimit"].as_f64().unwrap_or(0.0);
    let mut out = String::new();
    out.push_str(&format!(
        "{code}  {}  {}  {}  version {}\n",
        v["mode"].as_str().unwrap_or("?"),
        v["state"].as_str().unwrap_or("?"),
        v["phase"].as_str().unwrap_or("?"),
        v["version"]
    ));
    let gate = v["gateRemaining"]
        .as_i64()
        .map_or_else(String::new, |g| format!("   gate left {g}"));
    out.push_str(&format!(
        "issued  {}  {used} / {limit}  ({:.0}%){gate}\n",
        bar(used, limit, 30),
        if limit > 0.0 {
            100.0 * used / limit
        } else {
            0.0
        }
    ));
    let rate = |scrapes_after: &[Scrape],
                scrapes_before: &[Scrape],
                name: &str,
                labels: &[(&str, &str)]| {
        (total(scrapes_after, name, labels) - total(scrapes_before, name, labels)).max(0.0) / dt
    };
    if !after.cores.is_empty() {
        let accepts = rate(
            &after.cores,
            &before.cores,
            "http_requests_total",
            &[("route", RESERVE_ROUTE), ("status", "201")],
        );
        let p99_core = p99(
            &before.cores,
            &after.cores,
            "http_request_duration_seconds",
            &[("route", RESERVE_ROUTE)],
        );
        out.push_str(&format!(
            "cores   accepts/s {accepts:.0}   p99 {}\n",
            ms(p99_core)
        ));
        let mut rejects = Vec::new();
        for code in values_of(
            &after.cores,
            "http_requests_total",
            &[("route", RESERVE_ROUTE)],
            "code",
        ) {
            if code == "OK" {
                continue;
            }
            let r = rate(
                &after.cores,
                &before.cores,
                "http_requests_total",
                &[("route", RESERVE_ROUTE), ("code", code.as_str())],
            );
            rejects.push(format!("{code} {r:.0}"));
        }
        out.push_str(&format!(
            "        rejects/s {}\n",
            if rejects.is_empty() {
                "none".to_owned()
            } else {
                rejects.join("  ")
            }
        ));
        let lag = total(&after.cores, "voucher_consumer_lag_messages", &[]);
        let labels = [("voucher", code)];
        let drift = after
            .cores
            .iter()
            .flat_map(|s| s.matching("voucher_gate_drift", &labels))
            .map(|s| s.value)
            .fold(0.0_f64, |a, b| if b.abs() > a.abs() { b } else { a });
        out.push_str(&format!(
            "        writer lag {lag:.0} events   gate drift {drift:.0}\n"
        ));
    }
    if !after.edges.is_empty() {
        let p99_edge = p99(
            &before.edges,
            &after.edges,
            "edge_request_duration_seconds",
            &[("route", "reserve")],
        );
        let mut outcomes = Vec::new();
        for outcome in values_of(
            &after.edges,
            "edge_requests_total",
            &[("route", "reserve")],
            "outcome",
        ) {
            let r = rate(
                &after.edges,
                &before.edges,
                "edge_requests_total",
                &[("route", "reserve"), ("outcome", outcome.as_str())],
            );
            outcomes.push(format!("{outcome} {r:.0}"));
        }
        out.push_str(&format!(
            "edges   reservations/s {}   p99 {}\n",
            if outcomes.is_empty() {
                "none".to_owned()
            } else {
                outcomes.join("  ")
            },
            ms(p99_edge)
        ));
    }
    out
}

/// Redraws every `interval` until interrupted, or prints one frame (`once`) after one
/// interval.
pub async fn watch(
    api: &Api,
    code: &str,
    cores: &[String],
    edges: &[String],
    interval: Duration,
    once: bool,
) -> Result<()> {
    let mut before = sample(api, code, cores, edges).await?;
    loop {
        tokio::time::sleep(interval).await;
        let after = sample(api, code, cores, edges).await?;
        let text = frame(code, &before, &after);
        if once {
            print!("{text}");
            return Ok(());
        }
        // Clear the screen and home the cursor, then draw.
        print!(
            "\x1b[2J\x1b[H{text}\n(every {}; Ctrl-C to stop)\n",
            humantime::format_duration(interval)
        );
        before = after;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrape(text: &str) -> Vec<Scrape> {
        vec![Scrape::parse(text).expect("samples")]
    }

    #[test]
    fn the_p99_interpolates_within_its_bucket() {
        let before =
            scrape("h_bucket{le=\"0.01\"} 0\nh_bucket{le=\"0.1\"} 0\nh_bucket{le=\"+Inf\"} 0\n");
        let after = scrape(
            "h_bucket{le=\"0.01\"} 50\nh_bucket{le=\"0.1\"} 100\nh_bucket{le=\"+Inf\"} 100\n",
        );
        let p = p99(&before, &after, "h", &[]).expect("observations");
        assert!((p - 0.0982).abs() < 1e-3, "{p}");
        assert_eq!(
            p99(&after, &after, "h", &[]),
            None,
            "nothing observed in between"
        );
    }

    #[test]
    fn the_bar_fills_with_the_share_issued() {
        assert_eq!(bar(5.0, 10.0, 4), "[██░░]");
        assert_eq!(bar(20.0, 10.0, 2), "[██]");
        assert_eq!(bar(0.0, 0.0, 2), "[░░]");
    }
}
