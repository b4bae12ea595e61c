//! The record the gate keeps per order:
//! `STATE|customer|orderAmount|discount|reservedMs|expiresMs|publishMs`.

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

impl OrderRecord {
    pub fn parse(raw: &str) -> Result<Self> {
        let bad = || Error::Internal(format!("malformed gate record {raw:?}"));
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
    fn refuses_garbage() {
        assert!(OrderRecord::parse("X|c|1|1|1|1|1").is_err());
        assert!(OrderRecord::parse("P|c|1|1|1|1").is_err());
        assert!(OrderRecord::parse("P|c|one|1|1|1|1").is_err());
    }
}
