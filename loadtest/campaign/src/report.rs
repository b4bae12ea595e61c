//! The campaign's verdict: a table per fault and `N passed, N failed`.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::Duration;

use crate::fault::Fault;
use crate::round::{settle_bound, unsold_bound, RoundOutcome, ROW_BOUND};

#[derive(Default)]
struct PerFault {
    rounds: usize,
    failed: usize,
    violations: usize,
    worst_recovery: Option<Duration>,
    worst_row_wait: Duration,
    lost: usize,
    unsold: i64,
    worst_unsold: i64,
    unavailable: usize,
}

/// The report of `outcomes` as Markdown; `header` lines go first.
pub fn markdown(header: &[String], outcomes: &[RoundOutcome]) -> String {
    let mut per: BTreeMap<Fault, PerFault> = BTreeMap::new();
    for o in outcomes {
        let p = per.entry(o.plan.fault).or_default();
        p.rounds += 1;
        p.failed += usize::from(!o.passed());
        p.violations += o.violations.len();
        // A round that never settled counts as the bound itself.
        let recovery = o.recovered_in.unwrap_or(settle_bound());
        p.worst_recovery = Some(p.worst_recovery.map_or(recovery, |w| w.max(recovery)));
        p.worst_row_wait = p.worst_row_wait.max(o.worst_row_wait);
        p.lost += o.lost;
        p.unsold += o.unsold;
        p.worst_unsold = p.worst_unsold.max(o.unsold);
        p.unavailable += o.unavailable;
    }
    let failed = outcomes.iter().filter(|o| !o.passed()).count();
    let mut md = String::new();
    let _ = writeln!(md, "# Fault campaign\n");
    for line in header {
        let _ = writeln!(md, "- {line}");
    }
    let _ = writeln!(
        md,
        "- bounds: every 201 has its row within {} s of the later of the 201 and the fault's end; \
         invariants 1-5 (drift 0 included) hold within {} s of the fault's end. Rows are first \
         looked for when the round's customers are done, so a wait is an upper bound",
        ROW_BOUND.as_secs(),
        settle_bound().as_secs()
    );
    let _ = writeln!(
        md,
        "- then every customer holding a 201 replays its order with the same body: the answer \
         must be a 201 marked `Idempotent-Replayed` whose status is PostgreSQL's row's; and new \
         customers buy what is left until PostgreSQL holds every use: a use neither sold nor \
         free {:.0} s after the sale fails the round, so a passed round has 0 unsold \
         (\"sold after the sale\" counts what they bought)",
        unsold_bound().as_secs_f64()
    );
    let _ = writeln!(md, "\n| fault | rounds | failed | violations | worst time to recover | worst 201-to-row wait (at most) | 201s that never had a row | uses unsold after the sell-out (total / worst round) | 503s retried |");
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|");
    for (fault, p) in &per {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {:.1} s | {:.1} s | {} | {} / {} | {} |",
            fault.name(),
            p.rounds,
            p.failed,
            p.violations,
            p.worst_recovery.unwrap_or_default().as_secs_f64(),
            p.worst_row_wait.as_secs_f64(),
            p.lost,
            p.unsold,
            p.worst_unsold,
            p.unavailable
        );
    }
    let _ = writeln!(md, "\n## Rounds\n");
    let _ = writeln!(md, "| round | fault | struck at | lasted | what it did | 201s held | released | unsold | sold after the sale | recovered in | verdict |");
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|");
    for o in outcomes {
        let _ = writeln!(
            md,
            "| {} | {} | {} ms | {} ms | {} | {} | {} | {} | {} | {} | {} |",
            o.plan.index,
            o.plan.fault.name(),
            o.plan.fault_at.as_millis(),
            o.plan.fault_for.as_millis(),
            o.effect,
            o.held,
            o.released,
            o.unsold,
            o.sold_late,
            o.recovered_in
                .map_or("never".into(), |d| format!("{:.1} s", d.as_secs_f64())),
            if o.passed() {
                "passed".to_owned()
            } else {
                o.violations.join("; ")
            }
        );
    }
    let _ = writeln!(
        md,
        "\n{} passed, {} failed",
        outcomes.len() - failed,
        failed
    );
    md
}
