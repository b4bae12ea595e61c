use voucher_edge::config::EdgeSettings;

/// mimalloc, as the core: glibc's malloc was the core's largest cost when profiled. Without
/// transparent huge pages, as the core (12 MiB resident at rest instead of 26).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    let settings = EdgeSettings::load()?;
    // Logs written by a thread of their own (an access line per request was a write call
    // on the proxy's threads), and spans exported when `tracing.otlp_endpoint` is set.
    // Held for as long as `main` runs; pingora's server exits the process from
    // `run_forever` without returning, so lines and spans still queued then can be lost.
    let service = voucher_telemetry::Service {
        name: "voucher-edge",
        version: env!("CARGO_PKG_VERSION"),
    };
    let logs = voucher_telemetry::Logs {
        filter: "info",
        json: settings.log_format == "json",
    };
    let _telemetry = voucher_telemetry::init(service, logs, &settings.tracing)?;
    tracing::info!(listen = %settings.listen, upstreams = ?settings.upstreams, "voucher-edge starting");
    voucher_edge::server::build(settings)?.run()
}
