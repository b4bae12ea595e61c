//! One reader of the Prometheus text format for every test: what a scrape says.

use prometheus_parse::{Scrape, Value};

/// One scrape of a `/metrics` endpoint.
pub struct Metrics(Scrape);

impl Metrics {
    pub fn parse(text: &str) -> Self {
        let lines = text.lines().map(|l| Ok(l.to_owned()));
        Self(Scrape::parse(lines).expect("valid Prometheus text"))
    }

    /// The sum of the samples of counter or gauge `name` whose labels include `labels`.
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.0
            .samples
            .iter()
            .filter(|s| s.metric == name)
            .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
            .map(|s| match s.value {
                Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => v,
                _ => 0.0,
            })
            .sum()
    }

    /// The number of series (samples) in the scrape: what a label set costs.
    pub fn series(&self) -> usize {
        self.0.samples.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_counters_by_label() {
        let m = Metrics::parse(
            "# TYPE r counter\nr{route=\"a\",code=\"OK\"} 2\nr{route=\"a\",code=\"X\"} 3\nr{route=\"b\",code=\"OK\"} 5\n",
        );
        assert_eq!(m.sum("r", &[("route", "a")]), 5.0);
        assert_eq!(m.sum("r", &[]), 10.0);
        assert_eq!(m.sum("missing", &[]), 0.0);
        assert_eq!(m.series(), 3);
    }
}
