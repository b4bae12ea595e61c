//! CPU time by process, from `/proc/<pid>/stat` (user plus system time of every thread of
//! a process), read before and after a step: where the machine's two cores went while it
//! ran, per request. Processes are grouped by what they are in the stack, by their command
//! name; a process that started or ended during the step counts only what it had at both
//! ends (the stack's processes and PostgreSQL's pooled backends live through a step).
//! [`MachineWatch`] reads the whole machine (`/proc/stat`) and the same processes through a
//! step instead, every few milliseconds, for a part of it such as a sale's burst.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The parts of the stack, by command name (`/proc/<pid>/comm`, at most 15 bytes).
const PARTS: [(&str, &str); 6] = [
    ("voucher-bench", "generator"),
    ("voucher-edge", "edge"),
    ("voucher-core", "cores"),
    ("redis-server", "Redis"),
    ("postgres", "PostgreSQL"),
    ("tansu", "broker"),
];

/// Clock ticks per second of `/proc`'s times: `getconf CLK_TCK`, 100 on Linux's usual
/// builds (read once; the workspace forbids `unsafe`, so no sysconf).
fn ticks_per_second() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// CPU ticks of each process of the stack at one moment.
pub struct CpuSample {
    at: Instant,
    /// pid -> (part, ticks)
    ticks: BTreeMap<u32, (&'static str, u64)>,
}

/// Reads every process's CPU time now.
pub fn sample() -> CpuSample {
    let mut ticks = BTreeMap::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            if let Some((part, t)) = parse_stat(&stat) {
                ticks.insert(pid, (part, t));
            }
        }
    }
    CpuSample {
        at: Instant::now(),
        ticks,
    }
}

/// The part and the user plus system ticks of one `/proc/<pid>/stat` line. The command
/// name sits in parentheses and may hold spaces, so fields are counted after its `)`.
fn parse_stat(stat: &str) -> Option<(&'static str, u64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?;
    let part = PARTS
        .iter()
        .find(|(name, _)| comm == *name)
        .map(|(_, part)| *part)?;
    // After ")": state is field 3; utime and stime are fields 14 and 15.
    let fields: Vec<&str> = stat.get(close + 1..)?.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((part, utime + stime))
}

/// The whole machine's busy and total time (every CPU, every process: `/proc/stat`'s first
/// line), read every `every` by a task of its own from [`MachineWatch::start`] until
/// [`MachineWatch::stop`]: how busy the two cores were over part of a step, such as a sale's
/// burst, which per-process times read at the step's two ends cannot show. The kernel counts
/// in ticks (10 ms on Linux's usual builds) per CPU, so over a window of 100 ms on two CPUs
/// the share is known to about a tenth. Each reading also takes the CPU time of the stack's
/// processes alive when the watch started (by part, as [`CpuSpent`]), each known to a tick:
/// a process started later (a new PostgreSQL backend) is in the machine's share only.
pub struct MachineWatch {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Taken by [`MachineWatch::stop`].
    task: Option<tokio::task::JoinHandle<Vec<MachineTicks>>>,
}

/// One reading of `/proc/stat`: ticks busy, idle while a disk read or write was pending
/// (iowait: PostgreSQL's commits wait on their WAL's flush), and in all, summed over the
/// CPUs.
#[derive(Clone, Copy, Debug)]
struct MachineTicks {
    at: Instant,
    busy: u64,
    iowait: u64,
    total: u64,
    /// The watched processes' ticks, by part in the order of [`PARTS`].
    parts: [u64; PARTS.len()],
}

/// The machine over a window: shares of its CPUs' time.
#[derive(Clone, Copy, Debug)]
pub struct MachineShare {
    pub busy: f64,
    pub iowait: f64,
    /// The window read, between the readings around the one asked.
    pub read: Duration,
    /// CPU seconds of the watched processes over `read`, by part in the order of [`PARTS`].
    pub parts: [f64; PARTS.len()],
}

impl MachineShare {
    /// The parts' CPU as "name N ms", in the order of [`PARTS`].
    pub fn parts_ms(&self) -> String {
        PARTS
            .iter()
            .zip(self.parts)
            .map(|((_, part), secs)| format!("{part} {:.0} ms", secs * 1e3))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl MachineWatch {
    pub fn start(every: Duration) -> Self {
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let watched: Vec<u32> = sample().ticks.keys().copied().collect();
        let task = tokio::spawn(async move {
            let mut readings = Vec::new();
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                tick.tick().await;
                if let Some(mut r) = machine_ticks() {
                    r.parts = parts_ticks(&watched);
                    readings.push(r);
                }
                if stopped.load(Ordering::Relaxed) {
                    return readings;
                }
            }
        });
        Self {
            stop,
            task: Some(task),
        }
    }

    /// Stops the readings (after one more) and returns them.
    pub async fn stop(mut self) -> MachineTrace {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let readings = match self.task.take() {
            Some(task) => task.await.unwrap_or_default(),
            None => Vec::new(),
        };
        MachineTrace(readings)
    }
}

/// A watch dropped without [`MachineWatch::stop`] (its step failed) stops reading too.
impl Drop for MachineWatch {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The readings of a [`MachineWatch`].
pub struct MachineTrace(Vec<MachineTicks>);

impl MachineTrace {
    /// The machine from `from` to `to`, between the last reading at or before `from` and
    /// the first at or after `to` (so the window read is never shorter than the one
    /// asked); `None` without readings on both sides.
    pub fn between(&self, from: Instant, to: Instant) -> Option<MachineShare> {
        let first = self.0.iter().rev().find(|r| r.at <= from)?;
        let last = self.0.iter().find(|r| r.at >= to)?;
        let total = last.total.checked_sub(first.total).filter(|t| *t > 0)? as f64;
        let hz = ticks_per_second();
        let mut parts = [0.0; PARTS.len()];
        for (i, secs) in parts.iter_mut().enumerate() {
            *secs = last.parts[i].saturating_sub(first.parts[i]) as f64 / hz;
        }
        Some(MachineShare {
            busy: last.busy.saturating_sub(first.busy) as f64 / total,
            iowait: last.iowait.saturating_sub(first.iowait) as f64 / total,
            read: last.at.saturating_duration_since(first.at),
            parts,
        })
    }
}

/// The ticks of the processes `pids` now, by part. A process gone by then counts nothing,
/// so a part one of whose processes ended within a window is undercounted there (at worst
/// zero: [`MachineTrace::between`] does not let a part's time fall below it).
fn parts_ticks(pids: &[u32]) -> [u64; PARTS.len()] {
    let mut parts = [0; PARTS.len()];
    for pid in pids {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        if let Some((part, t)) = parse_stat(&stat) {
            if let Some(i) = PARTS.iter().position(|(_, p)| *p == part) {
                parts[i] += t;
            }
        }
    }
    parts
}

fn machine_ticks() -> Option<MachineTicks> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    parse_machine(stat.lines().next()?, Instant::now())
}

/// `cpu  user nice system idle iowait irq softirq steal guest guest_nice`: guest time is
/// counted in user already, so the first eight fields are the whole; idle and iowait are
/// the time not busy.
fn parse_machine(line: &str, at: Instant) -> Option<MachineTicks> {
    let mut fields = line.split_whitespace();
    if fields.next()? != "cpu" {
        return None;
    }
    let ticks: Vec<u64> = fields
        .take(8)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    let total: u64 = ticks.iter().sum();
    let (idle, iowait) = (*ticks.get(3)?, *ticks.get(4)?);
    Some(MachineTicks {
        at,
        busy: total.saturating_sub(idle + iowait),
        iowait,
        total,
        parts: [0; PARTS.len()],
    })
}

/// CPU spent by each part between two samples.
#[derive(Clone)]
pub struct CpuSpent {
    pub wall: Duration,
    /// part -> CPU seconds, in the order of [`PARTS`].
    pub by_part: Vec<(&'static str, f64)>,
}

impl CpuSpent {
    pub fn between(before: &CpuSample, after: &CpuSample) -> Self {
        let hz = ticks_per_second();
        let mut by_part: Vec<(&'static str, f64)> =
            PARTS.iter().map(|(_, part)| (*part, 0.0)).collect();
        for (pid, (part, end)) in &after.ticks {
            let Some((_, start)) = before.ticks.get(pid) else {
                continue;
            };
            if let Some(slot) = by_part.iter_mut().find(|(p, _)| p == part) {
                slot.1 += end.saturating_sub(*start) as f64 / hz;
            }
        }
        Self {
            wall: after.at.saturating_duration_since(before.at),
            by_part,
        }
    }

    /// All parts' CPU, in seconds.
    pub fn total(&self) -> f64 {
        self.by_part.iter().map(|(_, s)| s).sum()
    }

    /// The share of `cores` cores all parts used over the wall time.
    pub fn busy(&self, cores: f64) -> f64 {
        self.total() / (self.wall.as_secs_f64() * cores).max(f64::EPSILON)
    }

    /// Every part's CPU in microseconds per request of `requests`, and the whole
    /// machine's share used (of `cores` cores), as table cells.
    pub fn cells(&self, requests: u64, cores: f64) -> Vec<String> {
        let per = |secs: f64| secs * 1e6 / requests.max(1) as f64;
        let mut cells: Vec<String> = self
            .by_part
            .iter()
            .map(|(_, secs)| format!("{:.0}", per(*secs)))
            .collect();
        cells.push(format!("{:.0}", per(self.total())));
        cells.push(format!("{:.0}%", 100.0 * self.busy(cores)));
        cells
    }

    /// The header of [`CpuSpent::cells`].
    pub fn header() -> String {
        let parts: Vec<String> = PARTS.iter().map(|(_, part)| format!("{part} µs")).collect();
        format!("{} | all µs | machine busy", parts.join(" | "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_gives_its_part_and_ticks() {
        let line =
            "4242 (voucher-core) S 1 4242 4242 0 -1 4194560 2961 0 0 0 150 25 0 0 20 0 9 0 123 0 0";
        assert_eq!(parse_stat(line), Some(("cores", 175)));
        let spaced = "7 (tokio runtime) S 1 7 7 0 -1 0 0 0 0 0 1 1 0 0";
        assert_eq!(parse_stat(spaced), None, "not a part of the stack");
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn the_machine_line_gives_busy_and_total_and_a_window_reads_between_readings() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // user nice system idle iowait irq softirq steal guest guest_nice
        let r = |ms, line| parse_machine(line, at(ms)).expect("a cpu line");
        let mut first = r(0, "cpu  100 0 50 800 50 0 0 0 7 0");
        assert_eq!((first.busy, first.iowait, first.total), (150, 50, 1000));
        assert!(
            parse_machine("cpu0 1 2 3 4 5 6 7 8", t0).is_none(),
            "one CPU's line"
        );
        assert!(parse_machine("cpu  1 2 x", t0).is_none());
        let mut last = r(75, "cpu  190 0 70 830 60 0 0 0 0 0");
        // The edge's process ran 30 ticks over the window, a core's 5; one of PostgreSQL's
        // ended (its part's ticks fell): none, not less.
        first.parts = [0, 100, 40, 0, 70, 0];
        last.parts = [0, 130, 45, 0, 20, 0];
        let trace = MachineTrace(vec![
            first,
            r(25, "cpu  120 0 60 815 55 0 0 0 0 0"),
            r(50, "cpu  140 0 70 830 60 0 0 0 0 0"),
            last,
        ]);
        // 10 ms to 60 ms is read from the readings around it: 0 to 75 ms.
        let share = trace
            .between(at(10), at(60))
            .expect("readings on both sides");
        assert_eq!(share.read, Duration::from_millis(75));
        assert!((share.busy - 110.0 / 150.0).abs() < 1e-9, "{share:?}");
        assert!((share.iowait - 10.0 / 150.0).abs() < 1e-9, "{share:?}");
        let hz = ticks_per_second();
        assert_eq!(share.parts, [0.0, 30.0 / hz, 5.0 / hz, 0.0, 0.0, 0.0]);
        assert!(
            trace.between(at(10), at(80)).is_none(),
            "no reading after the end"
        );
    }
}
