//! Kafka: the events flash mode publishes, and the consumer that writes them into PostgreSQL.
//! The SQL of that writing is the store's (`Store::record_reserved`), which knows nothing of
//! events: the consumer turns each event into a [`Reservation`] first.
//!
//! Only one event type is needed: `reserved`, published after the gate takes a use: with
//! the broker deciding, its acknowledgement comes before the client's 201; with PostgreSQL
//! deciding, it follows the 201 (the row is committed already) and nobody waits for it. Confirm and release write PostgreSQL directly (they are
//! rare: at most one each per use) once the row is there, so they need no event.
//! Events are keyed by voucher code: all events of a voucher are in one partition, in order.
//!
//! - `publisher`: the producers (acks=all; one awaited, one that only counts deliveries) and
//!   how their failures are classified;
//! - `consumer`: the writers, one per partition, owned through PostgreSQL, batched, with
//!   their dead-letter topic;
//! - `progress`: "has everything published so far been written?";
//! - `monitor`: per-partition lag and age of the oldest unwritten event, for metrics and
//!   readiness;
//! - `topics`: creates the topics at start-up (not every broker creates them on demand).

pub mod consumer;
pub mod monitor;
pub mod progress;
pub mod publisher;
pub mod topics;

use serde::{Deserialize, Serialize};

use super::gate::OrderRecord;
use crate::domain::{
    utc_from_millis, CustomerId, Money, OrderId, Reservation, ReservationStatus, VoucherCode,
};

/// An event on the reservations topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum VoucherEvent {
    Reserved(ReservedEvent),
}

/// A use taken by the gate, to be recorded as a RESERVED row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReservedEvent {
    pub voucher_code: String,
    pub order_id: String,
    pub customer_id: String,
    pub order_amount: i64,
    pub discount_amount: i64,
    pub reserved_at_ms: i64,
    pub expires_at_ms: i64,
}

impl ReservedEvent {
    /// The event of the use `record` holds for `order_id` on `code`.
    pub fn new(code: &VoucherCode, order_id: &OrderId, record: &OrderRecord) -> Self {
        Self {
            voucher_code: code.to_string(),
            order_id: order_id.to_string(),
            customer_id: record.customer_id.clone(),
            order_amount: record.order_amount,
            discount_amount: record.discount_amount,
            reserved_at_ms: record.reserved_ms,
            expires_at_ms: record.expires_ms,
        }
    }
}

/// The RESERVED row an event asks for. Identifiers are checked as at the HTTP edge: an
/// event that fails is unreadable and goes to the dead letters, not into the database.
impl TryFrom<&ReservedEvent> for Reservation {
    type Error = String;

    fn try_from(e: &ReservedEvent) -> Result<Self, String> {
        let bad = |f: crate::domain::FieldError| format!("{}: {}", f.field, f.reason);
        Ok(Reservation {
            order_id: OrderId::parse(e.order_id.clone()).map_err(bad)?,
            voucher_code: VoucherCode::parse(e.voucher_code.clone()).map_err(bad)?,
            customer_id: CustomerId::parse(e.customer_id.clone()).map_err(bad)?,
            order_amount: Money::from_db(e.order_amount),
            discount_amount: Money::from_db(e.discount_amount),
            status: ReservationStatus::Reserved,
            reserved_at: utc_from_millis(e.reserved_at_ms),
            expires_at: utc_from_millis(e.expires_at_ms),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_carries_its_record_and_becomes_its_row() {
        let record =
            OrderRecord::parse("P|c-1|250000|100000|1795982069000|1795982969000|1795982069500")
                .expect("record");
        let code = VoucherCode::parse("V1").expect("code");
        let order = OrderId::parse("o-1").expect("order");
        let event = ReservedEvent::new(&code, &order, &record);
        assert_eq!(event.reserved_at_ms, 1795982069000);
        let row = Reservation::try_from(&event).expect("readable");
        assert_eq!(row.status, ReservationStatus::Reserved);
        assert_eq!(
            row,
            record.reservation(&code, &order).expect("record converts")
        );
        let bad = ReservedEvent {
            order_id: "no spaces allowed".into(),
            ..event
        };
        assert!(Reservation::try_from(&bad)
            .expect_err("refused")
            .starts_with("orderId"));
    }

    #[test]
    fn wire_format_is_tagged_camel_case() {
        let event = VoucherEvent::Reserved(ReservedEvent {
            voucher_code: "V".into(),
            order_id: "o1".into(),
            customer_id: "c1".into(),
            order_amount: 10,
            discount_amount: 5,
            reserved_at_ms: 1,
            expires_at_ms: 2,
        });
        let json = serde_json::to_string(&event).expect("serializes");
        assert!(
            json.starts_with(r#"{"type":"reserved","voucherCode":"V","orderId":"o1""#),
            "{json}"
        );
        assert_eq!(
            serde_json::from_str::<VoucherEvent>(&json).expect("parses"),
            event
        );
    }
}
