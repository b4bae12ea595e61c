//! Ladders of offered rates: each step is one open-model run at a constant rate, and a
//! ladder climbs until a step is not sustained, so its last sustained step is the rate the
//! path under test keeps up with.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::cpu::{self, CpuSpent};
use crate::load::{Outcome, Plan, RequestFn};
use crate::probe::reserve_body;
use crate::report::fmt_ms;

/// Connections for a sale: enough that the burst of slow answers of its accepting phase
/// does not stop the generator from offering the load on time.
pub const SALE_CONNECTIONS: usize = 1024;
/// Connections for fast answers: more would only cost the shared CPU context switches.
pub const FAST_CONNECTIONS: usize = 256;
/// How long a ladder's untimed warm-up runs at its first rate (never longer than a step):
/// a ladder's first step otherwise measured cold pools and caches, or the generator's own
/// start, along with the service.
pub const WARM_UP: Duration = Duration::from_secs(2);

/// One step of a ladder, summarised.
pub struct Step {
    pub rate: u64,
    pub outcome: Outcome,
    pub note: String,
    /// A condition of the step's own that its answers do not show, when it was not met
    /// (the sale's: exactly the limit issued, few requests at a core after the sell-out).
    pub unmet: Option<String>,
    /// What every process of the stack spent over the step (set by [`climb`]).
    pub cpu: Option<CpuSpent>,
}

impl Step {
    /// Kept up ([`Outcome::sustained`], p99 < 100 ms) and met its own condition.
    pub fn sustained(&self) -> bool {
        self.why_not().is_none()
    }

    /// Why the step was not sustained: its own condition and every shortfall of its
    /// answers; `None` when it was.
    pub fn why_not(&self) -> Option<String> {
        let why: Vec<String> = self
            .unmet
            .iter()
            .cloned()
            .chain(self.outcome.shortfalls(100.0))
            .collect();
        (!why.is_empty()).then(|| why.join("; "))
    }

    /// The step's row of a ladder table (`report::STEP_HEADER`).
    pub fn line(&self) -> String {
        let o = &self.outcome;
        format!(
            "| {} | {:.0} | {} | {} | {} | {} | {:.2} | {}{}{} |",
            self.rate,
            o.achieved_rate(),
            o.late,
            o.errors(),
            fmt_ms(o.percentile(50.0, |s| s.status != 0)),
            fmt_ms(o.percentile(99.0, |s| s.status != 0)),
            o.generator_cpu,
            if self.sustained() { "yes" } else { "no" },
            if self.note.is_empty() {
                String::new()
            } else {
                format!("; {}", self.note)
            },
            self.why_not()
                .map_or(String::new(), |why| format!("; not sustained: {why}")),
        )
    }
}

/// Reservations of `code` sent to `target` at `rate` for `duration`, request `i` from
/// customer `{tag}-c{i}` with order `{code}-{tag}{i}`.
pub fn reserve_plan(
    target: SocketAddr,
    rate: u64,
    duration: Duration,
    code: &str,
    tag: &'static str,
    connections: usize,
) -> Plan {
    Plan {
        target,
        rate,
        duration,
        connections,
        request: reserve_request(code, tag),
    }
}

/// Request `i`: a new reservation of `code` by customer `TAG-cI`, orderId `CODE-TAGI`.
pub fn reserve_request(code: &str, tag: &'static str) -> RequestFn {
    let code = code.to_owned();
    Arc::new(move |i| {
        (
            hyper::Method::POST,
            format!("/vouchers/{code}/reservations"),
            Some(reserve_body(&code, i, tag)),
        )
    })
}

/// Climbs a ladder of rates until a step is not sustained; returns every step run, each
/// with the CPU the stack's processes spent over it.
pub async fn climb<F, Fut>(rates: &[u64], mut run_step: F) -> anyhow::Result<Vec<Step>>
where
    F: FnMut(u64) -> Fut,
    Fut: Future<Output = anyhow::Result<Step>>,
{
    let mut steps = Vec::new();
    for &rate in rates {
        let before = cpu::sample();
        let mut step = run_step(rate).await?;
        step.cpu = Some(CpuSpent::between(&before, &cpu::sample()));
        let ok = step.sustained();
        eprintln!("  {rate}/s: {}", step.line());
        steps.push(step);
        if !ok {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(steps)
}

/// The highest step sustained.
pub fn best(steps: &[Step]) -> Option<&Step> {
    steps.iter().rfind(|s| s.sustained())
}

/// The achieved rate of the highest step sustained; 0 when none was.
pub fn best_rate(steps: &[Step]) -> f64 {
    best(steps).map_or(0.0, |s| s.outcome.achieved_rate())
}
