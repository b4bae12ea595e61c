//! Logging set-up: `tracing` spans and events, as text or JSON, written by a thread of
//! their own.
//!
//! A request's thread only formats its lines and queues them: writing each access line to
//! stdout from the runtime's worker threads was one `write` call per request on the hot
//! path. The queue holds [`QUEUED_LINES`] lines; when the writer falls that far behind
//! (a stalled disk or pipe), logging waits for it rather than dropping lines or growing
//! without bound. Colours only on a terminal.

use std::io::IsTerminal;

use tracing_appender::non_blocking::{NonBlockingBuilder, WorkerGuard};
use tracing_subscriber::EnvFilter;

use crate::config::LogSettings;

/// Lines queued for the writer thread, at most (a few MiB of text).
pub const QUEUED_LINES: usize = 8192;

/// Installs the global subscriber. `RUST_LOG`, when set, wins over the configured filter.
/// Keep the guard for the life of the process: dropping it flushes what is queued and
/// stops the writer. `None` when a subscriber was installed already (several apps in one
/// test process keep the first).
#[must_use = "dropping the guard stops the log writer"]
pub fn init(settings: &LogSettings) -> Option<WorkerGuard> {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&settings.filter))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let stdout = std::io::stdout();
    let ansi = stdout.is_terminal();
    let (writer, guard) = NonBlockingBuilder::default()
        .buffered_lines_limit(QUEUED_LINES)
        .lossy(false)
        .thread_name("log-writer")
        .finish(stdout);
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(writer);
    let result = if settings.format == "json" {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
    result.ok().map(|()| guard)
}
