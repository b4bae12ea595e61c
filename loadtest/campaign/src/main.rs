//! `voucher-campaign`: runs the seeded fault campaign and writes its report. Every option
//! is a flag or the environment variable of its name (`--seed` or `SEED`, ...); see
//! `voucher-campaign --help`. Exits 1 when a round failed.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;
use voucher_campaign::fault::Fault;
use voucher_campaign::report;
use voucher_campaign::round::RoundSize;
use voucher_campaign::stack::{Binaries, Layout, RECONCILE_GRACE, RECONCILE_INTERVAL};
use voucher_campaign::{Campaign, Setup};
use voucher_core::config::Decision;
use voucher_testkit::postgres::Replication;

/// Runs the seeded fault campaign and writes its report. Exits 1 when a round failed.
// The paths are strings, as they were before clap: clap refuses an empty `PathBuf`.
#[derive(Debug, Parser)]
struct Args {
    /// The seed: the same seed, the same rounds, faults, moments and customer choices.
    #[arg(long, env = "SEED", default_value_t = 1)]
    seed: u64,
    /// How many rounds.
    #[arg(long, env = "ROUNDS", default_value_t = 100)]
    rounds: usize,
    /// The faults to draw from, comma-separated names (all of them when unset).
    #[arg(long, env = "FAULTS", value_delimiter = ',', value_parser = parse_fault)]
    faults: Vec<Fault>,
    /// `short` rounds, or `full` ones (anything but `short` is full).
    #[arg(long, env = "SIZE", default_value = "full")]
    size: String,
    /// Who has the last word before a 201, `database` or `broker` (the cores'
    /// `flash.decision`).
    #[arg(long, env = "DECISION", default_value = "database", value_parser = parse_decision)]
    decision: Decision,
    /// Whether the PostgreSQL primary's commits wait for its standby: `sync` (what
    /// production runs) or `async` (to measure what a failover would lose without it).
    #[arg(long, env = "REPLICATION", default_value = "sync", value_parser = parse_replication)]
    replication: Replication,
    /// The one-way delay, in milliseconds, of the link the standby streams over: 0 for a
    /// standby beside its primary, more for one in another data centre (its loss at
    /// failover, asynchronous, is what was on that link).
    #[arg(long, env = "LINK_DELAY_MS", default_value_t = 0)]
    link_delay_ms: u64,
    /// The stack's layout: `single` (`scripts/up.sh`'s) or `scaled` (`scripts/up-scaled.sh`'s:
    /// a Redis Cluster, three cores, two edges, six partitions).
    #[arg(long, env = "LAYOUT", default_value = "single", value_parser = parse_layout)]
    layout: Layout,
    /// Where voucher-core and voucher-edge are.
    #[arg(long, env = "BIN_DIR", default_value = "target/release")]
    bin_dir: String,
    /// The report's directory.
    #[arg(long, env = "OUT", default_value = "reports/campaign")]
    out: String,
    /// Where the cores' logs of failed rounds are copied (nowhere when unset).
    #[arg(long, env = "CAMPAIGN_LOGS")]
    campaign_logs: Option<String>,
}

fn parse_fault(name: &str) -> Result<Fault, String> {
    Fault::parse(name).ok_or_else(|| format!("unknown fault {name:?}"))
}

fn parse_layout(name: &str) -> Result<Layout, String> {
    match name {
        "single" => Ok(Layout::Single),
        "scaled" => Ok(Layout::Scaled),
        other => Err(format!("LAYOUT must be single or scaled, not {other:?}")),
    }
}

fn parse_replication(name: &str) -> Result<Replication, String> {
    match name {
        "sync" => Ok(Replication::Synchronous),
        "async" => Ok(Replication::Asynchronous),
        other => Err(format!("REPLICATION must be sync or async, not {other:?}")),
    }
}

fn parse_decision(name: &str) -> Result<Decision, String> {
    match name {
        "broker" => Ok(Decision::Broker),
        "database" => Ok(Decision::Database),
        other => Err(format!(
            "DECISION must be broker or database, not {other:?}"
        )),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let (seed, rounds, decision) = (args.seed, args.rounds, args.decision);
    let layout = args.layout;
    let faults_given: String = args
        .faults
        .iter()
        .map(|f| f.name())
        .collect::<Vec<_>>()
        .join(",");
    let faults = if args.faults.is_empty() {
        Fault::ALL.into_iter().filter(|f| f.fits(layout)).collect()
    } else {
        args.faults
    };
    let size = match args.size.as_str() {
        "short" => RoundSize::SHORT,
        _ => RoundSize::FULL,
    };
    let binaries = Binaries::in_dir(args.bin_dir)?;
    let out = PathBuf::from(args.out);
    let logs = args.campaign_logs.map(PathBuf::from);

    let campaign = Campaign {
        seed,
        rounds,
        faults,
        size,
        setup: Setup {
            layout,
            decision,
            replication: args.replication,
            link_delay: std::time::Duration::from_millis(args.link_delay_ms),
        },
    };

    let started = Instant::now();
    let outcomes = campaign
        .run(&binaries, logs.as_deref(), |o| {
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
            "command: `SEED={seed} ROUNDS={rounds} DECISION={} REPLICATION={}{} LAYOUT={}{} ./loadtest/campaign.sh`",
            decision.as_str(),
            match args.replication {
                Replication::Synchronous => "sync",
                Replication::Asynchronous => "async",
            },
            if args.link_delay_ms > 0 {
                format!(" LINK_DELAY_MS={}", args.link_delay_ms)
            } else {
                String::new()
            },
            layout.name(),
            if faults_given.is_empty() {
                String::new()
            } else {
                format!(" FAULTS={faults_given}")
            }
        ),
        format!(
            "PostgreSQL: a primary with a {} standby{}; the cores follow the primary through a URL naming both",
            match args.replication {
                Replication::Synchronous => "synchronous (`synchronous_standby_names = '*'`, `synchronous_commit = on`)",
                Replication::Asynchronous => "asynchronous",
            },
            if args.link_delay_ms > 0 {
                format!(
                    " streaming over a link of {} ms each way (a relay of the campaign's, cut with what is on it when the primary is lost)",
                    args.link_delay_ms
                )
            } else {
                String::new()
            }
        ),
        format!(
            "the last word before a 201: {} (`flash.decision`)",
            match decision {
                Decision::Broker => "the broker's acknowledgement of the event",
                Decision::Database => "PostgreSQL's commit of the row, in grouped transactions",
            }
        ),
        format!(
            "took {:.0} s on this machine: 2 cores; tansu, {}, PostgreSQL (primary and standby) of the campaign's own, and the customers, all on it",
            started.elapsed().as_secs_f64(),
            match layout {
                Layout::Single => "two cores, the edge, one Redis, three event partitions",
                Layout::Scaled => "three cores, two edges (customers spread over both), a Redis Cluster of three masters with a replica each, six event partitions",
            }
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
