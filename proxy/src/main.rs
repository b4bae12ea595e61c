use std::io::IsTerminal;

use tracing_appender::non_blocking::NonBlockingBuilder;
use voucher_edge::config::EdgeSettings;

/// mimalloc, as the core: glibc's malloc was the core's largest cost when profiled. Without
/// transparent huge pages, as the core (12 MiB resident at rest instead of 26).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Log lines queued for the writer thread, at most; past it logging waits for the writer.
const QUEUED_LINES: usize = 8192;

fn main() -> anyhow::Result<()> {
    let settings = EdgeSettings::load()?;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // A thread of its own writes the lines: an access line per request was a write call
    // on the proxy's threads. The guard lives as long as `main`; pingora's server exits
    // the process from `run_forever` without returning, so lines still queued then can be
    // lost.
    let stdout = std::io::stdout();
    let ansi = stdout.is_terminal();
    let (writer, _guard) = NonBlockingBuilder::default()
        .buffered_lines_limit(QUEUED_LINES)
        .lossy(false)
        .thread_name("log-writer")
        .finish(stdout);
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(writer);
    if settings.log_format == "json" {
        logs.json().init();
    } else {
        logs.init();
    }
    tracing::info!(listen = %settings.listen, upstreams = ?settings.upstreams, "voucher-edge starting");
    voucher_edge::server::build(settings)?.run()
}
