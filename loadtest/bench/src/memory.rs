//! The memory account: what the edge's and a core's resident memory is made of, measured
//! part by part on the running stack (MEMORY.md).
//!
//! - at rest: the process as started (binary and libraries mapped from files, threads,
//!   pools, runtime), from `/proc/PID/status` (`RssFile`, `RssAnon`, `Threads`);
//! - per client connection: 1,024 keep-alive connections opened, each after one request,
//!   and held (the buffers a server keeps per connection);
//! - what the allocator keeps: the same after they close;
//! - a sale through the edge with 1,024 connections: the peak while requests are in flight;
//! - the broker stalled (`SIGSTOP`) while a core accepts: librdkafka's queue of events
//!   nobody acknowledges, which grows until its bound (`kafka.queue_max_kbytes`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::ladder::{reserve_plan, reserve_request, SALE_CONNECTIONS};
use crate::load;
use crate::probe::{self, ProcStatus};
use crate::run::Run;

/// The processes accounted for, by their pid files (`scripts/lib.sh`).
const EDGE_PID: &str = "run/edge.pid";
const CORE_PID: &str = "run/core.pid";
const BROKER_PID: &str = "run/broker.pid";

impl Run {
    pub async fn memory_account(&mut self, sale_rate: u64, step: Duration) -> anyhow::Result<()> {
        eprintln!("memory account");
        // A voucher sold out at once: every request of the held connections is a 409, from
        // the edge itself (its flag) or from the core (its gate).
        let code = format!("M{}", self.run_id);
        self.stack.create_voucher(&code, 1, "flash").await?;
        let first = load::run(reserve_plan(
            self.core,
            1,
            Duration::from_secs(1),
            &code,
            "m",
            1,
        ))
        .await?;
        anyhow::ensure!(
            first.count(|s| s.status == 201) == 1,
            "the one use of {code} was not taken"
        );
        self.stack.flag_sold_out(&code).await?;
        for (name, target, pid) in [
            ("edge", self.edge, EDGE_PID),
            ("core 1", self.core, CORE_PID),
        ] {
            tokio::time::sleep(Duration::from_secs(2)).await;
            let rest = probe::proc_status(pid)?;
            let held = load::hold(target, SALE_CONNECTIONS, reserve_request(&code, "h")).await?;
            tokio::time::sleep(Duration::from_secs(1)).await;
            let holding = probe::proc_status(pid)?;
            drop(held);
            tokio::time::sleep(Duration::from_secs(3)).await;
            let after = probe::proc_status(pid)?;
            self.table.push(format!(
                "| {name}: at rest | {} | | | {} |",
                mib(rest.rss),
                parts(&rest)
            ));
            self.table.push(format!(
                "| {name}: {SALE_CONNECTIONS} keep-alive connections held, one request each | {} | at rest {} | {:.1} KiB per connection | {} |",
                mib(holding.rss),
                mib(rest.rss),
                (holding.rss - rest.rss) * 1024.0 / SALE_CONNECTIONS as f64,
                parts(&holding)
            ));
            self.table.push(format!(
                "| {name}: 3 s after they closed | {} | at rest {} | {:+.1} MiB kept | {} |",
                mib(after.rss),
                mib(rest.rss),
                after.rss - rest.rss,
                parts(&after)
            ));
        }

        // A sale through the edge at `sale_rate`, both processes sampled every 100 ms.
        let sale = format!("M{}S", self.run_id);
        self.stack.create_voucher(&sale, 1000, "flash").await?;
        let (before_edge, before_core) =
            (probe::proc_status(EDGE_PID)?, probe::proc_status(CORE_PID)?);
        let peaks = sample_peaks(&[EDGE_PID, CORE_PID], async {
            load::run(reserve_plan(
                self.edge,
                sale_rate,
                step,
                &sale,
                "s",
                SALE_CONNECTIONS,
            ))
            .await
        })
        .await;
        let (outcome, peaks) = (peaks.0?, peaks.1);
        crate::invariants::remember_accepted(&self.accepted, &sale, "s", &outcome);
        for (name, before, peak) in [
            ("edge", before_edge, peaks[0]),
            ("core 1", before_core, peaks[1]),
        ] {
            self.table.push(format!(
                "| {name}: peak in a sale at {sale_rate}/s through the edge, {SALE_CONNECTIONS} connections | {} | before it {} | {:+.1} MiB | {} issued, p99 {} |",
                mib(peak),
                mib(before.rss),
                peak - before.rss,
                outcome.count(|s| s.status == 201),
                crate::report::fmt_ms(outcome.percentile(99.0, |s| s.status != 0))
            ));
        }

        // The broker stalled while core 1 accepts: events of committed uses pile up in
        // librdkafka's queue (nobody waits for them with PostgreSQL deciding).
        let stalled = format!("M{}B", self.run_id);
        self.stack
            .create_voucher(&stalled, 10_000_000, "flash")
            .await?;
        let rate = (sale_rate / 2).max(500);
        let not_written = (
            "voucher_publish_duration_seconds_count",
            [("result", "not_written")],
        );
        let dropped_before = self
            .stack
            .core_counter(not_written.0, &not_written.1)
            .await?;
        let before = probe::proc_status(CORE_PID)?;
        signal(BROKER_PID, "STOP")?;
        let stall = sample_peaks(&[CORE_PID], async {
            load::run(reserve_plan(self.core, rate, step * 2, &stalled, "b", 256)).await
        })
        .await;
        signal(BROKER_PID, "CONT")?;
        let (outcome, peak) = (stall.0?, stall.1[0]);
        crate::invariants::remember_accepted(&self.accepted, &stalled, "b", &outcome);
        let dropped = self
            .stack
            .core_counter(not_written.0, &not_written.1)
            .await?
            - dropped_before;
        self.table.push(format!(
            "| core 1: the broker stopped (SIGSTOP) for {} s while it accepts {rate}/s | {} | before it {} | {:+.1} MiB | {} accepted; events dropped at the full queue: {dropped:.0} |",
            (step * 2).as_secs(),
            mib(peak),
            mib(before.rss),
            peak - before.rss,
            outcome.count(|s| s.status == 201),
        ));
        Ok(())
    }
}

fn mib(v: f64) -> String {
    format!("{v:.1} MiB")
}

fn parts(s: &ProcStatus) -> String {
    format!(
        "anonymous {:.1} MiB, from files {:.1} MiB, {} threads",
        s.anon, s.file, s.threads
    )
}

/// Runs `work` while reading each pid file's process's RSS every 100 ms; its result and
/// each process's peak (MiB).
async fn sample_peaks<T>(
    pids: &[&'static str],
    work: impl std::future::Future<Output = T>,
) -> (T, Vec<f64>) {
    let peaks = Arc::new(Mutex::new(vec![0.0_f64; pids.len()]));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peaks, done, pids) = (peaks.clone(), done.clone(), pids.to_vec());
        tokio::spawn(async move {
            while !done.load(Ordering::Relaxed) {
                for (k, pid) in pids.iter().enumerate() {
                    if let (Some(rss), Ok(mut p)) = (probe::rss_mib(pid), peaks.lock()) {
                        p[k] = p[k].max(rss);
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let out = work.await;
    done.store(true, Ordering::Relaxed);
    let _ = sampler.await;
    let peaks = peaks.lock().map(|p| p.clone()).unwrap_or_default();
    (out, peaks)
}

/// Sends `SIGNAL` to the process of a pid file.
fn signal(pid_file: &str, signal: &str) -> anyhow::Result<()> {
    let pid = std::fs::read_to_string(pid_file)?;
    let status = std::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.trim())
        .status()?;
    anyhow::ensure!(status.success(), "kill -{signal} {pid_file} failed");
    Ok(())
}
