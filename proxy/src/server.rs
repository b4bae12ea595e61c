//! Assembling the Pingora server: the proxy service, the cores found by `discovery` and
//! checked for readiness, the availability subscription, pingora's Prometheus service on
//! the metrics listener, and the drain on SIGTERM.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::http::RequestHeader;
use pingora::lb::health_check::HttpHealthCheck;
use pingora::lb::{Backends, LoadBalancer};
use pingora::listeners::{L4BufferSettings, ListenerConfig};
use pingora::server::configuration::ServerConf;
use pingora::server::{RunArgs, Server, ShutdownSignal, ShutdownSignalWatch, ShutdownWatch};
use pingora::services::background::{background_service, BackgroundService};
use secrecy::ExposeSecret;

use crate::config::EdgeSettings;
use crate::discovery::Resolver;
use crate::edge::Edge;
use crate::flagging::Flagger;
use crate::metrics::EdgeMetrics;
use crate::rate_limit::RateLimits;
use crate::signals::AvailabilitySignals;
use crate::sold_out::SoldOutCache;

/// Keeps the gauge of sold-out flags current (flags also end by their TTL, which no
/// event announces). Counting them also takes the lapsed ones out, with their order
/// filters (`SoldOutCache::len`): this task is what frees them.
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

/// The edge's server and how it drains; [`EdgeServer::run`] it.
pub struct EdgeServer {
    server: Server,
    drain: Drain,
}

/// SIGTERM as the cores take it: `GET /readyz` turns 503 at once while every request is
/// still served, for `drain_delay`; only then is pingora told to stop (its listener closes,
/// requests in flight get its grace period, `shutdown_deadline`). SIGINT stops at once,
/// SIGQUIT is pingora's graceful upgrade.
struct Drain {
    draining: Arc<AtomicBool>,
    delay: Duration,
}

#[async_trait]
impl ShutdownSignalWatch for Drain {
    async fn recv(&self) -> ShutdownSignal {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut term), Ok(mut int), Ok(mut quit)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
            signal(SignalKind::quit()),
        ) else {
            tracing::error!("cannot listen for signals; stopping");
            return ShutdownSignal::FastShutdown;
        };
        tokio::select! {
            _ = term.recv() => {
                self.draining.store(true, Ordering::Relaxed);
                tracing::info!(delay = ?self.delay, "draining: readyz answers 503");
                tokio::time::sleep(self.delay).await;
                tracing::info!("stopping: the listener closes, requests in flight may finish");
                ShutdownSignal::GracefulTerminate
            }
            _ = int.recv() => ShutdownSignal::FastShutdown,
            _ = quit.recv() => ShutdownSignal::GracefulUpgrade,
        }
    }
}

impl EdgeServer {
    /// Serves until a signal stops it (see [`Drain`]), then exits the process.
    pub fn run(self) -> ! {
        self.server.run(RunArgs {
            shutdown_signal: Box::new(self.drain),
        });
        std::process::exit(0)
    }
}

/// Builds the server; [`EdgeServer::run`] it.
pub fn build(settings: EdgeSettings) -> anyhow::Result<EdgeServer> {
    let settings = Arc::new(settings);
    let conf = ServerConf {
        threads: settings.threads,
        // Whole seconds: pingora's grace period, rounded up so a deadline is never cut.
        grace_period_seconds: Some(settings.shutdown_deadline.as_secs_f64().ceil() as u64),
        // Then the runtimes' own shutdown, briefly: nothing is left in flight by then.
        graceful_shutdown_timeout_seconds: Some(1),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();

    let mut upstreams =
        LoadBalancer::from_backends(Backends::new(Box::new(Resolver::new(&settings.upstreams))));
    upstreams.set_health_check(readiness_check(&settings)?);
    upstreams.health_check_frequency = Some(settings.health_check_interval);
    upstreams.update_frequency = Some(settings.upstream_resolve_interval);
    let health = background_service("core health checks", upstreams);

    let draining = Arc::new(AtomicBool::new(false));
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
        // No idle timeout for the pool of connections to the cores: with one, the client
        // keeps a repeating timer on the runtime of the task that fetched first, a request
        // worker's, and each park of that worker then services it (about 450
        // instructions a sold-out answer, `reports/callgrind/EDGE.md`). Fetches are few
        // (one per voucher at a time), so are their connections, and a connection a core
        // closed is found closed when it is next taken.
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .pool_idle_timeout(None)
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
        places: crate::places::VoucherPlaces::new(
            settings.voucher_in_flight,
            settings.admission.queue_timeout,
            settings.cache_capacity,
        ),
        flag_waiters: Arc::new(tokio::sync::Semaphore::new(
            settings
                .sold_out_max_waiting
                .min(tokio::sync::Semaphore::MAX_PERMITS),
        )),
        admission: admission.clone(),
        draining: draining.clone(),
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
        let clients = voucher_contract::redis_tls::node_urls(url.expose_secret())
            .into_iter()
            .map(|node| voucher_contract::redis_tls::redis_client(node, &settings.redis_tls))
            .collect::<anyhow::Result<Vec<_>>>()?;
        anyhow::ensure!(!clients.is_empty(), "redis_url names no Redis");
        server.add_service(background_service(
            "availability signals",
            AvailabilitySignals {
                clients,
                channel: settings.availability_channel(),
                // Flags start early only where the edge answers for sold-out vouchers.
                sold_out_channel: settings
                    .sold_out_answers
                    .then(|| settings.sold_out_channel()),
                flagger,
            },
        ));
    }
    Ok(EdgeServer {
        server,
        drain: Drain {
            draining,
            delay: settings.drain_delay,
        },
    })
}
