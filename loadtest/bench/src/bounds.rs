//! The last section of REPORT.md, "What now limits each path": for every path the run
//! climbed or pressed (the sale through the edge, the edge's and a core's reject paths,
//! accepting at a core and through the edge in each mode, the closed loops of the overload
//! bench), what it sustained, what is asked of it, the step that failed above it and why,
//! and where the machine's CPU went in that step; then, for the sale, the budget of its
//! opening burst worked out from this run's own costs. Every figure comes from the run;
//! nothing here is typed in.

use std::fmt::Write as _;

use crate::cpu::CpuSpent;
use crate::ladder::{best, Step};

/// The paths the sale's budget is worked out from (with the flash accepting path through
/// the edge, [`accepting_path`]).
pub const SALE: &str = "Flash sale, 1,000 uses, through the edge";
pub const EDGE_REJECT: &str = "The edge's reject path (sold-out flag)";

/// The name of the accepting path on one hot voucher of `mode`, `via` the edge or "at a
/// core": the accepting bench and the overload bench record it, the report looks it up.
pub fn accepting_path(mode: &str, via: &str) -> String {
    let mut letters = mode.chars();
    let mode: String = letters
        .next()
        .map_or(String::new(), |c| c.to_uppercase().chain(letters).collect());
    format!("{mode} accepting, one hot voucher, {via}")
}

/// The machine's cores (the reports' CPU shares are of these).
const CORES: f64 = 2.0;
/// A failed step whose processes used at least this share of both cores ran out of CPU.
const CPU_BOUND: f64 = 0.85;
/// The p99 the sale's 201s must keep (ms).
const SALE_P99_MS: f64 = 100.0;
/// The sale's uses.
const SALE_USES: f64 = 1000.0;

/// The burst of the sale's failed step, measured (`flash_sale`): the machine from the
/// step's first scheduled send to its last 201's answer, and the answers in that window.
#[derive(Clone, Copy, Debug)]
pub struct SaleBurst {
    pub rate: u64,
    pub window_ms: f64,
    /// Share of both cores busy (`/proc/stat`), over the window read around it: from the
    /// last reading at or before its start to the first at or after its end.
    pub busy: f64,
    pub read_ms: f64,
    /// Answers other than a 201 answered within the window (the edge's and the cores'
    /// 409s, any 503s).
    pub others: u64,
}

/// What one step cost: the CPU of every process of the stack over it, per answer.
#[derive(Clone)]
pub struct Cost {
    pub rate: u64,
    pub answers: u64,
    pub cpu: CpuSpent,
}

impl Cost {
    /// A ladder step's cost, if its CPU was measured.
    pub fn of(step: &Step) -> Option<Self> {
        step.cpu.clone().map(|cpu| Self {
            rate: step.rate,
            answers: step.outcome.completed(),
            cpu,
        })
    }

    /// All processes' CPU per answer (µs).
    pub fn per_answer_us(&self) -> f64 {
        self.cpu.total() * 1e6 / self.answers.max(1) as f64
    }

    /// The `n` parts that spent most per answer, "edge 77 µs, cores 63 µs".
    fn largest(&self, n: usize) -> String {
        let mut parts = self.cpu.by_part.clone();
        parts.sort_by(|a, b| b.1.total_cmp(&a.1));
        let per = |secs: f64| secs * 1e6 / self.answers.max(1) as f64;
        let named: Vec<String> = parts
            .iter()
            .take(n)
            .map(|(part, secs)| format!("{part} {:.0} µs", per(*secs)))
            .collect();
        named.join(", ")
    }
}

/// What a path is asked to reach, and whose figure that is.
pub struct Asked {
    pub rate: f64,
    pub what: String,
}

/// One path's standing in this run.
pub struct PathFound {
    pub path: String,
    /// The achieved rate of its highest sustained step, and that step's cost.
    pub sustained: Option<(f64, Option<Cost>)>,
    /// The step that failed above it: what it was, why, and its cost.
    pub failed: Option<(String, String, Option<Cost>)>,
    pub asked: Option<Asked>,
    /// A ladder, which climbs until a step fails (not a single step such as a closed loop).
    pub climbs: bool,
}

impl PathFound {
    /// A ladder's standing: its highest sustained step, and its last step if that failed.
    pub fn from_ladder(path: &str, steps: &[Step], asked: Option<Asked>) -> Self {
        let sustained = best(steps).map(|s| (s.outcome.achieved_rate(), Cost::of(s)));
        let failed = steps.last().and_then(|s| {
            s.why_not()
                .map(|why| (format!("{}/s", s.rate), why, Cost::of(s)))
        });
        Self {
            path: path.to_owned(),
            sustained,
            failed,
            asked,
            climbs: true,
        }
    }

    /// What the failed step says limits the path: the machine's CPU when its processes
    /// used most of both cores, otherwise a wait the CPU does not explain.
    fn limit(&self) -> String {
        let Some((_, why, cost)) = &self.failed else {
            return if self.climbs {
                "not found: the ladder's top step held (a higher rate is needed to find the limit)"
            } else {
                "none: it holds"
            }
            .into();
        };
        let Some(cost) = cost else {
            return why.clone();
        };
        let busy = cost.cpu.busy(CORES);
        let us = cost.per_answer_us();
        if busy >= CPU_BOUND {
            format!(
                "the machine's CPU: both cores {:.0}% busy; at {us:.0} µs per answer ({}) two cores answer at most {:.0}/s",
                100.0 * busy,
                cost.largest(3),
                CORES * 1e6 / us.max(1.0)
            )
        } else {
            format!(
                "not the CPU averaged over the step (both cores {:.0}% busy, {us:.0} µs per answer): {why}",
                100.0 * busy
            )
        }
    }
}

/// The section: one row per path, then the sale's budget.
pub fn write(md: &mut String, found: &[PathFound], burst: Option<&SaleBurst>) {
    let _ = writeln!(
        md,
        "\n## What now limits each path\n\n\
         Per path of this run: its highest sustained step, what is asked of it, and the step \
         that failed above it with the CPU every process of the stack spent over that step \
         (from `/proc`, as in the CPU tables above; the step's own set-up and checks \
         included). A failed step whose processes kept both cores at least {:.0}% busy ran out \
         of CPU; the answers two cores can give at that step's cost per answer is the bound it \
         sets.\n",
        100.0 * CPU_BOUND
    );
    let _ = writeln!(
        md,
        "| path | sustained | asked | of what is asked | failed above (why) | what limits it |\n|---|---|---|---|---|---|"
    );
    for f in found {
        let sustained = f
            .sustained
            .as_ref()
            .map_or("none".into(), |(rate, _)| format!("{rate:.0}/s"));
        let (asked, share) = match (&f.asked, &f.sustained) {
            (Some(a), Some((rate, _))) => (
                format!("{:.0}/s ({})", a.rate, a.what),
                format!("{:.2}", rate / a.rate.max(1.0)),
            ),
            (Some(a), None) => (format!("{:.0}/s ({})", a.rate, a.what), "0".into()),
            (None, _) => ("-".into(), "-".into()),
        };
        let failed = f
            .failed
            .as_ref()
            .map_or("none".into(), |(step, why, _)| format!("{step}: {why}"));
        let _ = writeln!(
            md,
            "| {} | {sustained} | {asked} | {share} | {failed} | {} |",
            f.path,
            f.limit()
        );
    }
    sale_budget(md, found, burst);
}

/// The sale's opening burst at the rate asked of it, from this run's own costs: what the
/// edge's refusals at that rate leave of the two cores, and how long 1,000 accepts at the
/// cost measured through the edge then take.
fn sale_budget(md: &mut String, found: &[PathFound], burst: Option<&SaleBurst>) {
    let find = |path: &str| found.iter().find(|f| f.path == path);
    let through_edge = accepting_path("flash", "through the edge");
    let (Some(sale), Some(reject), Some(accept)) =
        (find(SALE), find(EDGE_REJECT), find(&through_edge))
    else {
        return;
    };
    let Some(asked) = &sale.asked else { return };
    let Some((_, Some(refusal))) = &reject.sustained else {
        return;
    };
    // An accept's cost through the edge at its highest sustained step; where none was
    // sustained, at the step that failed (its answers are still nearly all accepts).
    let accepting = match (&accept.sustained, &accept.failed) {
        (Some((_, Some(cost))), _) => (cost, "its highest sustained step"),
        (_, Some((_, _, Some(cost)))) => (cost, "the step that failed, none being sustained"),
        _ => return,
    };
    let (accepting, which) = accepting;
    let refusal_us = refusal.per_answer_us();
    let accept_us = accepting.per_answer_us();
    let refusing_cores = asked.rate * refusal_us / 1e6;
    let left = CORES - refusing_cores;
    let _ = writeln!(
        md,
        "\n### The sale's burst at the rate asked of it\n\n\
         At {:.0}/s ({}), taking in the requests alone, at what one of the edge's own 409s \
         costs all processes ({refusal_us:.0} µs: the edge's reject ladder at {}/s, its highest \
         sustained step, generator included), takes {:.2} of the two cores.",
        asked.rate, asked.what, refusal.rate, refusing_cores
    );
    if left <= 0.0 {
        let _ = writeln!(
            md,
            "Nothing is left for the sale's 1,000 accepts: the requests of the rate asked \
             cost more than two cores before a single use is taken."
        );
        return;
    }
    let burst_ms = SALE_USES * accept_us / 1e3 / left;
    let _ = writeln!(
        md,
        "The {:.2} cores left take the 1,000 accepts, at {accept_us:.0} µs each of all \
         processes (accepting through the edge at {}/s, {which}), in at \
         least {burst_ms:.0} ms, against a p99 of {SALE_P99_MS:.0} ms for the sale's 201s: \
         the cost of an accept through the edge would have to fall to {:.0} µs ({:.2} of \
         today's) for the last of them to be answered within it, before any queueing.",
        left,
        accepting.rate,
        SALE_P99_MS * 1e3 * left / SALE_USES,
        SALE_P99_MS / burst_ms.max(f64::EPSILON)
    );
    // The accepting ladder's cost is that of a steady rate, in smaller batches than a
    // burst's: the failed step's own burst says what an accept cost in one.
    if let Some(b) = burst {
        let cpu_ms = b.busy * CORES * b.window_ms;
        let others_ms = b.others as f64 * refusal_us / 1e3;
        let per_accept_us = (cpu_ms - others_ms).max(0.0) * 1e3 / SALE_USES;
        let allowed_us = SALE_P99_MS * 1e3 * left / SALE_USES;
        let _ = writeln!(
            md,
            "In the sale's failed step ({}/s), measured: from its first scheduled send to its \
             last 201's answer, {:.0} ms with both cores {:.0}% busy (read over {:.0} ms around \
             it), {cpu_ms:.0} ms of CPU for the 1,000 accepts and {} other answers. With \
             those at the edge's 409 cost above (the cores' 409s and any 503s cost more, so \
             this is an upper bound), an accept \
             cost at most {per_accept_us:.0} µs of all processes in the burst: the {:.0} µs \
             the rate asked allows is {:.2} of it.",
            b.rate,
            b.window_ms,
            100.0 * b.busy,
            b.read_ms,
            b.others,
            allowed_us,
            allowed_us / per_accept_us.max(f64::EPSILON),
        );
    }
}
