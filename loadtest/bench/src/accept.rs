//! `voucher-bench accept`: where the time of an accepted reservation goes. The hot
//! voucher's ladder at one core (both modes in the whole benchmark), and for every step
//! the CPU each process of the stack spent per accepted reservation (`/proc` times, see
//! [`crate::cpu`]), the writing transactions per use, the consumer's transactions, the
//! reservations per grouped statement, and the core's own view of its waits (the gate
//! script, PostgreSQL's grouped commit). Flash mode (ACCEPT.md) or standard mode
//! (`ACCEPT_MODE=standard`: ACCEPT-standard.md, no gate); the method is at its top.

use std::fmt::Write as _;
use std::time::Duration;

use crate::bounds::{accepting_path, Asked, Cost, PathFound};
use crate::cpu::{self, CpuSpent};
use crate::invariants::remember_accepted;
use crate::ladder::{reserve_plan, SALE_CONNECTIONS};
use crate::load;
use crate::report::fmt_ms;
use crate::run::Run;

/// What the core's grouped decision takes alone, at one batch size.
pub(crate) struct Alone {
    pub batch: usize,
    pub writers: usize,
    pub uses_per_sec: f64,
    pub transactions_per_sec: f64,
    pub postgres_us_per_use: f64,
}

/// The rate asked of accepting on one hot voucher at a core, in either mode.
const ASKED_ACCEPTS: f64 = 10_000.0;

/// The standing of `mode`'s accepting path at a core: what is asked of it is 10,000/s,
/// aiming (flash) at half of what the grouped decision takes alone.
fn found(mode: &str, steps: &[AcceptStep], alone: &[Alone]) -> PathFound {
    let cost = |s: &AcceptStep| Cost {
        rate: s.rate,
        answers: s.accepted,
        cpu: s.cpu.clone(),
    };
    let sustained = steps
        .iter()
        .rfind(|s| s.sustained)
        .map(|s| (s.achieved, Some(cost(s))));
    let failed = steps.last().filter(|s| !s.sustained).map(|s| {
        (
            format!("{}/s", s.rate),
            s.why.clone().unwrap_or_default(),
            Some(cost(s)),
        )
    });
    let alone_best = alone.iter().map(|a| a.uses_per_sec).fold(0.0, f64::max);
    let what = if mode == "flash" {
        format!(
            "aiming at half of the grouped decision alone, {:.0}/s",
            alone_best / 2.0
        )
    } else {
        "at most one transaction per 10 uses".to_owned()
    };
    PathFound {
        path: accepting_path(mode, "at a core"),
        sustained,
        failed,
        asked: Some(Asked {
            rate: ASKED_ACCEPTS,
            what,
        }),
        climbs: true,
    }
}

impl Run {
    /// The summary table's row of accepting on one hot voucher at a core, flash against
    /// standard, from the two accepting ladders; `decision` is the cores'
    /// `flash.decision`, to name what a flash use waits for.
    pub fn hot_voucher_row(&mut self, decision: &str) {
        let rate = |mode: &str| {
            let path = accepting_path(mode, "at a core");
            self.found
                .iter()
                .find(|f| f.path == path)
                .and_then(|f| f.sustained.as_ref().map(|(rate, _)| *rate))
                .unwrap_or(0.0)
        };
        let (flash, standard) = (rate("flash"), rate("standard"));
        self.table.push(format!(
            "| Accepting on one hot voucher, at a core: flash gate path vs standard PostgreSQL path (ours) | {flash:.0}/s | {standard:.0}/s | {:.2} | flash = Redis script + {} per use; ladders and CPU per accept in the sections \"Accepting at a core\" |",
            flash / standard.max(1.0),
            match decision {
                "broker" => "Kafka acks=all",
                _ => "PostgreSQL commit (grouped)",
            }
        ));
    }
}

/// Batch sizes and writers of the decision measured alone.
const ALONE: [(usize, usize); 4] = [(10, 1), (50, 1), (200, 1), (50, 2)];

/// One step's figures.
struct AcceptStep {
    rate: u64,
    accepted: u64,
    achieved: f64,
    p99: Option<f64>,
    sustained: bool,
    /// Why it was not sustained.
    why: Option<String>,
    cpu: CpuSpent,
    writing_transactions: i64,
    consumer_transactions: f64,
    gate_ms: f64,
    record_ms: f64,
    /// Reservations per grouped statement, on average (`voucher_group_size`).
    group_size: f64,
}

impl Run {
    /// The accepting ladder at one core with the CPU breakdown, as a section of a report;
    /// climbs until a step is not sustained (it stops at the first failed step above a
    /// sustained one). Its standing goes to [`Run::found`].
    pub async fn accept_breakdown(
        &mut self,
        rates: &[u64],
        step: Duration,
        mode: &str,
    ) -> anyhow::Result<String> {
        let initial = mode[..1].to_ascii_uppercase();
        // A warm-up first, neither timed nor reported: on a stack just started the first
        // step met cold pools, caches and producer metadata, and its p99 was the ladder's
        // worst even where the next, higher step held (runs of 2026-12-01).
        if let Some(&first) = rates.first() {
            // Codes carry the mode: one run climbs both modes (`./loadtest/bench.sh`).
            let code = format!("A{initial}{}WARM", self.run_id);
            self.warm_up(self.core, &code, 10_000_000, mode, first, step, "a")
                .await?;
        }
        let mut steps = Vec::new();
        for &rate in rates {
            // A voucher per step: every request of the step is a new order, none a retry
            // of an earlier step's.
            let code = format!("A{initial}{}R{rate}", self.run_id);
            self.stack.create_voucher(&code, 10_000_000, mode).await?;
            let tag = "a";
            let (_, _, xid_before, consumer_before) = self.stack.sale_counters().await?;
            let waits_before = self.waits().await?;
            let groups_before = self.groups(mode).await?;
            let before = cpu::sample();
            let outcome = load::run(reserve_plan(
                self.core,
                rate,
                step,
                &code,
                tag,
                SALE_CONNECTIONS,
            ))
            .await?;
            let after = cpu::sample();
            let (_, _, xid_after, consumer_after) = self.stack.sale_counters().await?;
            let waits_after = self.waits().await?;
            let groups_after = self.groups(mode).await?;
            remember_accepted(&self.accepted, &code, tag, &outcome);
            let accepted = outcome.count(|s| s.status == 201);
            let per = |sum: f64, count: f64| 1000.0 * sum / count.max(1.0);
            steps.push(AcceptStep {
                rate,
                accepted,
                achieved: accepted as f64 / step.as_secs_f64(),
                p99: outcome.percentile(99.0, |s| s.status != 0),
                sustained: outcome.sustained(100.0),
                why: Some(outcome.shortfalls(100.0).join("; ")).filter(|w| !w.is_empty()),
                cpu: CpuSpent::between(&before, &after),
                writing_transactions: xid_after - xid_before,
                consumer_transactions: consumer_after - consumer_before,
                gate_ms: per(
                    waits_after.0 - waits_before.0,
                    waits_after.1 - waits_before.1,
                ),
                record_ms: per(
                    waits_after.2 - waits_before.2,
                    waits_after.3 - waits_before.3,
                ),
                group_size: (groups_after.0 - groups_before.0)
                    / (groups_after.1 - groups_before.1).max(1.0),
            });
            if !steps.last().is_some_and(|s| s.sustained) {
                break;
            }
        }
        let pool = self.stack.db.clone();
        let alone = self.decision_alone(step, mode, &pool, &initial).await?;
        self.found(found(mode, &steps, &alone));
        let mut md = String::new();
        writeln!(
            md,
            "\n## Accepting at a core, {mode} mode: where an accepted reservation's time goes\n"
        )?;
        writeln!(md, "- load: new reservations of one {mode} voucher of 10,000,000 uses (a new voucher per step), straight to one core, open model, {SALE_CONNECTIONS} connections, steps of {} s after an untimed warm-up of 2 s at the first rate; PostgreSQL deciding", step.as_secs())?;
        writeln!(md, "- CPU: user plus system time of every process of the stack from `/proc/<pid>/stat`, read right before and after the step, divided by the step's accepted reservations (µs per accept); `machine busy` is all of it over the step's wall time on 2 cores. The cores' column sums both cores (the one not called runs its background jobs); PostgreSQL sums every backend and its own processes")?;
        writeln!(md, "- writing transactions: the server's transaction ids taken over the step (only writing transactions take one), whole server; consumer transactions from `voucher_consumer_transactions_total`")?;
        writeln!(md, "- waits: the core's mean time in the gate script (`voucher_gate_duration_seconds`) and in PostgreSQL's grouped commit, queue included (`voucher_record_duration_seconds`); flash mode only. Uses per statement: the mean of `voucher_group_size` for the mode over the step")?;
        writeln!(md, "- sustained: answers at 97% of the offered rate or more, at most 1% late starts, p99 < 100 ms, no connection error, at most 0.1% 503s\n")?;
        writeln!(md, "| offered/s | accepted/s | p99 | sustained | {} | writing transactions per use | uses per statement | consumer transactions | gate wait | commit wait |", CpuSpent::header())?;
        let columns = 4 + 8 + 5;
        writeln!(md, "|{}", "---|".repeat(columns))?;
        for s in &steps {
            writeln!(
                md,
                "| {} | {:.0} | {} | {} | {} | {:.3} | {:.1} | {:.0} | {:.2} ms | {:.2} ms |",
                s.rate,
                s.achieved,
                fmt_ms(s.p99),
                if s.sustained { "yes" } else { "no" },
                s.cpu.cells(s.accepted, 2.0).join(" | "),
                s.writing_transactions as f64 / s.accepted.max(1) as f64,
                s.group_size,
                s.consumer_transactions,
                s.gate_ms,
                s.record_ms,
            )?;
        }
        writeln!(
            md,
            "\n### PostgreSQL's grouped decision alone, {mode} mode\n"
        )?;
        if mode == "standard" {
            writeln!(md, "The core's own statement (`DecidedWriter::reserve_standard`, what standard mode's grouper runs), called in a loop by this process with batches of a fixed size for one step's time, on one standard voucher of 10,000,000 uses: what one grouping worker could decide if the HTTP path and the queue cost nothing.\n")?;
        } else {
            writeln!(md, "The core's own statement (`Store::decided_writer`, what the recorder runs), called in a loop by this process with batches of a fixed size for one step's time, on one flash voucher of 10,000,000 uses, fenced by its gate generation: what one recorder worker could commit if the gate, the HTTP path and the queue cost nothing.\n")?;
        }
        writeln!(md, "| batch size | writers | uses/s | transactions/s | PostgreSQL µs per use |\n|---|---|---|---|---|")?;
        for a in &alone {
            writeln!(
                md,
                "| {} | {} | {:.0} | {:.0} | {:.1} |",
                a.batch, a.writers, a.uses_per_sec, a.transactions_per_sec, a.postgres_us_per_use
            )?;
        }
        Ok(md)
    }

    /// The core's grouped decision, called directly on `pool` in batches of each size of
    /// [`ALONE`], each for `step`, on vouchers named with `tag`; the uses go to the
    /// invariant check with the rest.
    pub(crate) async fn decision_alone(
        &mut self,
        step: Duration,
        mode: &str,
        pool: &sqlx::PgPool,
        tag: &str,
    ) -> anyhow::Result<Vec<Alone>> {
        use voucher_core::domain::{
            CustomerId, Money, OrderId, Reservation, ReservationStatus, VoucherCode,
        };
        use voucher_core::store::{Recording, Store};

        let mut found = Vec::new();
        for (k, &(batch, writers)) in ALONE.iter().enumerate() {
            let code = format!("D{tag}{}B{batch}W{writers}", self.run_id);
            self.stack.create_voucher(&code, 10_000_000, mode).await?;
            let standard = mode == "standard";
            let store = Store::new(pool.clone());
            let voucher = VoucherCode::parse(&code).map_err(|e| anyhow::anyhow!("{e:?}"))?;
            let generation = store.gate_generation(&voucher).await?;
            let started = tokio::time::Instant::now();
            let before = cpu::sample();
            let mut tasks = tokio::task::JoinSet::new();
            for w in 0..writers {
                let (store, code, voucher) = (store.clone(), code.clone(), voucher.clone());
                tasks.spawn(async move {
                    let mut writer = store.decided_writer();
                    let (mut uses, mut transactions, mut n) = (0u64, 0u64, 0u64);
                    let mut made = Vec::new();
                    while started.elapsed() < step {
                        let mut rows = Vec::with_capacity(batch);
                        for _ in 0..batch {
                            n += 1;
                            let (customer, order) =
                                (format!("d{k}w{w}-c{n}"), format!("{code}-d{w}-{n}"));
                            rows.push(Reservation {
                                order_id: OrderId::parse(order.clone())
                                    .map_err(|e| anyhow::anyhow!("{e:?}"))?,
                                voucher_code: voucher.clone(),
                                customer_id: CustomerId::parse(customer.clone())
                                    .map_err(|e| anyhow::anyhow!("{e:?}"))?,
                                order_amount: Money::positive("orderAmount", 100_000)
                                    .map_err(|e| anyhow::anyhow!("{e:?}"))?,
                                discount_amount: Money::positive("discountAmount", 100_000)
                                    .map_err(|e| anyhow::anyhow!("{e:?}"))?,
                                status: ReservationStatus::Reserved,
                                reserved_at: chrono::Utc::now(),
                                expires_at: chrono::Utc::now() + chrono::Duration::minutes(15),
                            });
                            made.push((customer, order));
                        }
                        let generations = vec![generation; rows.len()];
                        let recording = if standard {
                            writer
                                .reserve_standard(&rows, chrono::Duration::minutes(15))
                                .await?
                        } else {
                            writer.record(&rows, &generations).await?
                        };
                        match recording {
                            Recording::Done(done) => {
                                uses += done.inserted as u64;
                                transactions += done.transactions as u64;
                            }
                            Recording::NotSent(e) => anyhow::bail!("no connection: {}", e.chain()),
                        }
                    }
                    anyhow::Ok((uses, transactions, made))
                });
            }
            let (mut uses, mut transactions) = (0, 0);
            while let Some(done) = tasks.join_next().await {
                let (u, t, made) = done??;
                uses += u;
                transactions += t;
                if let Ok(mut list) = self.accepted.lock() {
                    list.extend(
                        made.iter()
                            .map(|(c, o)| voucher_testkit::invariants::Accepted::new(&code, c, o)),
                    );
                }
            }
            let spent = CpuSpent::between(&before, &cpu::sample());
            // Written behind the gate's back: the gate is rebuilt from PostgreSQL, so the
            // invariant check finds it in step.
            if !standard {
                self.stack.reload_gate(&code).await?;
            }
            let secs = spent.wall.as_secs_f64().max(f64::EPSILON);
            let postgres = spent
                .by_part
                .iter()
                .find(|(part, _)| *part == "PostgreSQL")
                .map_or(0.0, |(_, s)| *s);
            found.push(Alone {
                batch,
                writers,
                uses_per_sec: uses as f64 / secs,
                transactions_per_sec: transactions as f64 / secs,
                postgres_us_per_use: postgres * 1e6 / uses.max(1) as f64,
            });
        }
        Ok(found)
    }

    /// The cores' grouped statements of `mode` so far: (reservations, statements).
    async fn groups(&self, mode: &str) -> anyhow::Result<(f64, f64)> {
        let s = &self.stack;
        let labels = [("mode", mode)];
        Ok((
            s.core_counter("voucher_group_size_sum", &labels).await?,
            s.core_counter("voucher_group_size_count", &labels).await?,
        ))
    }

    /// The cores' gate and record waits so far: (gate sum, gate count, record sum, record
    /// count), in seconds.
    async fn waits(&self) -> anyhow::Result<(f64, f64, f64, f64)> {
        let s = &self.stack;
        Ok((
            s.core_counter("voucher_gate_duration_seconds_sum", &[])
                .await?,
            s.core_counter("voucher_gate_duration_seconds_count", &[])
                .await?,
            s.core_counter("voucher_record_duration_seconds_sum", &[])
                .await?,
            s.core_counter("voucher_record_duration_seconds_count", &[])
                .await?,
        ))
    }
}
