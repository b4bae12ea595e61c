//! `voucherctl`: the operators' command line of the voucher gate. It speaks a core's admin
//! API (the token's scopes decide what it may do) and, for `watch`, the metrics endpoints
//! of the cores and edges it is pointed at. Errors are told in words, with what to do next
//! (`api::CtlError`); the exit status is 1 on any error.

mod api;
mod watch;

use std::io::Write;
use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::{Parser, Subcommand};
use futures::StreamExt;
use reqwest::Method;
use serde_json::{json, Value};

use api::{Api, CtlError, Result};

#[derive(Parser)]
#[command(
    version,
    about = "Run a voucher sale: create, change, pause, export, audit, watch"
)]
struct Cli {
    /// A core's API (admin calls are not served by the edge's public listener).
    #[arg(
        long,
        env = "VOUCHERCTL_URL",
        default_value = "http://127.0.0.1:8081",
        global = true
    )]
    url: String,
    /// A bearer token whose scopes allow the command (`voucher-core tokens create`).
    #[arg(long, env = "VOUCHERCTL_TOKEN", hide_env_values = true, global = true)]
    token: Option<String>,
    /// Print the service's JSON instead of a summary.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create a voucher.
    Create {
        code: String,
        /// Discount in minor units.
        #[arg(long)]
        discount: i64,
        /// Uses the voucher may hold at once.
        #[arg(long)]
        limit: i64,
        #[arg(long, default_value_t = 0)]
        min_order: i64,
        #[arg(long, default_value_t = 1)]
        per_user: i64,
        /// RFC 3339, `now`, or `now+1h` / `+30m` / `-5m`.
        #[arg(long, default_value = "now", allow_hyphen_values = true)]
        starts: String,
        #[arg(long, allow_hyphen_values = true)]
        ends: String,
        /// `standard` or `flash`.
        #[arg(long, default_value = "standard")]
        mode: String,
    },
    /// List vouchers (every page).
    List {
        #[arg(long)]
        mode: Option<String>,
        /// active, paused or archived (archived ones only when asked for).
        #[arg(long)]
        state: Option<String>,
        /// scheduled, live or ended.
        #[arg(long)]
        phase: Option<String>,
    },
    /// One voucher with its counts.
    Show { code: String },
    /// Change a voucher's window, limit or terms (read, then changed at that version).
    Change {
        code: String,
        #[arg(long, allow_hyphen_values = true)]
        starts: Option<String>,
        #[arg(long, allow_hyphen_values = true)]
        ends: Option<String>,
        #[arg(long)]
        limit: Option<i64>,
        #[arg(long)]
        discount: Option<i64>,
        #[arg(long)]
        min_order: Option<i64>,
    },
    /// The kill switch: refuse new reservations now.
    Pause { code: String },
    /// Take new reservations again.
    Resume { code: String },
    /// Archive a voucher with no active reservation, for good.
    Archive { code: String },
    /// Rebuild a flash voucher's gate from PostgreSQL.
    Reload { code: String },
    /// Every reservation as CSV (to standard output, or a file).
    Export {
        code: String,
        #[arg(long)]
        status: Option<String>,
        #[arg(long, short)]
        output: Option<std::path::PathBuf>,
    },
    /// Every admin change of a voucher: who, when, what.
    Audit { code: String },
    /// A live view of a sale, refreshed every second.
    Watch {
        code: String,
        /// Metrics endpoints of cores (comma-separated).
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "http://127.0.0.1:9181/metrics"
        )]
        core_metrics: Vec<String>,
        /// Metrics endpoints of edges (comma-separated; none by default).
        #[arg(long, value_delimiter = ',')]
        edge_metrics: Vec<String>,
        #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
        interval: Duration,
        /// One frame after one interval, then exit.
        #[arg(long)]
        once: bool,
    },
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    if let Err(e) = run(cli).await {
        eprintln!("voucherctl: {e}");
        std::process::exit(1);
    }
}

/// A time an operator types: RFC 3339, `now`, `now+1h`, `+30m`, `-5m`.
fn when(raw: &str) -> Result<DateTime<Utc>> {
    let raw = raw.trim();
    if let Ok(t) = DateTime::parse_from_rfc3339(raw) {
        return Ok(t.with_timezone(&Utc));
    }
    let offset = raw.strip_prefix("now").unwrap_or(raw);
    if offset.is_empty() {
        return Ok(Utc::now());
    }
    let (sign, span) = match offset.split_at(1) {
        ("+", span) => (1, span),
        ("-", span) => (-1, span),
        _ => return Err(bad_time(raw)),
    };
    let span = humantime::parse_duration(span).map_err(|_| bad_time(raw))?;
    let span = chrono::Duration::from_std(span).map_err(|_| bad_time(raw))?;
    Ok(Utc::now() + span * sign)
}

fn bad_time(raw: &str) -> CtlError {
    CtlError::Usage(format!(
        "{raw:?} is not a time: write 2026-12-24T18:00:00Z, now, now+1h, +30m or -5m"
    ))
}

fn print_json(v: &Value) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

/// A voucher in a few lines.
fn print_voucher(v: &Value) {
    println!(
        "{}  {}  {}  {}  version {}",
        v["code"].as_str().unwrap_or("?"),
        v["mode"].as_str().unwrap_or("?"),
        v["state"].as_str().unwrap_or("?"),
        v["phase"].as_str().unwrap_or("?"),
        v["version"]
    );
    println!(
        "  uses {} of {} (reserved {}, confirmed {}){}",
        v["usedCount"],
        v["totalLimit"],
        v["reserved"],
        v["confirmed"],
        v["gateRemaining"]
            .as_i64()
            .map_or_else(String::new, |g| format!(", gate left {g}"))
    );
    println!(
        "  discount {}, minimum order {}, per customer {}",
        v["discountAmount"], v["minOrderAmount"], v["perUserLimit"]
    );
    println!(
        "  from {} to {}",
        v["startsAt"].as_str().unwrap_or("?"),
        v["endsAt"].as_str().unwrap_or("?")
    );
}

async fn run(cli: Cli) -> Result<()> {
    let api = Api::new(&cli.url, cli.token.clone());
    let show = |v: &Value| {
        if cli.json {
            print_json(v)
        } else {
            print_voucher(v)
        }
    };
    match cli.command {
        Command::Create {
            code,
            discount,
            limit,
            min_order,
            per_user,
            starts,
            ends,
            mode,
        } => {
            let body = json!({
                "code": code, "discountAmount": discount, "minOrderAmount": min_order,
                "totalLimit": limit, "perUserLimit": per_user,
                "startsAt": when(&starts)?, "endsAt": when(&ends)?, "mode": mode,
            });
            let made = api
                .call(&code, Method::POST, "/vouchers", Some(&body), None)
                .await?;
            show(&made.body);
        }
        Command::List { mode, state, phase } => {
            let mut query = vec!["limit=500".to_owned()];
            for (key, value) in [("mode", &mode), ("state", &state), ("phase", &phase)] {
                if let Some(v) = value {
                    query.push(format!("{key}={v}"));
                }
            }
            let all = every_page(&api, "", &format!("/vouchers?{}", query.join("&"))).await?;
            if cli.json {
                print_json(&Value::Array(all));
            } else {
                println!(
                    "{:<32} {:<8} {:<8} {:<9} {:>10} {:>10}",
                    "code", "mode", "state", "phase", "used", "limit"
                );
                for v in &all {
                    println!(
                        "{:<32} {:<8} {:<8} {:<9} {:>10} {:>10}",
                        v["code"].as_str().unwrap_or("?"),
                        v["mode"].as_str().unwrap_or("?"),
                        v["state"].as_str().unwrap_or("?"),
                        v["phase"].as_str().unwrap_or("?"),
                        v["usedCount"],
                        v["totalLimit"]
                    );
                }
                println!("{} vouchers", all.len());
            }
        }
        Command::Show { code } => {
            let v = api.get(&code, &format!("/vouchers/{code}")).await?.body;
            show(&v);
        }
        Command::Change {
            code,
            starts,
            ends,
            limit,
            discount,
            min_order,
        } => {
            let mut change = serde_json::Map::new();
            if let Some(t) = starts {
                change.insert("startsAt".into(), json!(when(&t)?));
            }
            if let Some(t) = ends {
                change.insert("endsAt".into(), json!(when(&t)?));
            }
            for (key, value) in [
                ("totalLimit", limit),
                ("discountAmount", discount),
                ("minOrderAmount", min_order),
            ] {
                if let Some(v) = value {
                    change.insert(key.into(), json!(v));
                }
            }
            if change.is_empty() {
                return Err(CtlError::Usage(
                    "nothing to change: give --starts, --ends, --limit, --discount or --min-order"
                        .into(),
                ));
            }
            let read = api.get(&code, &format!("/vouchers/{code}")).await?;
            let version = read
                .etag
                .ok_or_else(|| CtlError::Usage("the service sent no ETag".into()))?;
            let changed = api
                .call(
                    &code,
                    Method::PATCH,
                    &format!("/vouchers/{code}"),
                    Some(&Value::Object(change)),
                    Some(&version),
                )
                .await?;
            show(&changed.body);
        }
        Command::Pause { code } => lifecycle(&api, &code, "pause", &show).await?,
        Command::Resume { code } => lifecycle(&api, &code, "resume", &show).await?,
        Command::Archive { code } => lifecycle(&api, &code, "archive", &show).await?,
        Command::Reload { code } => {
            let answer = api
                .call(
                    &code,
                    Method::POST,
                    &format!("/vouchers/{code}/gate/reload"),
                    None,
                    None,
                )
                .await?;
            if cli.json {
                print_json(&answer.body);
            } else {
                println!("{code}: the gate is being rebuilt from PostgreSQL; its reservations get 503 until then");
            }
        }
        Command::Export {
            code,
            status,
            output,
        } => {
            let path = match &status {
                Some(s) => format!("/vouchers/{code}/export?status={s}"),
                None => format!("/vouchers/{code}/export"),
            };
            let resp = api.stream(&code, &path).await?;
            let mut sink: Box<dyn Write> = match &output {
                Some(file) => Box::new(std::fs::File::create(file).map_err(|e| {
                    CtlError::Usage(format!("cannot write {}: {e}", file.display()))
                })?),
                None => Box::new(std::io::stdout().lock()),
            };
            let mut body = resp.bytes_stream();
            let mut lines = 0usize;
            while let Some(chunk) = body.next().await {
                let chunk = chunk
                    .map_err(|e| CtlError::Unavailable(format!("the export was cut short: {e}")))?;
                lines += chunk.iter().filter(|b| **b == b'\n').count();
                sink.write_all(&chunk)
                    .map_err(|e| CtlError::Usage(format!("cannot write the export: {e}")))?;
            }
            sink.flush()
                .map_err(|e| CtlError::Usage(format!("cannot write the export: {e}")))?;
            if let Some(file) = output {
                eprintln!(
                    "{} reservations written to {}",
                    lines.saturating_sub(1),
                    file.display()
                );
            }
        }
        Command::Audit { code } => {
            let all = every_page(&api, &code, &format!("/vouchers/{code}/audit?limit=500")).await?;
            if cli.json {
                print_json(&Value::Array(all));
            } else {
                for e in &all {
                    println!(
                        "{}  {:<12} by {:<16} {}{}",
                        e["at"].as_str().unwrap_or("?"),
                        e["action"].as_str().unwrap_or("?"),
                        e["actor"].as_str().unwrap_or("?"),
                        what_changed(&e["before"], &e["after"]),
                        e["requestId"]
                            .as_str()
                            .map_or_else(String::new, |id| format!("  (request {id})"))
                    );
                }
            }
        }
        Command::Watch {
            code,
            core_metrics,
            edge_metrics,
            interval,
            once,
        } => watch::watch(&api, &code, &core_metrics, &edge_metrics, interval, once).await?,
    }
    Ok(())
}

/// Every item of a paged list (`items`, `nextCursor`), `path` already carrying a query.
async fn every_page(api: &Api, code: &str, path: &str) -> Result<Vec<Value>> {
    let mut all = Vec::new();
    let mut next = path.to_owned();
    loop {
        let page = api.get(code, &next).await?.body;
        all.extend(page["items"].as_array().cloned().unwrap_or_default());
        match page["nextCursor"].as_str() {
            Some(cursor) => next = format!("{path}&cursor={cursor}"),
            None => return Ok(all),
        }
    }
}

async fn lifecycle(api: &Api, code: &str, action: &str, show: &impl Fn(&Value)) -> Result<()> {
    let answer = api
        .call(
            code,
            Method::POST,
            &format!("/vouchers/{code}/{action}"),
            None,
            None,
        )
        .await?;
    show(&answer.body);
    Ok(())
}

/// `field: before -> after` for each field an audit entry changed.
fn what_changed(before: &Value, after: &Value) -> String {
    let (Some(before), Some(after)) = (before.as_object(), after.as_object()) else {
        return String::new();
    };
    let changes: Vec<String> = after
        .iter()
        .filter(|(k, v)| *k != "version" && before.get(*k) != Some(*v))
        .map(|(k, v)| format!("{k}: {} -> {v}", before.get(k).unwrap_or(&Value::Null)))
        .collect();
    changes.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_read_as_operators_write_them() {
        let now = Utc::now();
        let soon = when("now+1h").expect("time");
        assert!(
            (soon - now - chrono::Duration::hours(1))
                .num_seconds()
                .abs()
                <= 1
        );
        assert!(when("-30m").expect("time") < now);
        assert_eq!(
            when("2026-12-24T18:00:00Z").expect("time").to_rfc3339(),
            "2026-12-24T18:00:00+00:00"
        );
        assert!(matches!(when("tomorrow"), Err(CtlError::Usage(_))));
    }

    #[test]
    fn an_audit_entry_names_what_changed() {
        let before = json!({"totalLimit": 10, "state": "active", "version": 1});
        let after = json!({"totalLimit": 20, "state": "active", "version": 2});
        assert_eq!(what_changed(&before, &after), "totalLimit: 10 -> 20");
    }
}
