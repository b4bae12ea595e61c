//! An open-model HTTP load generator: requests are scheduled at a constant arrival rate,
//! whatever the server's latency, and each latency is measured from the request's
//! *scheduled* time, so a server that stalls is charged for the queue it causes
//! (no coordinated omission). Requests that start late say the generator itself could
//! not keep up; the report shows them next to the achieved rate.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::latency::Latencies;

/// Builds request number `i` (method, path, body).
pub type RequestFn = Arc<dyn Fn(u64) -> (hyper::Method, String, Option<Bytes>) + Send + Sync>;

pub struct Plan {
    pub target: SocketAddr,
    /// Requests per second offered.
    pub rate: u64,
    pub duration: Duration,
    /// Keep-alive connections; each carries one request at a time.
    pub connections: usize,
    pub request: RequestFn,
}

/// One answered (or failed) request.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// When it was scheduled, from the start of the run.
    pub at: Duration,
    /// From its scheduled time to the end of the response.
    pub latency: Duration,
    /// 0 when the request failed without an answer.
    pub status: u16,
    /// Whether the answer came from the edge itself (`x-served-by: edge`).
    pub by_edge: bool,
    /// The request's number `i` (what `RequestFn` was called with).
    pub index: u64,
}

#[derive(Debug)]
pub struct Outcome {
    pub offered: u64,
    pub samples: Vec<Sample>,
    /// Requests sent more than `LATE` after their scheduled time.
    pub late: u64,
    /// How long the load was planned to last.
    pub planned: Duration,
    /// From the first scheduled send to the last answer.
    pub elapsed: Duration,
    /// When the first send was scheduled: a sample's `at` counts from here.
    pub start: Instant,
    /// Generator CPU time over wall time (1.0 = one core busy).
    pub generator_cpu: f64,
}

/// A start later than this means the generator fell behind.
const LATE: Duration = Duration::from_millis(10);

impl Outcome {
    pub fn completed(&self) -> u64 {
        self.samples.iter().filter(|s| s.status != 0).count() as u64
    }

    pub fn errors(&self) -> u64 {
        self.samples.iter().filter(|s| s.status == 0).count() as u64
    }

    pub fn achieved_rate(&self) -> f64 {
        self.completed() as f64 / self.elapsed.as_secs_f64()
    }

    /// Latency percentile (0..=100) of the samples `keep` selects, in milliseconds; `None`
    /// when it selects none.
    pub fn percentile(&self, p: f64, keep: impl Fn(&Sample) -> bool) -> Option<f64> {
        let kept = self.samples.iter().filter(|s| keep(s)).map(|s| s.latency);
        Latencies::of(kept).map(|l| l.percentile_ms(p))
    }

    pub fn count(&self, keep: impl Fn(&Sample) -> bool) -> u64 {
        self.samples.iter().filter(|s| keep(s)).count() as u64
    }

    /// Kept up: the load was offered (few late starts, rate achieved) and answered, and
    /// answered with something else than "come back later" (at most 0.1% 503s: a 503 is
    /// not an answer the ladders count as achieved).
    pub fn sustained(&self, p99_limit_ms: f64) -> bool {
        self.shortfalls(p99_limit_ms).is_empty()
    }

    /// Why the step was not kept up ([`Outcome::sustained`]): one phrase per condition it
    /// missed, none when it was.
    pub fn shortfalls(&self, p99_limit_ms: f64) -> Vec<String> {
        let mut missed = Vec::new();
        // The rate was offered: answers kept pace with the plan, not just eventually came.
        let planned_rate = self.offered as f64 / self.planned.as_secs_f64();
        if self.achieved_rate() < 0.97 * planned_rate {
            missed.push(format!(
                "achieved {:.0}/s, under 0.97 of {planned_rate:.0}/s",
                self.achieved_rate()
            ));
        }
        if (self.late as f64) > 0.01 * self.offered as f64 {
            missed.push(format!(
                "{} late starts, more than 1% of {}",
                self.late, self.offered
            ));
        }
        match self.percentile(99.0, |s| s.status != 0) {
            Some(p) if p < p99_limit_ms => {}
            Some(p) => missed.push(format!("p99 {p:.1} ms, not under {p99_limit_ms} ms")),
            None => missed.push("nothing answered".into()),
        }
        let unavailable = self.count(|s| s.status == 503);
        if unavailable * 1000 > self.completed() {
            missed.push(format!(
                "{unavailable} answers of 503, more than 0.1% of {}",
                self.completed()
            ));
        }
        if self.errors() > 0 {
            missed.push(format!("{} errors", self.errors()));
        }
        missed
    }
}

fn cpu_seconds() -> f64 {
    // utime + stime of this process, in clock ticks (100 per second on Linux).
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            let after = s.rsplit_once(')')?.1.split_whitespace().collect::<Vec<_>>();
            let utime: f64 = after.get(11)?.parse().ok()?;
            let stime: f64 = after.get(12)?.parse().ok()?;
            Some((utime + stime) / 100.0)
        })
        .unwrap_or(0.0)
}

/// Runs the plan and returns every sample.
pub async fn run(plan: Plan) -> anyhow::Result<Outcome> {
    let total = plan.rate * plan.duration.as_secs_f64() as u64;
    let interval = Duration::from_secs_f64(1.0 / plan.rate as f64);
    let next = Arc::new(AtomicU64::new(0));
    let late = Arc::new(AtomicU64::new(0));
    let cpu_before = cpu_seconds();
    let start = Instant::now() + Duration::from_millis(50);
    let mut tasks = Vec::with_capacity(plan.connections);
    for _ in 0..plan.connections {
        let (next, late, request) = (next.clone(), late.clone(), plan.request.clone());
        let target = plan.target;
        tasks.push(tokio::spawn(async move {
            let mut samples = Vec::new();
            let mut sender = None;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    return samples;
                }
                let scheduled = start + interval.mul_f64(i as f64);
                let now = Instant::now();
                if scheduled > now {
                    tokio::time::sleep_until(scheduled.into()).await;
                } else if now - scheduled > LATE {
                    late.fetch_add(1, Ordering::Relaxed);
                }
                let (method, path, body) = request(i);
                let Answer {
                    status, by_edge, ..
                } = match send(&mut sender, target, method, &path, body).await {
                    Ok(answer) => answer,
                    Err(_) => {
                        sender = None; // reconnect for the next one
                        Answer::default()
                    }
                };
                samples.push(Sample {
                    at: scheduled.saturating_duration_since(start),
                    latency: Instant::now().saturating_duration_since(scheduled),
                    status,
                    by_edge,
                    index: i,
                });
            }
        }));
    }
    let mut samples = Vec::with_capacity(total as usize);
    for task in tasks {
        samples.extend(task.await?);
    }
    let elapsed = Instant::now().saturating_duration_since(start);
    let generator_cpu = (cpu_seconds() - cpu_before) / elapsed.as_secs_f64();
    Ok(Outcome {
        offered: total,
        samples,
        late: late.load(Ordering::Relaxed),
        planned: plan.duration,
        elapsed,
        start,
        generator_cpu,
    })
}

/// What a closed-model client does after a `503` with `Retry-After`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Client {
    /// Sends again at once, as after any other answer: the most a client can press.
    Greedy,
    /// Waits the `Retry-After` it was given (plus a jitter of up to half of it), as the
    /// API asks of its clients.
    WaitsRetryAfter,
}

/// The closed model: `connections` clients, each sending its next request as soon as its
/// last was answered (or, told to retry later, when `client` says), for `duration`.
/// Latency is from each send; there is no schedule to fall behind, so no late starts.
/// Request numbers are handed out as in [`run`].
pub async fn run_closed(
    target: SocketAddr,
    connections: usize,
    duration: Duration,
    request: RequestFn,
    client: Client,
) -> anyhow::Result<Outcome> {
    let next = Arc::new(AtomicU64::new(0));
    let cpu_before = cpu_seconds();
    let start = Instant::now();
    let end = start + duration;
    let mut tasks = Vec::with_capacity(connections);
    for _ in 0..connections {
        let (next, request) = (next.clone(), request.clone());
        tasks.push(tokio::spawn(async move {
            let mut samples = Vec::new();
            let mut sender = None;
            while Instant::now() < end {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let sent = Instant::now();
                let (method, path, body) = request(i);
                let answer = match send(&mut sender, target, method, &path, body).await {
                    Ok(answer) => answer,
                    Err(_) => {
                        sender = None;
                        Answer::default()
                    }
                };
                samples.push(Sample {
                    at: sent.saturating_duration_since(start),
                    latency: sent.elapsed(),
                    status: answer.status,
                    by_edge: answer.by_edge,
                    index: i,
                });
                // A client that keeps the contract waits what a 503 says before it sends
                // again, plus up to half of it more, so refused clients do not come back
                // as one wave; nothing of the wait is counted as latency.
                if let (Client::WaitsRetryAfter, Some(wait)) = (client, answer.retry_after) {
                    let jitter = wait.mul_f64((i.wrapping_mul(0x9E37_79B9) % 1000) as f64 / 2000.0);
                    tokio::time::sleep_until(end.min(Instant::now() + wait + jitter).into()).await;
                }
            }
            samples
        }));
    }
    let mut samples = Vec::new();
    for task in tasks {
        samples.extend(task.await?);
    }
    let elapsed = Instant::now().saturating_duration_since(start);
    Ok(Outcome {
        offered: samples.len() as u64,
        generator_cpu: (cpu_seconds() - cpu_before) / elapsed.as_secs_f64(),
        samples,
        late: 0,
        planned: duration,
        elapsed,
        start,
    })
}

pub type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

/// Opens `connections` keep-alive connections to `target`, one at a time, each carrying one
/// request (`request(i)`), and hands them back open: what a server keeps per idle client
/// connection is measured while they are held. Fails on any connection error.
pub async fn hold(
    target: SocketAddr,
    connections: usize,
    request: RequestFn,
) -> anyhow::Result<Vec<Sender>> {
    let mut held = Vec::with_capacity(connections);
    for i in 0..connections as u64 {
        let mut sender = None;
        let (method, path, body) = request(i);
        send(&mut sender, target, method, &path, body).await?;
        held.extend(sender);
    }
    Ok(held)
}

/// What the generator keeps of an answer (status 0: none came).
#[derive(Clone, Copy, Debug, Default)]
struct Answer {
    status: u16,
    /// Answered by the edge itself (`x-served-by`).
    by_edge: bool,
    /// A `Retry-After` given in seconds.
    retry_after: Option<Duration>,
}

async fn send(
    sender: &mut Option<Sender>,
    target: SocketAddr,
    method: hyper::Method,
    path: &str,
    body: Option<Bytes>,
) -> anyhow::Result<Answer> {
    if sender.as_ref().is_none_or(|s| s.is_closed()) {
        let stream = TcpStream::connect(target).await?;
        stream.set_nodelay(true)?;
        let (s, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(conn);
        *sender = Some(s);
    }
    let s = sender
        .as_mut()
        .ok_or_else(|| anyhow::anyhow!("no connection"))?;
    s.ready().await?;
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", target.to_string());
    if body.is_some() {
        req = req.header("content-type", "application/json");
    }
    let req = req.body(Full::new(body.unwrap_or_default()))?;
    let resp = s.send_request(req).await?;
    let status = resp.status().as_u16();
    let by_edge = resp.headers().contains_key("x-served-by");
    let retry_after = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        .map(Duration::from_secs);
    // Read the whole body so the connection can carry the next request.
    resp.into_body().collect().await?;
    Ok(Answer {
        status,
        by_edge,
        retry_after,
    })
}
