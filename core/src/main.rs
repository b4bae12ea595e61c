use std::sync::atomic::Ordering;

use tokio_util::sync::CancellationToken;
use voucher_core::config::Settings;
use voucher_core::startup::{shutdown_signal, Application};

/// mimalloc, not glibc's malloc: profiled accepting 6,000 reservations/s (perf, as
/// `loadtest/perf-core.sh` does), glibc's allocation and free paths (`_int_malloc`,
/// `_int_free`, `malloc_consolidate`, ...) had 21% of the core's samples. Built without
/// transparent huge pages (`no_thp` in the workspace's `Cargo.toml`): its arenas asked the
/// kernel for 2 MiB pages, and the core was 33 MiB resident at rest instead of 20.
/// The feature `system-allocator` leaves it out, for heap profilers that see only malloc
/// (`loadtest/heap-core.sh`).
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The voucher service's core. Without a command it serves; `tokens` manages the named
/// API tokens in the configured database.
#[derive(clap::Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Serve the API (the default).
    Serve,
    /// Named API tokens with scopes, stored as digests (see `voucher_core::auth`).
    #[command(subcommand)]
    Tokens(voucher_core::auth::cli::TokensCommand),
    /// Print the OpenAPI document the API serves (the repository's `openapi.json`).
    Openapi,
    /// Apply the migrations to the configured database and exit (a deployment's Job, for
    /// cores that run with `database.migrate = false`).
    Migrate,
}

fn main() -> anyhow::Result<()> {
    let cli = <Cli as clap::Parser>::parse();
    if let Some(Command::Openapi) = cli.command {
        println!("{:#}", voucher_core::http::openapi_json());
        return Ok(());
    }
    let settings = Settings::load()?;
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if settings.runtime.worker_threads > 0 {
        builder.worker_threads(settings.runtime.worker_threads);
    }
    let runtime = builder.enable_all().build()?;
    match cli.command {
        Some(Command::Tokens(command)) => {
            return runtime.block_on(voucher_core::auth::cli::run(&settings, command))
        }
        Some(Command::Migrate) => {
            runtime.block_on(async {
                voucher_core::store::Store::connect_to_primary(&settings.database)
                    .await?
                    .migrate()
                    .await
            })?;
            println!("migrations applied");
            return Ok(());
        }
        _ => {}
    }
    // Before the runtime runs anything: the span exporter's HTTP client has a runtime of
    // its own, which may be neither made nor dropped inside another.
    let service = voucher_telemetry::Service {
        name: "voucher-core",
        version: env!("CARGO_PKG_VERSION"),
    };
    let logs = voucher_telemetry::Logs {
        filter: &settings.log.filter,
        json: settings.log.format == "json",
    };
    let telemetry = voucher_telemetry::init(service, logs, &settings.tracing)?;
    let served = runtime.block_on(serve(&settings));
    // Tasks still running (requests past the shutdown deadline) are dropped, not awaited;
    // then the spans and lines still queued are sent, outside the runtime.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    telemetry.shutdown();
    served
}

/// Serves until SIGTERM or SIGINT, then drains (`http.drain_delay`) and stops, or exits at
/// the shutdown deadline with requests still in flight.
async fn serve(settings: &Settings) -> anyhow::Result<()> {
    let app = Application::build(settings).await?;
    tracing::info!(api = %app.api_addr(), metrics = %app.metrics_addr(), "voucher-core started");
    let shutdown = CancellationToken::new();
    let trigger = shutdown.clone();
    let draining = app.draining();
    let (drain_delay, deadline) = (settings.http.drain_delay, settings.http.shutdown_deadline);
    let (deadline_passed, at_deadline) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        shutdown_signal().await;
        // Ready no more, still serving: balancers stop sending before the listener closes.
        draining.store(true, Ordering::Relaxed);
        tracing::info!(?drain_delay, "draining: readyz answers 503");
        tokio::time::sleep(drain_delay).await;
        tracing::info!(?deadline, "stopping: requests in flight may finish");
        trigger.cancel();
        tokio::time::sleep(deadline).await;
        let _ = deadline_passed.send(());
    });
    tokio::select! {
        stopped = app.run_until_stopped(shutdown) => stopped,
        Ok(()) = at_deadline => {
            tracing::warn!("requests still in flight at the shutdown deadline; exiting");
            anyhow::bail!("requests still in flight at the shutdown deadline")
        }
    }
}
