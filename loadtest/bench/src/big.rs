//! A flash voucher of a million uses (`USES`), sold out through a core, then reloaded and
//! reconciled, while Redis's slow log records every call slower than `SLOW_US`
//! microseconds. What it shows: no Redis call of the gate blocks for long whatever the
//! voucher's size (loads and reads go in chunks), and reconciliation looks at what changed,
//! not at every order. Run by `loadtest/big-voucher.sh`; writes `OUT/REPORT.md`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::invariants::{check_invariants, remember_accepted};
use crate::latency::Latencies;
use crate::load::{self, Plan};
use crate::probe::{peak_rss_mib, reserve_body, Stack};
use crate::report::{fmt_ms, write_big_report};
use crate::slowlog::{redis_memory_mib, slow_summary, slowlog, slowlog_reset};
use crate::{BigArgs, StackArgs};

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

/// p50, p99 and max of `latencies`, `-` without any.
fn percentiles(latencies: Vec<Duration>) -> String {
    Latencies::of(latencies).map_or("-".into(), |l| {
        format!(
            "p50 {:.2} / p99 {:.2} / max {:.2} ms",
            l.percentile_ms(50.0),
            l.percentile_ms(99.0),
            l.percentile_ms(100.0)
        )
    })
}

/// Times, one at a time: a load chunk of `CHUNK` orders into a scratch gate, a page of the
/// big voucher's orders (HSCAN), and a reconciliation snapshot of it.
async fn calls_alone(stack: &Stack, code: &str) -> anyhow::Result<String> {
    use voucher_core::domain::{Money, Voucher, VoucherCode, VoucherMode};
    use voucher_core::flash::gate::{Gate, OrderRecord, RecordState, CHUNK};
    let gate = Gate::connect(&stack.redis_settings(&stack.gate_prefix)).await?;
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
        state: voucher_core::domain::VoucherState::Active,
        version: 1,
        updated_at: now,
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
        fills.push(started.elapsed());
    }
    gate.unload(&scratch.code).await?;
    let big = VoucherCode::parse(code).map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let mut snapshots = Vec::new();
    for _ in 0..200 {
        let started = Instant::now();
        gate.snapshot(&big).await?;
        snapshots.push(started.elapsed());
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

pub async fn run(stack_args: &StackArgs, args: &BigArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.out)?;
    let stack = Stack::connect(stack_args).await?;
    let (uses, rate, threshold_us) = (args.uses, args.rate, args.slow_us);
    let redis_url = stack.redis_url.as_str();
    let code = format!("BIG{}", chrono::Utc::now().format("%H%M%S"));
    let core: std::net::SocketAddr = stack.core.parse()?;
    let mut table = Vec::new();

    // 1. The sale: USES + 2% requests, one new customer each, at BIG_RATE, to a core.
    slowlog_reset(redis_url, threshold_us).await?;
    let memory_before = redis_memory_mib(redis_url).await?;
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
    let sale_slow = slowlog(redis_url).await?;
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
    let memory = redis_memory_mib(redis_url).await? - memory_before;

    // 2. Reload: the operator drops the gate and it is loaded again from PostgreSQL.
    slowlog_reset(redis_url, threshold_us).await?;
    let started = Instant::now();
    stack.request_reload(&code).await?;
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
    let reload_slow = slowlog(redis_url).await?;
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
    slowlog_reset(redis_url, threshold_us).await?;
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
        slow_summary(&slowlog(redis_url).await?, threshold_us),
    ));
    table.push(format!(
        "| Memory | Redis used_memory grew {memory:.0} MiB over the sale (records, counts, claims); core peak RSS {} | |",
        peak_rss_mib("run/core.pid").map_or("-".into(), |m| format!("{m:.0} MiB"))
    ));

    // 4. The same calls alone, on the quiet stack: what a call costs Redis itself, apart
    //    from the preemption a loaded two-core machine adds to everything on it.
    slowlog_reset(redis_url, threshold_us).await?;
    let alone = calls_alone(&stack, &code).await?;
    table.push(format!(
        "| The gate's biggest calls alone, quiet stack (client-timed round trips) | {alone} | {} |",
        slow_summary(&slowlog(redis_url).await?, threshold_us)
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

    write_big_report(args, &table)
}
