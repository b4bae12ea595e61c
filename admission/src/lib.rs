//! Admission: how many reservations a process works on at once, and a quick "no" for the
//! rest.
//!
//! Offered more than it can take, a server that accepts everything queues it: in its
//! runtime, in its Redis connection, in the recorder's batch queue. Every request then
//! waits behind the queue, and the latency of all of them grows without bound while the
//! throughput does not grow at all. A [`Limiter`] bounds the requests in flight instead;
//! one over the limit waits at most `queue_timeout` (50 ms) for a place and is then refused
//! (the edge and the core answer it `503 OVERLOADED` with `Retry-After`), before anything
//! was done for it, so the client's retry is safe.
//!
//! The limit adapts to measured latency, in the manner of TCP's congestion control and of
//! the adaptive concurrency limiters of service meshes: time is cut into windows of
//! `latency_target`; a window in which more than one request in ten took longer than
//! `latency_target` (its 90th percentile is over the target) multiplies the limit by 0.9;
//! a window within the target whose busiest moment used at least 0.8 of the limit adds the
//! square root of the limit; one within the target that did not need the limit doubles it
//! back toward `initial_limit`, where the next burst should meet it. So the limit grows
//! while more concurrency still comes back fast (the recorder's batches grow with it),
//! shrinks when it only adds queueing, and rests at its start when the load has passed.
//!
//! Waiting requests get their places first come, first served, until the wait queue has
//! stood for `queue_timeout` without emptying once: then the load is not a burst but an
//! overload, and a place given back goes to the request that began to wait last (the
//! adaptive LIFO of Facebook's "Fail at Scale", with CoDel's standing-queue test). In first
//! come order every admitted request of an overload had first waited nearly its whole
//! `queue_timeout`, so its answer took that wait plus its service; newest first, the
//! admitted ones come in fresh and the wait falls on those that are refused at its end.
//! The refusals still come only after `queue_timeout`, which is what paces clients that
//! send again as soon as they are answered.
//!
//! Written here rather than taken from a crate: the crates that exist decide overload per
//! request (one slow request in a window cuts the limit, and at 10,000 requests a second
//! some request of every window is slow), keep their samples in types a caller cannot read
//! or extend, and take an async lock per completed request.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntCounter, IntGauge, Opts};
use serde::Deserialize;

/// A window decides only once it holds this many requests: a few requests say nothing about
/// a percentile.
const MIN_SAMPLES: u32 = 10;
/// The share of a window's requests allowed over the target before the limit shrinks.
const SLOW_SHARE: f64 = 0.1;
/// What a window over the target keeps of the limit.
const DECREASE: f64 = 0.9;
/// The share of the limit a window must have used at its busiest to let the limit grow:
/// a limit nobody reaches says nothing about what more concurrency would cost.
const BUSY_SHARE: f64 = 0.8;

/// The `[admission]` section of the edge's and the core's configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdmissionSettings {
    /// Off: every request is taken, as before admission existed (for comparisons).
    pub enabled: bool,
    /// The limit a process starts with. High: a sale opens with its largest burst, and a
    /// limit that had to grow into it would refuse the sale's first customers while the
    /// process could still take them; latency cuts it within a few windows if it cannot.
    pub initial_limit: usize,
    /// The limit never shrinks below this (so a stall of a dependency cannot leave a
    /// process taking one request at a time when it ends).
    pub min_limit: usize,
    /// Nor grows above this: bounds what a process holds even if latency stays low.
    pub max_limit: usize,
    /// The latency the limit keeps the 90th percentile under, and the window length.
    #[serde(with = "humantime_serde")]
    pub latency_target: Duration,
    /// How long a request over the limit waits for a place before it is refused (0: refused
    /// at once). Clients that send again as soon as they are answered otherwise spend the
    /// machine on refusals: 1,000 such connections at a core took 96% of both cores for
    /// 28,000 refusals a second while accepts fell to 993/s (a run of the overload bench
    /// with this at 0; `reports/bench/OVERLOAD.md` is the run with the default).
    #[serde(with = "humantime_serde")]
    pub queue_timeout: Duration,
    /// Once the wait queue has stood for `queue_timeout`, a place given back goes to the
    /// request that began to wait last. Off: always to the one that began first (for
    /// comparisons).
    pub newest_first: bool,
}

impl Default for AdmissionSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            initial_limit: 1024,
            min_limit: 16,
            max_limit: 4096,
            latency_target: Duration::from_millis(50),
            queue_timeout: Duration::from_millis(50),
            newest_first: true,
        }
    }
}

impl AdmissionSettings {
    /// Why these settings cannot work, if they cannot (checked at start, with the other
    /// settings, so a bad file stops the process instead of shedding every request).
    pub fn problem(&self) -> Option<String> {
        if self.min_limit == 0 {
            return Some("admission.min_limit must be at least 1".into());
        }
        if !(self.min_limit <= self.initial_limit && self.initial_limit <= self.max_limit) {
            return Some(format!(
                "admission limits must satisfy min_limit <= initial_limit <= max_limit (got {} <= {} <= {})",
                self.min_limit, self.initial_limit, self.max_limit
            ));
        }
        if self.latency_target.is_zero() {
            return Some("admission.latency_target must be longer than 0".into());
        }
        None
    }
}

/// Admits requests up to a limit that adapts to their latency. Cheap to clone: clones share
/// one limit.
#[derive(Clone, Debug)]
pub struct Limiter {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    settings: AdmissionSettings,
    /// The limit in force, `window.limit` rounded down; read by every acquire.
    limit: AtomicUsize,
    in_flight: AtomicUsize,
    /// The most requests in flight at once since the window began.
    peak: AtomicUsize,
    refused: AtomicU64,
    window: Mutex<Window>,
    /// Wakes a request waiting for a place when one is given back.
    released: tokio::sync::Notify,
    /// The requests waiting for a place.
    waiting: Mutex<usize>,
    /// Since when the wait queue has not been empty, in nanoseconds after `epoch`;
    /// [`NO_QUEUE`] while nobody waits. Read by every place given back, without the lock.
    queued_since: AtomicU64,
    /// tokio's clock, not std's: the tests pause it.
    epoch: tokio::time::Instant,
}

/// `queued_since` while nobody waits.
const NO_QUEUE: u64 = u64::MAX;

#[derive(Debug)]
struct Window {
    started: Instant,
    samples: u32,
    slow: u32,
    /// The limit with its fraction: square-root steps of a small limit are not whole.
    limit: f64,
}

/// A request's place within the limit. [`Permit::complete`] gives it back with the
/// request's latency; dropped without it (the request was cancelled), it is given back and
/// says nothing about latency.
#[derive(Debug)]
pub struct Permit {
    shared: Arc<Shared>,
    started: Instant,
}

impl Limiter {
    pub fn new(settings: AdmissionSettings) -> Self {
        let initial = settings.initial_limit.max(1);
        Self {
            shared: Arc::new(Shared {
                limit: AtomicUsize::new(initial),
                in_flight: AtomicUsize::new(0),
                peak: AtomicUsize::new(0),
                refused: AtomicU64::new(0),
                window: Mutex::new(Window {
                    started: Instant::now(),
                    samples: 0,
                    slow: 0,
                    limit: initial as f64,
                }),
                released: tokio::sync::Notify::new(),
                waiting: Mutex::new(0),
                queued_since: AtomicU64::new(NO_QUEUE),
                epoch: tokio::time::Instant::now(),
                settings,
            }),
        }
    }

    /// A permit, waiting up to `queue_timeout` for one when the limit is reached (places
    /// are handed out in the order requests began to wait, newest first once the queue has
    /// stood for `queue_timeout`); `None`: refuse the request.
    /// The latency a permit measures starts when it is granted: waiting here is the
    /// limit's doing, not a sign of the downstream's congestion.
    pub async fn acquire(&self) -> Option<Permit> {
        if let Some(permit) = self.admit() {
            return Some(permit);
        }
        let deadline = tokio::time::Instant::now() + self.shared.settings.queue_timeout;
        let _waiting = Waiting::new(&self.shared);
        loop {
            let released = self.shared.released.notified();
            tokio::pin!(released);
            // Registered before trying again, so a place given back in between wakes it.
            released.as_mut().enable();
            if let Some(permit) = self.admit() {
                return Some(permit);
            }
            if tokio::time::timeout_at(deadline, released).await.is_err() {
                self.shared.refused.fetch_add(1, Ordering::Relaxed);
                return None;
            }
        }
    }

    /// A permit at once, or `None` when the limit is reached (counted as refused): what
    /// [`Limiter::acquire`] is without its wait, for the tests that fill the limit.
    #[cfg(test)]
    fn try_acquire(&self) -> Option<Permit> {
        let permit = self.admit();
        if permit.is_none() {
            self.shared.refused.fetch_add(1, Ordering::Relaxed);
        }
        permit
    }

    /// A place if one is free now.
    fn admit(&self) -> Option<Permit> {
        let s = &self.shared;
        let now_in_flight = s.in_flight.fetch_add(1, Ordering::AcqRel) + 1;
        // Each acquire sees its own count, so in flight never stays above the limit; when
        // the limit shrinks below it, nothing is admitted until enough requests finish.
        if s.settings.enabled && now_in_flight > s.limit.load(Ordering::Acquire) {
            s.in_flight.fetch_sub(1, Ordering::AcqRel);
            // Demand reached the limit: the window counts as busy.
            s.peak.fetch_max(now_in_flight, Ordering::AcqRel);
            return None;
        }
        s.peak.fetch_max(now_in_flight, Ordering::AcqRel);
        Some(Permit {
            shared: self.shared.clone(),
            started: Instant::now(),
        })
    }

    /// The limit in force.
    pub fn limit(&self) -> usize {
        self.shared.limit.load(Ordering::Acquire)
    }

    /// Requests holding a permit now.
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::Acquire)
    }

    /// Requests refused since the start.
    pub fn refused(&self) -> u64 {
        self.shared.refused.load(Ordering::Relaxed)
    }

    /// The limiter's gauges and counter for a Prometheus registry, read at each scrape:
    /// `{prefix}_admission_limit`, `{prefix}_admission_in_flight` and
    /// `{prefix}_admission_refused_total`.
    pub fn collector(&self, prefix: &str) -> prometheus::Result<AdmissionCollector> {
        let gauge = |name: &str, help: &str| {
            IntGauge::with_opts(Opts::new(format!("{prefix}_admission_{name}"), help))
        };
        Ok(AdmissionCollector {
            limiter: self.clone(),
            limit: gauge(
                "limit",
                "Requests admitted at once at most, as adapted to latency",
            )?,
            in_flight: gauge("in_flight", "Requests admitted and not finished")?,
            refused: IntCounter::with_opts(Opts::new(
                format!("{prefix}_admission_refused_total"),
                "Requests refused at the admission limit, after at most queue_timeout (503 OVERLOADED)",
            ))?,
        })
    }
}

impl Shared {
    /// One finished request of `latency`, at `now`; closes the window when it is due.
    fn record(&self, now: Instant, latency: Duration) {
        let target = self.settings.latency_target;
        // A poisoned lock means a panic elsewhere while holding it; the window's counts are
        // plain numbers, still usable.
        let mut w = self.window.lock().unwrap_or_else(|e| e.into_inner());
        w.samples += 1;
        if latency > target {
            w.slow += 1;
        }
        if w.samples < MIN_SAMPLES || now.saturating_duration_since(w.started) < target {
            return;
        }
        let peak = self
            .peak
            .swap(self.in_flight.load(Ordering::Acquire), Ordering::AcqRel);
        let (min, max) = (
            self.settings.min_limit as f64,
            self.settings.max_limit as f64,
        );
        if f64::from(w.slow) > SLOW_SHARE * f64::from(w.samples) {
            w.limit = (w.limit * DECREASE).max(min);
        } else if peak as f64 >= BUSY_SHARE * w.limit.floor() {
            w.limit = (w.limit + w.limit.sqrt()).min(max);
        } else if w.limit < self.settings.initial_limit as f64 {
            // Fast, and the limit not needed: nothing says the process is overloaded any
            // more, so the limit goes back to where the next burst should meet it. (Growing
            // only with demand, a limit cut by one overload met the next sale's opening at
            // 16 and refused it for seconds while it grew.)
            w.limit = (w.limit * 2.0).min(self.settings.initial_limit as f64);
        }
        self.limit.store(w.limit as usize, Ordering::Release);
        w.started = now;
        w.samples = 0;
        w.slow = 0;
    }

    /// Whether the wait queue has stood, not once empty, for `queue_timeout`: an overload.
    fn queue_standing(&self) -> bool {
        if !self.settings.newest_first {
            return false;
        }
        let since = self.queued_since.load(Ordering::Acquire);
        if since == NO_QUEUE {
            return false;
        }
        let stood = Duration::from_nanos(self.now_ns().saturating_sub(since));
        stood >= self.settings.queue_timeout
    }

    fn now_ns(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(NO_QUEUE - 1)
    }
}

/// A request's turn in the wait queue, from its first failed try for a place until it has
/// one, is refused or is dropped (its client went away).
struct Waiting<'a>(&'a Shared);

impl<'a> Waiting<'a> {
    fn new(shared: &'a Shared) -> Self {
        let mut waiting = shared.waiting.lock().unwrap_or_else(|e| e.into_inner());
        *waiting += 1;
        if *waiting == 1 {
            shared
                .queued_since
                .store(shared.now_ns(), Ordering::Release);
        }
        Self(shared)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut waiting = self.0.waiting.lock().unwrap_or_else(|e| e.into_inner());
        *waiting -= 1;
        if *waiting == 0 {
            self.0.queued_since.store(NO_QUEUE, Ordering::Release);
        }
    }
}

impl Permit {
    /// The request finished: its latency counts toward the limit.
    pub fn complete(self) {
        self.shared.record(Instant::now(), self.started.elapsed());
        // Drop gives the place back.
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let s = &self.shared;
        s.in_flight.fetch_sub(1, Ordering::AcqRel);
        if s.queue_standing() {
            s.released.notify_last();
        } else {
            s.released.notify_one();
        }
    }
}

/// The metrics of one [`Limiter`], registered as one collector.
pub struct AdmissionCollector {
    limiter: Limiter,
    limit: IntGauge,
    in_flight: IntGauge,
    refused: IntCounter,
}

impl Collector for AdmissionCollector {
    fn desc(&self) -> Vec<&Desc> {
        [
            &self.limit.desc(),
            &self.in_flight.desc(),
            &self.refused.desc(),
        ]
        .into_iter()
        .flatten()
        .copied()
        .collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let gauge = |g: &IntGauge, v: usize| g.set(i64::try_from(v).unwrap_or(i64::MAX));
        gauge(&self.limit, self.limiter.limit());
        gauge(&self.in_flight, self.limiter.in_flight());
        let refused = self.limiter.refused();
        self.refused
            .inc_by(refused.saturating_sub(self.refused.get()));
        [
            self.limit.collect(),
            self.in_flight.collect(),
            self.refused.collect(),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(initial: usize, min: usize, max: usize) -> Limiter {
        Limiter::new(AdmissionSettings {
            enabled: true,
            initial_limit: initial,
            min_limit: min,
            max_limit: max,
            latency_target: Duration::from_millis(50),
            queue_timeout: Duration::from_secs(30),
            newest_first: true,
        })
    }

    #[tokio::test]
    async fn a_request_over_the_limit_waits_for_the_next_place_given_back() {
        let l = limiter(1, 1, 1);
        let held = l.try_acquire().expect("the one place");
        let waiting = tokio::spawn({
            let l = l.clone();
            async move { l.acquire().await.is_some() }
        });
        tokio::task::yield_now().await;
        drop(held);
        assert!(
            waiting.await.expect("waiter"),
            "the place went to the waiting request"
        );
        assert_eq!(l.refused(), 0);
    }

    /// A limiter of one place whose waits last 50 ms, the default.
    fn one_place() -> Limiter {
        Limiter::new(AdmissionSettings {
            initial_limit: 1,
            min_limit: 1,
            ..AdmissionSettings::default()
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_waits_no_longer_than_the_queue_timeout() {
        let l = one_place();
        let _held = l.try_acquire().expect("the one place");
        let started = tokio::time::Instant::now();
        assert!(l.acquire().await.is_none());
        assert_eq!(
            started.elapsed(),
            Duration::from_millis(50),
            "the paused clock's own time"
        );
        assert_eq!(l.refused(), 1);
    }

    /// A request over the limit of `l` that waits for a place in a task of its own.
    fn waiter(l: &Limiter) -> tokio::task::JoinHandle<Option<Permit>> {
        let l = l.clone();
        tokio::spawn(async move { l.acquire().await })
    }

    #[tokio::test(start_paused = true)]
    async fn a_queue_that_has_not_stood_long_gives_the_place_to_its_oldest_waiter() {
        let l = one_place();
        let held = l.try_acquire().expect("the one place");
        let older = waiter(&l);
        tokio::time::sleep(Duration::from_millis(10)).await;
        let newer = waiter(&l);
        tokio::time::sleep(Duration::from_millis(10)).await;
        // 20 ms into the queue: a burst, served in order.
        assert!(!l.shared.queue_standing());
        drop(held);
        let got = older
            .await
            .expect("older waiter")
            .expect("the oldest got the place");
        assert!(
            newer.await.expect("newer waiter").is_none(),
            "the newer waited out its 50 ms behind it"
        );
        drop(got);
    }

    #[tokio::test(start_paused = true)]
    async fn once_the_queue_has_stood_for_the_timeout_the_newest_waiter_gets_the_place() {
        let l = one_place();
        let held = l.try_acquire().expect("the one place");
        let first = waiter(&l);
        tokio::time::sleep(Duration::from_millis(40)).await;
        let older = waiter(&l);
        tokio::time::sleep(Duration::from_millis(5)).await;
        let newer = waiter(&l);
        tokio::time::sleep(Duration::from_millis(10)).await;
        // 55 ms: the first was refused at 50, but the queue has not emptied since 0.
        assert!(first.await.expect("first waiter").is_none());
        assert!(l.shared.queue_standing());
        drop(held);
        let got = newer
            .await
            .expect("newer waiter")
            .expect("the newest got the place");
        assert!(
            older.await.expect("older waiter").is_none(),
            "the older one waited out its 50 ms"
        );
        drop(got);
        assert!(
            !l.shared.queue_standing(),
            "nobody waits: the next queue starts in order again"
        );
        assert_eq!((l.in_flight(), l.refused()), (0, 2));
    }

    /// `n` requests of `latency` finishing at `at`.
    fn finish(l: &Limiter, at: Instant, n: u32, latency: Duration) {
        for _ in 0..n {
            l.shared.record(at, latency);
        }
    }

    #[test]
    fn requests_over_the_limit_are_refused_until_one_finishes() {
        let l = limiter(2, 1, 10);
        let a = l.try_acquire().expect("first");
        let _b = l.try_acquire().expect("second");
        assert!(l.try_acquire().is_none(), "a third is over the limit of 2");
        assert_eq!((l.in_flight(), l.refused()), (2, 1));
        drop(a);
        assert!(l.try_acquire().is_some(), "a place was given back");
    }

    #[test]
    fn disabled_it_takes_everything() {
        let l = Limiter::new(AdmissionSettings {
            enabled: false,
            initial_limit: 1,
            min_limit: 1,
            ..AdmissionSettings::default()
        });
        let held: Vec<_> = (0..100).filter_map(|_| l.try_acquire()).collect();
        assert_eq!((held.len(), l.refused()), (100, 0));
    }

    #[test]
    fn a_window_mostly_slow_cuts_the_limit_by_a_tenth() {
        let l = limiter(100, 10, 1000);
        let t0 = l.shared.window.lock().expect("lock").started;
        // 80 fast and 20 slow: the window's 90th percentile is over the target. It closes
        // with the first request to finish after its length.
        finish(
            &l,
            t0 + Duration::from_millis(10),
            20,
            Duration::from_millis(80),
        );
        finish(
            &l,
            t0 + Duration::from_millis(10),
            79,
            Duration::from_millis(5),
        );
        assert_eq!(l.limit(), 100);
        finish(
            &l,
            t0 + Duration::from_millis(60),
            1,
            Duration::from_millis(5),
        );
        assert_eq!(l.limit(), 90);
    }

    #[test]
    fn a_few_slow_requests_do_not_cut_it() {
        // At 10,000 requests a second some request of every window is slow; only a slow
        // tenth is a sign of queueing.
        let l = limiter(100, 10, 1000);
        let t0 = l.shared.window.lock().expect("lock").started;
        finish(
            &l,
            t0 + Duration::from_millis(60),
            95,
            Duration::from_millis(5),
        );
        finish(
            &l,
            t0 + Duration::from_millis(60),
            5,
            Duration::from_millis(500),
        );
        assert_eq!(
            l.limit(),
            100,
            "nobody used the limit, so it does not grow either"
        );
    }

    #[test]
    fn a_fast_window_that_used_the_limit_grows_it_by_its_square_root() {
        let l = limiter(100, 10, 1000);
        let held: Vec<_> = (0..100).filter_map(|_| l.try_acquire()).collect();
        assert!(l.try_acquire().is_none());
        drop(held);
        let t0 = l.shared.window.lock().expect("lock").started;
        finish(
            &l,
            t0 + Duration::from_millis(60),
            100,
            Duration::from_millis(5),
        );
        assert_eq!(l.limit(), 110);
        // The next window starts where this one ended and has seen nobody busy.
        finish(
            &l,
            t0 + Duration::from_millis(120),
            100,
            Duration::from_millis(5),
        );
        assert_eq!(l.limit(), 110);
    }

    #[test]
    fn a_window_decides_only_after_its_length_and_ten_requests() {
        let l = limiter(100, 10, 1000);
        let t0 = l.shared.window.lock().expect("lock").started;
        finish(
            &l,
            t0 + Duration::from_millis(10),
            50,
            Duration::from_millis(80),
        );
        assert_eq!(l.limit(), 100, "the window is not over yet");
        let l = limiter(100, 10, 1000);
        let t0 = l.shared.window.lock().expect("lock").started;
        finish(
            &l,
            t0 + Duration::from_secs(5),
            9,
            Duration::from_millis(80),
        );
        assert_eq!(l.limit(), 100, "nine requests decide nothing");
        finish(
            &l,
            t0 + Duration::from_secs(5),
            1,
            Duration::from_millis(80),
        );
        assert_eq!(l.limit(), 90);
    }

    #[test]
    fn once_answers_are_fast_and_the_limit_unneeded_it_returns_to_its_start() {
        let l = limiter(64, 2, 1000);
        let mut t = l.shared.window.lock().expect("lock").started;
        for _ in 0..40 {
            t += Duration::from_millis(60);
            finish(&l, t, 20, Duration::from_secs(1));
        }
        assert_eq!(l.limit(), 2, "an overload cut it to its minimum");
        let mut seen = Vec::new();
        for _ in 0..6 {
            t += Duration::from_millis(60);
            finish(&l, t, 20, Duration::from_millis(1));
            seen.push(l.limit());
        }
        // The first window still holds the last slow answers; then it doubles, up to its start.
        assert_eq!(
            seen,
            [2, 4, 8, 16, 32, 64],
            "doubling back, no further than the start"
        );
    }

    #[test]
    fn the_limit_stays_within_its_bounds() {
        let l = limiter(20, 16, 22);
        let mut t = l.shared.window.lock().expect("lock").started;
        for _ in 0..10 {
            t += Duration::from_millis(60);
            finish(&l, t, 20, Duration::from_secs(1));
        }
        assert_eq!(l.limit(), 16);
        for _ in 0..10 {
            let held: Vec<_> = (0..30).filter_map(|_| l.try_acquire()).collect();
            t += Duration::from_millis(60);
            finish(&l, t, 20, Duration::from_millis(1));
            drop(held);
        }
        assert_eq!(l.limit(), 22);
    }

    #[test]
    fn bad_settings_are_named() {
        let bad = |f: fn(&mut AdmissionSettings)| {
            let mut s = AdmissionSettings::default();
            f(&mut s);
            s.problem()
        };
        assert!(bad(|_| {}).is_none());
        assert!(bad(|s| s.min_limit = 0).is_some());
        assert!(bad(|s| s.initial_limit = s.max_limit + 1).is_some());
        assert!(bad(|s| s.latency_target = Duration::ZERO).is_some());
    }

    #[test]
    fn the_collector_reports_what_the_limiter_holds() {
        let l = limiter(2, 1, 10);
        let _a = l.try_acquire();
        let _b = l.try_acquire();
        let _ = l.try_acquire();
        let registry = prometheus::Registry::new();
        registry
            .register(Box::new(l.collector("edge").expect("collector")))
            .expect("registered");
        // Read as a scraper reads it: the text format.
        let text = prometheus::TextEncoder::new()
            .encode_to_string(&registry.gather())
            .expect("encoded");
        let value = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok())
        };
        assert_eq!(value("edge_admission_limit"), Some(2.0));
        assert_eq!(value("edge_admission_in_flight"), Some(2.0));
        assert_eq!(value("edge_admission_refused_total"), Some(1.0));
    }
}
