//! A flash voucher of a million uses (`USES`), sold out through a core, then reloaded and
//! reconciled, while Redis's slow log records every call slower than `SLOW_US`
//! microseconds. What it shows: no Redis call of the gate blocks for long whatever the
//! voucher's size (loads and reads go in chunks), and reconciliation looks at what changed,
//! not at every order. Run by `loadtest/big-voucher.sh`; writes `OUT/REPORT.md`.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::load::{self, Plan};
use crate::probe::{peak_rss_mib, reserve_body, Stack};
use crate::{check_invariants, env_or, fmt_ms, remember_accepted};

/// One slow-log entry: how long the call took and what it was.
struct Slow {
    micros: i64,
    command: String,
}

async fn redis() -> anyhow::Result<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(env_or("REDIS_URL", "redis://127.0.0.1:6379/"))?;
    Ok(client.get_multiplexed_async_connection().await?)
}

/// Empties the slow log and sets its threshold.
async fn slowlog_reset(threshold_us: i64) -> anyhow::Result<()> {
    let mut conn = redis().await?;
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("slowlog-log-slower-than")
        .arg(threshold_us)
        .query_async::<()>(&mut conn)
        .await?;
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("slowlog-max-len")
        .arg(10_000)
        .query_async::<()>(&mut conn)
        .await?;
    redis::cmd("SLOWLOG")
        .arg("RESET")
        .query_async::<()>(&mut conn)
        .await?;
    Ok(())
}

/// Every call the slow log kept since the reset, slowest first.
async fn slowlog() -> anyhow::Result<Vec<Slow>> {
    let mut conn = redis().await?;
    let entries: Vec<redis::Value> = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(-1)
        .query_async(&mut conn)
        .await?;
    let mut slow = Vec::new();
    for entry in entries {
        let redis::Value::Array(fields) = entry else {
            continue;
        };
        let micros: i64 = fields
            .get(2)
            .map(redis::from_redis_value)
            .transpose()?
            .unwrap_or(0);
        let words: Vec<String> = fields
            .get(3)
            .map(redis::from_redis_value)
            .transpose()?
            .unwrap_or_default();
        let command = match words.as_slice() {
            [verb, sha, ..] if verb.eq_ignore_ascii_case("EVALSHA") => {
                format!("script {}", script_name(sha))
            }
            _ => words.into_iter().take(2).collect::<Vec<_>>().join(" "),
        };
        slow.push(Slow { micros, command });
    }
    slow.sort_by_key(|s| std::cmp::Reverse(s.micros));
    Ok(slow)
}

/// The gate script whose SHA1 is `sha`.
fn script_name(sha: &str) -> String {
    voucher_core::flash::gate::SCRIPT_SOURCES
        .iter()
        .find(|(_, source)| redis::Script::new(source).get_hash() == sha)
        .map_or_else(|| sha.to_owned(), |(name, _)| (*name).to_owned())
}

/// Calls slower than the threshold, per command, with the slowest of each.
fn slow_by_command(slow: &[Slow]) -> String {
    let mut by: Vec<(String, usize, i64)> = Vec::new();
    for s in slow {
        match by.iter_mut().find(|(c, _, _)| *c == s.command) {
            Some(entry) => {
                entry.1 += 1;
                entry.2 = entry.2.max(s.micros);
            }
            None => by.push((s.command.clone(), 1, s.micros)),
        }
    }
    by.iter()
        .map(|(c, n, max)| format!("{c}: {n} (max {:.1} ms)", *max as f64 / 1000.0))
        .collect::<Vec<_>>()
        .join("; ")
}

fn slow_summary(slow: &[Slow], threshold_us: i64) -> String {
    match slow.first() {
        None => format!("no call over {:.1} ms", threshold_us as f64 / 1000.0),
        Some(worst) => format!(
            "{} calls over {:.1} ms; slowest {:.2} ms ({}); by command: {}",
            slow.len(),
            threshold_us as f64 / 1000.0,
            worst.micros as f64 / 1000.0,
            worst.command,
            slow_by_command(slow)
        ),
    }
}

/// The voucher's fields of `GET /vouchers/{code}`.
async fn voucher(stack: &Stack, code: &str) -> anyhow::Result<serde_json::Value> {
    Ok(stack
        .http
        .get(format!("http://{}/vouchers/{code}", stack.core))
        .send()
        .await?
        .json()
        .await?)
}

async fn redis_memory_mib() -> anyhow::Result<f64> {
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(&mut redis().await?)
        .await?;
    let bytes: f64 = info
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0);
    Ok(bytes / (1024.0 * 1024.0))
}

/// Sum and count of the reconciliation histogram, and the entries it looked at.
async fn reconcile_counters(stack: &Stack) -> anyhow::Result<(f64, f64, f64)> {
    Ok((
        stack
            .core_counter("voucher_reconcile_duration_seconds_sum", &[])
            .await?,
        stack
            .core_counter("voucher_reconcile_duration_seconds_count", &[])
            .await?,
        stack
            .core_counter("voucher_reconcile_checked_total", &[])
            .await?,
    ))
}

fn percentiles(mut micros: Vec<u128>) -> String {
    if micros.is_empty() {
        return "-".into();
    }
    micros.sort_unstable();
    let at = |p: f64| micros[((micros.len() - 1) as f64 * p) as usize] as f64 / 1000.0;
    format!(
        "p50 {:.2} / p99 {:.2} / max {:.2} ms",
        at(0.5),
        at(0.99),
        at(1.0)
    )
}

/// Times, one at a time: a load chunk of `CHUNK` orders into a scratch gate, a page of the
/// big voucher's orders (HSCAN), and a reconciliation snapshot of it.
async fn calls_alone(code: &str) -> anyhow::Result<String> {
    use voucher_core::domain::{Money, Voucher, VoucherCode, VoucherMode};
    use voucher_core::flash::gate::{Gate, OrderRecord, RecordState, CHUNK};
    let gate = Gate::connect(&crate::redis_settings(&env_or("GATE_PREFIX", "vg:"))).await?;
    let now = chrono::Utc::now();
    let scratch = Voucher {
        code: VoucherCode::parse(format!("{code}S")).map_err(|e| anyhow::anyhow!("{e:?}"))?,
        discount_amount: Money::positive("discountAmount", 100_000)
            .map_err(|e| anyhow::anyhow!("{e:?}"))?,
        min_order_amount: Money::not_negative("minOrderAmount", 0)
            .map_err(|e| anyhow::anyhow!("{e:?}"))?,
        total_limit: 1_000_000,
        per_user_limit: 1,
        starts_at: now,
        ends_at: now + chrono::Duration::days(1),
        mode: VoucherMode::Flash,
        created_at: now,
    };
    let (_, loading) = gate.begin_load(&scratch, 1).await?;
    let mut fills = Vec::new();
    for chunk in 0..200 {
        let orders: Vec<(String, OrderRecord)> = (0..CHUNK)
            .map(|i| {
                let record = OrderRecord {
                    state: RecordState::Accepted,
                    customer_id: format!("b-c{}", chunk * CHUNK + i),
                    order_amount: 250_000,
                    discount_amount: 100_000,
                    reserved_ms: now.timestamp_millis(),
                    expires_ms: now.timestamp_millis() + 900_000,
                    publish_ms: now.timestamp_millis(),
                };
                (format!("{code}S-b{}", chunk * CHUNK + i), record)
            })
            .collect();
        let started = Instant::now();
        gate.fill_load(&loading, &[], &orders).await?;
        fills.push(started.elapsed().as_micros());
    }
    gate.unload(&scratch.code).await?;
    let big = VoucherCode::parse(code).map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let mut snapshots = Vec::new();
    for _ in 0..200 {
        let started = Instant::now();
        gate.snapshot(&big).await?;
        snapshots.push(started.elapsed().as_micros());
    }
    let started = Instant::now();
    let ids = gate.order_ids(&big).await?.map_or(0, |ids| ids.len());
    let scan = started.elapsed();
    Ok(format!(
        "load chunk of {CHUNK} orders: {}; reconciliation snapshot: {}; every order id by HSCAN pages: {ids} ids in {:.1} s",
        percentiles(fills),
        percentiles(snapshots),
        scan.as_secs_f64()
    ))
}

pub async fn run(out: std::path::PathBuf) -> anyhow::Result<()> {
    std::fs::create_dir_all(&out)?;
    let stack = Stack::from_env().await?;
    let uses: u64 = env_or("USES", "1000000").parse()?;
    let rate: u64 = env_or("BIG_RATE", "3000").parse()?;
    let threshold_us: i64 = env_or("SLOW_US", "2000").parse()?;
    let code = format!("BIG{}", chrono::Utc::now().format("%H%M%S"));
    let core: std::net::SocketAddr = stack.core.parse()?;
    let mut table = Vec::new();

    // 1. The sale: USES + 2% requests, one new customer each, at BIG_RATE, to a core.
    slowlog_reset(threshold_us).await?;
    let memory_before = redis_memory_mib().await?;
    stack.create_voucher(&code, uses as i64, "flash").await?;
    let requests = uses + uses / 50;
    eprintln!("big voucher {code}: {uses} uses, {requests} requests at {rate}/s");
    let reconcile_before = reconcile_counters(&stack).await?;
    let plan_code = code.clone();
    let started = Instant::now();
    let outcome = load::run(Plan {
        target: core,
        rate,
        duration: Duration::from_secs_f64(requests as f64 / rate as f64),
        connections: 512,
        request: Arc::new(move |i| {
            (
                hyper::Method::POST,
                format!("/vouchers/{plan_code}/reservations"),
                Some(reserve_body(&plan_code, i, "b")),
            )
        }),
    })
    .await?;
    let sale_secs = started.elapsed().as_secs_f64();
    let issued = outcome.count(|s| s.status == 201);
    let (rows, used) = stack.wait_recorded(&code, issued as i64).await?;
    let sale_slow = slowlog().await?;
    let reconcile_after = reconcile_counters(&stack).await?;
    let rounds = reconcile_after.1 - reconcile_before.1;
    table.push(format!(
        "| Sale through a core | {issued} uses issued of {uses} ({} answers, {:.0}/s over {sale_secs:.0} s: {} 409, {} 503, {} failed); rows {rows}, used_count {used}; accepted p99 {} | {} |",
        outcome.completed(),
        outcome.completed() as f64 / sale_secs,
        outcome.count(|s| s.status == 409),
        outcome.count(|s| s.status == 503),
        outcome.count(|s| s.status == 0),
        fmt_ms(outcome.percentile(99.0, |s| s.status == 201)),
        if issued == uses && rows == uses as i64 {
            "sold out exactly".to_owned()
        } else {
            format!("{} uses unsold: the generator does not retry a 503 (a use held by an unanswered publish comes back after the grace)", uses - issued)
        },
    ));
    table.push(format!(
        "| Redis slow log during the sale | {} | threshold {threshold_us} µs |",
        slow_summary(&sale_slow, threshold_us)
    ));
    table.push(format!(
        "| Reconciliation during the sale | {rounds:.0} rounds, mean {:.1} ms, {:.0} entries looked at per round | a round over every order would read {uses} |",
        if rounds > 0.0 { (reconcile_after.0 - reconcile_before.0) / rounds * 1000.0 } else { 0.0 },
        if rounds > 0.0 { (reconcile_after.2 - reconcile_before.2) / rounds } else { 0.0 },
    ));
    let memory = redis_memory_mib().await? - memory_before;

    // 2. Reload: the operator drops the gate and it is loaded again from PostgreSQL.
    slowlog_reset(threshold_us).await?;
    let started = Instant::now();
    let reload = stack
        .http
        .post(format!("http://{}/vouchers/{code}/gate/reload", stack.core))
        .bearer_auth(&stack.token)
        .send()
        .await?;
    anyhow::ensure!(reload.status().is_success(), "reload: {}", reload.status());
    let mut reopened = None;
    // Polled every 500 ms: each GET counts the voucher's rows by status.
    for _ in 0..600 {
        let v = voucher(&stack, &code).await?;
        if v["gateRemaining"].as_i64().is_some() {
            reopened = Some((started.elapsed(), v["gateRemaining"].as_i64()));
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let reload_slow = slowlog().await?;
    table.push(format!(
        "| Reload from PostgreSQL (`POST /vouchers/{{code}}/gate/reload`) | {} | includes the rebuild's wait for publishes in flight (`kafka.message_timeout`) |",
        match reopened {
            Some((t, remaining)) => format!("open again after {:.1} s with gateRemaining {}", t.as_secs_f64(), remaining.unwrap_or(-1)),
            None => "NOT open after 300 s".into(),
        }
    ));
    table.push(format!(
        "| Redis slow log during the reload | {} | threshold {threshold_us} µs |",
        slow_summary(&reload_slow, threshold_us)
    ));

    // 3. Reconciliation of the reloaded gate, a few rounds.
    slowlog_reset(threshold_us).await?;
    let before = reconcile_counters(&stack).await?;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let after = reconcile_counters(&stack).await?;
    let rounds = after.1 - before.1;
    let drift = stack
        .core_counter("voucher_gate_drift", &[("voucher", &code)])
        .await?;
    table.push(format!(
        "| Reconciliation after the reload (10 s) | {rounds:.0} rounds, mean {:.1} ms, {:.0} entries looked at per round; drift {drift} | {} |",
        if rounds > 0.0 { (after.0 - before.0) / rounds * 1000.0 } else { 0.0 },
        if rounds > 0.0 { (after.2 - before.2) / rounds } else { 0.0 },
        slow_summary(&slowlog().await?, threshold_us),
    ));
    table.push(format!(
        "| Memory | Redis used_memory grew {memory:.0} MiB over the sale (records, counts, claims); core peak RSS {} | |",
        peak_rss_mib("run/core.pid").map_or("-".into(), |m| format!("{m:.0} MiB"))
    ));

    // 4. The same calls alone, on the quiet stack: what a call costs Redis itself, apart
    //    from the preemption a loaded two-core machine adds to everything on it.
    slowlog_reset(threshold_us).await?;
    let alone = calls_alone(&code).await?;
    table.push(format!(
        "| The gate's biggest calls alone, quiet stack (client-timed round trips) | {alone} | {} |",
        slow_summary(&slowlog().await?, threshold_us)
    ));

    // 5. The invariants, over every accepted reservation.
    let accepted = Mutex::new(Vec::new());
    remember_accepted(&accepted, &code, "b", &outcome);
    let accepted = accepted.into_inner().unwrap_or_default();
    let verdict = check_invariants(&stack, &accepted).await?;
    table.push(format!(
        "| Invariants 1-5 | {verdict} | {} accepted reservations checked |",
        accepted.len()
    ));

    let mut md = String::new();
    writeln!(md, "# A flash voucher of {uses} uses\n")?;
    writeln!(md, "- when: {}", chrono::Utc::now().to_rfc3339())?;
    writeln!(md, "- machine: {}", crate::probe::machine())?;
    writeln!(
        md,
        "- command: `USES={uses} BIG_RATE={rate} SLOW_US={threshold_us} ./loadtest/big-voucher.sh`"
    )?;
    writeln!(md, "- method: one request per new customer (per-user limit 1) sent to a core at a constant rate; Redis's own slow log (`slowlog-log-slower-than`) records every command, script or not, slower than the threshold; reconciliation figures are the core's `voucher_reconcile_duration_seconds` and `voucher_reconcile_checked_total`\n")?;
    writeln!(md, "| measure | result | notes |\n|---|---|---|")?;
    for row in &table {
        writeln!(md, "{row}")?;
    }
    std::fs::write(out.join("REPORT.md"), &md)?;
    print!("{md}");
    Ok(())
}
