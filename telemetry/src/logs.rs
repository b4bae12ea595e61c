//! Log lines: formatted on the thread that logs, written by a thread of their own.
//!
//! A request's thread only formats its lines and queues them: writing each access line to
//! stdout from the runtime's worker threads was one `write` call per request on the hot
//! path. The queue holds [`QUEUED_LINES`] lines; when the writer falls that far behind (a
//! stalled disk or pipe), logging waits for it rather than dropping lines or growing
//! without bound. Colours only on a terminal. Access lines (`crate::access`) are queued on
//! the same thread, formatted by their callers rather than by this layer.

use std::io::IsTerminal;

use tracing::Subscriber;
use tracing_appender::non_blocking::{NonBlockingBuilder, WorkerGuard};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// Lines queued for the writer thread, at most (a few MiB of text).
pub const QUEUED_LINES: usize = 8192;

/// The layer that formats lines (JSON or text) and the guard of its writer thread.
/// `access` says whether the filter lets access lines through: the writer is then handed
/// to [`crate::access`] too, which queues its lines on the same thread.
pub(crate) fn layer<S>(json: bool, access: bool) -> (Box<dyn Layer<S> + Send + Sync>, WorkerGuard)
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    let stdout = std::io::stdout();
    let ansi = stdout.is_terminal();
    let (writer, guard) = NonBlockingBuilder::default()
        .buffered_lines_limit(QUEUED_LINES)
        .lossy(false)
        .thread_name("log-writer")
        .finish(stdout);
    crate::access::init(&writer, json, access);
    let lines = tracing_subscriber::fmt::layer()
        .with_ansi(ansi)
        .with_writer(writer);
    let lines = if json {
        lines.json().boxed()
    } else {
        lines.boxed()
    };
    (lines, guard)
}
