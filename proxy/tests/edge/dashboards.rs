//! The Grafana dashboards against a real Prometheus: every panel's query must return
//! series for the running stack after a short k6 run (which doubles as CI's k6 smoke,
//! with its thresholds).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use voucher_testkit::assert::assert_error;
use voucher_testkit::invariants::Accepted;
use voucher_testkit::stack::flash_voucher;
use voucher_testkit::wait::eventually;
use voucher_testkit::{free_port, TempDir};

use super::stack_with;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A dashboard's PromQL with its template variables as Grafana fills them with "All".
fn as_grafana_fills(expr: &str) -> String {
    expr.replace("$voucher", ".+")
        .replace("$job", ".+")
        .replace("$instance", ".+")
        .replace("$__rate_interval", "1m")
}

/// Every PromQL expression of every dashboard in `dashboards/grafana/`, with its panel (or
/// annotation), after checking that the dashboard travels: its data source is the
/// `${datasource}` variable everywhere, and every range is `$__rate_interval` (a fixed one
/// shows empty panels under a slower scrape).
///
/// The third field says whether the query must return series once the sale ran: an
/// annotation of events (`... > 0`, gate rebuilds) is rightly empty when none happened,
/// and is only checked to be valid PromQL.
fn panel_queries() -> Vec<(String, String, bool)> {
    let mut queries = Vec::new();
    let dir = repo().join("dashboards/grafana");
    for entry in std::fs::read_dir(&dir).expect("dashboards directory") {
        let path = entry.expect("entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("readable");
        let dashboard: Value = serde_json::from_str(&text).expect("valid JSON");
        let uids: Vec<&str> = text
            .match_indices("\"uid\": \"")
            .map(|(i, m)| text[i + m.len()..].split('"').next().unwrap_or(""))
            .filter(|uid| !matches!(*uid, "${datasource}" | "-- Grafana --"))
            .collect();
        assert_eq!(
            uids,
            ["voucher-sale"],
            "{}: only the dashboard's own uid is fixed",
            path.display()
        );
        let variables: Vec<&str> = dashboard["templating"]["list"]
            .as_array()
            .expect("variables")
            .iter()
            .filter_map(|v| v["name"].as_str())
            .collect();
        for needed in ["datasource", "job", "instance"] {
            assert!(
                variables.contains(&needed),
                "no ${needed} variable: {variables:?}"
            );
        }
        let annotations = dashboard["annotations"]["list"]
            .as_array()
            .expect("annotations");
        for annotation in annotations.iter().filter(|a| a["expr"].is_string()) {
            let name = format!("annotation {}", annotation["name"]);
            let expr = annotation["expr"].as_str().unwrap_or_default();
            let events_only = expr.trim_end().ends_with("> 0");
            queries.push((name, as_grafana_fills(expr), !events_only));
        }
        for panel in dashboard["panels"].as_array().expect("panels") {
            let title = panel["title"].as_str().unwrap_or("?");
            for target in panel["targets"].as_array().into_iter().flatten() {
                let expr = target["expr"].as_str().expect("every target has an expr");
                let fixed = ["[1m]", "[5m]", "[30s]", "[1h]"];
                assert!(
                    !fixed.iter().any(|r| expr.contains(r)),
                    "{title}: a fixed range instead of $__rate_interval: {expr}"
                );
                if expr.contains("_total") || expr.contains("_bucket") {
                    assert!(
                        expr.contains("{job=~\"$job\"") || expr.contains("job=~\"$job\""),
                        "{title}: not filtered by $job: {expr}"
                    );
                }
                queries.push((title.to_owned(), as_grafana_fills(expr), true));
            }
        }
    }
    assert!(queries.len() >= 40, "dashboards found: {queries:?}");
    queries
}

/// A Prometheus of the test's own, scraping the stack every second. Killed when dropped.
struct Prometheus {
    child: std::process::Child,
    base: String,
    _dir: TempDir,
}

impl Prometheus {
    async fn start(edge_metrics: &str, core_metrics: &[&str]) -> Self {
        let dir = TempDir::new("prom");
        let targets = |list: &[&str]| {
            list.iter()
                .map(|t| format!("\"{t}\""))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  \
             - job_name: voucher-edge\n    static_configs:\n      - targets: [{}]\n  \
             - job_name: voucher-core\n    static_configs:\n      - targets: [{}]\n",
            targets(&[edge_metrics]),
            targets(core_metrics)
        );
        let config_path = dir.0.join("prometheus.yml");
        std::fs::write(&config_path, config).expect("config written");
        let port = free_port();
        let child =
            Command::new(std::env::var("PROMETHEUS").unwrap_or_else(|_| "prometheus".into()))
                .arg(format!("--config.file={}", config_path.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.0.join("data").display()
                ))
                .arg(format!("--web.listen-address=127.0.0.1:{port}"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect(
                    "prometheus must be installed (scripts/test.sh installs the Debian package)",
                );
        let prometheus = Self {
            child,
            base: format!("http://127.0.0.1:{port}"),
            _dir: dir,
        };
        let client = reqwest::Client::new();
        let ready = format!("{}/-/ready", prometheus.base);
        eventually(
            Duration::from_secs(20),
            "prometheus to be ready",
            || async {
                let r = client.get(&ready).send().await.ok()?;
                r.status().is_success().then_some(())
            },
        )
        .await;
        prometheus
    }

    /// `Ok(series count)` or the error Prometheus gave.
    async fn query(&self, expr: &str) -> Result<usize, String> {
        let resp: Value = reqwest::Client::new()
            .get(format!("{}/api/v1/query", self.base))
            .query(&[("query", expr)])
            .send()
            .await
            .map_err(|e| e.to_string())?
            .json()
            .await
            .map_err(|e| e.to_string())?;
        if resp["status"] != "success" {
            return Err(format!("{}: {}", resp["errorType"], resp["error"]));
        }
        Ok(resp["data"]["result"].as_array().map_or(0, Vec::len))
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_dashboard_panel_returns_series_after_a_short_k6_sale() {
    let stack = stack_with(Duration::from_secs(2), |s| {
        // Reconciliation exports the gate's remaining uses and the drift: run it often.
        s.flash.reconcile_enabled = true;
        s.flash.reconcile_interval = Duration::from_millis(500);
        // The writers' panels need writers: with PostgreSQL deciding they run only when
        // asked for (a fleet moving from the broker deciding, or a broker-deciding one).
        if let Some(k) = s.kafka.as_mut() {
            k.consume = Some(true);
        }
    })
    .await;
    let edge_metrics = stack
        .edge()
        .metrics_base
        .trim_start_matches("http://")
        .to_owned();
    let core_metrics: Vec<String> = stack
        .cores
        .iter()
        .map(|c| c.metrics_base.trim_start_matches("http://").to_owned())
        .collect();
    let core_refs: Vec<&str> = core_metrics.iter().map(String::as_str).collect();
    let prometheus = Prometheus::start(&edge_metrics, &core_refs).await;
    stack
        .app()
        .given_voucher(flash_voucher("DASH", 300, 1))
        .await;

    // A short k6 flash sale through the edge; its thresholds must pass (the CI smoke).
    // Correctness thresholds as they are; the latency one generous, since these are debug
    // builds sharing two cores with other tests (speed is the benchmark's business).
    let summary_dir = TempDir::new("k6");
    let summary_json = summary_dir.0.join("summary.json");
    let k6 = Command::new(std::env::var("K6").unwrap_or_else(|_| "k6".into()))
        .args(["run", "--quiet", "loadtest/k6/flash-sale.js"])
        .current_dir(repo())
        .env("SUMMARY_JSON", &summary_json)
        .env("BASE_URL", &stack.edge().api.base)
        .env("ADMIN_URL", &stack.app().base)
        .env("CODE", "DASH")
        .env("RATE", "200")
        .env("DURATION", "5s")
        .env("VUS", "200")
        .env("MAX_VUS", "400")
        .env("P99_MS", "3000")
        // k6 shares two cores with the other tests: it may start a few iterations late.
        // Correctness is asserted below (the stock sells out exactly), not k6's own pace.
        .env("MAX_DROPPED_SHARE", "0.2")
        .output()
        .expect("k6 must be installed (scripts/test.sh installs it)");
    let report = String::from_utf8_lossy(&k6.stdout);
    println!("{report}{}", String::from_utf8_lossy(&k6.stderr));
    assert!(k6.status.success(), "k6 thresholds failed:\n{report}");
    assert!(report.contains("issued uses          300"), "{report}");
    // The same figures as JSON, for a CI.
    let json: Value = serde_json::from_str(
        &std::fs::read_to_string(&summary_json).expect("k6 wrote SUMMARY_JSON"),
    )
    .expect("the summary is JSON");
    assert_eq!(json["issued"], 300, "{json}");
    assert_eq!(json["thresholdsFailed"], serde_json::json!([]), "{json}");
    // The edge answers the sale's late requests itself now, even those of its sell-out
    // burst (they wait for the flag's filter or for a place), so a core may refuse none;
    // one newcomer sent to a core directly gives its refusal panel a series, as a client
    // that bypasses the edge would.
    let late = stack
        .app()
        .reserve("DASH", "direct", "direct-1", 100_000)
        .await;
    assert_error(late, reqwest::StatusCode::CONFLICT, "OUT_OF_STOCK").await;

    // Every query of every panel, retried while Prometheus scrapes (bounded).
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut pending = panel_queries();
    let mut last_errors = Vec::new();
    while !pending.is_empty() && Instant::now() < deadline {
        last_errors.clear();
        let mut still = Vec::new();
        for (panel, expr, needs_data) in pending {
            match prometheus.query(&expr).await {
                Ok(n) if n > 0 || !needs_data => {}
                Ok(_) => {
                    last_errors.push(format!("{panel}: no series for {expr}"));
                    still.push((panel, expr, needs_data));
                }
                Err(e) => panic!("{panel}: query error {e} for {expr}"),
            }
        }
        pending = still;
        if !pending.is_empty() {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    assert!(
        pending.is_empty(),
        "panels without series:\n{}",
        last_errors.join("\n")
    );
    let accepted: Vec<Accepted> = sqlx::query_as::<_, (String, String)>(
        "SELECT customer_id, order_id FROM redemptions WHERE voucher_code = 'DASH'",
    )
    .fetch_all(&stack.pool)
    .await
    .expect("rows")
    .into_iter()
    .map(|(customer, order)| Accepted::new("DASH", &customer, &order))
    .collect();
    assert_eq!(accepted.len(), 300);
    stack.finish(&accepted).await;
}

/// The alerting and recording rules are valid, and each alert fires on the series it
/// watches and stays quiet on healthy ones (`dashboards/alerts.test.yml`), by promtool from
/// Debian's prometheus package.
#[test]
fn alert_rules_pass_promtool_check_and_unit_tests() {
    let dir = repo().join("dashboards");
    for args in [
        vec!["check", "rules", "alerts.yml"],
        vec!["check", "config", "prometheus.yml"],
        vec!["test", "rules", "alerts.test.yml"],
    ] {
        let output = Command::new("promtool")
            .args(&args)
            .current_dir(&dir)
            .output()
            .expect("promtool is installed by scripts/test.sh (Debian's prometheus)");
        assert!(
            output.status.success(),
            "promtool {}:\n{}\n{}",
            args.join(" "),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// Every alert says what it means (`description`) and links its section of the runbook
/// (`runbook_url`, relative to the repository), and the runbook has that section.
#[test]
fn every_alert_has_a_description_and_a_runbook_section() {
    let rules = std::fs::read_to_string(repo().join("dashboards/alerts.yml")).expect("alerts.yml");
    let runbook = std::fs::read_to_string(repo().join("docs/RUNBOOK.md")).expect("docs/RUNBOOK.md");
    let alerts: Vec<&str> = rules.split("- alert: ").skip(1).collect();
    assert!(alerts.len() >= 13, "{} alerts", alerts.len());
    for alert in alerts {
        let name = alert.split_whitespace().next().unwrap_or_default();
        // The rule's own lines: up to the next rule.
        let body = alert.split("\n      - ").next().unwrap_or_default();
        assert!(
            body.contains("description: \""),
            "{name} has no description"
        );
        let url = format!("runbook_url: \"docs/RUNBOOK.md#{}\"", name.to_lowercase());
        assert!(body.contains(&url), "{name}: no {url}");
        assert!(
            runbook.contains(&format!("\n## {name}\n")),
            "docs/RUNBOOK.md has no section {name}"
        );
    }
}
