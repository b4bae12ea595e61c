//! What the runs write: the benchmark's REPORT.md (how it was measured, the summary table,
//! every ladder and section, what now limits each path), the flash sale's samples as CSV for `loadtest/plot.py`, RATE-LIMITS.md,
//! and the REPORT.md of `big-voucher`.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use crate::ladder::{Step, FAST_CONNECTIONS, SALE_CONNECTIONS};
use crate::load::Outcome;
use crate::probe;
use crate::run::Run;
use crate::{bounds, BigArgs};

/// A latency in milliseconds, `-` when there was none.
pub fn fmt_ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.2} ms"))
}

/// A p99 as a fraction of the 100 ms limit.
pub fn ratio_to_limit(p99: Option<f64>) -> String {
    p99.map_or("-".into(), |p| format!("{:.2} of the limit", p / 100.0))
}

const STEP_HEADER: &str = "| offered/s | achieved/s | late starts | errors | p50 | p99 | generator CPU (cores) | sustained |\n|---|---|---|---|---|---|---|---|";

/// A ladder's table under `title`.
pub fn write_steps(report: &mut String, title: &str, steps: &[Step]) {
    write_steps_under(report, "##", title, steps);
}

/// A ladder's table under `title`, a heading of `level` (`##`, `###`).
pub fn write_steps_under(report: &mut String, level: &str, title: &str, steps: &[Step]) {
    let _ = writeln!(report, "\n{level} {title}\n\n{STEP_HEADER}");
    for s in steps {
        let _ = writeln!(report, "{}", s.line());
    }
}

/// Every sample of `o`, one CSV line each.
pub fn write_samples(path: &Path, o: &Outcome) -> anyhow::Result<()> {
    let mut csv = String::from("at_ms,latency_ms,status,by_edge\n");
    for s in &o.samples {
        let _ = writeln!(
            csv,
            "{:.3},{:.3},{},{}",
            s.at.as_secs_f64() * 1000.0,
            s.latency.as_secs_f64() * 1000.0,
            s.status,
            u8::from(s.by_edge)
        );
    }
    std::fs::write(path, csv)?;
    Ok(())
}

/// REPORT.md: how it was measured, the summary table, then every ladder. `decision` is the
/// cores' `flash.decision`, `step` the length of a ladder's step.
pub fn write_report(run: &Run, decision: &str, step: Duration) -> anyhow::Result<()> {
    let mut md = String::new();
    writeln!(md, "# Benchmark report\n")?;
    writeln!(md, "- when: {}", chrono::Utc::now().to_rfc3339())?;
    writeln!(md, "- machine: {}", probe::machine())?;
    writeln!(md, "- command: `{}./loadtest/bench.sh` (steps of {} s; ladders in the environment: SALE_RATES, REJECT_RATES, ACCEPT_RATES)", match decision { "database" => String::new(), other => format!("VOUCHER__FLASH__DECISION={other} ") }, step.as_secs())?;
    writeln!(
        md,
        "- the cores' `flash.decision`: {decision} (the last word before a flash 201)"
    )?;
    writeln!(md, "- generator: `voucher-bench` (open model: constant arrival rate, latency from the scheduled time; \"late starts\" count requests the generator itself sent > 10 ms late) unless a row says redis-benchmark")?;
    writeln!(md, "- a step is *sustained* when achieved >= 97% of offered, late starts <= 1%, no errors, at most 0.1% of its answers 503 and p99 < 100 ms; a sale's step also needs exactly 1,000 issued, the p99 of its 201s and of its 409s each under 100 ms, and at most 0.5% of the requests after the sell-out at a core")?;
    writeln!(md, "- connections: {SALE_CONNECTIONS} for sales and accepting runs, {FAST_CONNECTIONS} for the reject-path comparison")?;
    writeln!(md, "- these machines have 2 shared, noisy cores: compare ratios and counts, not absolute rates, across runs\n")?;
    writeln!(
        md,
        "| measure | ours | baseline / limit | ratio | notes |\n|---|---|---|---|---|"
    )?;
    for row in &run.table {
        writeln!(md, "{row}")?;
    }
    writeln!(md, "\n![latency over time](flash-sale-latency.png)\n\n![issued uses over time](flash-sale-issued.png)\n")?;
    md.push_str(&run.report);
    bounds::write(&mut md, &run.found, run.sale_burst.as_ref());
    std::fs::write(run.out.join("REPORT.md"), &md)?;
    println!("{md}");
    Ok(())
}

/// ACCEPT.md (flash) or ACCEPT-standard.md: the accepting ladder at a core, `section`,
/// with how it was run and the invariant check below it.
pub fn write_accept(run: &Run, mode: &str, section: &str) -> anyhow::Result<()> {
    let (file, command) = match mode {
        "standard" => (
            "ACCEPT-standard.md",
            "ACCEPT_MODE=standard BENCH_ONLY=accept ./loadtest/bench.sh",
        ),
        _ => ("ACCEPT.md", "BENCH_ONLY=accept ./loadtest/bench.sh"),
    };
    let title = format!("Where an accepted {mode} reservation's time goes");
    write_table(run, file, &title, command, section)
}

/// OVERLOAD.md: the section "Overload", with how it was run and the invariant check.
pub fn write_overload(run: &Run, section: &str) -> anyhow::Result<()> {
    write_table(
        run,
        "OVERLOAD.md",
        "Overload: a core and the edge offered more than they take",
        "BENCH_ONLY=overload ./loadtest/bench.sh",
        section,
    )
}

/// RATE-LIMITS.md: the rows of [`Run::rate_limit_cost`] and [`Run::access_log_cost`]
/// alone, with how they were made.
pub fn write_rate_limits(run: &Run) -> anyhow::Result<()> {
    write_table(
        run,
        "RATE-LIMITS.md",
        "What the edge's rate limits and access log cost",
        "BENCH_ONLY=rate-limits ./loadtest/bench.sh",
        "",
    )
}

/// The REJECT.md of `reject`: the edge's reject path against the servers that bound it.
pub fn write_reject(run: &Run) -> anyhow::Result<()> {
    write_table(
        run,
        "REJECT.md",
        "The edge's reject path against the framework's and other servers' ceilings",
        "BENCH_ONLY=reject ./loadtest/bench.sh",
        &run.report,
    )
}

/// The SALE.md of `sale`: the flash sale through the edge beside the edge's reject path,
/// in one run (the sale's rate is judged against the reject path's).
pub fn write_sale(run: &Run) -> anyhow::Result<()> {
    write_table(
        run,
        "SALE.md",
        "The flash sale through the edge, beside the edge's reject path",
        "BENCH_ONLY=sale ./loadtest/bench.sh",
        &run.report,
    )
}

/// The MANY.md of `many`: ten flash vouchers selling out together through every edge.
pub fn write_many(run: &Run) -> anyhow::Result<()> {
    write_table(
        run,
        "MANY.md",
        "Many hot vouchers at once, through every edge",
        "./loadtest/bench-scaled.sh",
        &run.report,
    )
}

/// The MEMORY.md of `memory`: the edge's and a core's resident memory, part by part.
pub fn write_memory(run: &Run) -> anyhow::Result<()> {
    write_table(
        run,
        "MEMORY.md",
        "What the edge's and a core's resident memory is made of",
        "BENCH_ONLY=memory ./loadtest/bench.sh",
        &run.report,
    )
}

/// The SOAK.md of `soak`: memory from minute 2 to the end, every sale exact.
pub fn write_soak(run: &Run) -> anyhow::Result<()> {
    write_table(
        run,
        "SOAK.md",
        "Soak: flash sales back to back, the memory of the edge and the cores",
        "OUT=reports/soak BENCH_ONLY=soak ./loadtest/bench.sh",
        &run.report,
    )
}

/// A report of `run`'s table, with how it was run, and `more` below it.
fn write_table(
    run: &Run,
    file: &str,
    title: &str,
    command: &str,
    more: &str,
) -> anyhow::Result<()> {
    let mut md = format!("# {title}\n\n");
    md.push_str(&format!(
        "- when: {}\n- machine: {}\n- command: `{command}`\n\
         - each edge: the release binary with `config/edge.yaml`; wrk from the same 2 shared cores\n\n",
        chrono::Utc::now().to_rfc3339(),
        probe::machine()
    ));
    md.push_str("| measure | ours | baseline | ratio | notes |\n|---|---|---|---|---|\n");
    for row in &run.table {
        md.push_str(row);
        md.push('\n');
    }
    md.push_str(more);
    std::fs::write(run.out.join(file), &md)?;
    println!("{md}");
    Ok(())
}

/// The REPORT.md of `big-voucher`: how it was run, then its table.
pub fn write_big_report(args: &BigArgs, table: &[String]) -> anyhow::Result<()> {
    let (uses, rate, threshold_us) = (args.uses, args.rate, args.slow_us);
    let mut md = String::new();
    writeln!(md, "# A flash voucher of {uses} uses\n")?;
    writeln!(md, "- when: {}", chrono::Utc::now().to_rfc3339())?;
    writeln!(md, "- machine: {}", probe::machine())?;
    writeln!(
        md,
        "- command: `USES={uses} BIG_RATE={rate} SLOW_US={threshold_us} ./loadtest/big-voucher.sh`"
    )?;
    writeln!(md, "- method: one request per new customer (per-user limit 1) sent to a core at a constant rate; Redis's own slow log (`slowlog-log-slower-than`) records every command, script or not, slower than the threshold; reconciliation figures are the core's `voucher_reconcile_duration_seconds` and `voucher_reconcile_checked_total`\n")?;
    writeln!(md, "| measure | result | notes |\n|---|---|---|")?;
    for row in table {
        writeln!(md, "{row}")?;
    }
    std::fs::write(args.out.join("REPORT.md"), &md)?;
    print!("{md}");
    Ok(())
}
