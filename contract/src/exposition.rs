//! Reading the Prometheus text format the edge and core expose: the sample lines of a
//! scrape, for the tests, the benchmark and `voucherctl watch`. Hand-written because label
//! values here hold braces (route templates such as `/vouchers/{code}/reservations`),
//! which the parser crates we tried split wrongly; it reads sample lines only (comments,
//! `# TYPE` and `# HELP` are skipped).

use std::collections::HashMap;

/// One sample: `name{label="value",...} value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: HashMap<String, String>,
    pub value: f64,
}

/// One scrape of a `/metrics` endpoint.
#[derive(Debug, Clone, Default)]
pub struct Scrape(Vec<Sample>);

impl Scrape {
    /// Reads every sample line; the first line that is not one is returned as the error.
    pub fn parse(text: &str) -> Result<Self, String> {
        text.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|l| parse_sample(l).ok_or_else(|| l.to_owned()))
            .collect::<Result<Vec<_>, _>>()
            .map(Self)
    }

    pub fn samples(&self) -> &[Sample] {
        &self.0
    }

    /// The samples named `name` whose labels include `labels`.
    pub fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.0.iter().filter(move |s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
    }

    /// The sum of the samples named `name` whose labels include `labels`.
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.matching(name, labels).map(|s| s.value).sum()
    }

    /// The number of series (sample lines) in the scrape: what a label set costs.
    pub fn series(&self) -> usize {
        self.0.len()
    }
}

fn parse_sample(line: &str) -> Option<Sample> {
    let name_end = line.find(['{', ' '])?;
    let name = line[..name_end].to_owned();
    let mut rest = &line[name_end..];
    let mut labels = HashMap::new();
    if let Some(inner) = rest.strip_prefix('{') {
        let (parsed, after) = parse_labels(inner)?;
        labels = parsed;
        rest = after;
    }
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample {
        name,
        labels,
        value,
    })
}

/// `key="value",...}` with escapes in values; returns the labels and what follows `}`.
fn parse_labels(mut s: &str) -> Option<(HashMap<String, String>, &str)> {
    let mut labels = HashMap::new();
    loop {
        s = s.trim_start_matches([',', ' ']);
        if let Some(after) = s.strip_prefix('}') {
            return Some((labels, after));
        }
        let eq = s.find('=')?;
        let key = s[..eq].trim().to_owned();
        let mut chars = s[eq + 1..].strip_prefix('"')?.char_indices();
        let mut value = String::new();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '"' => break i,
                '\\' => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                c => value.push(c),
            }
        };
        labels.insert(key, value);
        s = &s[eq + 2 + end + 1..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_ok(text: &str) -> Scrape {
        Scrape::parse(text).expect("sample lines")
    }

    #[test]
    fn a_line_that_is_no_sample_is_the_error() {
        assert_eq!(
            Scrape::parse("ok 1\nnot a sample").err().as_deref(),
            Some("not a sample")
        );
    }

    #[test]
    fn sums_counters_by_label() {
        let m = parse_ok(
            "# TYPE r counter\nr{route=\"a\",code=\"OK\"} 2\nr{route=\"a\",code=\"X\"} 3\nr{route=\"b\",code=\"OK\"} 5\nplain 1.5e3\n",
        );
        assert_eq!(m.sum("r", &[("route", "a")]), 5.0);
        assert_eq!(m.sum("r", &[]), 10.0);
        assert_eq!(m.sum("missing", &[]), 0.0);
        assert_eq!(m.sum("plain", &[]), 1500.0);
        assert_eq!(m.series(), 4);
    }

    #[test]
    fn escaped_quotes_and_buckets_read_right() {
        let m =
            parse_ok("x{msg=\"say \\\"hi\\\"\",b=\"2\"} 1\nh_bucket{le=\"+Inf\"} 4 1700000000\n");
        assert_eq!(m.samples()[0].labels["msg"], "say \"hi\"");
        assert_eq!(m.samples()[0].labels["b"], "2");
        assert_eq!(m.sum("h_bucket", &[("le", "+Inf")]), 4.0);
    }

    #[test]
    fn label_values_may_hold_braces() {
        let m = parse_ok(
            "# TYPE h counter\nh{method=\"POST\",route=\"/vouchers/{code}/reservations\"} 7\n",
        );
        assert_eq!(
            m.sum("h", &[("route", "/vouchers/{code}/reservations")]),
            7.0
        );
    }
}
