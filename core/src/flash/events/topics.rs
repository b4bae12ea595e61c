//! Topic creation at start-up: brokers without automatic creation (tansu, locked-down
//! clusters) need the topics to exist before the first event.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::types::RDKafkaErrorCode;

use crate::config::KafkaSettings;

/// Creates the events topic and its dead-letter topic unless they exist.
pub async fn ensure_topics(settings: &KafkaSettings) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &settings.brokers)
        .create()?;
    let dlq = settings.dlq_topic();
    let topics = [
        NewTopic::new(
            &settings.topic,
            settings.partitions,
            TopicReplication::Fixed(1),
        ),
        NewTopic::new(&dlq, 1, TopicReplication::Fixed(1)),
    ];
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    for result in admin.create_topics(&topics, &options).await? {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => anyhow::bail!("cannot create topic {topic}: {code}"),
        }
    }
    Ok(())
}
