//! What a scrape of the edge's or a core's `/metrics` says, for the tests and the
//! benchmark: the wire contract's reader (`voucher_contract::exposition`), panicking on a
//! line that is not a sample (the exporters are ours).

use voucher_contract::exposition::{Sample, Scrape};

/// One scrape of a `/metrics` endpoint.
pub struct Metrics(Scrape);

impl Metrics {
    /// Reads every sample line; panics on a line that is not one.
    pub fn parse(text: &str) -> Self {
        Self(Scrape::parse(text).unwrap_or_else(|l| panic!("not a sample line: {l:?}")))
    }

    pub fn samples(&self) -> &[Sample] {
        self.0.samples()
    }

    /// The sum of the samples named `name` whose labels include `labels`.
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.0.sum(name, labels)
    }

    /// The number of series (sample lines) in the scrape: what a label set costs.
    pub fn series(&self) -> usize {
        self.0.series()
    }
}
