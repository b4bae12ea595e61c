//! The producers of reservation events: [`Publisher`] waits for each event's
//! acknowledgement (the broker deciding: the ack is what turns a use into a 201);
//! [`Announcer`] sends events whose rows PostgreSQL committed before the 201, and only
//! counts what became of them.
//!
//! Traced, each event carries its publish span's context in its record's headers
//! (`traceparent`, `tracestate`), and the writer that puts the event into PostgreSQL
//! continues that trace.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{
    BaseRecord, DeliveryResult, FutureProducer, FutureRecord, Producer, ProducerContext,
    ThreadedProducer,
};
use rdkafka::ClientContext;

use super::ReservedEvent;
use crate::config::KafkaSettings;
use crate::metrics::Metrics;

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
        let producer: FutureProducer = producer_config(settings, linger).create()?;
        Ok(Self {
            producer,
            topic: settings.topic.clone(),
        })
    }

    /// Publishes and waits for the broker's acknowledgement (acks=all).
    #[tracing::instrument(name = "kafka.publish", skip_all, fields(order_id = %event.order_id, otel.kind = "producer"))]
    pub async fn publish(&self, event: &ReservedEvent) -> Result<(), PublishError> {
        let payload = match serde_json::to_vec(&super::VoucherEvent::Reserved(event.clone())) {
            Ok(payload) => payload,
            Err(_) => {
                // Cannot happen (plain strings and integers); if it did, nothing was sent.
                let invalid = KafkaError::MessageProduction(RDKafkaErrorCode::InvalidMessage);
                return Err(PublishError::NotWritten(invalid));
            }
        };
        let mut record = FutureRecord::to(&self.topic)
            .key(event.voucher_code.as_str())
            .payload(&payload);
        if let Some(headers) = trace_headers() {
            record = record.headers(headers);
        }
        // Zero queue timeout: a full local queue fails now (certainly not written) instead
        // of making the request wait.
        match self.producer.send(record, Duration::ZERO).await {
            Ok(_) => Ok(()),
            Err((e, _)) => Err(classify(e)),
        }
    }
}

/// The events of uses PostgreSQL already holds (`flash.decision = "database"`), for whoever
/// reads the topic. Nobody waits for them: each is handed to librdkafka's queue with no
/// task or future of its own (profiled at 8,000 accepts/s, a spawned task awaiting each
/// delivery took 6% of the core's CPU), and librdkafka's own thread reports every delivery
/// to [`Deliveries`], which times it in `voucher_publish_duration_seconds` like an awaited
/// publish and logs a failure. Events still queued when the core stops are dropped: their
/// rows are committed, and the writers do not run in this mode.
pub struct Announcer {
    producer: ThreadedProducer<Deliveries>,
    topic: String,
}

impl Announcer {
    /// A producer that groups events for up to `linger` (`linger.ms`) before sending.
    pub fn new(
        settings: &KafkaSettings,
        linger: Duration,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Self> {
        let producer =
            producer_config(settings, linger).create_with_context(Deliveries { metrics })?;
        Ok(Self {
            producer,
            topic: settings.topic.clone(),
        })
    }

    /// Queues `event`; never waits. A full local queue drops it (counted `not_written`).
    /// Its span covers the queueing only: the delivery is reported later, on another thread.
    #[tracing::instrument(level = "debug", name = "kafka.announce", skip_all, fields(otel.kind = "producer"))]
    pub fn announce(&self, event: ReservedEvent) {
        let event = super::VoucherEvent::Reserved(event);
        let Ok(payload) = serde_json::to_vec(&event) else {
            return; // cannot happen: plain strings and integers
        };
        let super::VoucherEvent::Reserved(reserved) = &event;
        let mut record = BaseRecord::with_opaque_to(&self.topic, Box::new(Instant::now()))
            .key(reserved.voucher_code.as_str())
            .payload(&payload);
        if let Some(headers) = trace_headers() {
            record = record.headers(headers);
        }
        if let Err((e, record)) = self.producer.send(record) {
            self.producer
                .context()
                .delivered(&record.delivery_opaque, Err(e));
        }
    }
}

/// Receives the announcer's delivery reports, on librdkafka's polling thread.
pub struct Deliveries {
    metrics: Arc<Metrics>,
}

impl Deliveries {
    fn delivered(&self, started: &Instant, result: Result<(), KafkaError>) {
        let label = match result.map_err(classify) {
            Ok(()) => "ok",
            Err(PublishError::NotWritten(e)) => {
                tracing::warn!(error = %e, "event of a recorded use not published");
                "not_written"
            }
            Err(PublishError::Ambiguous(e)) => {
                tracing::warn!(error = %e, "event of a recorded use may not be published");
                "ambiguous"
            }
        };
        self.metrics
            .publish_duration
            .with_label_values(&[label])
            .observe(started.elapsed().as_secs_f64());
    }
}

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = Box<Instant>;

    fn delivery(&self, result: &DeliveryResult<'_>, started: Box<Instant>) {
        let result = match result {
            Ok(_) => Ok(()),
            Err((e, _)) => Err(e.clone()),
        };
        self.delivered(&started, result);
    }
}

/// The record headers that carry the current span's trace context; `None` while tracing
/// is off (no header at all, as before traces existed).
fn trace_headers() -> Option<OwnedHeaders> {
    // Checked before `Span::current()`, which is a lookup in the subscriber: this runs for
    // every event.
    if !voucher_telemetry::tracing_enabled() {
        return None;
    }
    let context = voucher_telemetry::trace::outgoing(&tracing::Span::current());
    if context.is_empty() {
        return None;
    }
    let headers = context
        .iter()
        .fold(OwnedHeaders::new(), |headers, (key, value)| {
            headers.insert(Header {
                key,
                value: Some(value.as_str()),
            })
        });
    Some(headers)
}

/// What both producers are: acks from every in-sync replica, `message_timeout`, `linger`.
fn producer_config(settings: &KafkaSettings, linger: Duration) -> rdkafka::ClientConfig {
    let mut config = settings.client_config();
    config
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
        // With the broker deciding the client waits for the ack, so this is short; with
        // PostgreSQL deciding nobody waits, and a longer linger means fewer produce
        // requests (`KafkaSettings::linger_for`).
        .set("linger.ms", linger.as_millis().to_string())
        .set(
            "queue.buffering.max.kbytes",
            settings.queue_max_kbytes.to_string(),
        );
    config
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
