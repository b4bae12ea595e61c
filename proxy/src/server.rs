//! Assembling the Pingora server: the proxy service, upstream health checks, the
//! availability subscription and pingora's Prometheus service on the metrics listener.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::http::RequestHeader;
use pingora::lb::health_check::HttpHealthCheck;
use pingora::lb::LoadBalancer;
use pingora::listeners::{L4BufferSettings, ListenerConfig};
use pingora::server::configuration::ServerConf;
use pingora::server::{Server, ShutdownWatch};
use pingora::services::background::{background_service, BackgroundService};
use secrecy::ExposeSecret;

use crate::config::EdgeSettings;
use crate::edge::Edge;
use crate::flagging::Flagger;
use crate::metrics::EdgeMetrics;
use crate::rate_limit::RateLimits;
use crate::signals::AvailabilitySignals;
use crate::sold_out::SoldOutCache;

/// Keeps the gauge of sold-out flags current (flags also end by their TTL, which no
/// event announces).
struct FlagGauge {
    metrics: Arc<EdgeMetrics>,
    sold_out: SoldOutCache,
}

#[async_trait]
impl BackgroundService for FlagGauge {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tick.tick() => {
                    let n = i64::try_from(self.sold_out.len()).unwrap_or(i64::MAX);
                    self.metrics.flags.set(n);
                }
            }
        }
    }
}

/// Cores are balanced on their readiness (`GET /readyz` answers 200), not on an open port:
/// a core whose database, Redis or broker it cannot use gets no traffic.
fn readiness_check(settings: &EdgeSettings) -> anyhow::Result<Box<HttpHealthCheck>> {
    let mut check = HttpHealthCheck::new("voucher-core", false);
    let mut req = RequestHeader::build(
        "GET",
        voucher_contract::Route::READINESS_PATH.as_bytes(),
        None,
    )?;
    req.append_header("Host", "voucher-core")?;
    check.req = req;
    check.peer_template.options.connection_timeout = Some(settings.upstream_connect_timeout);
    check.peer_template.options.read_timeout =
        Some(settings.upstream_read_timeout.min(Duration::from_secs(2)));
    Ok(Box::new(check))
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
    upstreams.set_health_check(readiness_check(&settings)?);
    upstreams.health_check_frequency = Some(settings.health_check_interval);
    let health = background_service("core health checks", upstreams);

    let metrics = EdgeMetrics::new(prometheus::default_registry())?;
    let admission = voucher_admission::Limiter::new(settings.admission.clone());
    prometheus::default_registry().register(Box::new(admission.collector("edge")?))?;
    let sold_out = SoldOutCache::new(
        settings.sold_out_ttl,
        settings.order_fetch_interval,
        settings.cache_capacity,
    );
    let upstreams = health.task();
    let flagger = Flagger {
        sold_out: sold_out.clone(),
        upstreams: upstreams.clone(),
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()?,
        orders_token: settings.orders_token.clone(),
        metrics: metrics.clone(),
    };
    let edge = Edge {
        rate_limits: RateLimits::new(&settings.rate_limit),
        upstreams,
        sold_out: sold_out.clone(),
        metrics: metrics.clone(),
        settings: settings.clone(),
        flagger: flagger.clone(),
        request_ids: voucher_contract::request::RequestIds::new(
            uuid::Uuid::new_v4().as_u64_pair().0,
        ),
        admission: admission.clone(),
    };
    let mut proxy = pingora::proxy::http_proxy_service(&server.configuration, edge);
    proxy.add_listener(
        ListenerConfig::tcp(settings.listen.as_str())
            .l4_buffer(L4BufferSettings::default().read(settings.read_buffer_bytes)),
    );
    server.add_service(proxy);
    server.add_service(health);
    // pingora's own Prometheus service: the default registry, on its own listener.
    let mut metrics_service = pingora_prometheus::prometheus_http_service();
    metrics_service.add_tcp(&settings.metrics_listen);
    server.add_service(metrics_service);
    server.add_service(background_service(
        "sold-out flag gauge",
        FlagGauge {
            metrics: metrics.clone(),
            sold_out: sold_out.clone(),
        },
    ));
    if let Some(url) = &settings.redis_url {
        // Built here so that a bad URL or an unreadable certificate stops the start.
        let client =
            voucher_contract::redis_tls::redis_client(url.expose_secret(), &settings.redis_tls)?;
        server.add_service(background_service(
            "availability signals",
            AvailabilitySignals {
                client,
                channel: settings.availability_channel(),
                // Flags start early only where the edge answers for sold-out vouchers.
                sold_out_channel: settings
                    .sold_out_answers
                    .then(|| settings.sold_out_channel()),
                flagger,
            },
        ));
    }
    Ok(server)
}
