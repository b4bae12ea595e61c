//! `voucher-bench overload`: a core offered more than it takes. For each mode (flash, then
//! standard) on one hot voucher: the accepting ladders first, at one core and through the
//! edge, which find the rate each path sustains in this run; then open-model steps at 2, 4
//! and 10 times the core's rate (stopping early once the generator itself falls behind:
//! more than 1% late starts), and two closed-model steps of 1,000 connections each sending
//! as soon as it was answered: one whose clients wait a 503's `Retry-After` (plus jitter) as
//! the API asks, one whose clients send again at once; both at the core, then both through
//! the edge (whose own admission limit and per-voucher places then bound what reaches the
//! core). Each closed step must keep 0.9 of its own path's sustained rate: through the
//! edge, the edge's CPU shares the same two cores, so that path sustains less.
//! Each step has its voucher of its own, and every 201 of the run is checked against
//! PostgreSQL and the gate at the end. The section "Overload" of REPORT.md, and OVERLOAD.md.

use std::fmt::Write as _;
use std::time::Duration;

use crate::bounds::{accepting_path, Asked, Cost, PathFound};
use crate::cpu::{self, CpuSpent};
use crate::invariants::remember_accepted;
use crate::ladder::{best, climb, reserve_plan, Step, SALE_CONNECTIONS, WARM_UP};
use crate::load::{self, Client, Outcome};
use crate::report::fmt_ms;
use crate::run::Run;

/// Multiples of the sustained rate offered beyond it.
const FACTORS: [u64; 3] = [2, 4, 10];
/// Connections of the closed-model steps.
const CLOSED_CONNECTIONS: usize = 1000;
/// The closed-model steps: clients that wait the `Retry-After` of a 503, as the API asks,
/// then clients that send again at once (the most 1,000 connections can press).
const CLOSED_CLIENTS: [(Client, &str); 2] = [
    (Client::WaitsRetryAfter, "clients wait Retry-After"),
    (Client::Greedy, "clients resend at once"),
];

/// One step past the limit, summarised.
struct Row {
    mode: &'static str,
    offered: String,
    outcome: Outcome,
    /// The accepted rate this step must keep: 0.9 of the sustained rate of the mode on the
    /// step's path (at the core, or through the edge).
    floor: f64,
    /// CPU of every process of the stack over the step.
    cpu: CpuSpent,
}

impl Row {
    fn accepted_rate(&self) -> f64 {
        self.outcome.count(|s| s.status == 201) as f64 / self.outcome.elapsed.as_secs_f64()
    }

    fn line(&self) -> String {
        let o = &self.outcome;
        let answered = o.completed().max(1) as f64;
        let p99 = o.percentile(99.0, |s| s.status != 0);
        let late = o.late as f64 > 0.01 * o.offered as f64;
        let holds = if late {
            // Beyond the generator's own ceiling: the step measures the generator.
            "generator ceiling"
        } else if p99.is_some_and(|p| p < 100.0) && self.accepted_rate() >= self.floor {
            "yes"
        } else {
            "no"
        };
        format!(
            "| {} | {} | {:.0} | {:.0} | {:.0} | {:.1}% | {} | {} | {} | {:.1}% | {} | {} |",
            self.mode,
            self.offered,
            o.achieved_rate(),
            self.accepted_rate(),
            self.floor,
            100.0 * o.count(|s| s.status == 503) as f64 / answered,
            fmt_ms(o.percentile(50.0, |s| s.status != 0)),
            fmt_ms(p99),
            fmt_ms(o.percentile(99.0, |s| s.status == 201)),
            100.0 * o.late as f64 / o.offered.max(1) as f64,
            o.errors(),
            holds,
        )
    }

    /// A closed loop's standing: the accepts it kept against its floor, and why it did not
    /// hold if it did not (open steps past the limit measure the generator's ceiling).
    fn found(&self) -> Option<PathFound> {
        if !self.offered.starts_with("closed") {
            return None;
        }
        let o = &self.outcome;
        let cost = Cost {
            rate: 0,
            answers: o.completed(),
            cpu: self.cpu.clone(),
        };
        let mut why = Vec::new();
        match o.percentile(99.0, |s| s.status != 0) {
            Some(p) if p < 100.0 => {}
            p => why.push(format!(
                "p99 of all answers {}, not under 100 ms",
                fmt_ms(p)
            )),
        }
        if self.accepted_rate() < self.floor {
            why.push(format!(
                "{:.0} accepted/s, under the floor of {:.0}/s",
                self.accepted_rate(),
                self.floor
            ));
        }
        Some(PathFound {
            path: format!("Overload, {} mode, {}", self.mode, self.offered),
            sustained: Some((self.accepted_rate(), Some(cost.clone()))),
            failed: (!why.is_empty()).then(|| {
                (
                    format!("{:.0} answers/s", o.achieved_rate()),
                    why.join("; "),
                    Some(cost),
                )
            }),
            asked: Some(Asked {
                rate: self.floor,
                what: "0.9 of the path's sustained rate, p99 of all answers under 100 ms".into(),
            }),
            climbs: false,
        })
    }

    /// The step's CPU per answered request, by process, and the machine's share used.
    fn cpu_line(&self) -> String {
        let cells = self.cpu.cells(self.outcome.completed(), 2.0).join(" | ");
        format!("| {} | {} | {cells} |", self.mode, self.offered)
    }
}

impl Run {
    /// The section "Overload" of a report; the ladders through the edge and the closed
    /// loops go to [`Run::found`].
    pub async fn overload(
        &mut self,
        flash_rates: &[u64],
        standard_rates: &[u64],
        step: Duration,
        decision: &str,
    ) -> anyhow::Result<String> {
        let mut ladders = Vec::new();
        let mut rows = Vec::new();
        for (mode, rates) in [("flash", flash_rates), ("standard", standard_rates)] {
            let at_core = self
                .sustained(false, mode, rates, step, &mut ladders)
                .await?;
            let through_edge = self
                .sustained(true, mode, rates, step, &mut ladders)
                .await?;
            let (Some(sustained), Some(through_edge)) = (at_core, through_edge) else {
                // Nothing to overload in this mode; its ladders in the report say why, and
                // the other mode still runs.
                eprintln!("  a {mode} ladder had no sustained step: nothing to overload");
                continue;
            };
            let (base_rate, base_achieved) = sustained;
            let floor = 0.9 * base_achieved;
            let edge_floor = 0.9 * through_edge.1;
            for (k, factor) in FACTORS.iter().enumerate() {
                let rate = base_rate * factor;
                let code = format!("O{}{}X{k}", &mode[..1], self.run_id);
                let before = cpu::sample();
                let s = self.open_step(self.core, code, mode, rate, step).await?;
                let cpu = CpuSpent::between(&before, &cpu::sample());
                eprintln!("  {rate}/s: {}", s.line());
                let late = s.outcome.late as f64 > 0.01 * s.outcome.offered as f64;
                rows.push(Row {
                    mode,
                    offered: format!("{rate}/s ({factor}x)"),
                    outcome: s.outcome,
                    floor,
                    cpu,
                });
                // The generator's own ceiling: a higher rate would measure the generator.
                if late {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            let targets = [
                (self.core, "at the core", floor),
                (self.edge, "through the edge", edge_floor),
            ];
            let closed = targets
                .iter()
                .flat_map(|t| CLOSED_CLIENTS.iter().map(move |c| (t, c)));
            for (k, ((target, via, floor), (client, clients))) in closed.enumerate() {
                let code = format!("O{}{}C{k}", &mode[..1], self.run_id);
                self.stack.create_voucher(&code, 10_000_000, mode).await?;
                let plan = reserve_plan(*target, 1, step, &code, "o", CLOSED_CONNECTIONS);
                let before = cpu::sample();
                let outcome =
                    load::run_closed(*target, CLOSED_CONNECTIONS, step, plan.request, *client)
                        .await?;
                let cpu = CpuSpent::between(&before, &cpu::sample());
                remember_accepted(&self.accepted, &code, "o", &outcome);
                rows.push(Row {
                    mode,
                    offered: format!("closed, {CLOSED_CONNECTIONS} connections, {clients}, {via}"),
                    outcome,
                    floor: *floor,
                    cpu,
                });
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        for (mode, via, steps) in &ladders {
            if *via == "through the edge" {
                let path = accepting_path(mode, via);
                self.found(PathFound::from_ladder(&path, steps, None));
            }
        }
        for row in &rows {
            if let Some(found) = row.found() {
                self.found(found);
            }
        }
        section(step, decision, &ladders, &rows)
    }

    /// The accepting ladder of `mode` at the core, or through the edge, kept in `ladders`:
    /// its best sustained step's offered and achieved rates, if any step was sustained.
    async fn sustained<'a>(
        &self,
        through_edge: bool,
        mode: &'a str,
        rates: &[u64],
        step: Duration,
        ladders: &mut Vec<(&'a str, &'static str, Vec<Step>)>,
    ) -> anyhow::Result<Option<(u64, f64)>> {
        let (target, via, tag) = if through_edge {
            (self.edge, "through the edge", "E")
        } else {
            (self.core, "at a core", "L")
        };
        eprintln!("overload, {mode} mode: the sustained rate {via} first");
        // A warm-up first, neither timed nor reported, as in the accepting bench: a ladder's
        // first step otherwise meets cold pools and caches (its p99 was the worst of the
        // ladder in runs of 2026-12-06).
        if let Some(&first) = rates.first() {
            let code = format!("O{}{}{tag}WARM", &mode[..1], self.run_id);
            let warm = WARM_UP.min(step);
            self.open_step(target, code, mode, first, warm).await?;
        }
        let mut n = 0;
        let steps = climb(rates, |rate| {
            n += 1;
            let code = format!("O{}{}{tag}{n}", &mode[..1], self.run_id);
            self.open_step(target, code, mode, rate, step)
        })
        .await?;
        let sustained = best(&steps).map(|s| (s.rate, s.outcome.achieved_rate()));
        ladders.push((mode, via, steps));
        Ok(sustained)
    }

    /// One open-model step of reservations of a new voucher `code`, at `rate`, sent to
    /// `target`.
    async fn open_step(
        &self,
        target: std::net::SocketAddr,
        code: String,
        mode: &str,
        rate: u64,
        step: Duration,
    ) -> anyhow::Result<Step> {
        self.stack.create_voucher(&code, 10_000_000, mode).await?;
        let outcome = load::run(reserve_plan(
            target,
            rate,
            step,
            &code,
            "o",
            SALE_CONNECTIONS,
        ))
        .await?;
        remember_accepted(&self.accepted, &code, "o", &outcome);
        let note = format!(
            "{} accepted, {} answered 503",
            outcome.count(|s| s.status == 201),
            outcome.count(|s| s.status == 503)
        );
        Ok(Step {
            unmet: None,
            cpu: None,
            rate,
            outcome,
            note,
        })
    }
}

/// The section "Overload": how it was run, the steps past the limit, their CPU, and the
/// ladders that found each path's sustained rate.
fn section(
    step: Duration,
    decision: &str,
    ladders: &[(&str, &str, Vec<Step>)],
    rows: &[Row],
) -> anyhow::Result<String> {
    let mut md = String::from("\n## Overload\n\n");
    writeln!(
        md,
        "- steps of {} s; flash rates `OVERLOAD_FLASH_RATES`, standard `OVERLOAD_STANDARD_RATES`",
        step.as_secs()
    )?;
    writeln!(
        md,
        "- the cores: release binaries with `config/core.toml` and its `[admission]` \
             defaults, `flash.decision` = {}; the load goes to one core, straight, except the \
             ladders and closed-loop steps marked \"through the edge\" (the edge with \
             `config/edge.yaml`, its voucher's reservations to that voucher's core)",
        decision
    )?;
    writeln!(
            md,
            "- method: per mode, the accepting ladders find the sustained rate at the core and \
             through the edge, each after an untimed warm-up of 2 s at its first rate (open \
             model, p99 < 100 ms, at most 0.1% 503s); then open-model steps at 2, 4 and 10 \
             times the core's offered rate, at the core, stopped after the first whose late \
             starts pass 1% (the generator's own ceiling on these 2 shared cores); then {CLOSED_CONNECTIONS} connections in \
             closed loop, twice: clients that wait the `Retry-After` of a 503 (1 s) plus a \
             jitter of up to half of it before they send again, as the API asks of them (the \
             wait is not counted as latency), then clients that send again at once; both at \
             the core, then both through the edge. A new voucher of 10,000,000 uses per step, \
             so no step sells out. \"Holds\": p99 of all answers under 100 ms and accepted \
             uses per second at least 0.9 of the sustained rate of the same path (the floor \
             column: the core's ladder for the steps at the core, the ladder through the edge \
             for those through it, where the edge's own CPU comes on top on the same two \
             cores). Latency is from the scheduled send (open model) or the send (closed \
             model).\n"
        )?;
    writeln!(md, "### Past the limit\n")?;
    writeln!(
            md,
            "| mode | offered | answered/s | accepted/s | floor | 503 | p50 | p99 all | p99 of 201s | late starts | errors | holds |"
        )?;
    writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|---|")?;
    for row in rows {
        writeln!(md, "{}", row.line())?;
    }
    writeln!(
        md,
        "\n### Where the CPU went, per answered request\n\n\
             From `/proc/<pid>/stat` before and after each step (as in ACCEPT.md): what each \
             process spent, in µs per answer of the step (201s and 503s alike), and how busy \
             the two cores were.\n"
    )?;
    let header = CpuSpent::header();
    writeln!(md, "| mode | offered | {header} |")?;
    let columns = 2 + header.split(" | ").count();
    writeln!(md, "|{}", "---|".repeat(columns))?;
    for row in rows {
        writeln!(md, "{}", row.cpu_line())?;
    }
    for (mode, via, steps) in ladders {
        let title = format!("The sustained rate, {mode} mode, {via}");
        crate::report::write_steps_under(&mut md, "###", &title, steps);
    }
    Ok(md)
}
