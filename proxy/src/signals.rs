//! Announcements of the cores on Redis Pub/Sub: a voucher code on the availability
//! channel when a use of it is given back, its limit raised or it is resumed (the edge
//! drops that voucher's flag at once), and on the sold-out channel when its gate took its
//! last use or an operator paused or archived it (the edge starts its flag at once,
//! `flagging`).
//!
//! On a Redis Cluster a message published on any node reaches the subscribers of every
//! node (classic Pub/Sub travels the cluster bus), so the edge listens on one node and,
//! when it loses that one, on the next of its list.

use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::flagging::Flagger;

pub struct AvailabilitySignals {
    /// One Redis, or nodes of one cluster, tried in turn.
    pub clients: Vec<redis::Client>,
    pub channel: String,
    /// Listened to only where the edge answers for sold-out vouchers.
    pub sold_out_channel: Option<String>,
    pub flagger: Flagger,
}

impl AvailabilitySignals {
    async fn listen(&self, client: &redis::Client) -> redis::RedisResult<()> {
        let mut pubsub = client.get_async_pubsub().await?;
        pubsub.subscribe(&self.channel).await?;
        if let Some(sold_out) = &self.sold_out_channel {
            pubsub.subscribe(sold_out).await?;
        }
        // Announcements sent while the edge was not subscribed are lost: no flag from
        // before can be trusted to hide every holder.
        self.flagger.sold_out.clear_all();
        let mut messages = pubsub.on_message();
        while let Some(message) = messages.next().await {
            let code: String = message.get_payload()?;
            if self.sold_out_channel.as_deref() == Some(message.get_channel_name()) {
                // A flag's answers still wait for its order filter, which is read after
                // the last use was taken: every holder is in it.
                self.flagger.flag(&code);
                self.flagger.metrics.sold_out_signals.inc();
            } else {
                self.flagger.sold_out.clear(&code);
                self.flagger.metrics.availability_signals.inc();
            }
        }
        Ok(())
    }
}

#[async_trait]
impl BackgroundService for AvailabilitySignals {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        for (node, client) in self.clients.iter().enumerate().cycle() {
            tokio::select! {
                _ = shutdown.changed() => return,
                result = self.listen(client) => {
                    // Lost the subscription: flags still end with their TTL meanwhile.
                    tracing::warn!(?result, node, "availability channel lost; resubscribing");
                }
            }
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
        }
    }
}
