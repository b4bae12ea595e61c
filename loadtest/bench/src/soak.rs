//! The soak: 1,000-use flash sales back to back through the edge for a long time (10
//! minutes by default) at half the sale's sustained rate, the resident memory of the edge
//! and of both cores sampled every few seconds; SOAK.md says whether it grew from minute 2
//! to the end (the limit is 5%), with the curve beside it (`soak-rss.csv`, `soak-rss.png`).
//! Before the clock starts, a warm-up gives every core a sale at the full rate.
//!
//! Memory that only a long run shows (a cache without a bound, a map keyed by voucher or
//! connection that is never pruned, an allocator that keeps what it freed) grows here sale
//! after sale; a benchmark's ladder is over before it shows.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::invariants::remember_accepted;
use crate::ladder::{reserve_plan, SALE_CONNECTIONS};
use crate::load;
use crate::probe;
use crate::report::fmt_ms;
use crate::run::Run;

/// How often the resident memory is read.
const SAMPLE_EVERY: Duration = Duration::from_secs(5);

/// The processes whose memory is followed, by their pid files (`scripts/lib.sh`).
const PROCESSES: [(&str, &str); 3] = [
    ("edge", "run/edge.pid"),
    ("core 1", "run/core.pid"),
    ("core 2", "run/core2.pid"),
];

/// One reading of every process's resident memory (MiB; `None` if it could not be read).
struct Reading {
    at: Duration,
    rss: [Option<f64>; 3],
}

/// One sale of the soak.
struct Sale {
    started: Duration,
    issued: u64,
    rows: i64,
    offered: u64,
    p99_accepted: Option<f64>,
    p99_rejected: Option<f64>,
    late: u64,
    errors: u64,
}

/// What the soak was asked to do.
pub struct SoakPlan {
    pub duration: Duration,
    /// Requests per second of every sale.
    pub rate: u64,
    /// Where the rate came from, for the report.
    pub rate_source: String,
    /// How long each sale's load lasts (it sells out early in it; the rest is rejects).
    pub sale: Duration,
    /// Requests per second of the warm-up's sales (the rate the soak's is half of).
    pub warm_rate: u64,
}

/// At most this many warm-up sales: each has even odds of going to either of two cores, so
/// both have one after 8 with a probability of 1 - 2/2^8.
const WARM_SALES: usize = 8;

/// The warm-up before the soak's clock starts: sales at the full rate until every core has
/// accepted one's reservations.
struct Warm {
    sales: Vec<Sale>,
    /// Reservations each core accepted over the warm-up (in the order of the cores' metrics).
    accepted_per_core: Vec<f64>,
    /// Why the cores' counters could not be read, if they could not: the warm-up then ends
    /// there and the soak goes on, its report saying so.
    unread: Option<String>,
}

impl Run {
    pub async fn soak(&mut self, plan: &SoakPlan) -> anyhow::Result<()> {
        eprintln!(
            "soak: sales of {} s at {}/s for {} s",
            plan.sale.as_secs(),
            plan.rate,
            plan.duration.as_secs()
        );
        let warm = self.warm_cores(plan).await?;
        let readings = Arc::new(Mutex::new(Vec::new()));
        let start = Instant::now();
        let sampler = {
            let readings = readings.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(SAMPLE_EVERY);
                loop {
                    tick.tick().await;
                    let rss = PROCESSES.map(|(_, pid_file)| probe::rss_mib(pid_file));
                    if let Ok(mut r) = readings.lock() {
                        r.push(Reading {
                            at: start.elapsed(),
                            rss,
                        });
                    }
                }
            })
        };
        let mut sales = Vec::new();
        let mut n = 0;
        while start.elapsed() + plan.sale <= plan.duration {
            n += 1;
            let started = start.elapsed();
            let sale = self
                .one_sale(
                    &format!("K{}N{n}", self.run_id),
                    plan.rate,
                    plan.sale,
                    started,
                )
                .await?;
            eprintln!("  sale {n}: issued {}, rows {}", sale.issued, sale.rows);
            sales.push(sale);
        }
        // One last reading at the end, whatever the interval's phase.
        tokio::time::sleep(SAMPLE_EVERY).await;
        sampler.abort();
        let readings = readings
            .lock()
            .map(|mut r| std::mem::take(&mut *r))
            .unwrap_or_default();
        self.report_soak(plan, &warm, &sales, &readings)
    }

    /// A voucher's sale goes to one core (the edge's ring), so half-rate sales can leave a
    /// core below the working set the full rate gives it until late in the soak, and its
    /// first peak then reads as growth (core 2 in the run of 2026-12-07 02:58: +5.4%, its
    /// level rising to core 1's, which the ladder had warmed, and no further under more
    /// load). Before the clock starts, sales at the full rate, one after another, until
    /// every core has accepted reservations of one; they are checked like the soak's.
    async fn warm_cores(&mut self, plan: &SoakPlan) -> anyhow::Result<Warm> {
        // Accepted reservations, not 201s: a voucher's creation is a 201 too, at whichever
        // core.
        const ACCEPTED: (&str, &[(&str, &str)]) = (
            "voucher_reservations_total",
            &[("mode", "flash"), ("outcome", "reserved")],
        );
        let mut warm = Warm {
            sales: Vec::new(),
            accepted_per_core: Vec::new(),
            unread: None,
        };
        let before = match self.stack.counter_per_core(ACCEPTED.0, ACCEPTED.1).await {
            Ok(before) => before,
            Err(e) => {
                warm.unread = Some(format!("{e:#}"));
                return Ok(warm);
            }
        };
        warm.accepted_per_core = vec![0.0; before.len()];
        for n in 1..=WARM_SALES {
            let sale = self
                .one_sale(
                    &format!("K{}W{n}", self.run_id),
                    plan.warm_rate,
                    plan.sale,
                    Duration::ZERO,
                )
                .await?;
            eprintln!(
                "  warm-up sale {n}: issued {}, rows {}",
                sale.issued, sale.rows
            );
            warm.sales.push(sale);
            let now = match self.stack.counter_per_core(ACCEPTED.0, ACCEPTED.1).await {
                Ok(now) => now,
                Err(e) => {
                    warm.unread = Some(format!("{e:#}"));
                    break;
                }
            };
            warm.accepted_per_core = now.iter().zip(&before).map(|(a, b)| a - b).collect();
            if warm.accepted_per_core.iter().all(|&a| a > 0.0) {
                break;
            }
        }
        Ok(warm)
    }

    /// One 1,000-use flash sale through the edge at `rate` for `length`, its accepted
    /// reservations remembered for the invariants and its rows waited for.
    async fn one_sale(
        &mut self,
        code: &str,
        rate: u64,
        length: Duration,
        started: Duration,
    ) -> anyhow::Result<Sale> {
        self.stack.create_voucher(code, 1000, "flash").await?;
        let outcome = load::run(reserve_plan(
            self.edge,
            rate,
            length,
            code,
            "k",
            SALE_CONNECTIONS,
        ))
        .await?;
        remember_accepted(&self.accepted, code, "k", &outcome);
        let issued = outcome.count(|s| s.status == 201);
        let (rows, _) = self.stack.wait_recorded(code, issued as i64).await?;
        Ok(Sale {
            started,
            issued,
            rows,
            offered: outcome.offered,
            p99_accepted: outcome.percentile(99.0, |s| s.status == 201),
            p99_rejected: outcome.percentile(99.0, |s| s.status == 409),
            late: outcome.late,
            errors: outcome.errors(),
        })
    }

    fn report_soak(
        &mut self,
        plan: &SoakPlan,
        warm: &Warm,
        sales: &[Sale],
        readings: &[Reading],
    ) -> anyhow::Result<()> {
        let mut csv = String::from("at_s,edge_mib,core1_mib,core2_mib\n");
        for r in readings {
            let v = r
                .rss
                .map(|m| m.map_or(String::new(), |m| format!("{m:.2}")));
            let _ = writeln!(csv, "{:.1},{},{},{}", r.at.as_secs_f64(), v[0], v[1], v[2]);
        }
        std::fs::write(self.out.join("soak-rss.csv"), csv)?;

        // "From minute 2": the first reading at or after a fifth of the run (minute 2 of
        // ten), so a shorter soak is judged the same way.
        let from = plan.duration / 5;
        let first = readings.iter().find(|r| r.at >= from);
        let last = readings.last();
        let sales_exact = exact(sales);
        for (k, (name, _)) in PROCESSES.iter().enumerate() {
            let (a, b) = (first.and_then(|r| r.rss[k]), last.and_then(|r| r.rss[k]));
            let growth = a.zip(b).map(|(a, b)| (b - a) / a);
            self.table.push(format!(
                "| RSS of {name}, minute {:.0} to the end | {} → {} | growth < 5% | {} | {} |",
                from.as_secs_f64() / 60.0,
                a.map_or("?".into(), |v| format!("{v:.1} MiB")),
                b.map_or("?".into(), |v| format!("{v:.1} MiB")),
                growth.map_or("?".into(), |g| format!("{:+.1}%", g * 100.0)),
                match growth {
                    Some(g) if g < 0.05 => "holds",
                    Some(_) => "grew",
                    None => "not read",
                }
            ));
        }
        self.table.push(format!(
            "| Sales | {} of {} issued exactly 1,000 (rows 1,000) | every one | {} | {} requests; worst p99 of a sale: accepted {}, rejected {}; late starts {}, errors {} |",
            sales_exact,
            sales.len(),
            if sales_exact == sales.len() { "holds" } else { "broken" },
            sales.iter().map(|s| s.offered).sum::<u64>(),
            fmt_ms(worst(sales, |s| s.p99_accepted)),
            fmt_ms(worst(sales, |s| s.p99_rejected)),
            sales.iter().map(|s| s.late).sum::<u64>(),
            sales.iter().map(|s| s.errors).sum::<u64>(),
        ));

        let warm_exact = exact(&warm.sales);
        let every_core = warm.accepted_per_core.iter().all(|&a| a > 0.0);
        self.table.push(format!(
            "| Warm-up before minute 0 | {} sales at {}/s, {} of them exactly 1,000; reservations accepted per core: {} | every core warmed | {} | worst p99 of a sale: accepted {}, rejected {}; errors {} |",
            warm.sales.len(),
            plan.warm_rate,
            warm_exact,
            match &warm.unread {
                Some(why) => format!("not read ({why})"),
                None => warm
                    .accepted_per_core
                    .iter()
                    .map(|a| format!("{a:.0}"))
                    .collect::<Vec<_>>()
                    .join(", "),
            },
            // A sale that did not issue exactly 1,000 is the worse news: it comes first.
            if warm_exact != warm.sales.len() {
                "broken"
            } else if warm.unread.is_some() {
                "not known"
            } else if every_core {
                "holds"
            } else {
                "a core not warmed"
            },
            fmt_ms(worst(&warm.sales, |s| s.p99_accepted)),
            fmt_ms(worst(&warm.sales, |s| s.p99_rejected)),
            warm.sales.iter().map(|s| s.errors).sum::<u64>(),
        ));

        let mut md = String::new();
        let _ = writeln!(
            md,
            "\n## The curve\n\nResident memory (VmRSS, MiB) every 30 s; every reading is in `soak-rss.csv`, plotted in `soak-rss.png`.\n\n![resident memory over the soak](soak-rss.png)\n\n| at | edge | core 1 | core 2 | sale running |\n|---|---|---|---|---|"
        );
        let mut next = Duration::ZERO;
        for r in readings {
            if r.at < next {
                continue;
            }
            next = r.at + Duration::from_secs(30);
            let v = r.rss.map(|m| m.map_or("?".into(), |m| format!("{m:.1}")));
            let sale = sales
                .iter()
                .rposition(|s| s.started <= r.at)
                .map_or("-".into(), |i| format!("{}", i + 1));
            let _ = writeln!(
                md,
                "| {:.0} s | {} | {} | {} | {sale} |",
                r.at.as_secs_f64(),
                v[0],
                v[1],
                v[2]
            );
        }
        self.report = format!(
            "\n## The soak\n\n- {} s of sales of {} s each at {}/s ({}), {} connections, a new 1,000-use flash voucher per sale, one after another\n- before its clock starts, a warm-up: sales of {} s at {}/s, one after another, until every core has accepted reservations of one (a voucher's sale goes to one core, so half-rate sales alone can leave a core below the working set the full rate gives it until late in the soak), at most {WARM_SALES}; no reading is taken during it\n{}{md}",
            plan.duration.as_secs(),
            plan.sale.as_secs(),
            plan.rate,
            plan.rate_source,
            SALE_CONNECTIONS,
            plan.sale.as_secs(),
            plan.warm_rate,
            std::mem::take(&mut self.report)
        );
        Ok(())
    }
}

/// How many of `sales` issued exactly 1,000 uses, with 1,000 rows.
fn exact(sales: &[Sale]) -> usize {
    sales
        .iter()
        .filter(|s| s.issued == 1000 && s.rows == 1000)
        .count()
}

/// The highest of a figure over `sales` (`None` if no sale has it).
fn worst(sales: &[Sale], figure: fn(&Sale) -> Option<f64>) -> Option<f64> {
    sales.iter().filter_map(figure).reduce(f64::max)
}
