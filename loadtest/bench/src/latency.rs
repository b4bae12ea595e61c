//! Latency percentiles from an HdrHistogram of microseconds rather than by sorting every
//! sample: one pass and a fixed few kilobytes, whether a run has a thousand samples or a
//! million.

use std::time::Duration;

use hdrhistogram::Histogram;

/// The longest latency told apart (an hour, in µs): longer ones count as an hour.
const HIGHEST_US: u64 = 3_600_000_000;
/// Three significant digits: 1 µs resolution up to 2 ms, then within 0.1%.
const SIGNIFICANT_DIGITS: u8 = 3;

/// A histogram of latencies, in microseconds.
pub struct Latencies(Histogram<u64>);

impl Latencies {
    /// The histogram of `latencies`; `None` when there are none.
    pub fn of(latencies: impl IntoIterator<Item = Duration>) -> Option<Self> {
        let mut histogram = Histogram::new_with_bounds(1, HIGHEST_US, SIGNIFICANT_DIGITS).ok()?;
        for latency in latencies {
            let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
            histogram.saturating_record(micros);
        }
        if histogram.is_empty() {
            return None;
        }
        Some(Self(histogram))
    }

    /// The `p`th percentile (0 to 100; 100 is the maximum), in milliseconds.
    pub fn percentile_ms(&self, p: f64) -> f64 {
        self.0.value_at_percentile(p) as f64 / 1000.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_a_known_spread() {
        let latencies = Latencies::of((1..=1000).map(Duration::from_micros));
        let at = |p: f64| latencies.as_ref().map(|l| l.percentile_ms(p));
        assert_eq!(at(50.0), Some(0.5));
        assert_eq!(at(99.0), Some(0.99));
        assert_eq!(at(100.0), Some(1.0));
    }

    #[test]
    fn no_latencies_no_histogram() {
        assert!(Latencies::of(std::iter::empty()).is_none());
    }

    #[test]
    fn an_hour_and_longer_saturate() {
        let latencies = Latencies::of([Duration::from_secs(7200)]);
        let max = latencies.map(|l| l.percentile_ms(100.0));
        assert!(max.is_some_and(|m| (3_600_000.0..3_610_000.0).contains(&m)));
    }
}
