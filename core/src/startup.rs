//! Building and running the application: what `main` does, and what tests do on port 0.

use std::future::IntoFuture;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::Settings;
use crate::expiry::ExpiryJob;
use crate::flash::events::consumer::EventConsumer;
use crate::flash::events::monitor::ConsumerMonitor;
use crate::flash::events::topics::ensure_topics;
use crate::flash::gate::Gate;
use crate::flash::reconcile::Reconciler;
use crate::flash::FlashPath;
use crate::http::{self, AppState};
use crate::metrics::Metrics;
use crate::service::VoucherService;
use crate::store::Store;

pub struct Application {
    api_listener: TcpListener,
    metrics_listener: TcpListener,
    router: axum::Router,
    metrics_router: axum::Router,
    expiry: Option<ExpiryJob>,
    consumer: Option<EventConsumer>,
    monitor: Option<ConsumerMonitor>,
    reconciler: Option<Reconciler>,
    store: Store,
    draining: Arc<std::sync::atomic::AtomicBool>,
}

impl Application {
    /// Connects, migrates (when configured), binds both listeners. Ports may be 0.
    pub async fn build(settings: &Settings) -> anyhow::Result<Self> {
        let store = Store::connect_lazy(&settings.database).context("database settings")?;
        if settings.database.migrate {
            store.migrate().await.context("applying migrations")?;
        }
        let metrics = Arc::new(Metrics::new());
        let (flash, consumer, monitor, reconciler) = match (&settings.redis, &settings.kafka) {
            (Some(redis), Some(kafka)) => {
                ensure_topics(kafka)
                    .await
                    .context("creating Kafka topics")?;
                let gate = Gate::connect(redis).await.context("connecting to Redis")?;
                let flash = FlashPath::new(
                    gate,
                    kafka,
                    store.clone(),
                    metrics.clone(),
                    settings.flash.clone(),
                )?;
                let monitor = ConsumerMonitor::new(
                    flash.progress().clone(),
                    metrics.clone(),
                    flash.consumer_health().clone(),
                    kafka.monitor_interval,
                );
                let consumer = if kafka.consume {
                    Some(
                        EventConsumer::new(kafka, store.clone(), metrics.clone())?
                            .settling(flash.gate().clone()),
                    )
                } else {
                    None
                };
                let reconciler = settings.flash.reconcile_enabled.then(|| Reconciler {
                    flash: flash.clone(),
                    store: store.clone(),
                    metrics: metrics.clone(),
                    interval: settings.flash.reconcile_interval,
                    grace: settings.flash.reconcile_grace,
                    catch_up_timeout: settings.flash.catch_up_timeout,
                    cursors: Default::default(),
                    exported: Default::default(),
                });
                (Some(flash), consumer, Some(monitor), reconciler)
            }
            _ => (None, None, None, None),
        };
        let service = VoucherService::new(
            store.clone(),
            metrics.clone(),
            settings.reservations.ttl(),
            flash,
        );
        let draining = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let state = AppState {
            service,
            admin_token: settings.admin.token.clone(),
            orders_token: settings.admin.orders_token.clone(),
            draining: draining.clone(),
        };
        let service = state.service.clone();
        let (router, _doc) = http::api_router(
            state,
            metrics.clone(),
            settings.http.max_body_bytes,
            settings.log.access,
        );
        let expiry = settings.reservations.expiry_enabled.then(|| ExpiryJob {
            service,
            metrics: metrics.clone(),
            interval: settings.reservations.expiry_interval,
            batch: settings.reservations.expiry_batch,
        });
        let api_listener = TcpListener::bind(settings.http.listen)
            .await
            .with_context(|| format!("binding {}", settings.http.listen))?;
        let metrics_listener = TcpListener::bind(settings.http.metrics_listen)
            .await
            .with_context(|| format!("binding {}", settings.http.metrics_listen))?;
        Ok(Self {
            api_listener,
            metrics_listener,
            router,
            metrics_router: http::metrics_router(crate::metrics::Scrape {
                metrics,
                pool: store.pool().clone(),
            }),
            expiry,
            consumer,
            monitor,
            reconciler,
            store,
            draining,
        })
    }

    pub fn api_addr(&self) -> SocketAddr {
        self.api_listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    pub fn metrics_addr(&self) -> SocketAddr {
        self.metrics_listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The flag that turns `readyz` to 503 before a shutdown.
    pub fn draining(&self) -> Arc<std::sync::atomic::AtomicBool> {
        self.draining.clone()
    }

    /// Serves until `shutdown` is cancelled, then lets requests in flight finish. Every
    /// background job runs in a set owned by this future: dropping it (an aborted task in a
    /// test, as a killed process) stops them all at once.
    pub async fn run_until_stopped(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let mut background = tokio::task::JoinSet::new();
        if let Some(job) = self.expiry {
            background.spawn(job.run(shutdown.child_token()));
        }
        if let Some(consumer) = self.consumer {
            background.spawn(consumer.run(shutdown.child_token()));
        }
        if let Some(monitor) = self.monitor {
            background.spawn(monitor.run(shutdown.child_token()));
        }
        if let Some(reconciler) = self.reconciler {
            background.spawn(reconciler.run(shutdown.child_token()));
        }
        let mut metrics = tokio::task::JoinSet::new();
        metrics.spawn(
            axum::serve(self.metrics_listener, self.metrics_router)
                .with_graceful_shutdown(shutdown.clone().cancelled_owned())
                .into_future(),
        );
        tracing::info!(addr = %self.api_listener.local_addr()?, "serving the API");
        axum::serve(self.api_listener, self.router)
            .with_graceful_shutdown(shutdown.clone().cancelled_owned())
            .await?;
        shutdown.cancel();
        while background.join_next().await.is_some() {}
        if let Some(served) = metrics.join_next().await {
            served??;
        }
        self.store.pool().close().await;
        Ok(())
    }
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("shutting down");
}
