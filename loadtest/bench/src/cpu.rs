//! CPU time by process, from `/proc/<pid>/stat` (user plus system time of every thread of
//! a process), read before and after a step: where the machine's two cores went while it
//! ran, per request. Processes are grouped by what they are in the stack, by their command
//! name; a process that started or ended during the step counts only what it had at both
//! ends (the stack's processes and PostgreSQL's pooled backends live through a step).

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
}
