//! Benchmark 6, the invariants over every reservation a run saw accepted, checked against
//! PostgreSQL and the gate once the writers caught up; shared by the benchmark and
//! `big-voucher`.

use std::sync::Mutex;
use std::time::Duration;

use voucher_testkit::invariants::{self, Accepted};

use crate::load::Outcome;
use crate::probe::Stack;
use crate::run::Run;

impl Run {
    pub async fn invariants(&mut self) -> anyhow::Result<()> {
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
}

/// Adds the 201s of `outcome` to `into`: the reservations of `code` sent with `tag`
/// (`ladder::reserve_plan`).
pub fn remember_accepted(into: &Mutex<Vec<Accepted>>, code: &str, tag: &str, outcome: &Outcome) {
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

/// Waits for the consumer group where the cores run writers, then checks invariants 1 to 5
/// on the bench's database.
pub async fn check_invariants(stack: &Stack, accepted: &[Accepted]) -> anyhow::Result<String> {
    let caught_up = if stack.writers_run {
        let progress = voucher_core::flash::events::progress::Progress::new(
            &stack.kafka,
            voucher_core::store::Store::new(stack.db.clone()),
        )?;
        progress.wait_caught_up(Duration::from_secs(60)).await?
    } else {
        true
    };
    let gate =
        voucher_core::flash::gate::Gate::connect(&stack.redis_settings(&stack.gate_prefix)).await?;
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
