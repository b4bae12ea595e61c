//! Building and running the application: what `main` does, and what tests do on port 0.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use tokio::net::{TcpListener, TcpSocket};
use tokio_util::sync::CancellationToken;

use crate::config::Settings;
use crate::expiry::ExpiryJob;
use crate::flash::FlashJobs;
use crate::http::{self, AppState};
use crate::metrics::Metrics;
use crate::service::VoucherService;
use crate::store::Store;

/// Connections the kernel holds for a listener before they are accepted (capped by
/// `net.core.somaxconn`). With tokio's `TcpListener::bind` a core's port had 128 (`ss -ltn`): when 1,000 clients
/// connected at once (an overload benchmark's closed loop; an edge fleet reconnecting
/// after a restart) the rest of their SYNs were dropped and each such client waited the
/// kernel's one-second SYN retransmission, which was the p99 of 1.05-1.1 s of those runs'
/// 201s (`reports/bench/OVERLOAD-backlog.md`).
const LISTEN_BACKLOG: u32 = 4096;

/// A listener on `addr` with [`LISTEN_BACKLOG`]; `SO_REUSEADDR` as tokio's `bind` sets it.
fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

pub struct Application {
    api_listener: TcpListener,
    metrics_listener: TcpListener,
    router: axum::Router,
    metrics_router: axum::Router,
    expiry: Option<ExpiryJob>,
    flash_jobs: Option<FlashJobs>,
    tokens: TokenRefresh,
    store: Store,
    /// How often the store checks that it is on the primary (several hosts in the URL).
    primary_check_interval: std::time::Duration,
    draining: Arc<std::sync::atomic::AtomicBool>,
}

/// The job that re-reads the stored API tokens.
struct TokenRefresh {
    credentials: crate::auth::Credentials,
    store: Store,
    interval: std::time::Duration,
}

impl Application {
    /// Connects, migrates (when configured), binds both listeners. Ports may be 0.
    pub async fn build(settings: &Settings) -> anyhow::Result<Self> {
        // A URL of a primary and its standbys: find the primary before the first statement
        // (the migrations). None found: with `migrate` the migrations fail and the core
        // exits (its supervisor starts it again); without, it starts and answers 503 until
        // the follower finds one.
        let store = Store::connect_to_primary(&settings.database)
            .await
            .context("database settings")?;
        if settings.database.migrate {
            store.migrate().await.context("applying migrations")?;
        }
        let metrics = Arc::new(Metrics::new());
        let flash = crate::flash::start(settings, store.clone(), metrics.clone()).await?;
        let (flash, flash_jobs) = match flash {
            Some(flash) => (Some(flash.path), Some(flash.jobs)),
            None => (None, None),
        };
        let standard = crate::standard::Grouper::start(
            &store,
            &settings.standard,
            settings.reservations.ttl(),
            metrics.clone(),
        );
        let service = VoucherService::new(
            store.clone(),
            metrics.clone(),
            settings.reservations.ttl(),
            standard,
            flash,
        );
        let draining = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let admission = voucher_admission::Limiter::new(settings.admission.clone());
        metrics.watch_admission(&admission)?;
        let credentials =
            crate::auth::Credentials::new(&settings.admin.token, &settings.admin.orders_token);
        // The stored tokens before the first request, when PostgreSQL answers now; else
        // from the first refresh that reaches it (the configured ones work meanwhile).
        match store.valid_tokens().await {
            Ok(rows) => credentials.replace_stored(rows),
            Err(e) => {
                tracing::warn!(error = %e.chain(), "API tokens not read at start; retried every admin.token_refresh")
            }
        }
        let tokens = TokenRefresh {
            credentials: credentials.clone(),
            store: store.clone(),
            interval: settings.admin.token_refresh,
        };
        let state = AppState::new(http::State {
            service,
            credentials,
            draining: draining.clone(),
            admission,
        });
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
        let api_listener = listen(settings.http.listen)
            .with_context(|| format!("binding {}", settings.http.listen))?;
        let metrics_listener = listen(settings.http.metrics_listen)
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
            flash_jobs,
            tokens,
            store,
            primary_check_interval: settings.database.primary_check_interval,
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
        let store = self.store.clone();
        let primary = shutdown.child_token();
        let interval = self.primary_check_interval;
        background.spawn(async move { store.follow_primary(interval, primary).await });
        let tokens = self.tokens;
        background.spawn(tokens.credentials.keep_fresh(
            tokens.store,
            tokens.interval,
            shutdown.child_token(),
        ));
        if let Some(jobs) = self.flash_jobs {
            jobs.spawn(&mut background, &shutdown);
        }
        let mut metrics = tokio::task::JoinSet::new();
        metrics.spawn(http::serve(
            self.metrics_listener,
            self.metrics_router,
            shutdown.clone(),
        ));
        tracing::info!(addr = %self.api_listener.local_addr()?, "serving the API");
        http::serve(self.api_listener, self.router, shutdown.clone()).await?;
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
