//! Reconciliation of flash vouchers: compares the Redis gate with PostgreSQL, exports the
//! drift, and gives back uses the gate holds for orders that never reached the database.
//!
//! One instance reconciles at a time (a PostgreSQL advisory lock held for the round).
//! Each round: read every gate (one atomic snapshot per voucher), *then* wait until the
//! consumer group has committed everything published so far. After that, an order in a
//! snapshot without its row will never get one, provided its latest publish started more
//! than `flash.reconcile_grace` ago (longer than the producer keeps trying): its use is given
//! back. An order held in the gate but released in PostgreSQL (the gate step of a release
//! failed) is released in the gate too. Both go through the one give-back path, which
//! tells the edges. Then the gate's count itself is checked: if it counts fewer uses than
//! PostgreSQL's rows and the reservations in flight hold (a stale, restored, partly evicted
//! or tampered gate), the difference is taken off its remaining count at once, so the gate
//! stops selling uses PostgreSQL has already given. (A gate that counts too many is only
//! reported: giving uses back on a guess could oversell.)

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::gate::{GateSnapshot, GiveBack, OrderRecord, RecordState, ReleaseOutcome};
use super::FlashPath;
use crate::domain::{OrderId, Reservation, ReservationStatus, Voucher};
use crate::metrics::Metrics;
use crate::store::Store;
use crate::Result;

pub struct Reconciler {
    pub flash: FlashPath,
    pub store: Store,
    pub metrics: Arc<Metrics>,
    pub interval: Duration,
    /// How old a record's latest publish must be before its use may be given back.
    pub grace: Duration,
    pub catch_up_timeout: Duration,
}

/// What one voucher's reconciliation found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VoucherReport {
    /// Uses held in Redis minus uses held in PostgreSQL, after the fixes below.
    pub drift: i64,
    pub forgotten: usize,
    pub released: usize,
    /// Uses taken off the gate's remaining count because it counted fewer uses than
    /// PostgreSQL and the reservations in flight hold (a stale, restored or tampered gate).
    pub repaired: i64,
    /// Customers whose count the gate held too low, raised to what they hold.
    pub repaired_customers: usize,
}

impl Reconciler {
    pub async fn run(self, shutdown: CancellationToken) {
        crate::periodic::every(self.interval, &shutdown, || async {
            if let Err(e) = self.run_once().await {
                tracing::warn!(error = %e.chain(), "reconciliation round failed");
            }
        })
        .await;
    }

    /// One round over every live flash voucher. `None` per voucher when its gate is not
    /// loaded or the consumer did not catch up in time (nothing is decided then).
    pub async fn run_once(&self) -> Result<Vec<(Voucher, Option<VoucherReport>)>> {
        // One reconciler at a time across the cores: each repair is a delta computed from
        // its own snapshot, so two running at once would both take the same missing uses
        // off the gate (the fault campaign saw remaining go negative that way).
        let Some(turn) = self.store.exclusive_turn("reconcile").await? else {
            return Ok(Vec::new());
        };
        let reports = self.reconcile_all().await;
        turn.rollback().await?;
        reports
    }

    async fn reconcile_all(&self) -> Result<Vec<(Voucher, Option<VoucherReport>)>> {
        let vouchers = self.store.live_flash_vouchers().await?;
        let mut snapshots = Vec::with_capacity(vouchers.len());
        for v in &vouchers {
            snapshots.push(self.flash.gate().snapshot(&v.code).await?);
        }
        let caught_up = self
            .flash
            .progress()
            .wait_caught_up(self.catch_up_timeout)
            .await
            .unwrap_or(false);
        let mut reports = Vec::with_capacity(vouchers.len());
        for (voucher, snapshot) in vouchers.into_iter().zip(snapshots) {
            if let Some(s) = &snapshot {
                self.metrics
                    .gate_remaining
                    .with_label_values(&[voucher.code.as_str()])
                    .set(s.remaining);
            }
            let report = match (caught_up, snapshot) {
                (true, Some(snapshot)) => Some(self.reconcile(&voucher, snapshot).await?),
                _ => None,
            };
            if let Some(r) = &report {
                self.metrics
                    .gate_drift
                    .with_label_values(&[voucher.code.as_str()])
                    .set(r.drift);
            }
            reports.push((voucher, report));
        }
        Ok(reports)
    }

    async fn reconcile(&self, voucher: &Voucher, snapshot: GateSnapshot) -> Result<VoucherReport> {
        let rows: HashMap<String, Reservation> = self
            .store
            .voucher_reservations(&voucher.code)
            .await?
            .into_iter()
            .map(|r| (r.order_id.to_string(), r))
            .collect();
        // Records carry Redis's time; the cutoff is taken on the same clock.
        let grace = i64::try_from(self.grace.as_millis()).unwrap_or(i64::MAX);
        let cutoff = snapshot.at_ms.saturating_sub(grace);
        let mut report = VoucherReport::default();
        let mut remaining = snapshot.remaining;
        let mut users = snapshot.users.clone();
        let mut forgotten = std::collections::HashSet::new();
        for (order, record) in &snapshot.orders {
            if !record.state.holds() {
                continue;
            }
            let Ok(order_id) = OrderId::parse(order.clone()) else {
                continue;
            };
            let how = match rows.get(order).map(|r| r.status) {
                None if record.publish_ms <= cutoff => GiveBack::Forget {
                    states: vec![RecordState::Pending, RecordState::Accepted],
                    published_by_ms: cutoff,
                },
                Some(ReservationStatus::Released) => GiveBack::Release,
                _ => continue,
            };
            let reason = if matches!(how, GiveBack::Release) {
                "released_in_db"
            } else {
                "never_recorded"
            };
            if self.flash.give_back(&voucher.code, &order_id, how).await?
                == ReleaseOutcome::Released
            {
                tracing::warn!(code = %voucher.code, %order_id, reason, "reconciliation gave a use back");
                self.metrics.reconciled.with_label_values(&[reason]).inc();
                remaining += 1;
                if let Some(held) = users.get_mut(&record.customer_id) {
                    *held -= 1;
                }
                if reason == "released_in_db" {
                    report.released += 1;
                } else {
                    report.forgotten += 1;
                    forgotten.insert(order.clone());
                }
            }
        }
        // Uses the gate should count: rows that hold one, plus records in flight (holding,
        // no row yet, not forgotten). A row whose order is not in the snapshot counts only if
        // it is older than the cutoff: a younger one may have been reserved after the
        // snapshot. Undercounting here only ever makes the repair smaller.
        let in_snapshot: HashMap<&str, &OrderRecord> = snapshot
            .orders
            .iter()
            .map(|(o, r)| (o.as_str(), r))
            .collect();
        let mut legit: HashMap<&str, i64> = HashMap::new();
        let mut db_active = 0;
        for (order, r) in &rows {
            let counts = r.status != ReservationStatus::Released
                && (in_snapshot.contains_key(order.as_str())
                    || r.reserved_at.timestamp_millis() <= cutoff);
            if counts {
                db_active += 1;
                *legit.entry(r.customer_id.as_str()).or_default() += 1;
            }
        }
        let mut in_flight = 0;
        for (order, r) in &snapshot.orders {
            if r.state.holds() && !rows.contains_key(order) && !forgotten.contains(order) {
                in_flight += 1;
                *legit.entry(r.customer_id.as_str()).or_default() += 1;
            }
        }
        let gate_used = i64::from(voucher.total_limit) - remaining;
        let drift = gate_used - db_active - in_flight;
        // Customers the gate counts fewer uses for than they hold would pass their limit.
        let customers: Vec<(String, i64)> = legit
            .iter()
            .filter_map(|(customer, held)| {
                let counted = users.get(*customer).copied().unwrap_or(0);
                (counted < *held).then(|| ((*customer).to_owned(), held - counted))
            })
            .collect();
        if drift < 0 || !customers.is_empty() {
            // The gate would sell uses PostgreSQL has already given: take them off now.
            let taken = drift.min(0);
            if self
                .flash
                .gate()
                .adjust(voucher, taken, &customers)
                .await?
                .is_some()
            {
                tracing::error!(code = %voucher.code, uses = -taken, customers = customers.len(), "gate counted fewer uses than PostgreSQL holds; repaired");
                self.metrics
                    .reconciled
                    .with_label_values(&["repaired"])
                    .inc_by(taken.unsigned_abs());
                report.repaired = -taken;
                report.repaired_customers = customers.len();
                remaining += taken;
            }
        }
        report.drift = i64::from(voucher.total_limit) - remaining - db_active - in_flight;
        if report.drift != 0 {
            tracing::warn!(code = %voucher.code, drift = report.drift, "gate counts more uses than PostgreSQL and the reservations in flight");
        }
        Ok(report)
    }
}
