//! The producer of reservation events.

use std::time::Duration;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{FutureProducer, FutureRecord};

use super::ReservedEvent;
use crate::config::KafkaSettings;

/// Why an event was not acknowledged.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// The event was certainly not written: the use may be given back.
    #[error("event not written: {0}")]
    NotWritten(KafkaError),
    /// The event may or may not have been written (a timeout, a lost connection): the use
    /// must stay held until reconciliation knows.
    #[error("event may have been written: {0}")]
    Ambiguous(KafkaError),
}

#[derive(Clone)]
pub struct Publisher {
    producer: FutureProducer,
    topic: String,
}

impl Publisher {
    /// A producer that groups events for up to `linger` (`linger.ms`) before sending.
    pub fn new(settings: &KafkaSettings, linger: Duration) -> anyhow::Result<Self> {
        let producer: FutureProducer = settings
            .client_config()
            .set("acks", "all")
            // Not idempotent: a duplicate from the producer's own retry is harmless (the
            // writer keeps the first row of an orderId and ignores the rest) and events of
            // different orders need no order among them. And tansu 0.6's check of an
            // idempotent producer panics after the broker is killed and restarted, leaving
            // it unable to store anything (found by the fault campaign's kill-broker round).
            .set("enable.idempotence", "false")
            .set(
                "message.timeout.ms",
                settings.message_timeout.as_millis().to_string(),
            )
            // With the broker deciding the client waits for the ack, so this is short;
            // with PostgreSQL deciding nobody waits, and a longer linger means fewer
            // produce requests (`KafkaSettings::linger_for`).
            .set("linger.ms", linger.as_millis().to_string())
            .create()?;
        Ok(Self {
            producer,
            topic: settings.topic.clone(),
        })
    }

    /// Publishes and waits for the broker's acknowledgement (acks=all).
    #[tracing::instrument(name = "kafka.publish", skip_all, fields(order_id = %event.order_id))]
    pub async fn publish(&self, event: &ReservedEvent) -> Result<(), PublishError> {
        let payload = match serde_json::to_vec(&super::VoucherEvent::Reserved(event.clone())) {
            Ok(payload) => payload,
            Err(_) => {
                // Cannot happen (plain strings and integers); if it did, nothing was sent.
                let invalid = KafkaError::MessageProduction(RDKafkaErrorCode::InvalidMessage);
                return Err(PublishError::NotWritten(invalid));
            }
        };
        let record = FutureRecord::to(&self.topic)
            .key(event.voucher_code.as_str())
            .payload(&payload);
        // Zero queue timeout: a full local queue fails now (certainly not written) instead
        // of making the request wait.
        match self.producer.send(record, Duration::ZERO).await {
            Ok(_) => Ok(()),
            Err((e, _)) => Err(classify(e)),
        }
    }
}

/// Errors after which the broker certainly does not have the message. Anything else
/// (timeouts above all) is treated as ambiguous: assuming "not written" when it was would
/// give a use back that the consumer later records, which is an oversell.
fn classify(e: KafkaError) -> PublishError {
    let certain = matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::QueueFull
                | RDKafkaErrorCode::MessageSizeTooLarge
                | RDKafkaErrorCode::InvalidMessageSize
                | RDKafkaErrorCode::InvalidMessage
                | RDKafkaErrorCode::UnknownTopic
                | RDKafkaErrorCode::UnknownTopicOrPartition
                | RDKafkaErrorCode::TopicAuthorizationFailed
                | RDKafkaErrorCode::InvalidRecord
        )
    );
    if certain {
        PublishError::NotWritten(e)
    } else {
        PublishError::Ambiguous(e)
    }
}
