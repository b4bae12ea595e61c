//! The record the gate keeps per order:
//! `STATE|customer|orderAmount|discount|reservedMs|expiresMs|publishMs`.

use crate::domain::{
    utc_from_millis, CustomerId, Money, OrderId, Reservation, ReservationStatus, VoucherCode,
};
use crate::{Error, Result};

/// Where an order stands in the gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordState {
    /// Accepted by the gate; its event is not yet acknowledged by Kafka.
    Pending,
    /// Its event is acknowledged: the consumer will write it to PostgreSQL.
    Accepted,
    Confirmed,
    Released,
}

impl RecordState {
    pub fn letter(self) -> char {
        match self {
            Self::Pending => 'P',
            Self::Accepted => 'A',
            Self::Confirmed => 'C',
            Self::Released => 'R',
        }
    }

    pub fn from_letter(c: char) -> Option<Self> {
        Some(match c {
            'P' => Self::Pending,
            'A' => Self::Accepted,
            'C' => Self::Confirmed,
            'R' => Self::Released,
            _ => return None,
        })
    }

    /// Whether the order holds a use.
    pub fn holds(self) -> bool {
        !matches!(self, Self::Released)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderRecord {
    pub state: RecordState,
    pub customer_id: String,
    pub order_amount: i64,
    pub discount_amount: i64,
    pub reserved_ms: i64,
    pub expires_ms: i64,
    /// When the latest publish of the order's event started.
    pub publish_ms: i64,
}

/// The status a client sees for an order in this state (a pending use is already held).
impl From<RecordState> for ReservationStatus {
    fn from(state: RecordState) -> Self {
        match state {
            RecordState::Pending | RecordState::Accepted => Self::Reserved,
            RecordState::Confirmed => Self::Confirmed,
            RecordState::Released => Self::Released,
        }
    }
}

/// The state a row of PostgreSQL is loaded into the gate with: its event is written.
impl From<ReservationStatus> for RecordState {
    fn from(status: ReservationStatus) -> Self {
        match status {
            ReservationStatus::Reserved => Self::Accepted,
            ReservationStatus::Confirmed => Self::Confirmed,
            ReservationStatus::Released => Self::Released,
        }
    }
}

/// The record a stored reservation is rebuilt into. Its event was published no later than
/// it was reserved.
impl From<&Reservation> for OrderRecord {
    fn from(r: &Reservation) -> Self {
        let reserved_ms = r.reserved_at.timestamp_millis();
        Self {
            state: r.status.into(),
            customer_id: r.customer_id.to_string(),
            order_amount: r.order_amount.minor_units(),
            discount_amount: r.discount_amount.minor_units(),
            reserved_ms,
            expires_ms: r.expires_at.timestamp_millis(),
            publish_ms: reserved_ms,
        }
    }
}

impl OrderRecord {
    /// The reservation this record stands for (records are keyed by voucher and order).
    pub fn reservation(&self, code: &VoucherCode, order_id: &OrderId) -> Result<Reservation> {
        Ok(Reservation {
            order_id: order_id.clone(),
            voucher_code: code.clone(),
            customer_id: CustomerId::parse(self.customer_id.clone()).map_err(|_| {
                Error::corrupt(format!("gate record customer {:?}", self.customer_id))
            })?,
            order_amount: Money::from_db(self.order_amount),
            discount_amount: Money::from_db(self.discount_amount),
            status: self.state.into(),
            reserved_at: utc_from_millis(self.reserved_ms),
            expires_at: utc_from_millis(self.expires_ms),
        })
    }

    /// Whether `customer` asking for `order_amount` repeats the request that made this record.
    pub fn is_retry_by(&self, customer: &CustomerId, order_amount: Money) -> bool {
        self.customer_id == customer.as_str() && self.order_amount == order_amount.minor_units()
    }

    pub fn parse(raw: &str) -> Result<Self> {
        let bad = || Error::corrupt(format!("gate record {raw:?}"));
        let mut parts = raw.split('|');
        let mut next = || parts.next().ok_or_else(bad);
        let state = next()?
            .chars()
            .next()
            .and_then(RecordState::from_letter)
            .ok_or_else(bad)?;
        let customer_id = next()?.to_owned();
        let mut number = || -> Result<i64> { next()?.parse().map_err(|_| bad()) };
        Ok(Self {
            state,
            customer_id,
            order_amount: number()?,
            discount_amount: number()?,
            reserved_ms: number()?,
            expires_ms: number()?,
            publish_ms: number()?,
        })
    }

    pub fn format(&self) -> String {
        format!(
            "{}|{}|{}|{}|{}|{}|{}",
            self.state.letter(),
            self.customer_id,
            self.order_amount,
            self.discount_amount,
            self.reserved_ms,
            self.expires_ms,
            self.publish_ms
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let raw = "A|c-1|250000|100000|1795982069000|1795982969000|1795982069000";
        let record = OrderRecord::parse(raw).expect("valid");
        assert_eq!(record.state, RecordState::Accepted);
        assert_eq!(record.customer_id, "c-1");
        assert_eq!(record.format(), raw);
    }

    #[test]
    fn states_and_statuses_convert_both_ways() {
        for status in [
            ReservationStatus::Reserved,
            ReservationStatus::Confirmed,
            ReservationStatus::Released,
        ] {
            assert_eq!(ReservationStatus::from(RecordState::from(status)), status);
        }
        assert_eq!(
            ReservationStatus::from(RecordState::Pending),
            ReservationStatus::Reserved,
            "a pending use is held"
        );
    }

    #[test]
    fn a_record_and_its_reservation_round_trip() {
        let raw = "C|c-1|250000|100000|1795982069000|1795982969000|1795982070000";
        let record = OrderRecord::parse(raw).expect("valid");
        let code = VoucherCode::parse("V1").expect("code");
        let order = OrderId::parse("o-1").expect("order");
        let reservation = record.reservation(&code, &order).expect("converts");
        assert_eq!(reservation.status, ReservationStatus::Confirmed);
        assert_eq!(reservation.reserved_at.timestamp_millis(), 1795982069000);
        assert_eq!(reservation.discount_amount.minor_units(), 100000);
        let back = OrderRecord::from(&reservation);
        assert_eq!(
            back,
            OrderRecord {
                publish_ms: record.reserved_ms,
                ..record.clone()
            },
            "a rebuilt record was published when it was reserved"
        );
        let customer = CustomerId::parse("c-1").expect("customer");
        assert!(record.is_retry_by(&customer, Money::from_db(250000)));
        assert!(!record.is_retry_by(&customer, Money::from_db(1)));
    }

    #[test]
    fn refuses_garbage() {
        assert!(OrderRecord::parse("X|c|1|1|1|1|1").is_err());
        assert!(OrderRecord::parse("P|c|1|1|1|1").is_err());
        assert!(OrderRecord::parse("P|c|one|1|1|1|1").is_err());
    }
}
