//! Log lines: formatted on the thread that logs, written by a thread of their own, in
//! batches.
//!
//! A request's thread only formats its lines and queues them: writing each access line to
//! stdout from the runtime's worker threads was one `write` call per request on the hot
//! path. The queue holds [`QUEUED_LINES`] lines; when the writer falls that far behind (a
//! stalled disk or pipe), logging waits for it rather than dropping lines or growing
//! without bound. Colours only on a terminal. Access lines (`crate::access`) are queued on
//! the same thread, formatted by their callers rather than by this layer.
//!
//! The writer thread, woken by a line, gathers what else comes for [`GATHER`] and writes it
//! all in one `write`: a writer that slept until each line (as `tracing-appender`'s does)
//! had to be woken by the request's thread for each one, and wrote each on its own, 1.5
//! system calls per access line in all, and about a sixth of the edge's CPU per forwarded
//! request (`reports/callgrind/EDGE.md`). A line waits at most [`GATHER`] to be written.

use std::io::{self, BufWriter, IsTerminal, Write};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError};
use std::thread;
use std::time::Duration;

use tracing::Subscriber;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// Lines queued for the writer thread, at most (a few MiB of text).
pub const QUEUED_LINES: usize = 8192;

/// How long the writer thread, woken by a line, lets more lines come before it writes.
pub const GATHER: Duration = Duration::from_millis(10);

/// How long stopping waits for the writer to write what is queued.
const STOP_WAIT: Duration = Duration::from_secs(1);

enum Msg {
    Line(Vec<u8>),
    Stop,
}

/// The queue's sending end: what every logging thread writes its lines to.
#[derive(Clone)]
pub(crate) struct Lines {
    queue: SyncSender<Msg>,
}

impl Lines {
    /// Queues one line (waiting while the queue is full); an error once the writer has
    /// stopped.
    pub(crate) fn send(&self, line: Vec<u8>) -> io::Result<()> {
        self.queue
            .send(Msg::Line(line))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the log writer has stopped"))
    }
}

/// One event's writer, as `tracing-subscriber` asks for one per event: it borrows the
/// queue rather than cloning it (a clone per line counts a shared reference up and down).
pub(crate) struct LineWriter<'a> {
    lines: &'a Lines,
}

impl io::Write for LineWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // The formatter writes each event whole, in one call.
        self.lines.send(buf.to_vec())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Lines {
    type Writer = LineWriter<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        LineWriter { lines: self }
    }
}

/// Hold it while the process logs: dropping it writes what is queued (waiting up to a
/// second) and stops the writer thread.
#[must_use = "dropping it stops the log writer"]
pub(crate) struct Writer {
    lines: Lines,
    stopped: Receiver<()>,
}

impl Drop for Writer {
    fn drop(&mut self) {
        if self.lines.queue.send(Msg::Stop).is_ok() {
            let _ = self.stopped.recv_timeout(STOP_WAIT);
        }
    }
}

/// Starts the writer thread on `out` and returns its queue and its guard.
pub(crate) fn start<W: Write + Send + 'static>(out: W) -> io::Result<(Lines, Writer)> {
    let (queue, queued) = mpsc::sync_channel(QUEUED_LINES);
    let (done, stopped) = mpsc::sync_channel(1);
    thread::Builder::new()
        .name("log-writer".into())
        .spawn(move || {
            write_lines(&queued, out);
            // The queue closed before stopping is reported: a line sent once the guard
            // is dropped is refused, never left in a queue no one reads.
            drop(queued);
            let _ = done.send(());
        })?;
    let lines = Lines { queue };
    Ok((lines.clone(), Writer { lines, stopped }))
}

/// The writer thread: sleeps until a line comes, lets what follows gather for [`GATHER`]
/// (senders do not wake it meanwhile: it is not waiting on the queue), writes the batch,
/// and sleeps again. Ends at [`Msg::Stop`], after writing what was queued before it.
fn write_lines<W: Write>(queued: &Receiver<Msg>, out: W) {
    let mut out = BufWriter::with_capacity(64 * 1024, out);
    // A failed write (stdout closed) loses its lines, as any logger's would; the thread
    // keeps taking lines so that no logging thread waits on a full queue.
    while let Ok(Msg::Line(first)) = queued.recv() {
        let _ = out.write_all(&first);
        thread::sleep(GATHER);
        loop {
            match queued.try_recv() {
                Ok(Msg::Line(line)) => {
                    let _ = out.write_all(&line);
                }
                Ok(Msg::Stop) | Err(TryRecvError::Disconnected) => {
                    let _ = out.flush();
                    return;
                }
                Err(TryRecvError::Empty) => break,
            }
        }
        let _ = out.flush();
    }
    let _ = out.flush();
}

/// The layer that formats lines (JSON or text) and the guard of its writer thread.
/// `access` says whether the filter lets access lines through: the queue is then handed
/// to [`crate::access`] too.
pub(crate) fn layer<S>(
    json: bool,
    access: bool,
) -> io::Result<(Box<dyn Layer<S> + Send + Sync>, Writer)>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    let stdout = io::stdout();
    let ansi = stdout.is_terminal();
    let (lines, writer) = start(stdout)?;
    crate::access::init(&lines, json, access);
    let layer = tracing_subscriber::fmt::layer()
        .with_ansi(ansi)
        .with_writer(lines);
    let layer = if json {
        layer.json().boxed()
    } else {
        layer.boxed()
    };
    Ok((layer, writer))
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// What the writer thread wrote, and in how many writes.
    #[derive(Clone, Default)]
    struct Seen(Arc<Mutex<(Vec<u8>, usize)>>);

    impl Write for Seen {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let mut seen = self.0.lock().map_err(|_| io::Error::other("poisoned"))?;
            seen.0.extend_from_slice(buf);
            seen.1 += 1;
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn every_line_from_every_thread_is_written_once_in_its_threads_order_by_the_time_it_stops() {
        let seen = Seen::default();
        let (lines, writer) = start(seen.clone()).expect("the writer thread");
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let lines = lines.clone();
                thread::spawn(move || {
                    for i in 0..5_000 {
                        let mut w = lines.make_writer();
                        w.write_all(format!("{t} {i}\n").as_bytes())
                            .expect("queued");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("a logging thread");
        }
        drop(writer);
        let (text, writes) = seen.0.lock().expect("seen").clone();
        let text = String::from_utf8(text).expect("UTF-8");
        let mut next = [0u32; 4];
        for line in text.lines() {
            let (t, i) = line.split_once(' ').expect("two numbers");
            let t: usize = t.parse().expect("a thread");
            assert_eq!(
                i.parse::<u32>().expect("a line"),
                next[t],
                "thread {t}'s order"
            );
            next[t] += 1;
        }
        assert_eq!(next, [5_000; 4], "every line, once");
        // 20,000 lines of a few bytes went out in batches, not a write each.
        assert!(writes < 2_000, "{writes} writes for 20,000 lines");
        // Stopped: a later line is refused, not queued for no one.
        assert!(lines.send(b"late\n".to_vec()).is_err());
    }

    #[test]
    fn a_single_line_is_written_without_waiting_for_more() {
        let seen = Seen::default();
        let (lines, _writer) = start(seen.clone()).expect("the writer thread");
        lines.send(b"alone\n".to_vec()).expect("queued");
        let mut written = false;
        for _ in 0..500 {
            if seen.0.lock().expect("seen").0 == b"alone\n" {
                written = true;
                break;
            }
            thread::sleep(Duration::from_millis(10));
        }
        assert!(written, "the line was not written within 5 s");
    }
}
