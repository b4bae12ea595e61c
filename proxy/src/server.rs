//! Assembling the Pingora server: the proxy service, upstream health checks, the
//! availability subscription and the metrics listener.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::lb::health_check::TcpHealthCheck;
use pingora::lb::LoadBalancer;
use pingora::server::configuration::ServerConf;
use pingora::server::{Server, ShutdownWatch};
use pingora::services::background::{background_service, BackgroundService};

use crate::config::EdgeSettings;
use crate::edge::Edge;
use crate::metrics::EdgeMetrics;
use crate::signals::AvailabilitySignals;
use crate::sold_out::SoldOutCache;

/// Serves `GET /metrics` on its own listener.
struct MetricsListener {
    addr: String,
    metrics: Arc<EdgeMetrics>,
    sold_out: SoldOutCache,
}

#[async_trait]
impl BackgroundService for MetricsListener {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let (metrics, sold_out) = (self.metrics.clone(), self.sold_out.clone());
        let app = axum::Router::new().route(
            "/metrics",
            axum::routing::get(move || {
                let (metrics, sold_out) = (metrics.clone(), sold_out.clone());
                async move {
                    metrics
                        .flags
                        .set(i64::try_from(sold_out.len()).unwrap_or(i64::MAX));
                    metrics.render()
                }
            }),
        );
        let listener = match tokio::net::TcpListener::bind(&self.addr).await {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(addr = %self.addr, error = %e, "cannot bind the metrics listener");
                return;
            }
        };
        let stop = async move {
            let _ = shutdown.changed().await;
        };
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(stop)
            .await
        {
            tracing::error!(error = %e, "metrics listener failed");
        }
    }
}

/// Builds the server; `run_forever` it.
pub fn build(settings: EdgeSettings) -> anyhow::Result<Server> {
    let settings = Arc::new(settings);
    let conf = ServerConf {
        threads: settings.threads,
        grace_period_seconds: Some(1),
        graceful_shutdown_timeout_seconds: Some(5),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();

    let mut upstreams = LoadBalancer::try_from_iter(settings.upstreams.iter().map(String::as_str))?;
    let mut check = TcpHealthCheck::new();
    check.peer_template.options.connection_timeout =
        Some(Duration::from_millis(settings.upstream_connect_timeout_ms));
    upstreams.set_health_check(check);
    upstreams.health_check_frequency =
        Some(Duration::from_millis(settings.health_check_interval_ms));
    let health = background_service("core health checks", upstreams);

    let metrics = EdgeMetrics::new();
    let sold_out = SoldOutCache::new(
        Duration::from_millis(settings.sold_out_ttl_ms),
        settings.cache_capacity,
    );
    let edge = Edge {
        upstreams: health.task(),
        sold_out: sold_out.clone(),
        metrics: metrics.clone(),
        settings: settings.clone(),
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()?,
    };
    let mut proxy = pingora::proxy::http_proxy_service(&server.configuration, edge);
    proxy.add_tcp(&settings.listen);
    server.add_service(proxy);
    server.add_service(health);
    server.add_service(background_service(
        "metrics listener",
        MetricsListener {
            addr: settings.metrics_listen.clone(),
            metrics: metrics.clone(),
            sold_out: sold_out.clone(),
        },
    ));
    if let Some(url) = &settings.redis_url {
        server.add_service(background_service(
            "availability signals",
            AvailabilitySignals {
                redis_url: url.clone(),
                channel: settings.availability_channel.clone(),
                sold_out,
                metrics,
            },
        ));
    }
    Ok(server)
}
