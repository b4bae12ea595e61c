//! Benchmark 2, the edge's reject path (a sold-out flag) against servers answering the
//! same 409, each in a process of its own: a bare hyper server (`bare.rs`), a minimal
//! Pingora `ProxyHttp` answering from `request_filter` (`bin/minimal-pingora.rs`: the
//! framework's own ceiling) and nginx with one worker (the server operators know).
//! Ladders with our generator for each, one after the other; then wrk against each,
//! interleaved over [`WRK_ROUNDS`] rounds, the median taken: a single wrk run of one
//! server moved by 10% between runs on two shared cores, more than the edge's own cost
//! changed (`reports/callgrind/EDGE.md`). The rows say which part of the edge's cost is
//! the framework and which is ours.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::bounds::{self, Asked, PathFound};
use crate::cpu::CpuSpent;
use crate::ladder::{best_rate, climb, reserve_plan, Step, FAST_CONNECTIONS, WARM_UP};
use crate::load;
use crate::report::write_steps;
use crate::run::Run;
use crate::wrk::wrk_rate;

/// Rounds of wrk against every server, interleaved.
const WRK_ROUNDS: usize = 3;

/// One server's reject path: its ladder (each step with the CPU it cost by process), its
/// wrk rates (one per round; empty without wrk).
struct Measured {
    steps: Vec<Step>,
    wrk_rounds: Vec<f64>,
}

impl Measured {
    fn ladder(&self) -> f64 {
        best_rate(&self.steps)
    }

    /// The median of the wrk rounds.
    fn wrk(&self) -> Option<f64> {
        let mut rates = self.wrk_rounds.clone();
        rates.sort_by(f64::total_cmp);
        rates.get(rates.len() / 2).copied()
    }

    /// The rounds, as the report's notes give them.
    fn wrk_listed(&self) -> String {
        let rates: Vec<String> = self.wrk_rounds.iter().map(|r| format!("{r:.0}")).collect();
        rates.join(", ")
    }
}

/// A baseline server, started for its measurement and stopped after it.
struct Baseline {
    name: &'static str,
    addr: SocketAddr,
    child: Child,
    /// nginx's prefix directory (config, pid, logs), removed after the run.
    dir: Option<PathBuf>,
}

impl Drop for Baseline {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// nginx answering every request with the edge's 409 body (one worker, keep-alive, no
/// access log), under a prefix directory of its own.
fn nginx(addr: SocketAddr) -> anyhow::Result<Baseline> {
    let dir = std::env::temp_dir().join(format!("voucher-bench-nginx-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("logs"))?;
    let conf = format!(
        "worker_processes 1;\ndaemon off;\npid {dir}/nginx.pid;\nerror_log {dir}/logs/error.log;\n\
         events {{ worker_connections 4096; }}\n\
         http {{\n  access_log off;\n  keepalive_requests 10000000;\n  keepalive_timeout 60s;\n\
           client_body_temp_path {dir}/body;\n\
           server {{\n    listen {addr};\n    location / {{\n      default_type application/json;\n\
               return 409 '{body}';\n    }}\n  }}\n}}\n",
        dir = dir.display(),
        body = crate::bare::BODY,
    );
    let path = dir.join("nginx.conf");
    std::fs::write(&path, conf)?;
    let child = Command::new("nginx")
        .arg("-p")
        .arg(&dir)
        .arg("-c")
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    Ok(Baseline {
        name: "nginx",
        addr,
        child,
        dir: Some(dir),
    })
}

/// A binary of this package (`voucher-bench` itself, or one of `src/bin`).
fn sibling(name: &str) -> anyhow::Result<PathBuf> {
    let me = std::env::current_exe()?;
    Ok(match name {
        "voucher-bench" => me,
        _ => me.with_file_name(name),
    })
}

fn spawn(
    name: &'static str,
    addr: SocketAddr,
    bin: &str,
    args: &[&str],
) -> anyhow::Result<Baseline> {
    let child = Command::new(sibling(bin)?)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    Ok(Baseline {
        name,
        addr,
        child,
        dir: None,
    })
}

impl Run {
    pub async fn reject_path(&mut self, rates: &[u64], step: Duration) -> anyhow::Result<()> {
        let (stack, run_id, edge) = (&self.stack, &self.run_id, self.edge);
        eprintln!("edge reject path vs minimal Pingora, bare 409 server and nginx");
        let code = format!("X{run_id}");
        stack.create_voucher(&code, 1, "flash").await?;
        stack.flag_sold_out(&code).await?;
        let mut ours = measure(edge, rates, step, &code).await?;
        // The same sold-out voucher straight at a core: the path of the requests sent on
        // before the edge's flag is in (the gate's refusal, and the core's lookup of the
        // orderId in PostgreSQL, whose row would be a retry's answer).
        eprintln!("a core's reject path");
        let at_core = measure(self.core, rates, step, &code).await?;
        let bare_addr: SocketAddr = "127.0.0.1:18409".parse()?;
        let pingora_addr: SocketAddr = "127.0.0.1:18410".parse()?;
        let nginx_addr: SocketAddr = "127.0.0.1:18411".parse()?;
        // Each baseline stays up until the wrk rounds are over (idle meanwhile).
        let mut servers = Vec::new();
        let mut baselines = Vec::new();
        for which in ["bare", "minimal Pingora", "nginx"] {
            let started = match which {
                "bare" => spawn(
                    which,
                    bare_addr,
                    "voucher-bench",
                    &["bare-409", "127.0.0.1:18409"],
                ),
                "nginx" => nginx(nginx_addr),
                _ => spawn(
                    which,
                    pingora_addr,
                    "minimal-pingora",
                    &["127.0.0.1:18410", "2"],
                ),
            };
            let server = match started {
                Ok(server) => server,
                Err(e) => {
                    eprintln!("  {which} did not start: {e:#}");
                    continue;
                }
            };
            tokio::time::sleep(Duration::from_millis(500)).await;
            let measured = measure(server.addr, rates, step, &code).await;
            baselines.push((server.name, measured?));
            servers.push(server);
        }
        eprintln!("wrk, {WRK_ROUNDS} rounds, servers interleaved");
        for _ in 0..WRK_ROUNDS {
            // The flag may have lapsed while the baselines' ladders ran: set it again,
            // so that every request of the round is the edge's own answer.
            stack.flag_sold_out(&code).await?;
            if let Some(rate) = wrk_rate(edge, &code).await {
                ours.wrk_rounds.push(rate);
            }
            for (server, (_, measured)) in servers.iter().zip(baselines.iter_mut()) {
                if let Some(rate) = wrk_rate(server.addr, &code).await {
                    measured.wrk_rounds.push(rate);
                }
            }
        }
        drop(servers);
        let find = |name: &str| baselines.iter().find(|(n, _)| *n == name).map(|(_, m)| m);
        let ratio = |a: f64, b: f64| a / b.max(1.0);
        let mut rows = Vec::new();
        if let Some(bare) = find("bare") {
            rows.push(format!(
                "| Edge reject path (sold-out flag) vs bare HTTP server answering the same 409 (ours, both) | {:.0}/s | {:.0}/s | {:.2} | the limit for the edge on this box |",
                ours.ladder(), bare.ladder(), ratio(ours.ladder(), bare.ladder())
            ));
            if let (Some(e), Some(b)) = (ours.wrk(), bare.wrk()) {
                rows.push(format!(
                    "| Edge reject path vs bare 409 server, closed loop, 64 connections (wrk) | {e:.0}/s | {b:.0}/s | {:.2} | wrk -t1 -c64 -d5s, median of {WRK_ROUNDS} interleaved rounds (edge {}; bare {}); every answer a 409 |",
                    ratio(e, b),
                    ours.wrk_listed(),
                    bare.wrk_listed()
                ));
            }
        }
        for (name, what) in [
            (
                "minimal Pingora",
                "a minimal Pingora ProxyHttp answering from request_filter (2 threads, mimalloc)",
            ),
            ("nginx", "nginx, one worker, `return 409`"),
        ] {
            let Some(m) = find(name) else { continue };
            rows.push(format!(
                "| Edge reject path vs {what} (ours) | {:.0}/s | {:.0}/s | {:.2} | |",
                ours.ladder(),
                m.ladder(),
                ratio(ours.ladder(), m.ladder())
            ));
            if let (Some(e), Some(b)) = (ours.wrk(), m.wrk()) {
                rows.push(format!(
                    "| Edge reject path vs {what} (wrk) | {e:.0}/s | {b:.0}/s | {:.2} | wrk -t1 -c64 -d5s, median of {WRK_ROUNDS} interleaved rounds ({name} {}) |",
                    ratio(e, b),
                    m.wrk_listed()
                ));
            }
        }
        if let (Some(p), Some(b)) = (find("minimal Pingora"), find("bare")) {
            rows.push(format!(
                "| Minimal Pingora vs bare 409 server: the framework's ceiling (ours / wrk) | {:.0}/s / {} | {:.0}/s / {} | {:.2} / {} | |",
                p.ladder(),
                p.wrk().map_or("-".into(), |w| format!("{w:.0}/s")),
                b.ladder(),
                b.wrk().map_or("-".into(), |w| format!("{w:.0}/s")),
                ratio(p.ladder(), b.ladder()),
                match (p.wrk(), b.wrk()) {
                    (Some(p), Some(b)) => format!("{:.2}", ratio(p, b)),
                    _ => "-".into(),
                },
            ));
        }
        rows.push(format!(
            "| A core's reject path (the gate's OUT_OF_STOCK 409), straight at core 1 (ours) | {:.0}/s | edge {:.0}/s | {:.2} | what each request sent on after a sell-out costs; CPU per answer below |",
            at_core.ladder(),
            ours.ladder(),
            ratio(at_core.ladder(), ours.ladder())
        ));
        self.table.extend(rows);
        self.found_reject(&ours, &at_core, find("bare"), find("minimal Pingora"));
        write_steps(
            &mut self.report,
            "Edge reject path ladder (ours)",
            &ours.steps,
        );
        write_cpu(
            &mut self.report,
            "CPU per rejected answer by process: the edge's own 409s",
            &ours,
        );
        write_steps(
            &mut self.report,
            "A core's reject path ladder, straight at core 1 (ours)",
            &at_core.steps,
        );
        write_cpu(
            &mut self.report,
            "CPU per rejected answer by process: a core's 409s",
            &at_core,
        );
        for (name, m) in &baselines {
            write_steps(
                &mut self.report,
                &format!("{name} 409 server ladder (ours)"),
                &m.steps,
            );
        }
        Ok(())
    }
}

impl Run {
    /// The reject paths' standing: the edge's in both measures (the open-model ladder and
    /// wrk), each asked what [`edge_asked`] says; the sale is asked for 0.8 of the edge's
    /// ladder.
    fn found_reject(
        &mut self,
        ours: &Measured,
        at_core: &Measured,
        bare: Option<&Measured>,
        pingora: Option<&Measured>,
    ) {
        let ladder = |m: Option<&Measured>| m.map(Measured::ladder);
        let asked = edge_asked(ladder(bare), ladder(pingora));
        self.found(PathFound::from_ladder(
            bounds::EDGE_REJECT,
            &ours.steps,
            asked,
        ));
        // The same ask in wrk's closed loop, the second measure.
        let wrk = |m: Option<&Measured>| m.and_then(Measured::wrk);
        let wrk_asked = edge_asked(wrk(bare), wrk(pingora));
        if let Some(edge) = ours.wrk() {
            let failed = wrk_asked.as_ref().filter(|a| edge < a.rate).map(|a| {
                (
                    format!("wrk -t1 -c64 -d5s, median of {WRK_ROUNDS} rounds"),
                    format!("{edge:.0}/s, under {:.0}/s ({})", a.rate, a.what),
                    None,
                )
            });
            self.found(PathFound {
                path: "The edge's reject path, closed loop of 64 connections (wrk)".into(),
                sustained: Some((edge, None)),
                failed,
                asked: wrk_asked,
                climbs: false,
            });
        }
        self.found(PathFound::from_ladder(
            "A core's reject path (the gate's OUT_OF_STOCK)",
            &at_core.steps,
            None,
        ));
        if let Some(sale) = self.found_mut(bounds::SALE) {
            sale.asked = Some(Asked {
                rate: 0.8 * ours.ladder(),
                what: "0.8 of the edge's reject path".into(),
            });
        }
    }
}

/// What the edge's reject path is asked to reach in one measure, from the bare server's
/// and the minimal Pingora's rates in it: 0.8 of the bare server's, or, where the minimal
/// Pingora itself stays below that, 0.95 of the minimal Pingora's.
fn edge_asked(bare: Option<f64>, pingora: Option<f64>) -> Option<Asked> {
    match (bare, pingora) {
        (Some(b), Some(p)) if p < 0.8 * b => Some(Asked {
            rate: 0.95 * p,
            what: "0.95 of the minimal Pingora, which stays below 0.8 of the bare server".into(),
        }),
        (Some(b), _) => Some(Asked {
            rate: 0.8 * b,
            what: "0.8 of the bare server".into(),
        }),
        (None, _) => None,
    }
}

/// The CPU table of a ladder: every process's CPU per answer, step by step (user plus
/// system time from `/proc`, before and after the step; the bare server and the minimal
/// Pingora run as processes of this generator, so only ours are tabled).
fn write_cpu(report: &mut String, title: &str, m: &Measured) {
    use std::fmt::Write as _;
    let header = CpuSpent::header();
    let columns = header.matches('|').count() + 3;
    let _ = writeln!(
        report,
        "\n## {title}\n\n| offered/s | answered/s | {header} |\n|{}",
        "---|".repeat(columns)
    );
    for step in &m.steps {
        let Some(spent) = &step.cpu else { continue };
        let mut cells = vec![
            step.rate.to_string(),
            format!("{:.0}", step.outcome.achieved_rate()),
        ];
        cells.extend(spent.cells(step.outcome.completed(), 2.0));
        let _ = writeln!(report, "| {} |", cells.join(" | "));
    }
}

/// The open-model ladder of sold-out reservations at `target` (wrk comes later, for every
/// server in turn).
async fn measure(
    target: SocketAddr,
    rates: &[u64],
    step: Duration,
    code: &str,
) -> anyhow::Result<Measured> {
    // A warm-up first, neither timed nor reported: each server is started just before
    // its ladder, and both Pingora servers failed their first step of 10,000/s cold (p99
    // 107 and 41 ms, late starts) and then held 50,000/s (runs of 2026-12-01).
    if let Some(&first) = rates.first() {
        let warm = WARM_UP.min(step);
        load::run(reserve_plan(
            target,
            first,
            warm,
            code,
            "w",
            FAST_CONNECTIONS,
        ))
        .await?;
    }
    let steps = climb(rates, |rate| {
        let code = code.to_owned();
        async move {
            let outcome = load::run(reserve_plan(
                target,
                rate,
                step,
                &code,
                "x",
                FAST_CONNECTIONS,
            ))
            .await?;
            let note = format!("{} answered 409", outcome.count(|s| s.status == 409));
            Ok(Step {
                unmet: None,
                cpu: None,
                rate,
                outcome,
                note,
            })
        }
    })
    .await?;
    Ok(Measured {
        steps,
        wrk_rounds: Vec::new(),
    })
}
