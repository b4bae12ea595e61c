//! The broker alone: the core's own producer (`flash::events::publisher::Publisher`,
//! acks from every in-sync replica, waiting for each acknowledgement as the broker
//! deciding does) publishing reservation events as fast as `CALLERS` callers can, to a
//! topic of one partition and to one of six, keyed by ten voucher codes as a sale of ten
//! vouchers keys them. Acknowledged events per second and the broker's CPU per event.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use voucher_core::config::KafkaSettings;
use voucher_core::flash::events::publisher::Publisher;
use voucher_core::flash::events::ReservedEvent;

use crate::cpu::{self, CpuSpent};
use crate::run::Run;

/// Callers waiting for acknowledgements at once (a core's requests in flight).
const CALLERS: usize = 256;

impl Run {
    pub async fn broker_alone(&mut self, brokers: &str, step: Duration) -> anyhow::Result<()> {
        let mut rows = Vec::new();
        for partitions in [1, 6] {
            let settings = KafkaSettings {
                brokers: brokers.to_owned(),
                topic: format!("bench-acks-{partitions}-{}", self.run_id),
                partitions,
                replication_factor: 1,
                min_insync_replicas: 1,
                ..KafkaSettings::default()
            };
            voucher_core::flash::events::topics::ensure_topics(&settings).await?;
            // The broker deciding's linger: each caller waits for its acknowledgement.
            let publisher = Publisher::new(&settings, Duration::from_millis(2))?;
            let acked = Arc::new(AtomicU64::new(0));
            let failed = Arc::new(AtomicU64::new(0));
            let started = Instant::now();
            let before = cpu::sample();
            let mut callers = tokio::task::JoinSet::new();
            for c in 0..CALLERS {
                let (publisher, acked, failed) = (publisher.clone(), acked.clone(), failed.clone());
                callers.spawn(async move {
                    let mut n = 0u64;
                    while started.elapsed() < step {
                        n += 1;
                        let event = ReservedEvent {
                            voucher_code: format!("ACKS{}", (c as u64 + n) % 10),
                            order_id: format!("acks-{c}-{n}"),
                            customer_id: format!("acks-c{c}-{n}"),
                            order_amount: 250_000,
                            discount_amount: 100_000,
                            reserved_at_ms: 0,
                            expires_at_ms: 0,
                        };
                        match publisher.publish(&event).await {
                            Ok(()) => acked.fetch_add(1, Ordering::Relaxed),
                            Err(_) => failed.fetch_add(1, Ordering::Relaxed),
                        };
                    }
                });
            }
            while callers.join_next().await.is_some() {}
            let spent = CpuSpent::between(&before, &cpu::sample());
            let secs = spent.wall.as_secs_f64().max(f64::EPSILON);
            let acks = acked.load(Ordering::Relaxed);
            let broker = spent
                .by_part
                .iter()
                .find(|(part, _)| *part == "broker")
                .map_or(0.0, |(_, s)| *s);
            rows.push(format!(
                "| {partitions} | {:.0} | {} | {:.1} | {:.2} |",
                acks as f64 / secs,
                failed.load(Ordering::Relaxed),
                broker * 1e6 / acks.max(1) as f64,
                broker / secs
            ));
        }
        self.report.push_str(&format!(
            "\n## The broker alone\n\nThe core's own producer (`Publisher`: acks=all, linger 2 ms, each caller waiting for its event's acknowledgement), {CALLERS} callers for {} s per topic, events keyed by ten voucher codes, to tansu.\n\n| partitions | acknowledged events/s | not acknowledged | broker µs per event | broker CPU (cores) |\n|---|---|---|---|---|\n{}\n",
            step.as_secs(),
            rows.join("\n")
        ));
        Ok(())
    }
}
