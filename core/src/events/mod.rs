//! Kafka: the events flash mode publishes, and the consumer that writes them into PostgreSQL.
//!
//! Only one event type is needed: `reserved`, published after the gate takes a use and
//! before the client gets its 201. Confirm and release write PostgreSQL directly (they are
//! rare: at most one each per use) once the row is there, so they need no event.
//! Events are keyed by voucher code: all events of a voucher are in one partition, in order.
//!
//! - `publisher`: the producer (acks=all, idempotent) and how its failures are classified;
//! - `consumer`: the batched, at-least-once writer with its dead-letter topic;
//! - `progress`: "has the consumer group written everything published so far?";
//! - `topics`: creates the topics at start-up (not every broker creates them on demand).

pub mod consumer;
pub mod progress;
pub mod publisher;
pub mod topics;

use serde::{Deserialize, Serialize};

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

#[cfg(test)]
mod tests {
    use super::*;

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
