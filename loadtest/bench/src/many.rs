//! Many hot vouchers at once (`voucher-bench many`, `loadtest/bench-scaled.sh`): ten flash
//! vouchers selling out together, offered through every edge of the stack at once, in a
//! ladder of total rates. Request `i` of an edge's generator is for voucher `i mod 10`, so
//! every voucher sees the same share of every edge's traffic. The vouchers' codes are
//! chosen so that they spread evenly over the Redis Cluster's masters and the events
//! topic's partitions. A step is sustained when every edge's answers are
//! (`Outcome::sustained`) and every voucher issued exactly its limit with a p99 under 100 ms,
//! of its 201s and of all its answers. Per voucher the
//! report says where it lives (its master and its partition), what it issued, its p99 and
//! how many requests reached a core after it sold out (counted, not a condition: at a
//! voucher's own rate the few requests of the flag's propagation are a large share of the
//! few that come after the sell-out).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::cpu::CpuSpent;
use crate::invariants::remember_accepted;
use crate::ladder::{best, climb, Step, SALE_CONNECTIONS};
use crate::load::{self, Outcome, Plan, Sample};
use crate::probe::reserve_body;
use crate::report::{fmt_ms, write_steps};
use crate::run::Run;

/// One voucher of a step, after it.
struct Voucher {
    code: String,
    /// The port of its Redis Cluster master (0 on one server).
    master: u16,
    partition: i32,
    issued: u64,
    rows: i64,
    requests: u64,
    p99: Option<f64>,
    p99_accepted: Option<f64>,
    /// 409s answered by a core (not by an edge's flag): requests that got past the edges
    /// after the voucher sold out.
    at_core: u64,
}

/// One step's vouchers.
struct StepDetail {
    rate: u64,
    vouchers: Vec<Voucher>,
}

/// What `many` is asked to run.
pub struct ManyPlan<'a> {
    pub edges: &'a [SocketAddr],
    pub rates: &'a [u64],
    pub step: Duration,
    pub vouchers: usize,
    pub limit: u64,
    /// The events topic's partitions (the cores' `kafka.partitions`).
    pub partitions: i32,
}

impl Run {
    pub async fn many_vouchers(&mut self, plan: &ManyPlan<'_>) -> anyhow::Result<()> {
        eprintln!(
            "{} flash vouchers at once through {} edges",
            plan.vouchers,
            plan.edges.len()
        );
        let details: Mutex<Vec<StepDetail>> = Mutex::new(Vec::new());
        let steps = {
            let (run, details) = (&*self, &details);
            climb(plan.rates, |rate| async move {
                let (step, vouchers) = run.many_step(plan, rate).await?;
                if let Ok(mut d) = details.lock() {
                    d.push(StepDetail { rate, vouchers });
                }
                Ok(step)
            })
            .await?
        };
        let details = details.into_inner().unwrap_or_default();
        let shown = best(&steps).or(steps.first()).map(|s| s.rate);
        let sustained = best(&steps).map(|s| s.outcome.achieved_rate());
        self.table.push(format!(
            "| {} flash vouchers of {} uses at once, through {} edges | {} | | | sustained: every voucher exactly its limit with p99 < 100 ms (201s and all answers), every edge's answers kept up |",
            plan.vouchers,
            plan.limit,
            plan.edges.len(),
            sustained.map_or("no step sustained".into(), |r| format!("highest sustained {r:.0}/s in all")),
        ));
        write_steps(
            &mut self.report,
            &format!(
                "Ladder: {} flash vouchers of {} uses each selling out together, the total rate split over {} edges",
                plan.vouchers,
                plan.limit,
                plan.edges.len()
            ),
            &steps,
        );
        self.report.push_str(&format!(
            "\n### CPU per request by process, each step\n\nUser plus system time of every process of each kind (`/proc/<pid>/stat`, summed over the three cores, both edges, the six Redis nodes, both PostgreSQL servers), from before the step's vouchers are made to after their rows are counted, over the step's answered requests; `machine busy` is all of it over that time on 2 cores.\n\n| offered/s | requests | {} |\n|---|---|---|---|---|---|---|---|---|---|\n",
            CpuSpent::header()
        ));
        for step in &steps {
            let Some(spent) = &step.cpu else { continue };
            let requests = step.outcome.completed();
            self.report.push_str(&format!(
                "| {} | {} | {} |\n",
                step.rate,
                requests,
                spent.cells(requests, 2.0).join(" | ")
            ));
        }
        for StepDetail { rate, vouchers, .. } in &details {
            let label = if Some(*rate) == shown {
                if sustained.is_some() {
                    "the highest sustained step"
                } else {
                    "the first step (none sustained)"
                }
            } else if steps
                .last()
                .is_some_and(|s| s.rate == *rate && !s.sustained())
            {
                "the failed step above it"
            } else {
                continue;
            };
            self.report.push_str(&format!(
                "\n### Per voucher at {rate}/s ({label})\n\n| voucher | Redis master | partition | issued | rows | requests | p99 | p99 of 201s | reached a core after its sell-out |\n|---|---|---|---|---|---|---|---|---|\n"
            ));
            for v in vouchers {
                self.report.push_str(&format!(
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                    v.code,
                    if v.master == 0 {
                        "the one server".to_owned()
                    } else {
                        format!("127.0.0.1:{}", v.master)
                    },
                    v.partition,
                    v.issued,
                    v.rows,
                    v.requests,
                    fmt_ms(v.p99),
                    fmt_ms(v.p99_accepted),
                    v.at_core
                ));
            }
        }
        Ok(())
    }

    /// One step: `plan.vouchers` new vouchers, `rate` requests/s in all, split evenly over
    /// the edges.
    async fn many_step(
        &self,
        plan: &ManyPlan<'_>,
        rate: u64,
    ) -> anyhow::Result<(Step, Vec<Voucher>)> {
        let (codes, masters) = self.spread_codes(plan, rate).await?;
        for code in &codes {
            self.stack
                .create_voucher(code, plan.limit as i64, "flash")
                .await?;
        }
        let per_edge = (rate / plan.edges.len() as u64).max(1);
        let runs = plan.edges.iter().enumerate().map(|(k, edge)| {
            let codes = codes.clone();
            let tag: &'static str = TAGS[k % TAGS.len()];
            load::run(Plan {
                target: *edge,
                rate: per_edge,
                duration: plan.step,
                connections: SALE_CONNECTIONS / plan.edges.len(),
                request: Arc::new(move |i| {
                    let code = &codes[i as usize % codes.len()];
                    (
                        hyper::Method::POST,
                        format!("/vouchers/{code}/reservations"),
                        Some(reserve_body(code, i, tag)),
                    )
                }),
            })
        });
        let outcomes: Vec<Outcome> = futures::future::try_join_all(runs).await?;
        let mut vouchers = Vec::with_capacity(codes.len());
        for (v, code) in codes.iter().enumerate() {
            let of = |s: &Sample| s.index as usize % codes.len() == v;
            let issued: u64 = outcomes
                .iter()
                .map(|o| o.count(|s| of(s) && s.status == 201))
                .sum();
            for (k, o) in outcomes.iter().enumerate() {
                let only = Outcome {
                    offered: 0,
                    samples: o.samples.iter().filter(|s| of(s)).copied().collect(),
                    late: 0,
                    planned: o.planned,
                    elapsed: o.elapsed,
                    start: o.start,
                    generator_cpu: 0.0,
                };
                remember_accepted(&self.accepted, code, TAGS[k % TAGS.len()], &only);
            }
            let (rows, _) = self.stack.wait_recorded(code, issued as i64).await?;
            let all: Vec<Sample> = outcomes
                .iter()
                .flat_map(|o| o.samples.iter().filter(|s| of(s)).copied())
                .collect();
            let merged = merge(&outcomes, all);
            vouchers.push(Voucher {
                code: code.clone(),
                master: masters.get(v).copied().unwrap_or_default(),
                partition: partition_of(code, plan.partitions),
                issued,
                rows,
                requests: merged.samples.len() as u64,
                p99: merged.percentile(99.0, |s| s.status != 0),
                p99_accepted: merged.percentile(99.0, |s| s.status == 201),
                at_core: merged.count(|s| s.status == 409 && !s.by_edge),
            });
        }
        let all: Vec<Sample> = outcomes
            .iter()
            .flat_map(|o| o.samples.iter().copied())
            .collect();
        let merged = merge(&outcomes, all);
        let unmet = vouchers.iter().find_map(|v| {
            if v.issued != plan.limit {
                Some(format!(
                    "{} issued {}, not {}",
                    v.code, v.issued, plan.limit
                ))
            } else if v.p99_accepted.is_none_or(|p| p >= 100.0) {
                Some(format!(
                    "{}: p99 of its 201s {}",
                    v.code,
                    fmt_ms(v.p99_accepted)
                ))
            } else if v.p99.is_none_or(|p| p >= 100.0) {
                Some(format!("{}: p99 {}", v.code, fmt_ms(v.p99)))
            } else {
                None
            }
        });
        let unmet = unmet.or_else(|| {
            outcomes
                .iter()
                .position(|o| !o.sustained(100.0))
                .map(|k| format!("edge {} did not keep up", k + 1))
        });
        let issued: u64 = vouchers.iter().map(|v| v.issued).sum();
        let at_core: u64 = vouchers.iter().map(|v| v.at_core).sum();
        let after: u64 = vouchers
            .iter()
            .map(|v| v.requests.saturating_sub(v.issued))
            .sum();
        Ok((
            Step {
                rate,
                outcome: merged,
                note: format!(
                    "issued {issued} of {}, {at_core} of the {after} requests after their voucher's sell-out at a core ({:.2}%)",
                    plan.limit * plan.vouchers as u64,
                    100.0 * at_core as f64 / after.max(1) as f64
                ),
                unmet,
                cpu: None,
            },
            vouchers,
        ))
    }
}

impl Run {
    /// The step's voucher codes, voucher `v` on master `v mod masters` and partition `v mod
    /// partitions` (found by trying suffixes), with each one's master.
    async fn spread_codes(
        &self,
        plan: &ManyPlan<'_>,
        rate: u64,
    ) -> anyhow::Result<(Vec<String>, Vec<u16>)> {
        let mut codes = Vec::with_capacity(plan.vouchers);
        let mut where_ = Vec::with_capacity(plan.vouchers);
        for v in 0..plan.vouchers {
            let partition = (v as i32) % plan.partitions.max(1);
            // Candidates on the right partition, their masters asked in one go: with three
            // masters, one in three is on the right one.
            let candidates: Vec<String> = (0u32..)
                .map(|attempt| format!("M{}R{rate}V{v}X{attempt}", self.run_id))
                .filter(|code| partition_of(code, plan.partitions) == partition)
                .take(64)
                .collect();
            let (masters, of) = self.stack.gate_masters(&candidates).await?;
            let found = candidates
                .into_iter()
                .zip(of)
                .find(|(_, master)| masters.is_empty() || *master == masters[v % masters.len()]);
            let (code, master) =
                found.ok_or_else(|| anyhow::anyhow!("no code for voucher {v}'s place"))?;
            codes.push(code);
            where_.push(master);
        }
        Ok((codes, where_))
    }
}

impl Run {
    /// PostgreSQL's grouped decision alone (`Run::decision_alone`), on the stack's pool and
    /// again on sessions with `synchronous_commit = local`: the same server and statement,
    /// the commit waiting for the synchronous standby's flush or not. What the standby costs.
    pub async fn standby_cost(&mut self, database_url: &str, step: Duration) -> anyhow::Result<()> {
        let waiting = self.stack.db.clone();
        let sep = if database_url.contains('?') { '&' } else { '?' };
        let local = sqlx::PgPool::connect(&format!(
            "{database_url}{sep}options=-c%20synchronous_commit%3Dlocal"
        ))
        .await?;
        let with = self.decision_alone(step, "flash", &waiting, "S").await?;
        let without = self.decision_alone(step, "flash", &local, "L").await?;
        self.report.push_str(
            "\n## PostgreSQL's grouped decision alone, with and without the synchronous standby\n\n\
             The core's own statement (`Store::decided_writer`) in a loop from this process, batches of a fixed size, on the scaled stack's primary: first as the cores run it (`synchronous_commit = on`: each commit waits for the standby's flush), then on sessions with `synchronous_commit = local` (the same server, not waiting).\n\n\
             | batch size | writers | uses/s waiting for the standby | uses/s not waiting | ratio | transactions/s waiting | PostgreSQL µs per use waiting / not |\n|---|---|---|---|---|---|---|\n",
        );
        for (a, b) in with.iter().zip(&without) {
            self.report.push_str(&format!(
                "| {} | {} | {:.0} | {:.0} | {:.2} | {:.0} | {:.1} / {:.1} |\n",
                a.batch,
                a.writers,
                a.uses_per_sec,
                b.uses_per_sec,
                a.uses_per_sec / b.uses_per_sec.max(f64::EPSILON),
                a.transactions_per_sec,
                a.postgres_us_per_use,
                b.postgres_us_per_use
            ));
        }
        local.close().await;
        Ok(())
    }
}

/// The customer tag of each edge's generator (customers and orders are its own).
const TAGS: [&str; 4] = ["ma", "mb", "mc", "md"];

/// One outcome of `samples` from the edges' runs: offered and late added up, the longest
/// elapsed time, the generators' CPU added up.
fn merge(outcomes: &[Outcome], samples: Vec<Sample>) -> Outcome {
    Outcome {
        offered: outcomes.iter().map(|o| o.offered).sum(),
        samples,
        late: outcomes.iter().map(|o| o.late).sum(),
        planned: outcomes.iter().map(|o| o.planned).max().unwrap_or_default(),
        elapsed: outcomes.iter().map(|o| o.elapsed).max().unwrap_or_default(),
        start: outcomes
            .iter()
            .map(|o| o.start)
            .min()
            .unwrap_or_else(std::time::Instant::now),
        generator_cpu: outcomes.iter().map(|o| o.generator_cpu).sum(),
    }
}

/// The events partition of `code`'s events: librdkafka's default partitioner
/// (`consistent_random`) puts a keyed message on CRC-32(key) mod partitions, and the cores
/// key every event by its voucher code.
fn partition_of(code: &str, partitions: i32) -> i32 {
    (crc32fast::hash(code.as_bytes()) % partitions.max(1) as u32) as i32
}
