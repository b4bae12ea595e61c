//! Availability announcements: cores publish a voucher code on a Redis channel when a use
//! of it is given back; the edge drops that voucher's sold-out flag at once.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::metrics::EdgeMetrics;
use crate::sold_out::SoldOutCache;

pub struct AvailabilitySignals {
    pub client: redis::Client,
    pub channel: String,
    pub sold_out: SoldOutCache,
    pub metrics: Arc<EdgeMetrics>,
}

impl AvailabilitySignals {
    async fn listen(&self) -> redis::RedisResult<()> {
        let mut pubsub = self.client.get_async_pubsub().await?;
        pubsub.subscribe(&self.channel).await?;
        // Announcements sent while the edge was not subscribed are lost: no flag from
        // before can be trusted to hide every holder.
        self.sold_out.clear_all();
        let mut messages = pubsub.on_message();
        while let Some(message) = messages.next().await {
            let code: String = message.get_payload()?;
            self.sold_out.clear(&code);
            self.metrics.availability_signals.inc();
        }
        Ok(())
    }
}

#[async_trait]
impl BackgroundService for AvailabilitySignals {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                result = self.listen() => {
                    // Lost the subscription: flags still end with their TTL meanwhile.
                    tracing::warn!(?result, "availability channel lost; resubscribing");
                }
            }
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
        }
    }
}
