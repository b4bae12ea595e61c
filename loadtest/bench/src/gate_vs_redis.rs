//! Benchmark 4, our gate client (the redis crate, from this process) against
//! redis-benchmark, both running the gate's reserve script on the same kind of state:
//! accepting, and sold out. What redis-benchmark reaches is the limit for the gate on
//! this machine.

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use voucher_core::domain::{
    CustomerId, Money, OrderId, ReservationRequest, Voucher, VoucherCode, VoucherMode,
};
use voucher_core::flash::gate::{Gate, GateLoad, RESERVE_SCRIPT};

use crate::run::Run;

/// Concurrent callers on each side.
const CALLERS: u64 = 50;

impl Run {
    /// `requests`: calls of the script per state, on each side.
    pub async fn gate_vs_redis_benchmark(&mut self, requests: u64) -> anyhow::Result<()> {
        eprintln!("gate vs redis-benchmark");
        let prefix = format!("bench{}:", self.run_id);
        let gate = Gate::connect(&self.stack.redis_settings(&prefix)).await?;
        let now = chrono::Utc::now();
        for (label, remaining) in [("accepting", 100_000_000i64), ("sold out", 0)] {
            let code = VoucherCode::parse(format!(
                "G{}{}",
                if remaining > 0 { "A" } else { "Z" },
                self.run_id
            ))
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
            let voucher = Voucher {
                code: code.clone(),
                discount_amount: Money::positive("discountAmount", 100_000)
                    .map_err(|e| anyhow::anyhow!("{e:?}"))?,
                min_order_amount: Money::not_negative("minOrderAmount", 0)
                    .map_err(|e| anyhow::anyhow!("{e:?}"))?,
                total_limit: 100_000_000,
                per_user_limit: 1,
                starts_at: now - chrono::Duration::hours(1),
                ends_at: now + chrono::Duration::days(1),
                mode: VoucherMode::Flash,
                created_at: now,
                state: voucher_core::domain::VoucherState::Active,
                version: 1,
                updated_at: now,
            };
            gate.load(
                &voucher,
                1,
                &GateLoad {
                    remaining,
                    ..Default::default()
                },
            )
            .await?;
            let theirs = redis_benchmark_rate(&prefix, &code, requests)?;
            let ours = gate_client_rate(&gate, &code, requests).await?;
            self.table.push(format!(
                "| Gate script, {label}: our gate client (50 callers) vs redis-benchmark (50 clients), same Lua script | {ours:.0}/s | {theirs:.0}/s (redis-benchmark) | {:.2} | the limit for the gate on this box |",
                ours / theirs.max(1.0)
            ));
            gate.unload(&code).await?;
        }
        Ok(())
    }
}

/// redis-benchmark running the reserve script on the gate of `code` (keys under `prefix`):
/// 50 clients, random order and customer ids. Calls per second; 0 when it printed none.
fn redis_benchmark_rate(prefix: &str, code: &VoucherCode, requests: u64) -> anyhow::Result<f64> {
    let sha = redis::Script::new(RESERVE_SCRIPT).get_hash().to_owned();
    let base = format!("{prefix}{{{}}}", code.as_str());
    let output = Command::new("redis-benchmark")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            "6379",
            "-c",
            &CALLERS.to_string(),
            "-n",
            &requests.to_string(),
            "-r",
            "1000000000",
            "--csv",
        ])
        .args(["EVALSHA", &sha, "5"])
        .arg(format!("{base}:meta"))
        .arg(format!("{base}:remaining"))
        .arg(format!("{base}:users"))
        .arg(format!("{base}:orders"))
        .arg(format!("{base}:unsettled"))
        .args(["o-__rand_int__", "c-__rand_int__", "250000", "900000"])
        .arg(voucher_contract::sold_out_channel(prefix))
        .arg(code.as_str())
        .output()?;
    let text = String::from_utf8_lossy(&output.stdout);
    Ok(text
        .lines()
        .filter_map(|l| {
            l.split("\",\"")
                .nth(1)
                .map(|v| v.trim_matches('"'))
                .and_then(|v| v.parse().ok())
        })
        .next()
        .unwrap_or(0.0))
}

/// The same script through our `Gate`, 50 concurrent callers: calls per second.
async fn gate_client_rate(gate: &Gate, code: &VoucherCode, requests: u64) -> anyhow::Result<f64> {
    let counter = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..CALLERS {
        let (gate, counter, code) = (gate.clone(), counter.clone(), code.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = counter.fetch_add(1, Ordering::Relaxed);
                if i >= requests {
                    return;
                }
                let (Ok(customer_id), Ok(order_id), Ok(order_amount)) = (
                    CustomerId::parse(format!("gc{i}")),
                    OrderId::parse(format!("go{i}")),
                    Money::positive("orderAmount", 250_000),
                ) else {
                    continue;
                };
                let request = ReservationRequest {
                    voucher_code: code.clone(),
                    customer_id,
                    order_id,
                    order_amount,
                };
                let _ = gate.reserve(&request, 900_000).await;
            }
        }));
    }
    for t in tasks {
        t.await?;
    }
    Ok(requests as f64 / started.elapsed().as_secs_f64())
}
