//! Topic creation at start-up: brokers without automatic creation (tansu, locked-down
//! clusters) need the topics to exist before the first event.
//!
//! Topics are created with `kafka.replication_factor` copies of each partition and
//! `min.insync.replicas` from `kafka.min_insync_replicas`: every producer here waits for
//! `acks=all`, which means "every in-sync replica", so those two settings are what an
//! acknowledged event survives. A topic that already exists is left as it is, but one with
//! fewer replicas than configured is reported: its events have fewer copies than the
//! operator asked for.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::types::RDKafkaErrorCode;

use crate::config::KafkaSettings;

/// Creates the events topic and its dead-letter topic unless they exist.
pub async fn ensure_topics(settings: &KafkaSettings) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> = settings.client_config().create()?;
    let dlq = settings.dlq_topic();
    let min_insync = settings.min_insync_replicas.to_string();
    let replication = || TopicReplication::Fixed(settings.replication_factor);
    let topics = [
        NewTopic::new(&settings.topic, settings.partitions, replication())
            .set("min.insync.replicas", &min_insync),
        NewTopic::new(&dlq, 1, replication()).set("min.insync.replicas", &min_insync),
    ];
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    for result in admin.create_topics(&topics, &options).await? {
        match result {
            Ok(topic) => tracing::info!(
                %topic,
                replication_factor = settings.replication_factor,
                min_insync_replicas = settings.min_insync_replicas,
                "created topic"
            ),
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => anyhow::bail!("cannot create topic {topic}: {code}"),
        }
    }
    report_replicas(&admin, settings, [settings.topic.as_str(), dlq.as_str()]);
    Ok(())
}

/// Warns about existing topics with fewer replicas than configured.
fn report_replicas<'a>(
    admin: &AdminClient<DefaultClientContext>,
    settings: &KafkaSettings,
    topics: impl IntoIterator<Item = &'a str>,
) {
    for topic in topics {
        let metadata = match admin
            .inner()
            .fetch_metadata(Some(topic), Duration::from_secs(5))
        {
            Ok(metadata) => metadata,
            Err(error) => {
                tracing::warn!(%topic, %error, "cannot read the topic's replicas");
                continue;
            }
        };
        let fewest = metadata
            .topics()
            .iter()
            .flat_map(|t| t.partitions())
            .map(|p| p.replicas().len())
            .min();
        if let Some(fewest) = fewest {
            if fewest < settings.replication_factor as usize {
                tracing::warn!(
                    %topic,
                    replicas = fewest,
                    configured = settings.replication_factor,
                    "the topic exists with fewer replicas than kafka.replication_factor: an \
                     acknowledged event has only that many copies"
                );
            }
        }
    }
}
