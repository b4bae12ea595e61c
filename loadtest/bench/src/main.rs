//! voucher-bench: runs the comparisons of `ARCHITECTURE.md` against the running stack (started by
//! `loadtest/bench.sh`) and writes a Markdown report with the ratio table, plus CSV files
//! for the plots.
//!
//!   voucher-bench OUT_DIR          the benchmark
//!   voucher-bench bare-409 ADDR    the bare 409 server it compares the edge with
//!   voucher-bench rate-limits OUT  only what the edge's rate limits and access log cost (RATE-LIMITS.md)
//!   voucher-bench big-voucher OUT  a flash voucher of a million uses: sale, reload,
//!                                  reconciliation, Redis's slow log (`loadtest/big-voucher.sh`)

mod bare;
mod big;
mod limits;
mod load;
mod probe;

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use load::{Outcome, Plan};
use probe::{peak_rss_mib, reserve_body, Stack};
use voucher_testkit::invariants::{self, Accepted};

/// Seconds of load per step of a ladder.
fn step() -> Duration {
    Duration::from_secs(
        std::env::var("STEP_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(3),
    )
}

/// The cores' `flash.decision`, as `bench.sh` passed it to them (the default otherwise).
fn decision() -> String {
    env_or("VOUCHER__FLASH__DECISION", "database")
}

pub(crate) fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.into())
}

fn ladder(name: &str, default: &str) -> Vec<u64> {
    env_or(name, default)
        .split(',')
        .filter_map(|v| v.trim().parse().ok())
        .collect()
}

/// One step of a ladder, summarised.
struct Step {
    rate: u64,
    outcome: Outcome,
    note: String,
}

impl Step {
    fn line(&self) -> String {
        let o = &self.outcome;
        format!(
            "| {} | {:.0} | {} | {} | {} | {} | {:.2} | {}{} |",
            self.rate,
            o.achieved_rate(),
            o.late,
            o.errors(),
            fmt_ms(o.percentile(50.0, |s| s.status != 0)),
            fmt_ms(o.percentile(99.0, |s| s.status != 0)),
            o.generator_cpu,
            if o.sustained(100.0) { "yes" } else { "no" },
            if self.note.is_empty() {
                String::new()
            } else {
                format!("; {}", self.note)
            },
        )
    }
}

pub(crate) fn fmt_ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.2} ms"))
}

const STEP_HEADER: &str = "| offered/s | achieved/s | late starts | errors | p50 | p99 | generator CPU (cores) | sustained |\n|---|---|---|---|---|---|---|---|";

/// Connections for a sale: enough that the burst of slow answers of its accepting phase
/// does not stop the generator from offering the load on time.
const SALE_CONNECTIONS: usize = 1024;
/// Connections for fast answers: more would only cost the shared CPU context switches.
const FAST_CONNECTIONS: usize = 256;

pub(crate) fn reserve_plan(
    target: SocketAddr,
    rate: u64,
    code: &str,
    tag: &'static str,
    connections: usize,
) -> Plan {
    let code = code.to_owned();
    Plan {
        target,
        rate,
        duration: step(),
        connections,
        request: Arc::new(move |i| {
            (
                hyper::Method::POST,
                format!("/vouchers/{code}/reservations"),
                Some(reserve_body(&code, i, tag)),
            )
        }),
    }
}

/// Climbs a ladder of rates until a step is not sustained; returns every step run.
async fn climb<F, Fut>(rates: &[u64], mut run_step: F) -> anyhow::Result<Vec<Step>>
where
    F: FnMut(u64) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Step>>,
{
    let mut steps = Vec::new();
    for &rate in rates {
        let step = run_step(rate).await?;
        let ok = step.outcome.sustained(100.0);
        eprintln!("  {rate}/s: {}", step.line());
        steps.push(step);
        if !ok {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(steps)
}

fn best(steps: &[Step]) -> Option<&Step> {
    steps.iter().rfind(|s| s.outcome.sustained(100.0))
}

fn best_rate(steps: &[Step]) -> f64 {
    best(steps).map_or(0.0, |s| s.outcome.achieved_rate())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("bare-409") {
        let addr = args
            .get(2)
            .ok_or_else(|| anyhow::anyhow!("bare-409 ADDR"))?
            .parse()?;
        return bare::serve(addr).await;
    }
    if args.get(1).map(String::as_str) == Some("rate-limits") {
        let out = args
            .get(2)
            .cloned()
            .unwrap_or_else(|| "reports/bench".into());
        let mut run = Run::connect(std::path::PathBuf::from(out)).await?;
        run.rate_limit_cost().await?;
        run.access_log_cost().await?;
        return run.write_rate_limits();
    }
    if args.get(1).map(String::as_str) == Some("big-voucher") {
        let out = args.get(2).cloned().unwrap_or_else(|| "reports/big".into());
        return big::run(std::path::PathBuf::from(out)).await;
    }
    let out = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| "reports/bench".into());
    let mut run = Run::connect(std::path::PathBuf::from(out)).await?;
    run.flash_sale().await?;
    run.reject_path().await?;
    run.rate_limit_cost().await?;
    run.access_log_cost().await?;
    run.hot_voucher().await?;
    run.gate_vs_redis_benchmark().await?;
    run.peak_memory().await?;
    run.invariants().await?;
    run.write_report()
}

/// One benchmark run: the stack it measures, and what it has found so far.
struct Run {
    stack: Stack,
    out: std::path::PathBuf,
    edge: SocketAddr,
    core: SocketAddr,
    /// Makes this run's voucher codes its own.
    run_id: String,
    /// Every 201 of every step, for the invariant check at the end.
    accepted: std::sync::Mutex<Vec<Accepted>>,
    /// Rows of the summary table.
    table: Vec<String>,
    /// The ladders, below the table.
    report: String,
}

impl Run {
    /// The stack of `loadtest/bench.sh`, as the environment names it.
    async fn connect(out: std::path::PathBuf) -> anyhow::Result<Self> {
        std::fs::create_dir_all(&out)?;
        let stack = Stack::from_env().await?;
        Ok(Self {
            edge: stack.edge.parse()?,
            core: stack.core.parse()?,
            stack,
            out,
            run_id: chrono::Utc::now().format("%H%M%S").to_string(),
            accepted: std::sync::Mutex::new(Vec::new()),
            table: Vec::new(),
            report: String::new(),
        })
    }

    /// 1. The flash sale through the edge: 1,000 uses, climbing to the highest rate sustained.
    async fn flash_sale(&mut self) -> anyhow::Result<()> {
        let (stack, run_id, accepted, edge) =
            (&self.stack, &self.run_id, &self.accepted, self.edge);
        eprintln!("flash sale through the edge");
        let sale_details = std::sync::Mutex::new(Vec::new());
        let flash_steps = climb(
            &ladder(
                "SALE_RATES",
                "1000,2000,3000,5000,10000,20000,30000,40000,50000",
            ),
            |rate| {
                let (stack, run_id, sale_details, accepted) =
                    (&stack, &run_id, &sale_details, &accepted);
                async move {
                    let code = format!("S{run_id}R{rate}");
                    stack.create_voucher(&code, 1000, "flash").await?;
                    let before = stack.sale_counters().await?;
                    let outcome =
                        load::run(reserve_plan(edge, rate, &code, "s", SALE_CONNECTIONS)).await?;
                    remember_accepted(accepted, &code, "s", &outcome);
                    let issued = outcome.count(|s| s.status == 201);
                    let (rows, used) = stack.wait_recorded(&code, issued as i64).await?;
                    let after = stack.sale_counters().await?;
                    let (oos0, tx0, w0, ctx0) = before;
                    let (oos1, tx1, w1, ctx1) = after;
                    let note = format!("issued {issued}, rows {rows}, used_count {used}");
                    if let Ok(mut d) = sale_details.lock() {
                        d.push((
                            rate,
                            issued,
                            rows,
                            used,
                            oos1 - oos0,
                            tx1 - tx0,
                            w1 - w0,
                            ctx1 - ctx0,
                        ));
                    }
                    Ok(Step {
                        rate,
                        outcome,
                        note,
                    })
                }
            },
        )
        .await?;
        let sustained = best(&flash_steps).is_some();
        let sale = best(&flash_steps).or(flash_steps.first());
        if let Some(s) = sale {
            let o = &s.outcome;
            let d = sale_details
                .lock()
                .ok()
                .and_then(|d| d.iter().find(|d| d.0 == s.rate).copied())
                .unwrap_or_default();
            write_samples(&self.out.join("flash-sale-samples.csv"), o)?;
            let which = if sustained {
                "highest sustained rate"
            } else {
                "no step sustained; lowest step"
            };
            self.table.push(format!(
                "| Flash sale, 1,000 uses, through the edge (ours) | {which} {:.0}/s (offered {}/s, {} late starts, generator {:.2} cores) | target 50,000/s | {:.2} of target | issued {} (must be 1,000), rows {}; rows below are this step |",
                o.achieved_rate(), s.rate, o.late, o.generator_cpu, o.achieved_rate() / 50_000.0, d.1, d.2
            ));
            self.table.push(format!(
                "| Flash sale latency, accepted (201) | p50 {} / p99 {} / max {} | p99 < 100 ms | {} | |",
                fmt_ms(o.percentile(50.0, |x| x.status == 201)),
                fmt_ms(o.percentile(99.0, |x| x.status == 201)),
                fmt_ms(o.percentile(100.0, |x| x.status == 201)),
                ratio_to_limit(o.percentile(99.0, |x| x.status == 201))
            ));
            self.table.push(format!(
                "| Flash sale latency, rejected (409) | p50 {} / p99 {} / max {} | p99 < 100 ms | {} | {} answered by the edge of {} |",
                fmt_ms(o.percentile(50.0, |x| x.status == 409)),
                fmt_ms(o.percentile(99.0, |x| x.status == 409)),
                fmt_ms(o.percentile(100.0, |x| x.status == 409)),
                ratio_to_limit(o.percentile(99.0, |x| x.status == 409)),
                o.count(|x| x.by_edge),
                o.count(|x| x.status == 409)
            ));
            self.table.push(format!(
                "| Requests that reached a core after the sell-out | {:.0} | {} requests sent | {:.4} of requests | flags last 2 s; each renewal forwards until the order list is in |",
                d.4, o.offered, d.4 / o.offered as f64
            ));
            self.table.push(format!(
                "| PostgreSQL transactions that wrote, for the sale | {} ({:.0} by the consumer) | 1,000 uses | {:.3} per use | {} commits in all: the rest are reads (progress of reconciliation and the lag monitor, partition ownership) |",
                d.6, d.7, d.6 as f64 / 1000.0, d.5
            ));
        }
        write_steps(
            &mut self.report,
            "Flash sale ladder (1,000-use flash voucher per step, through the edge; ours)",
            &flash_steps,
        );
        Ok(())
    }

    /// 2. The edge's reject path against a bare server answering the same 409.
    async fn reject_path(&mut self) -> anyhow::Result<()> {
        let (stack, run_id, edge) = (&self.stack, &self.run_id, self.edge);
        eprintln!("edge reject path vs bare 409 server");
        let code = format!("X{run_id}");
        stack.create_voucher(&code, 1, "flash").await?;
        stack.flag_sold_out(&code).await?;
        let reject_rates = ladder("REJECT_RATES", "10000,20000,30000,40000,50000,60000");
        let edge_steps = climb(&reject_rates, |rate| {
            let code = code.clone();
            async move {
                let outcome =
                    load::run(reserve_plan(edge, rate, &code, "x", FAST_CONNECTIONS)).await?;
                let note = format!("{} answered by the edge", outcome.count(|s| s.by_edge));
                Ok(Step {
                    rate,
                    outcome,
                    note,
                })
            }
        })
        .await?;
        let bare_addr: SocketAddr = "127.0.0.1:18409".parse()?;
        let mut bare = Command::new(std::env::current_exe()?)
            .args(["bare-409", &bare_addr.to_string()])
            .stdout(Stdio::null())
            .spawn()?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let bare_steps = climb(&reject_rates, |rate| {
            let code = code.clone();
            async move {
                let outcome =
                    load::run(reserve_plan(bare_addr, rate, &code, "b", FAST_CONNECTIONS)).await?;
                Ok(Step {
                    rate,
                    outcome,
                    note: String::new(),
                })
            }
        })
        .await;
        // The same comparison with wrk (a C generator, closed loop), which offers more load on
        // two shared cores than an open-model generator can.
        let wrk_edge = wrk_rate(edge, &code).await;
        let wrk_bare = wrk_rate(bare_addr, &code).await;
        let _ = bare.kill();
        let _ = bare.wait();
        let bare_steps = bare_steps?;
        if let (Some(e), Some(b)) = (wrk_edge, wrk_bare) {
            self.table.push(format!(
                "| Edge reject path vs bare 409 server, closed loop, 64 connections (wrk) | {e:.0}/s | {b:.0}/s | {:.2} | wrk -t1 -c64 -d5s; every answer a 409 |",
                e / b.max(1.0)
            ));
        }
        self.table.push(format!(
            "| Edge reject path (sold-out flag) vs bare HTTP server answering the same 409 (ours, both) | {:.0}/s | {:.0}/s | {:.2} | the limit for the edge on this box |",
            best_rate(&edge_steps), best_rate(&bare_steps), best_rate(&edge_steps) / best_rate(&bare_steps).max(1.0)
        ));
        write_steps(
            &mut self.report,
            "Edge reject path ladder (ours)",
            &edge_steps,
        );
        write_steps(
            &mut self.report,
            "Bare 409 server ladder (ours)",
            &bare_steps,
        );
        Ok(())
    }

    /// 3. Accepting reservations on one hot voucher, straight to a core: flash vs standard.
    async fn hot_voucher(&mut self) -> anyhow::Result<()> {
        let (stack, run_id, accepted, core) =
            (&self.stack, &self.run_id, &self.accepted, self.core);
        eprintln!("flash gate path vs standard PostgreSQL path, accepting, on one hot voucher");
        let accept_rates = ladder("ACCEPT_RATES", "250,500,1000,1500,2000,3000,4000");
        let mut hot = Vec::new();
        for mode in ["standard", "flash"] {
            let code = format!("H{}{run_id}", &mode[..1]);
            stack.create_voucher(&code, 10_000_000, mode).await?;
            let steps = climb(&accept_rates, |rate| {
                let (code, accepted) = (code.clone(), &accepted);
                async move {
                    let tag = if rate % 2 == 0 { "a" } else { "b" };
                    let outcome =
                        load::run(reserve_plan(core, rate, &code, tag, SALE_CONNECTIONS)).await?;
                    remember_accepted(accepted, &code, tag, &outcome);
                    let note = format!("{} accepted", outcome.count(|s| s.status == 201));
                    Ok(Step {
                        rate,
                        outcome,
                        note,
                    })
                }
            })
            .await?;
            hot.push((mode, steps));
        }
        let (std_best, flash_best) = (best_rate(&hot[0].1), best_rate(&hot[1].1));
        self.table.push(format!(
            "| Accepting on one hot voucher, at a core: flash gate path vs standard PostgreSQL path (ours) | {flash_best:.0}/s | {std_best:.0}/s | {:.2} | flash = Redis script + {} per use |",
            flash_best / std_best.max(1.0),
            match decision().as_str() {
                "broker" => "Kafka acks=all",
                _ => "PostgreSQL commit (grouped)",
            }
        ));
        for (mode, steps) in &hot {
            write_steps(
                &mut self.report,
                &format!("Hot voucher, {mode} mode, accepting, at a core (ours)"),
                steps,
            );
        }
        Ok(())
    }

    /// 4. The gate against redis-benchmark running the same script.
    async fn gate_vs_redis_benchmark(&mut self) -> anyhow::Result<()> {
        eprintln!("gate vs redis-benchmark");
        let rows = gate_vs_redis_benchmark(&self.run_id).await?;
        self.table.extend(rows);
        Ok(())
    }

    /// 5. Peak memory of the edge and the core after all runs.
    async fn peak_memory(&mut self) -> anyhow::Result<()> {
        let (edge_rss, core_rss) = (peak_rss_mib("run/edge.pid"), peak_rss_mib("run/core.pid"));
        self.table.push(format!(
            "| Peak RSS (VmHWM) after all runs | edge {} MiB, core {} MiB | | | |",
            edge_rss.map_or("?".into(), |v| format!("{v:.1}")),
            core_rss.map_or("?".into(), |v| format!("{v:.1}"))
        ));
        Ok(())
    }

    /// 6. The invariants over every voucher of this run, once the consumer caught up.
    async fn invariants(&mut self) -> anyhow::Result<()> {
        let accepted = self
            .accepted
            .lock()
            .map(|mut a| std::mem::take(&mut *a))
            .unwrap_or_default();
        let verdict = check_invariants(&self.stack, &accepted).await?;
        self.table.push(format!(
            "| Invariants 1-5 after all runs | {verdict} | | | {} accepted reservations checked |",
            accepted.len()
        ));
        Ok(())
    }

    /// REPORT.md: how it was measured, the summary table, then every ladder.
    fn write_report(&self) -> anyhow::Result<()> {
        let (table, report, out) = (&self.table, &self.report, &self.out);
        let mut md = String::new();
        writeln!(md, "# Benchmark report\n")?;
        writeln!(md, "- when: {}", chrono::Utc::now().to_rfc3339())?;
        writeln!(md, "- machine: {}", probe::machine())?;
        writeln!(md, "- command: `{}./loadtest/bench.sh` (steps of {} s; ladders in the environment: SALE_RATES, REJECT_RATES, ACCEPT_RATES)", match decision().as_str() { "database" => String::new(), other => format!("VOUCHER__FLASH__DECISION={other} ") }, step().as_secs())?;
        writeln!(
            md,
            "- the cores' `flash.decision`: {} (the last word before a flash 201)",
            decision()
        )?;
        writeln!(md, "- generator: `voucher-bench` (open model: constant arrival rate, latency from the scheduled time; \"late starts\" count requests the generator itself sent > 10 ms late) unless a row says redis-benchmark")?;
        writeln!(md, "- a step is *sustained* when achieved >= 97% of offered, late starts <= 1%, no errors and p99 < 100 ms")?;
        writeln!(md, "- connections: {SALE_CONNECTIONS} for sales and accepting runs, {FAST_CONNECTIONS} for the reject-path comparison")?;
        writeln!(md, "- these machines have 2 shared, noisy cores: compare ratios and counts, not absolute rates, across runs\n")?;
        writeln!(
            md,
            "| measure | ours | baseline / limit | ratio | notes |\n|---|---|---|---|---|"
        )?;
        for row in table {
            writeln!(md, "{row}")?;
        }
        writeln!(md, "\n![latency over time](flash-sale-latency.png)\n\n![issued uses over time](flash-sale-issued.png)\n")?;
        md.push_str(report);
        std::fs::write(out.join("REPORT.md"), &md)?;
        println!("{md}");
        Ok(())
    }
}

/// Requests per second wrk reaches against `target` with reservations for `code`
/// (closed loop: 64 connections, one request in flight each). `None` without wrk.
pub(crate) async fn wrk_rate(target: SocketAddr, code: &str) -> Option<f64> {
    // Keep the flag fresh: one request through the normal path first.
    let script = format!(
        "wrk.method = \"POST\"\nwrk.headers[\"Content-Type\"] = \"application/json\"\ncounter = 0\n\
         request = function()\n  counter = counter + 1\n  return wrk.format(nil, \"/vouchers/{code}/reservations\", nil, \
         '{{\"customerId\":\"w' .. counter .. '\",\"orderId\":\"{code}-w' .. counter .. '\",\"orderAmount\":250000}}')\nend\n"
    );
    let path = std::env::temp_dir().join(format!("voucher-bench-{}.lua", std::process::id()));
    std::fs::write(&path, script).ok()?;
    let output = Command::new("wrk")
        .args(["-t1", "-c64", "-d5s", "-s"])
        .arg(&path)
        .arg(format!("http://{target}"))
        .output()
        .ok()?;
    let _ = std::fs::remove_file(&path);
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .find_map(|l| {
            l.strip_prefix("Requests/sec:")
                .and_then(|v| v.trim().parse().ok())
        })
}

pub(crate) fn remember_accepted(
    into: &std::sync::Mutex<Vec<Accepted>>,
    code: &str,
    tag: &str,
    outcome: &Outcome,
) {
    if let Ok(mut list) = into.lock() {
        list.extend(outcome.samples.iter().filter(|s| s.status == 201).map(|s| {
            let (customer, order) = (
                format!("{tag}-c{}", s.index),
                format!("{code}-{tag}{}", s.index),
            );
            Accepted::new(code, &customer, &order)
        }));
    }
}

/// Waits for the consumer group, then checks invariants 1 to 5 on the bench's database.
pub(crate) async fn check_invariants(
    stack: &Stack,
    accepted: &[Accepted],
) -> anyhow::Result<String> {
    let kafka = voucher_core::config::KafkaSettings {
        brokers: env_or("KAFKA_BROKERS", "127.0.0.1:9092"),
        topic: env_or("KAFKA_TOPIC", "voucher-events"),
        group: env_or("KAFKA_GROUP", "voucher-writer"),
        consume: false,
        ..Default::default()
    };
    let progress = voucher_core::flash::events::progress::Progress::new(
        &kafka,
        voucher_core::store::Store::new(stack.db.clone()),
    )?;
    let caught_up = progress.wait_caught_up(Duration::from_secs(60)).await?;
    let gate =
        voucher_core::flash::gate::Gate::connect(&redis_settings(&env_or("GATE_PREFIX", "vg:")))
            .await?;
    let report = invariants::check_with_gate(&stack.db, &gate, accepted).await?;
    // Checked whether or not the writers caught up: with PostgreSQL deciding, rows precede
    // the 201s and the writers only meet duplicates; with the broker deciding, a row they
    // have not written yet shows as a violation.
    let lag = if caught_up {
        String::new()
    } else {
        "; the writers were still behind after 60 s".into()
    };
    Ok(if report.holds() {
        format!("hold ({} vouchers){lag}", report.vouchers_checked)
    } else {
        format!("VIOLATED: {}{lag}", report.violations.join("; "))
    })
}

/// The stack's Redis (`REDIS_URL`), with the gate's keys under `prefix`.
pub(crate) fn redis_settings(prefix: &str) -> voucher_core::config::RedisSettings {
    voucher_core::config::RedisSettings {
        url: env_or("REDIS_URL", "redis://127.0.0.1:6379/").into(),
        key_prefix: prefix.to_owned(),
        timeout: Duration::from_secs(2),
        ..Default::default()
    }
}

fn ratio_to_limit(p99: Option<f64>) -> String {
    p99.map_or("-".into(), |p| format!("{:.2} of the limit", p / 100.0))
}

fn write_steps(report: &mut String, title: &str, steps: &[Step]) {
    let _ = writeln!(report, "\n## {title}\n\n{STEP_HEADER}");
    for s in steps {
        let _ = writeln!(report, "{}", s.line());
    }
}

fn write_samples(path: &std::path::Path, o: &Outcome) -> anyhow::Result<()> {
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

/// Our gate client (the redis crate, from this process) against redis-benchmark, both
/// running the gate's reserve script on the same kind of state: accepting, and sold out.
async fn gate_vs_redis_benchmark(run_id: &str) -> anyhow::Result<Vec<String>> {
    use voucher_core::domain::{
        CustomerId, Money, OrderId, ReservationRequest, Voucher, VoucherCode, VoucherMode,
    };
    use voucher_core::flash::gate::{Gate, GateLoad, RESERVE_SCRIPT};
    let prefix = format!("bench{run_id}:");
    let gate = Gate::connect(&redis_settings(&prefix)).await?;
    let sha = redis::Script::new(RESERVE_SCRIPT).get_hash().to_owned();
    let requests: u64 = env_or("GATE_REQUESTS", "200000").parse()?;
    let now = chrono::Utc::now();
    let mut rows = Vec::new();
    for (label, remaining) in [("accepting", 100_000_000i64), ("sold out", 0)] {
        let code = VoucherCode::parse(format!(
            "G{}{run_id}",
            if remaining > 0 { "A" } else { "Z" }
        ))
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        let voucher = Voucher {
            code: code.clone(),
            discount_amount: Money::positive("discountAmount", 100_000)
                .map_err(|e| anyhow::anyhow!("{e:?}"))?,
            min_order_amount: Money::not_negative("minOrderAmount", 0)
                .map_err(|e| anyhow::anyhow!("{e:?}"))?,
            total_limit: 100_000_000,
            per_user_limit: 1,
            starts_at: now - chrono::Duration::hours(1),
            ends_at: now + chrono::Duration::days(1),
            mode: VoucherMode::Flash,
            created_at: now,
        };
        gate.load(
            &voucher,
            1,
            &GateLoad {
                remaining,
                ..Default::default()
            },
        )
        .await?;
        // redis-benchmark: 50 clients, random order and customer ids.
        let base = format!("{prefix}{{{}}}", code.as_str());
        let output = Command::new("redis-benchmark")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                "6379",
                "-c",
                "50",
                "-n",
                &requests.to_string(),
                "-r",
                "1000000000",
                "--csv",
            ])
            .args(["EVALSHA", &sha, "4"])
            .arg(format!("{base}:meta"))
            .arg(format!("{base}:remaining"))
            .arg(format!("{base}:users"))
            .arg(format!("{base}:orders"))
            .args(["o-__rand_int__", "c-__rand_int__", "250000", "900000"])
            .output()?;
        let text = String::from_utf8_lossy(&output.stdout);
        let theirs: f64 = text
            .lines()
            .filter_map(|l| {
                l.split("\",\"")
                    .nth(1)
                    .map(|v| v.trim_matches('"'))
                    .and_then(|v| v.parse().ok())
            })
            .next()
            .unwrap_or(0.0);
        // Ours: the same script through the Gate, 50 concurrent callers.
        let counter = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let started = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..50 {
            let (gate, counter, code) = (gate.clone(), counter.clone(), code.clone());
            tasks.push(tokio::spawn(async move {
                loop {
                    let i = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= requests {
                        return;
                    }
                    let (Ok(customer_id), Ok(order_id), Ok(order_amount)) = (
                        CustomerId::parse(format!("gc{i}")),
                        OrderId::parse(format!("go{i}")),
                        Money::positive("orderAmount", 250_000),
                    ) else {
                        continue;
                    };
                    let request = ReservationRequest {
                        voucher_code: code.clone(),
                        customer_id,
                        order_id,
                        order_amount,
                    };
                    let _ = gate.reserve(&request, 900_000).await;
                }
            }));
        }
        for t in tasks {
            t.await?;
        }
        let ours = requests as f64 / started.elapsed().as_secs_f64();
        rows.push(format!(
            "| Gate script, {label}: our gate client (50 callers) vs redis-benchmark (50 clients), same Lua script | {ours:.0}/s | {theirs:.0}/s (redis-benchmark) | {:.2} | the limit for the gate on this box |",
            ours / theirs.max(1.0)
        ));
        gate.unload(&code).await?;
    }
    Ok(rows)
}
