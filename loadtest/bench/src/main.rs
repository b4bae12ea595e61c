//! voucher-bench: runs the comparisons of `ARCHITECTURE.md` against the running stack (started by
//! `loadtest/bench.sh`) and writes a Markdown report with the ratio table, plus CSV files
//! for the plots.
//!
//!   voucher-bench [OUT]              the benchmark, every comparison in one run, ending with
//!                                    what now limits each path (OUT: reports/bench)
//!   voucher-bench bare-409 ADDR      the bare 409 server it compares the edge with
//!   voucher-bench rate-limits [OUT]  only what the edge's rate limits and access log cost (RATE-LIMITS.md)
//!   voucher-bench accept [OUT]       only the accepting ladder at a core, with the CPU of every
//!                                    process per accept (ACCEPT.md)
//!   voucher-bench sale [OUT]         only the flash sale through the edge and the edge's
//!                                    reject path, in one run (SALE.md)
//!   voucher-bench reject [OUT]       only the edge's reject path against a bare server, a
//!                                    minimal Pingora and nginx (REJECT.md)
//!   voucher-bench many [OUT]        only ten flash vouchers selling out together through
//!                                    every edge (MANY.md; `loadtest/bench-scaled.sh`)
//!   voucher-bench overload [OUT]     only a core offered more than it takes, flash and
//!                                    standard (OVERLOAD.md)
//!   voucher-bench memory [OUT]       what the edge's and a core's memory is made of, part
//!                                    by part (MEMORY.md)
//!   voucher-bench soak [OUT]         flash sales back to back for 10 minutes at half the
//!                                    sustained sale rate, the edge's and cores' memory
//!                                    followed (SOAK.md)
//!   voucher-bench big-voucher [OUT]  a flash voucher of a million uses: sale, reload,
//!                                    reconciliation, Redis's slow log (`loadtest/big-voucher.sh`)
//!
//! This file only reads the arguments and calls the benchmarks; every setting is a flag
//! that falls back on the environment variable the scripts set (`--help` lists them).

mod accept;
mod bare;
mod big;
mod bounds;
mod broker_alone;
mod cpu;
mod flash_sale;
mod gate_vs_redis;
mod invariants;
mod ladder;
mod latency;
mod limits;
mod load;
mod many;
mod memory;
mod overload;
mod peak_memory;
mod probe;
mod reject_path;
mod report;
mod run;
mod slowlog;
mod soak;
mod wrk;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use run::Run;

#[derive(Parser, Debug)]
#[command(
    name = "voucher-bench",
    about = "The benchmark of the voucher service: run against the stack of loadtest/bench.sh"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Where the benchmark writes REPORT.md and its CSV files (without a command).
    #[arg(default_value = "reports/bench")]
    out: PathBuf,
    #[command(flatten)]
    stack: StackArgs,
    #[command(flatten)]
    bench: BenchArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// The bare server answering every request with a 409, that the edge is compared with.
    #[command(name = "bare-409")]
    Bare409 { addr: SocketAddr },
    /// Only what the edge's rate limits and access log cost (RATE-LIMITS.md).
    RateLimits {
        #[arg(default_value = "reports/bench")]
        out: PathBuf,
    },
    /// A flash voucher of a million uses: sale, reload, reconciliation, Redis's slow log.
    BigVoucher(BigArgs),
    /// Only the accepting ladder of a flash voucher at a core, with the CPU every process
    /// spends per accept (ACCEPT.md).
    Accept {
        #[arg(default_value = "reports/bench")]
        out: PathBuf,
    },
    /// Only the flash sale through the edge and the edge's reject path (SALE.md).
    Sale {
        #[arg(default_value = "reports/bench")]
        out: PathBuf,
    },
    /// Only the edge's reject path against the bare server, a minimal Pingora and nginx
    /// (REJECT.md).
    Reject {
        #[arg(default_value = "reports/bench")]
        out: PathBuf,
    },
    /// What the edge's and a core's resident memory is made of, part by part (MEMORY.md).
    Memory {
        #[arg(default_value = "reports/bench")]
        out: PathBuf,
    },
    /// Flash sales back to back through the edge, the resident memory of the edge and the
    /// cores followed (SOAK.md).
    Soak(SoakArgs),
    /// Ten flash vouchers selling out together through every edge (MANY.md).
    Many {
        #[arg(default_value = "reports/scaled")]
        out: PathBuf,
    },
    /// Only a core offered more than it takes: flash and standard, open model up to 10
    /// times the sustained rate and 1,000 connections in closed loop (OVERLOAD.md).
    Overload {
        #[arg(default_value = "reports/bench")]
        out: PathBuf,
    },
}

/// Where the stack under test is, as `loadtest/bench.sh` names it.
#[derive(Args, Debug)]
#[command(next_help_heading = "The stack")]
pub struct StackArgs {
    /// The edge (host:port).
    #[arg(long, env = "EDGE", default_value = "127.0.0.1:8080")]
    pub edge: String,
    /// A core (host:port): admin calls and the runs that bypass the edge.
    #[arg(long, env = "CORE", default_value = "127.0.0.1:8081")]
    pub core: String,
    /// Every core's metrics endpoint (host:port, comma-separated).
    #[arg(
        long,
        env = "CORE_METRICS",
        value_delimiter = ',',
        default_value = "127.0.0.1:9181,127.0.0.1:9182"
    )]
    pub core_metrics: Vec<String>,
    /// The edge's metrics endpoint (host:port).
    #[arg(long, env = "EDGE_METRICS", default_value = "127.0.0.1:9180")]
    pub edge_metrics: String,
    /// The cores' admin token.
    #[arg(
        long,
        env = "ADMIN_TOKEN",
        default_value = "dev-admin-token",
        hide_env_values = true
    )]
    pub admin_token: String,
    /// The vouchers database.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/vouchers?sslmode=disable",
        hide_env_values = true
    )]
    pub database_url: String,
    /// The stack's Redis.
    #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379/")]
    pub redis_url: String,
    /// The prefix of the cores' gate keys in Redis.
    /// `single`, or `cluster` when REDIS_URL lists a Redis Cluster's nodes.
    #[arg(long, env = "REDIS_TOPOLOGY", default_value = "single")]
    pub redis_topology: String,
    /// Every edge, for the benchmarks that spread load over several (`many`); the first
    /// is EDGE when unset.
    #[arg(long, env = "EDGES", value_delimiter = ',')]
    pub edges: Vec<String>,
    #[arg(long, env = "GATE_PREFIX", default_value = "vg:")]
    pub gate_prefix: String,
    /// The broker, for the invariant check's wait on the writers.
    #[arg(long, env = "KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    pub kafka_brokers: String,
    /// The writers' topic.
    #[arg(long, env = "KAFKA_TOPIC", default_value = "voucher-events")]
    pub kafka_topic: String,
    /// The writers' consumer group.
    #[arg(long, env = "KAFKA_GROUP", default_value = "voucher-writer")]
    pub kafka_group: String,
    /// The cores' `flash.decision`, as bench.sh passed it to them.
    #[arg(long, env = "VOUCHER__FLASH__DECISION", default_value = "database")]
    pub decision: String,
    /// The cores' `kafka.consume`, as bench.sh passed it to them (unset: writers run only
    /// with the broker deciding).
    #[arg(long, env = "VOUCHER__KAFKA__CONSUME")]
    pub consume: Option<bool>,
}

/// The benchmark's own settings (the run without a command).
#[derive(Args, Debug)]
#[command(next_help_heading = "The benchmark")]
struct BenchArgs {
    /// Seconds of load per step of a ladder.
    #[arg(long, env = "STEP_SECS", default_value_t = 3)]
    step_secs: u64,
    /// Offered rates of the flash sale ladder (per second, comma-separated). Steps of at
    /// most half again between 3,000/s and 10,000/s, where the sale's ladders have ended:
    /// from 5,000/s straight to 10,000/s a sustained figure could be a third under the truth.
    #[arg(
        long,
        env = "SALE_RATES",
        default_value = "1000,2000,3000,5000,7000,10000,15000,20000,30000,40000,50000"
    )]
    sale_rates: Rates,
    /// Offered rates of the reject path ladders, edge and bare server. Up to 120,000/s:
    /// the bare server and nginx held the 80,000/s that used to be the top, so their
    /// ladders had no failed step above their "sustained" (the generator's own late starts
    /// end them here, which the report says).
    #[arg(
        long,
        env = "REJECT_RATES",
        default_value = "10000,20000,30000,40000,50000,60000,70000,80000,100000,120000"
    )]
    reject_rates: Rates,
    /// Offered rates of the hot voucher ladders, flash and standard.
    #[arg(
        long,
        env = "ACCEPT_RATES",
        default_value = "2000,4000,6000,8000,10000,12000,14000,16000"
    )]
    accept_rates: Rates,
    /// The voucher mode of `accept`: flash (ACCEPT.md) or standard (ACCEPT-standard.md).
    #[arg(long, env = "ACCEPT_MODE", default_value = "flash", value_parser = ["flash", "standard"])]
    accept_mode: String,
    /// The flash ladder of `overload`, which finds the rate to overload. Up to 16,000/s: a
    /// core here sustained the old top, 12,000/s, so the ladder ended without a failed step.
    #[arg(
        long,
        env = "OVERLOAD_FLASH_RATES",
        default_value = "2000,4000,6000,8000,10000,12000,14000,16000"
    )]
    overload_flash_rates: Rates,
    /// The standard ladder of `overload`.
    #[arg(
        long,
        env = "OVERLOAD_STANDARD_RATES",
        default_value = "500,1000,2000,4000,8000,12000,16000,20000,24000"
    )]
    overload_standard_rates: Rates,
    /// The rate of the sale of `memory` (through the edge).
    /// `many`: the ladder of total rates, split evenly over the edges.
    #[arg(
        long,
        env = "MANY_RATES",
        default_value = "1000,2000,3000,4000,6000,8000,12000,16000,20000"
    )]
    many_rates: Rates,
    /// `many`: how many flash vouchers sell out together.
    #[arg(long, env = "MANY_VOUCHERS", default_value_t = 10)]
    many_vouchers: usize,
    /// `many`: the uses of each.
    #[arg(long, env = "MANY_LIMIT", default_value_t = 100)]
    many_limit: u64,
    /// `many`: the events topic's partitions (the cores' `kafka.partitions`).
    #[arg(long, env = "VOUCHER__KAFKA__PARTITIONS", default_value_t = 3)]
    partitions: i32,
    #[arg(long, env = "MEMORY_SALE_RATE", default_value_t = 2000)]
    memory_sale_rate: u64,
    /// Calls of the gate's reserve script per state, by our client and by redis-benchmark.
    #[arg(long, env = "GATE_REQUESTS", default_value_t = 200_000)]
    gate_requests: u64,
}

/// The settings of `big-voucher`.
#[derive(Args, Debug)]
pub struct BigArgs {
    /// Where REPORT.md goes.
    #[arg(default_value = "reports/big")]
    pub out: PathBuf,
    /// Uses of the voucher.
    #[arg(long, env = "USES", default_value_t = 1_000_000)]
    pub uses: u64,
    /// Requests per second of the sale.
    #[arg(long, env = "BIG_RATE", default_value_t = 3000)]
    pub rate: u64,
    /// Redis's slow log keeps every call slower than this (microseconds).
    #[arg(long, env = "SLOW_US", default_value_t = 2000)]
    pub slow_us: i64,
}

/// The settings of `soak`.
#[derive(Args, Debug)]
pub struct SoakArgs {
    /// Where SOAK.md and its CSV go.
    #[arg(default_value = "reports/soak")]
    pub out: PathBuf,
    /// How long the soak lasts, in seconds.
    #[arg(long, env = "SOAK_SECS", default_value_t = 600)]
    pub secs: u64,
    /// Requests per second of every sale; unset, half the highest rate the sale ladder
    /// (SALE_RATES) sustains in a first pass. The warm-up's sales run at twice it.
    #[arg(long, env = "SOAK_RATE")]
    pub rate: Option<u64>,
    /// Seconds of load per sale.
    #[arg(long, env = "SOAK_SALE_SECS", default_value_t = 10)]
    pub sale_secs: u64,
}

/// A ladder of rates, comma-separated: blanks around a rate and empty entries are skipped,
/// anything else that is not a number is refused.
#[derive(Clone, Debug)]
struct Rates(Vec<u64>);

impl FromStr for Rates {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut rates = Vec::new();
        for rate in s.split(',').map(str::trim).filter(|r| !r.is_empty()) {
            rates.push(
                rate.parse()
                    .map_err(|e| format!("rate {rate:?} in {s:?}: {e}"))?,
            );
        }
        Ok(Self(rates))
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Bare409 { addr }) => bare::serve(addr).await,
        Some(Command::RateLimits { out }) => {
            let mut run = Run::connect(out, &cli.stack).await?;
            run.rate_limit_cost().await?;
            run.access_log_cost().await?;
            report::write_rate_limits(&run)
        }
        Some(Command::BigVoucher(args)) => big::run(&cli.stack, &args).await,
        Some(Command::Memory { out }) => {
            let step = Duration::from_secs(cli.bench.step_secs);
            let mut run = Run::connect(out, &cli.stack).await?;
            run.memory_account(cli.bench.memory_sale_rate, step).await?;
            run.invariants().await?;
            report::write_memory(&run)
        }
        Some(Command::Soak(args)) => {
            let step = Duration::from_secs(cli.bench.step_secs);
            let mut run = Run::connect(args.out.clone(), &cli.stack).await?;
            let (rate, rate_source, warm_rate) = match args.rate {
                Some(rate) => (rate, "SOAK_RATE".to_owned(), rate * 2),
                None => {
                    let sustained = run.flash_sale(&cli.bench.sale_rates.0, step).await?;
                    let Some(sustained) = sustained else {
                        anyhow::bail!("the sale ladder sustained no step: no rate to soak at");
                    };
                    (
                        sustained / 2,
                        format!("half of {sustained}/s, the highest step the sale ladder sustained first in this run"),
                        sustained,
                    )
                }
            };
            let plan = soak::SoakPlan {
                duration: Duration::from_secs(args.secs),
                rate,
                rate_source,
                sale: Duration::from_secs(args.sale_secs),
                warm_rate,
            };
            run.soak(&plan).await?;
            run.invariants().await?;
            report::write_soak(&run)
        }
        Some(Command::Accept { out }) => {
            let step = Duration::from_secs(cli.bench.step_secs);
            let mut run = Run::connect(out, &cli.stack).await?;
            let mode = cli.bench.accept_mode.clone();
            let section = run
                .accept_breakdown(&cli.bench.accept_rates.0, step, &mode)
                .await?;
            run.invariants().await?;
            report::write_accept(&run, &mode, &section)
        }
        Some(Command::Sale { out }) => {
            let step = Duration::from_secs(cli.bench.step_secs);
            let mut run = Run::connect(out, &cli.stack).await?;
            let _ = run.flash_sale(&cli.bench.sale_rates.0, step).await?;
            run.reject_path(&cli.bench.reject_rates.0, step).await?;
            run.invariants().await?;
            report::write_sale(&run)
        }
        Some(Command::Many { out }) => {
            let step = Duration::from_secs(cli.bench.step_secs);
            let mut run = Run::connect(out, &cli.stack).await?;
            let edges: Vec<SocketAddr> = if cli.stack.edges.is_empty() {
                vec![run.edge]
            } else {
                cli.stack
                    .edges
                    .iter()
                    .map(|e| e.parse())
                    .collect::<Result<_, _>>()?
            };
            let b = &cli.bench;
            run.many_vouchers(&many::ManyPlan {
                edges: &edges,
                rates: &b.many_rates.0,
                step,
                vouchers: b.many_vouchers,
                limit: b.many_limit,
                partitions: b.partitions,
            })
            .await?;
            run.standby_cost(&cli.stack.database_url, step).await?;
            run.broker_alone(&cli.stack.kafka_brokers, step).await?;
            run.invariants().await?;
            report::write_many(&run)
        }
        Some(Command::Reject { out }) => {
            let step = Duration::from_secs(cli.bench.step_secs);
            let mut run = Run::connect(out, &cli.stack).await?;
            run.reject_path(&cli.bench.reject_rates.0, step).await?;
            report::write_reject(&run)
        }
        Some(Command::Overload { out }) => {
            let step = Duration::from_secs(cli.bench.step_secs);
            let mut run = Run::connect(out, &cli.stack).await?;
            let b = &cli.bench;
            let (flash, standard) = (&b.overload_flash_rates.0, &b.overload_standard_rates.0);
            let section = run
                .overload(flash, standard, step, &cli.stack.decision)
                .await?;
            run.invariants().await?;
            report::write_overload(&run, &section)
        }
        None => bench(cli.out, &cli.stack, &cli.bench).await,
    }
}

/// The benchmark: every comparison, then REPORT.md, in one run: the sale and the reject
/// paths (summary table and ladders), accepting at a core in both modes, the gate against
/// redis-benchmark, overload, the peak memory, the invariants, and what now limits each
/// path.
async fn bench(out: PathBuf, stack: &StackArgs, args: &BenchArgs) -> anyhow::Result<()> {
    let step = Duration::from_secs(args.step_secs);
    let mut run = Run::connect(out, stack).await?;
    let _ = run.flash_sale(&args.sale_rates.0, step).await?;
    run.reject_path(&args.reject_rates.0, step).await?;
    run.rate_limit_cost().await?;
    run.access_log_cost().await?;
    let mut sections = Vec::new();
    for mode in ["flash", "standard"] {
        sections.push(
            run.accept_breakdown(&args.accept_rates.0, step, mode)
                .await?,
        );
    }
    run.hot_voucher_row(&stack.decision);
    run.gate_vs_redis_benchmark(args.gate_requests).await?;
    let (flash, standard) = (
        &args.overload_flash_rates.0,
        &args.overload_standard_rates.0,
    );
    sections.push(run.overload(flash, standard, step, &stack.decision).await?);
    run.peak_memory();
    run.invariants().await?;
    for section in sections {
        run.report.push_str(&section);
    }
    report::write_report(&run, &stack.decision, step)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn rates_skip_blanks_and_refuse_words() {
        let rates: Result<Rates, _> = " 1000, 2000,,3000 ".parse();
        assert_eq!(rates.map(|r| r.0), Ok(vec![1000, 2000, 3000]));
        assert!("1000,2k".parse::<Rates>().is_err());
        assert_eq!("".parse::<Rates>().map(|r| r.0), Ok(vec![]));
    }

    #[test]
    fn the_scripts_command_lines_parse() {
        let parse = |args: &[&str]| Cli::try_parse_from(args).map(|c| (c.command, c.out));
        let out = parse(&["voucher-bench", "reports/x"]);
        assert!(matches!(out, Ok((None, ref o)) if o.as_os_str() == "reports/x"));
        let default = parse(&["voucher-bench"]);
        assert!(matches!(default, Ok((None, ref o)) if o.as_os_str() == "reports/bench"));
        let limits = parse(&["voucher-bench", "rate-limits", "reports/y"]);
        assert!(
            matches!(limits, Ok((Some(Command::RateLimits { ref out }), _)) if out.as_os_str() == "reports/y")
        );
        let big = parse(&["voucher-bench", "big-voucher"]);
        assert!(
            matches!(big, Ok((Some(Command::BigVoucher(ref b)), _)) if b.out.as_os_str() == "reports/big")
        );
        let bare = parse(&["voucher-bench", "bare-409", "127.0.0.1:18409"]);
        assert!(matches!(bare, Ok((Some(Command::Bare409 { .. }), _))));
        assert!(parse(&["voucher-bench", "bare-409"]).is_err());
    }
}
