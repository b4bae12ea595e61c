//! `voucher-campaign`: runs the seeded fault campaign and writes its report.
//!
//! Environment: `SEED` (default 1), `ROUNDS` (default 100), `FAULTS` (comma-separated
//! names, default all), `DECISION` (`database`, the default, or `broker`: the cores'
//! `flash.decision`), `SIZE` (`full` or `short`), `BIN_DIR` (where voucher-core and
//! voucher-edge are), `OUT` (the report's directory), `CAMPAIGN_LOGS` (where the cores'
//! logs of failed rounds are copied; none when unset). Exits 1 when a round failed.

use std::io::Write;
use std::time::Instant;

use voucher_campaign::fault::Fault;
use voucher_campaign::report;
use voucher_campaign::round::RoundSize;
use voucher_campaign::stack::{Binaries, RECONCILE_GRACE, RECONCILE_INTERVAL};
use voucher_campaign::Campaign;
use voucher_core::config::Decision;

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let seed: u64 = env_or("SEED", "1").parse()?;
    let rounds: usize = env_or("ROUNDS", "100").parse()?;
    let faults = match std::env::var("FAULTS") {
        Ok(names) => names
            .split(',')
            .map(|n| Fault::parse(n).ok_or_else(|| anyhow::anyhow!("unknown fault {n:?}")))
            .collect::<anyhow::Result<Vec<_>>>()?,
        Err(_) => Fault::ALL.to_vec(),
    };
    let size = match env_or("SIZE", "full").as_str() {
        "short" => RoundSize::SHORT,
        _ => RoundSize::FULL,
    };
    let decision = match env_or("DECISION", "database").as_str() {
        "broker" => Decision::Broker,
        "database" => Decision::Database,
        other => anyhow::bail!("DECISION must be broker or database, not {other:?}"),
    };
    let binaries = Binaries::in_dir(env_or("BIN_DIR", "target/release"))?;
    let out = std::path::PathBuf::from(env_or("OUT", "reports/campaign"));

    let campaign = Campaign {
        seed,
        rounds,
        faults,
        size,
        decision,
    };

    let started = Instant::now();
    let outcomes = campaign
        .run(&binaries, |o| {
            eprintln!(
                "round {:>3} {:<20} {}",
                o.plan.index,
                o.plan.fault.name(),
                if o.passed() {
                    format!(
                        "passed (held {}, unsold {}, recovered in {:.1} s)",
                        o.held,
                        o.unsold,
                        o.recovered_in.unwrap_or_default().as_secs_f64()
                    )
                } else {
                    format!("FAILED: {}", o.violations.join("; "))
                }
            );
        })
        .await?;
    let header = vec![
        format!(
            "command: `SEED={seed} ROUNDS={rounds} DECISION={} ./loadtest/campaign.sh`",
            decision.as_str()
        ),
        format!(
            "the last word before a 201: {} (`flash.decision`)",
            match decision {
                Decision::Broker => "the broker's acknowledgement of the event",
                Decision::Database => "PostgreSQL's commit of the row, in grouped transactions",
            }
        ),
        format!(
            "took {:.0} s on this machine: 2 cores; tansu, two cores, the edge, PostgreSQL and Redis of the campaign's own, and the customers, all on it",
            started.elapsed().as_secs_f64()
        ),
        format!(
            "each round: a flash voucher of {} uses (1 per customer), {} customers arriving over {} ms through the edge, retrying their own orderId on 503 and lost connections; 40% confirm or release; one in ten tries a second order",
            size.limit,
            size.customers,
            size.sale.as_millis()
        ),
        format!(
            "the stack as an operator runs a sale: reconciliation every {} ms, grace {} ms",
            RECONCILE_INTERVAL.as_millis(),
            RECONCILE_GRACE.as_millis()
        ),
    ];
    let md = report::markdown(&header, &outcomes);
    std::fs::create_dir_all(&out)?;
    std::fs::write(out.join("REPORT.md"), &md)?;
    let verdict = md.lines().last().unwrap_or_default().to_owned();
    writeln!(std::io::stdout(), "{verdict}")?;
    if outcomes.iter().any(|o| !o.passed()) {
        std::process::exit(1);
    }
    Ok(())
}
