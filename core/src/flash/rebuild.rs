//! Rebuilding a lost gate from PostgreSQL, and only once PostgreSQL holds every event
//! published for the voucher: otherwise the gate would count too few uses and oversell.

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::Context;

use super::gate::{GateLoad, OrderRecord};
use super::FlashPath;
use crate::domain::{Reservation, ReservationStatus, Voucher};
use crate::{Error, Result};

/// How a rebuild ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rebuild {
    Loaded,
    AlreadyLoaded,
    /// The consumer did not catch up in time; the next reservation tries again.
    NotCaughtUp,
}

impl Rebuild {
    fn label(self) -> &'static str {
        match self {
            Self::Loaded => "loaded",
            Self::AlreadyLoaded => "already_loaded",
            Self::NotCaughtUp => "not_caught_up",
        }
    }
}

/// The gate as PostgreSQL knows it: uses left, uses per customer, every order's record.
impl GateLoad {
    pub fn from_rows(voucher: &Voucher, rows: &[Reservation]) -> Self {
        let mut users: HashMap<String, i64> = HashMap::new();
        let mut active = 0;
        for r in rows
            .iter()
            .filter(|r| r.status != ReservationStatus::Released)
        {
            active += 1;
            *users.entry(r.customer_id.to_string()).or_default() += 1;
        }
        Self {
            remaining: i64::from(voucher.total_limit) - active,
            users: users.into_iter().collect(),
            orders: rows
                .iter()
                .map(|r| (r.order_id.to_string(), OrderRecord::from(r)))
                .collect(),
        }
    }
}

impl FlashPath {
    /// Starts a rebuild of the voucher's gate unless this instance is already at it.
    pub fn trigger_rebuild(&self, voucher: Arc<Voucher>) {
        {
            let mut rebuilding = self
                .inner
                .rebuilding
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if !rebuilding.insert(voucher.code.clone()) {
                return;
            }
        }
        let this = self.clone();
        tokio::spawn(async move {
            let result = this.rebuild(&voucher).await;
            let label = result.as_ref().map_or("error", |r| r.label());
            this.inner
                .metrics
                .gate_rebuilds
                .with_label_values(&[label])
                .inc();
            match result {
                Ok(outcome) => tracing::info!(code = %voucher.code, ?outcome, "gate rebuild"),
                Err(e) => {
                    tracing::warn!(code = %voucher.code, error = %e.chain(), "gate rebuild failed")
                }
            }
            let mut rebuilding = this
                .inner
                .rebuilding
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            rebuilding.remove(&voucher.code);
        });
    }

    /// Rebuilds the gate: wait out publishes in flight, wait for the consumer, read
    /// PostgreSQL, load (unless another instance got there first).
    pub async fn rebuild(&self, voucher: &Voucher) -> Result<Rebuild> {
        // 1. A reservation that passed the gate just before it was lost may still be
        //    publishing; after message_timeout its event is written or never will be.
        tokio::time::sleep(self.inner.message_timeout).await;
        // 2. Every event published so far is in PostgreSQL once the group caught up.
        let caught_up = self
            .inner
            .progress
            .wait_caught_up(self.inner.settings.catch_up_timeout)
            .await
            .context("reading the consumer group's progress")
            .map_err(Error::internal)?;
        if !caught_up {
            return Ok(Rebuild::NotCaughtUp);
        }
        // 3. The gate as PostgreSQL knows it.
        let rows = self.inner.store.voucher_reservations(&voucher.code).await?;
        let state = GateLoad::from_rows(voucher, &rows);
        // 4. Claims of its orders first (lost with the gate, or not), so no other voucher
        //    can take one of them once the gate reopens; then load, unless another instance
        //    got there first.
        let orders: Vec<String> = state.orders.iter().map(|(o, _)| o.clone()).collect();
        self.inner.gate.claim_orders(&voucher.code, &orders).await?;
        if self.inner.gate.load(voucher, &state).await? {
            self.inner.gate.announce_available(&voucher.code).await;
            Ok(Rebuild::Loaded)
        } else {
            Ok(Rebuild::AlreadyLoaded)
        }
    }
}

#[cfg(test)]
mod tests {
    use chrono::{TimeZone, Utc};

    use super::*;
    use crate::domain::{CustomerId, Money, OrderId, VoucherCode, VoucherMode};

    fn row(order: &str, customer: &str, status: ReservationStatus) -> Reservation {
        let at = Utc
            .timestamp_millis_opt(1_795_982_069_000)
            .single()
            .expect("time");
        Reservation {
            order_id: OrderId::parse(order).expect("order"),
            voucher_code: VoucherCode::parse("V1").expect("code"),
            customer_id: CustomerId::parse(customer).expect("customer"),
            order_amount: Money::from_db(250_000),
            discount_amount: Money::from_db(100_000),
            status,
            reserved_at: at,
            expires_at: at + chrono::Duration::minutes(15),
        }
    }

    #[test]
    fn a_gate_rebuilt_from_rows_counts_only_held_uses() {
        let now = Utc::now();
        let voucher = Voucher {
            code: VoucherCode::parse("V1").expect("code"),
            discount_amount: Money::from_db(100_000),
            min_order_amount: Money::from_db(0),
            total_limit: 10,
            per_user_limit: 2,
            starts_at: now,
            ends_at: now + chrono::Duration::hours(1),
            mode: VoucherMode::Flash,
            created_at: now,
        };
        let rows = [
            row("o1", "alice", ReservationStatus::Reserved),
            row("o2", "alice", ReservationStatus::Confirmed),
            row("o3", "bob", ReservationStatus::Released),
        ];
        let load = GateLoad::from_rows(&voucher, &rows);
        assert_eq!(load.remaining, 8, "a released row holds no use");
        assert_eq!(load.users, vec![("alice".to_owned(), 2)]);
        assert_eq!(
            load.orders.len(),
            3,
            "every order keeps its record for retries"
        );
        let released = load.orders.iter().find(|(o, _)| o == "o3").expect("o3");
        assert!(!released.1.state.holds());
    }
}
