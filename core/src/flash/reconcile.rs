//! Reconciliation of flash vouchers: compares the Redis gate with PostgreSQL, exports the
//! drift, gives back uses the gate holds for orders that never reached the database, and
//! repairs a gate that counts fewer uses than PostgreSQL holds.
//!
//! One instance reconciles at a time (a PostgreSQL advisory lock held for the round).
//! Each round reads every gate first (one short atomic snapshot per voucher: the remaining
//! count and the *unsettled* orders, those the gate took whose row was not yet seen), *then*
//! waits until the writers have stored everything published so far. After that, per voucher:
//!
//! - an unsettled order with its row is settled (dropped from the set); one whose row is
//!   released is released in the gate too; one without a row will never get one, provided
//!   its latest publish started more than `flash.reconcile_grace` ago (longer than the
//!   producer keeps trying): its use is given back;
//! - rows released since the last round whose gate record still holds (the gate step of a
//!   release failed) are released in the gate;
//! - the gate's count is checked against the voucher's counter: uses the gate should count
//!   are the active rows reserved by the snapshot plus the orders still in flight. If the
//!   gate counts fewer (a stale, restored, partly evicted or tampered gate), the difference
//!   is taken off its remaining count, so it stops selling uses PostgreSQL has already
//!   given. A gate that counts too many (uses neither sold nor free) gets them back when
//!   PostgreSQL decides, since PostgreSQL refuses anything beyond the limit; with the
//!   broker deciding that could oversell, so it is only reported. Both repairs wait for a
//!   second round that finds the same.
//! - one page of customers is checked per round, in turn, and counts the gate holds too low
//!   are raised.
//!
//! Every read is bounded by the reservations in flight or by a page size, never by the
//! voucher's size: a million-use voucher costs a round what a small one does.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use super::gate::{Amended, GateSnapshot, GiveBack, RecordState, ReleaseOutcome, CHUNK};
use super::FlashPath;
use crate::config::FlashSettings;
use crate::domain::{utc_from_millis, OrderId, ReservationStatus, Voucher, VoucherCode};
use crate::metrics::Metrics;
use crate::store::Store;
use crate::Result;

/// Customers checked per voucher and round: the page of the per-customer sweep.
const CUSTOMERS_PER_ROUND: i64 = 2_000;
/// Released rows looked at per voucher and round.
const RELEASED_PER_ROUND: i64 = 5_000;
/// How far behind the database's clock the released-rows cursor stays: a release whose
/// transaction began earlier but committed after a round's read is still seen next round.
const RELEASED_MARGIN: chrono::Duration = chrono::Duration::seconds(60);

pub struct Reconciler {
    flash: FlashPath,
    store: Store,
    metrics: Arc<Metrics>,
    interval: Duration,
    /// How old a record's latest publish must be before its use may be given back.
    grace: Duration,
    catch_up_timeout: Duration,
    /// Where each voucher's incremental reads stand.
    cursors: Mutex<HashMap<VoucherCode, Cursors>>,
    /// Vouchers whose gauges this core exports: a voucher that leaves the live set has its
    /// series removed, not frozen at their last value.
    exported: Mutex<std::collections::HashSet<String>>,
}

/// Where one voucher's incremental reads stand between rounds.
#[derive(Debug, Clone, Default)]
pub struct Cursors {
    /// The last released row looked at: (released_at, order id).
    released: Option<(DateTime<Utc>, String)>,
    /// The last customer checked; the sweep starts over after the last page.
    customer: String,
    /// The shortfall the previous round found (uses the gate counted too few), if any.
    short_before: i64,
    /// The surplus the previous round found (uses the gate counted too many), if any.
    surplus_before: i64,
    /// What the previous round read of the voucher: the gate's remaining count and
    /// unsettled orders, and PostgreSQL's active uses. A surplus is given back only when
    /// two rounds read the same (see `repair_surplus`).
    seen_before: Option<(i64, usize, i64)>,
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
    /// Uses given back to the gate's remaining count because it counted more uses than
    /// PostgreSQL and the reservations in flight hold (PostgreSQL deciding only).
    pub repaired_surplus: i64,
    /// Customers whose count the gate held too low, raised to what they hold.
    pub repaired_customers: usize,
}

impl Reconciler {
    /// A reconciler of `flash`'s gates against `store`, paced by `settings`
    /// (`reconcile_interval`, `reconcile_grace`, `catch_up_timeout`).
    pub fn new(
        flash: FlashPath,
        store: Store,
        metrics: Arc<Metrics>,
        settings: &FlashSettings,
    ) -> Self {
        Self {
            flash,
            store,
            metrics,
            interval: settings.reconcile_interval,
            grace: settings.reconcile_grace,
            catch_up_timeout: settings.catch_up_timeout,
            cursors: Mutex::default(),
            exported: Mutex::default(),
        }
    }

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
        let timer = self.metrics.reconcile_duration.start_timer();
        let reports = self.reconcile_all().await;
        timer.observe_duration();
        turn.rollback().await?;
        if reports.is_ok() {
            self.metrics
                .reconcile_last_success
                .set(chrono::Utc::now().timestamp());
        }
        reports
    }

    /// Removes the gauges of vouchers no longer live; remembers the ones that are.
    fn export_only(&self, live: &[Voucher]) {
        let live: std::collections::HashSet<String> =
            live.iter().map(|v| v.code.as_str().to_owned()).collect();
        let mut exported = self.exported.lock().unwrap_or_else(|e| e.into_inner());
        for gone in exported.difference(&live) {
            let _ = self
                .metrics
                .gate_remaining
                .remove_label_values(&[gone.as_str()]);
            let _ = self
                .metrics
                .gate_drift
                .remove_label_values(&[gone.as_str()]);
            let _ = self
                .metrics
                .sale_start
                .remove_label_values(&[gone.as_str()]);
        }
        *exported = live;
    }

    async fn reconcile_all(&self) -> Result<Vec<(Voucher, Option<VoucherReport>)>> {
        let vouchers = self.store.live_flash_vouchers().await?;
        self.export_only(&vouchers);
        let mut snapshots = Vec::with_capacity(vouchers.len());
        for v in &vouchers {
            // A change an operator committed whose gate amend was lost (its core died, or
            // Redis was away then) reaches the gate here; only a newer version is taken.
            if self.flash.gate().amend(v).await? == Amended::Amended {
                tracing::warn!(code = %v.code, version = v.version, "gate was behind the voucher's definition; amended");
            }
            snapshots.push(self.flash.gate().snapshot(&v.code).await?);
        }
        let caught_up = self
            .flash
            .rows_caught_up(self.catch_up_timeout)
            .await
            .unwrap_or(false);
        let mut reports = Vec::with_capacity(vouchers.len());
        for (voucher, snapshot) in vouchers.into_iter().zip(snapshots) {
            self.metrics
                .sale_start
                .with_label_values(&[voucher.code.as_str()])
                .set(voucher.starts_at.timestamp());
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

    fn checked(&self, kind: &str, n: usize) {
        self.metrics
            .reconcile_checked
            .with_label_values(&[kind])
            .inc_by(n as u64);
    }

    fn cursors(&self, code: &VoucherCode) -> Cursors {
        self.cursors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(code)
            .cloned()
            .unwrap_or_default()
    }

    fn keep_cursors(&self, code: &VoucherCode, cursors: Cursors) {
        self.cursors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(code.clone(), cursors);
    }

    async fn reconcile(&self, voucher: &Voucher, snapshot: GateSnapshot) -> Result<VoucherReport> {
        let code = &voucher.code;
        let mut cursors = self.cursors(code);
        // Records carry Redis's time; the cutoff is taken on the same clock.
        let grace = i64::try_from(self.grace.as_millis()).unwrap_or(i64::MAX);
        let cutoff = snapshot.at_ms.saturating_sub(grace);
        let at = utc_from_millis(snapshot.at_ms);
        let orders: Vec<String> = snapshot.unsettled.iter().map(|(o, _)| o.clone()).collect();
        let view = self.store.reconcile_view(code, &orders, at).await?;
        self.checked("unsettled", orders.len());
        let rows: HashMap<&str, ReservationStatus> = view
            .rows
            .iter()
            .map(|r| (r.order_id.as_str(), r.status))
            .collect();

        let mut report = VoucherReport::default();
        // The gate's remaining count as of the snapshot, plus what this round gives back.
        let mut remaining = snapshot.remaining;
        let mut settled = Vec::new();
        let mut in_flight = 0;
        for (order, publish_ms) in &snapshot.unsettled {
            // An unsettled order holds its use (every give-back drops it from the set).
            let how = match rows.get(order.as_str()) {
                Some(ReservationStatus::Released) => GiveBack::Release,
                Some(_) => {
                    settled.push(order.clone());
                    continue;
                }
                None if *publish_ms <= cutoff => GiveBack::Forget {
                    states: vec![RecordState::Pending, RecordState::Accepted],
                    published_by_ms: cutoff,
                },
                None => {
                    in_flight += 1;
                    continue;
                }
            };
            let reason = match how {
                GiveBack::Release => "released_in_db",
                GiveBack::Forget { .. } => "never_recorded",
            };
            let Ok(order_id) = OrderId::parse(order.clone()) else {
                settled.push(order.clone());
                continue;
            };
            match self.flash.give_back(code, &order_id, how).await? {
                ReleaseOutcome::Released => {
                    tracing::warn!(%code, %order_id, reason, "reconciliation gave a use back");
                    self.metrics.reconciled.with_label_values(&[reason]).inc();
                    remaining += 1;
                    if reason == "released_in_db" {
                        report.released += 1;
                    } else {
                        report.forgotten += 1;
                    }
                }
                // Re-published since the snapshot: still in flight.
                ReleaseOutcome::Busy => in_flight += 1,
                // Nothing held any more (or no record left to hold it): settled.
                _ => settled.push(order.clone()),
            }
        }
        self.flash.gate().settle(code, &settled).await?;
        let (released, next) = self
            .release_released_rows(voucher, snapshot.at_ms, &cursors)
            .await?;
        remaining += released;
        report.released += usize::try_from(released).unwrap_or(0);
        cursors.released = next;

        // Uses the gate should count as of the snapshot: active rows reserved by then, and
        // the orders still in flight (holding, no row yet, not given back). When the
        // snapshot could not hold every unsettled order, the count is not checked this round.
        // The gate's own limit: a change of the limit moved it and remaining together.
        let gate_used = snapshot.total_limit - remaining;
        let drift = gate_used - view.active_by - in_flight;
        // A shortfall is repaired once two rounds in a row found one, by the smaller of the
        // two: a stale gate stays short, while a shortfall made by a race between this
        // round's reads and a give-back elsewhere (the fault campaign caught one after both
        // cores were killed mid-release) is gone by the next round. Taking such a one off
        // would lose a use for good.
        let short = if snapshot.is_complete() {
            (-drift).max(0)
        } else {
            0
        };
        let confirmed = short.min(cursors.short_before);
        cursors.short_before = short;
        if confirmed > 0 {
            // The gate would sell uses PostgreSQL has already given: take them off now.
            if self
                .flash
                .gate()
                .adjust(voucher, -confirmed, &[])
                .await?
                .is_some()
            {
                tracing::error!(%code, uses = confirmed, "gate counted fewer uses than PostgreSQL holds, two rounds in a row; repaired");
                self.metrics
                    .reconciled
                    .with_label_values(&["repaired"])
                    .inc_by(confirmed.unsigned_abs());
                report.repaired = confirmed;
                remaining -= confirmed;
                cursors.short_before -= confirmed;
            }
        } else if short > 0 {
            tracing::warn!(%code, uses = short, "gate counts fewer uses than PostgreSQL holds; repaired if the next round finds it too");
        }
        let seen = (snapshot.remaining, snapshot.unsettled_count, view.active_by);
        let quiet = cursors.seen_before == Some(seen);
        cursors.seen_before = Some(seen);
        report.repaired_surplus = self
            .repair_surplus(voucher, drift, snapshot.is_complete(), quiet, &mut cursors)
            .await?;
        remaining += report.repaired_surplus;
        report.repaired_customers = self.repair_customers(voucher, &mut cursors).await?;
        report.drift = snapshot.total_limit - remaining - view.active_by - in_flight;
        if report.drift != 0 && snapshot.is_complete() {
            tracing::warn!(%code, drift = report.drift, "gate counts more uses than PostgreSQL and the reservations in flight");
        }
        self.keep_cursors(code, cursors);
        Ok(report)
    }

    /// A gate that counts more uses than PostgreSQL's active rows and the orders in flight
    /// (`drift` > 0: restored from a snapshot older than some releases, or a give-back lost
    /// further back than the released-rows cursor reaches) leaves those uses unsold for good.
    /// With PostgreSQL deciding, giving them back is safe: an over-generous gate only sends
    /// PostgreSQL more requests, and PostgreSQL refuses what it cannot hold. As for a
    /// shortfall, only once two rounds in a row found a surplus, by the smaller of the two,
    /// and only when the voucher was quiet between them (`quiet`: the same remaining count,
    /// unsettled orders and active uses read twice). A release committed between a
    /// round's gate snapshot and its PostgreSQL read shows as a surplus for that round; on
    /// a busy voucher one in every round could look like a lasting surplus, and giving it
    /// back would count the release twice. A voucher the gate wrongly calls sold out is
    /// quiet (nothing can be sold), so it is repaired. The uses are announced, so edges
    /// drop their sold-out flags. With the broker deciding, the gate's word is the 201: a
    /// surplus is only reported (the `VoucherGateDrift` alert). Returns the uses given back.
    async fn repair_surplus(
        &self,
        voucher: &Voucher,
        drift: i64,
        complete: bool,
        quiet: bool,
        cursors: &mut Cursors,
    ) -> Result<i64> {
        let surplus = if complete && self.flash.database_decides() {
            drift.max(0)
        } else {
            0
        };
        let confirmed = if quiet {
            surplus.min(cursors.surplus_before)
        } else {
            0
        };
        cursors.surplus_before = surplus;
        if confirmed <= 0 {
            if surplus > 0 {
                tracing::warn!(code = %voucher.code, uses = surplus, "gate counts more uses than PostgreSQL holds; given back if the next round finds it too");
            }
            return Ok(0);
        }
        if self
            .flash
            .gate()
            .adjust(voucher, confirmed, &[])
            .await?
            .is_none()
        {
            return Ok(0);
        }
        tracing::error!(code = %voucher.code, uses = confirmed, "gate counted more uses than PostgreSQL holds, two rounds in a row; given back");
        self.metrics
            .reconciled
            .with_label_values(&["repaired_surplus"])
            .inc_by(confirmed.unsigned_abs());
        cursors.surplus_before -= confirmed;
        self.flash.gate().announce_available(&voucher.code).await;
        Ok(confirmed)
    }

    /// Releases in the gate the orders released in PostgreSQL since the cursor whose record
    /// still holds a use taken by the snapshot. Returns the uses given back and the cursor
    /// to keep.
    async fn release_released_rows(
        &self,
        voucher: &Voucher,
        snapshot_ms: i64,
        cursors: &Cursors,
    ) -> Result<(i64, Option<(DateTime<Utc>, String)>)> {
        let code = &voucher.code;
        let db_now = self.store.now().await?;
        let start = cursors
            .released
            .clone()
            .unwrap_or((DateTime::<Utc>::UNIX_EPOCH, String::new()));
        let page = self
            .store
            .released_after(code, &start, RELEASED_PER_ROUND)
            .await?;
        let orders: Vec<String> = page.iter().map(|(_, o)| o.clone()).collect();
        self.checked("released", orders.len());
        let records = self.flash.gate().records(code, &orders).await?;
        let mut given = 0;
        for (order, record) in orders.iter().zip(records) {
            // A use taken after the snapshot (or in its millisecond: it may be later) is not
            // in its count: leave it to the next round.
            let Some(record) = record.filter(|r| r.state.holds() && r.reserved_ms < snapshot_ms)
            else {
                continue;
            };
            let Ok(order_id) = OrderId::parse(order.clone()) else {
                continue;
            };
            if self
                .flash
                .give_back(code, &order_id, GiveBack::Release)
                .await?
                == ReleaseOutcome::Released
            {
                tracing::warn!(%code, %order_id, customer = %record.customer_id, "reconciliation released a use released in PostgreSQL");
                self.metrics
                    .reconciled
                    .with_label_values(&["released_in_db"])
                    .inc();
                given += 1;
            }
        }
        // Never past the database's clock minus the margin: a release still committing
        // carries an earlier time than rows already seen.
        let floor = (db_now - RELEASED_MARGIN, String::new());
        let next = match page.last() {
            Some(last) if last.clone() < floor => Some(last.clone()),
            _ => Some(floor.max(start)),
        };
        Ok((given, next))
    }

    /// Checks one page of customers: a count the gate holds lower than PostgreSQL's active
    /// rows (reserved by the moment the gate was read) is raised to it. Returns how many
    /// were raised.
    async fn repair_customers(&self, voucher: &Voucher, cursors: &mut Cursors) -> Result<usize> {
        let code = &voucher.code;
        let page = self
            .store
            .customers_after(code, &cursors.customer, CUSTOMERS_PER_ROUND)
            .await?;
        self.checked("customers", page.len());
        cursors.customer = if (page.len() as i64) < CUSTOMERS_PER_ROUND {
            String::new()
        } else {
            page.last().cloned().unwrap_or_default()
        };
        let mut raised = 0;
        for chunk in page.chunks(CHUNK) {
            // The gate first, then PostgreSQL: a use is taken in the gate before its row
            // exists and released in PostgreSQL before the gate, so reading in this order
            // never shows the gate lower than it is.
            let Some((at_ms, counted)) = self.flash.gate().customer_counts(code, chunk).await?
            else {
                return Ok(raised);
            };
            let held: HashMap<String, i64> = self
                .store
                .customer_uses_by(code, chunk, utc_from_millis(at_ms))
                .await?
                .into_iter()
                .collect();
            let low: Vec<(String, i64)> = chunk
                .iter()
                .zip(counted)
                .filter_map(|(customer, counted)| {
                    let held = held.get(customer).copied().unwrap_or(0);
                    (counted < held).then(|| (customer.clone(), held - counted))
                })
                .collect();
            if !low.is_empty() && self.flash.gate().adjust(voucher, 0, &low).await?.is_some() {
                tracing::error!(%code, customers = low.len(), "gate counted fewer uses than customers hold; repaired");
                raised += low.len();
            }
        }
        Ok(raised)
    }
}
