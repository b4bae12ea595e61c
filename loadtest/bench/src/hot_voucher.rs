//! Benchmark 3, accepting reservations on one hot voucher, straight to a core: the flash
//! gate path against the standard PostgreSQL path, each climbing its own ladder.

use std::time::Duration;

use crate::invariants::remember_accepted;
use crate::ladder::{best_rate, climb, reserve_plan, Step, SALE_CONNECTIONS};
use crate::load;
use crate::report::write_steps;
use crate::run::Run;

/// Customer and order tags, one per step of a ladder.
const STEP_TAGS: [&str; 16] = [
    "s0", "s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8", "s9", "s10", "s11", "s12", "s13", "s14",
    "s15",
];

impl Run {
    /// `decision` is the cores' `flash.decision`, to name what a flash use waits for.
    pub async fn hot_voucher(
        &mut self,
        rates: &[u64],
        step: Duration,
        decision: &str,
    ) -> anyhow::Result<()> {
        let (stack, run_id, accepted, core) =
            (&self.stack, &self.run_id, &self.accepted, self.core);
        eprintln!("flash gate path vs standard PostgreSQL path, accepting, on one hot voucher");
        let mut hot = Vec::new();
        for mode in ["standard", "flash"] {
            let code = format!("H{}{run_id}", &mode[..1]);
            stack.create_voucher(&code, 10_000_000, mode).await?;
            let steps = climb(rates, |rate| {
                let (code, accepted) = (code.clone(), &accepted);
                async move {
                    // A tag of the step's own: a tag used again would send retries of
                    // the orders of an earlier step, and count their replays as accepts.
                    let index = rates.iter().position(|r| *r == rate).unwrap_or(0);
                    let tag = STEP_TAGS[index % STEP_TAGS.len()];
                    let outcome =
                        load::run(reserve_plan(core, rate, step, &code, tag, SALE_CONNECTIONS))
                            .await?;
                    remember_accepted(accepted, &code, tag, &outcome);
                    let note = format!("{} accepted", outcome.count(|s| s.status == 201));
                    Ok(Step {
                        unmet: None,
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
            match decision {
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
}
