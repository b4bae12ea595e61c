//! Benchmark 2, the edge's reject path (a sold-out flag) against a bare HTTP server
//! answering the same 409 (`bare.rs`, in a process of its own): ladders with our
//! generator, then with wrk.

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::ladder::{best_rate, climb, reserve_plan, Step, FAST_CONNECTIONS};
use crate::load;
use crate::report::write_steps;
use crate::run::Run;
use crate::wrk::wrk_rate;

impl Run {
    pub async fn reject_path(&mut self, rates: &[u64], step: Duration) -> anyhow::Result<()> {
        let (stack, run_id, edge) = (&self.stack, &self.run_id, self.edge);
        eprintln!("edge reject path vs bare 409 server");
        let code = format!("X{run_id}");
        stack.create_voucher(&code, 1, "flash").await?;
        stack.flag_sold_out(&code).await?;
        let edge_steps = climb(rates, |rate| {
            let code = code.clone();
            async move {
                let outcome =
                    load::run(reserve_plan(edge, rate, step, &code, "x", FAST_CONNECTIONS)).await?;
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
        let bare_steps = climb(rates, |rate| {
            let code = code.clone();
            async move {
                let outcome = load::run(reserve_plan(
                    bare_addr,
                    rate,
                    step,
                    &code,
                    "b",
                    FAST_CONNECTIONS,
                ))
                .await?;
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
}
