//! Access lines: one per request, formatted by the code that answered it and queued for the
//! log writer's thread (`logs`) without going through a `tracing` event.
//!
//! Why not `tracing::info!(target: "access", ...)`: the edge writes the line of every request
//! it forwards, and through `tracing-subscriber`'s formatter that line (ten fields, each
//! visited and written with `core::fmt`, a timestamp, a writer made per event) was half of
//! what the edge itself added to a forwarded request (`reports/callgrind/EDGE.md`, "The
//! forward path"). Here the line is written byte by byte into the buffer that is queued.
//!
//! The line looks like the `tracing` lines around it, so that one parser reads the whole log:
//! in JSON `{"timestamp":…,"level":"INFO","fields":{"message":"answered",…},"target":"access"}`,
//! in text `<timestamp>  INFO access: answered request_id="…" … status=201 …`, strings quoted
//! and escaped as JSON strings. The log filter still decides: a line is written only when
//! the process's filter (`RUST_LOG`, else the configured one) lets target `access` through
//! at `info`, read once when the logs are set up ([`init`]); the filter cannot change later.

use std::fmt::{self, Write as _};
use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::logs::Lines;

/// The target the access lines carry, as a `tracing` event's would.
pub const TARGET: &str = "access";

/// Where lines go: set by [`init`] when the filter lets them through.
struct Sink {
    lines: Lines,
    json: bool,
}

static SINK: OnceLock<Sink> = OnceLock::new();

/// The longest line written without growing its buffer: most are shorter.
const LINE_CAPACITY: usize = 384;

/// Called by the logs' set-up with the writer thread's queue, once per process.
pub(crate) fn init(lines: &Lines, json: bool, enabled: bool) {
    if enabled {
        let _ = SINK.set(Sink {
            lines: lines.clone(),
            json,
        });
    }
}

/// Whether access lines are written at all (the logs set up, the filter letting them
/// through): the caller can skip gathering a line's fields when not.
#[inline]
pub fn enabled() -> bool {
    SINK.get().is_some()
}

/// One request's access line. Strings are written escaped; none is cut here (the caller
/// bounds what a client chose, such as the path).
#[derive(Clone, Copy)]
pub struct AccessLine<'a> {
    pub request_id: &'a str,
    pub method: &'a str,
    pub path: &'a str,
    /// The route's metric label.
    pub route: &'a str,
    /// 0 when nothing was answered (the client went away first).
    pub status: u16,
    /// What was done with the request (`forwarded`, `sold_out`, ...).
    pub outcome: &'a str,
    /// From the request's arrival to its log phase; written in milliseconds to the µs.
    pub duration: Duration,
    pub client: Option<SocketAddr>,
    /// Why the request failed, when it did.
    pub error: Option<&'a dyn fmt::Display>,
}

impl fmt::Debug for AccessLine<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut line = Vec::new();
        self.format(true, UNIX_EPOCH, &mut line);
        f.write_str(&String::from_utf8_lossy(&line))
    }
}

impl AccessLine<'_> {
    /// Queues the line for the log writer (waiting when its queue is full, as every line
    /// does); nothing when [`enabled`] is false.
    pub fn write(&self) {
        let Some(sink) = SINK.get() else {
            return;
        };
        let mut line = Vec::with_capacity(LINE_CAPACITY);
        self.format(sink.json, SystemTime::now(), &mut line);
        // The writer's thread gone (the process stopping): the line is lost, as a
        // `tracing` event's would be.
        let _ = sink.lines.send(line);
    }

    /// The line, ending in a newline, as JSON or as text.
    pub fn format(&self, json: bool, now: SystemTime, out: &mut Vec<u8>) {
        let error = self.error.map(|e| e.to_string());
        if json {
            out.extend_from_slice(b"{\"timestamp\":\"");
            timestamp(now, out);
            out.extend_from_slice(b"\",\"level\":\"INFO\",\"fields\":{\"message\":\"answered\"");
        } else {
            timestamp(now, out);
            out.extend_from_slice(b"  INFO ");
            out.extend_from_slice(TARGET.as_bytes());
            out.extend_from_slice(b": answered");
        }
        let mut fields = Fields { json, out };
        fields.text("request_id", self.request_id);
        fields.text("method", self.method);
        fields.text("path", self.path);
        fields.text("route", self.route);
        fields.number("status", u64::from(self.status));
        fields.text("outcome", self.outcome);
        fields.key("duration_ms");
        millis(self.duration, fields.out);
        if let Some(client) = self.client {
            fields.key("client");
            fields.out.push(b'"');
            address(client, fields.out);
            fields.out.push(b'"');
        }
        if let Some(error) = &error {
            fields.text("error", error);
        }
        if json {
            out.extend_from_slice(b"},\"target\":\"");
            out.extend_from_slice(TARGET.as_bytes());
            out.extend_from_slice(b"\"}\n");
        } else {
            out.push(b'\n');
        }
    }
}

/// Writes `name=value` (text) or `,"name":value` (JSON) pairs.
struct Fields<'o> {
    json: bool,
    out: &'o mut Vec<u8>,
}

impl Fields<'_> {
    fn key(&mut self, name: &str) {
        if self.json {
            self.out.extend_from_slice(b",\"");
            self.out.extend_from_slice(name.as_bytes());
            self.out.extend_from_slice(b"\":");
        } else {
            self.out.push(b' ');
            self.out.extend_from_slice(name.as_bytes());
            self.out.push(b'=');
        }
    }

    fn text(&mut self, name: &str, value: &str) {
        self.key(name);
        quoted(value, self.out);
    }

    fn number(&mut self, name: &str, value: u64) {
        self.key(name);
        self.out
            .extend_from_slice(itoa::Buffer::new().format(value).as_bytes());
    }
}

/// `value` as a JSON string: quotes, backslashes and control characters escaped, the rest
/// (valid UTF-8 already) as it is.
fn quoted(value: &str, out: &mut Vec<u8>) {
    out.push(b'"');
    let bytes = value.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0..=0x1f | 0x7f => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        if escape.is_empty() {
            out.extend_from_slice(b"\\u00");
            out.push(HEX[usize::from(b >> 4)]);
            out.push(HEX[usize::from(b & 0xf)]);
        } else {
            out.extend_from_slice(escape);
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// `d` in milliseconds with three decimals (`12.345`).
fn millis(d: Duration, out: &mut Vec<u8>) {
    let micros = d.as_micros();
    out.extend_from_slice(itoa::Buffer::new().format(micros / 1000).as_bytes());
    out.push(b'.');
    let frac = (micros % 1000) as u16;
    out.extend_from_slice(&[
        b'0' + (frac / 100) as u8,
        b'0' + (frac / 10 % 10) as u8,
        b'0' + (frac % 10) as u8,
    ]);
}

/// An IPv4 address and port digit by digit (the common case); IPv6 through `Display`.
fn address(addr: SocketAddr, out: &mut Vec<u8>) {
    match addr {
        SocketAddr::V4(v4) => {
            let mut digits = itoa::Buffer::new();
            for (i, octet) in v4.ip().octets().into_iter().enumerate() {
                if i > 0 {
                    out.push(b'.');
                }
                out.extend_from_slice(digits.format(octet).as_bytes());
            }
            out.push(b':');
            out.extend_from_slice(digits.format(v4.port()).as_bytes());
        }
        SocketAddr::V6(_) => {
            let mut text = String::new();
            let _ = write!(text, "{addr}");
            out.extend_from_slice(text.as_bytes());
        }
    }
}

/// UTC, RFC 3339 to the microsecond (`2026-12-07T23:18:21.123456Z`), as `tracing-subscriber`
/// writes its own lines' time. A clock before 1970 is written as 1970.
fn timestamp(now: SystemTime, out: &mut Vec<u8>) {
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (year, month, day) = civil_date(secs / 86_400);
    let in_day = secs % 86_400;
    let year = u32::try_from(year).unwrap_or(9999).min(9999);
    two(year / 100, out);
    two(year % 100, out);
    out.push(b'-');
    two(month, out);
    out.push(b'-');
    two(day, out);
    out.push(b'T');
    two((in_day / 3600) as u32, out);
    out.push(b':');
    two((in_day / 60 % 60) as u32, out);
    out.push(b':');
    two((in_day % 60) as u32, out);
    out.push(b'.');
    let micros = since.subsec_micros();
    two(micros / 10_000, out);
    two(micros / 100 % 100, out);
    two(micros % 100, out);
    out.push(b'Z');
}

/// Two decimal digits of `n` (below 100).
fn two(n: u32, out: &mut Vec<u8>) {
    out.push(b'0' + (n / 10) as u8);
    out.push(b'0' + (n % 10) as u8);
}

/// The proleptic Gregorian date of a day counted from 1970-01-01 (Howard Hinnant's
/// `civil_from_days`, for days on or after the epoch).
fn civil_date(days: u64) -> (u64, u32, u32) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(json: bool, l: &AccessLine<'_>, at: SystemTime) -> String {
        let mut out = Vec::new();
        l.format(json, at, &mut out);
        String::from_utf8(out).expect("UTF-8")
    }

    fn sample<'a>(error: Option<&'a dyn fmt::Display>) -> AccessLine<'a> {
        AccessLine {
            request_id: "checkout-7f3a.1:retry-0",
            method: "POST",
            path: "/vouchers/SALE\"\\\n\u{1}é/reservations",
            route: "reserve",
            status: 201,
            outcome: "forwarded",
            duration: Duration::from_micros(12_345),
            client: Some("10.0.200.7:51234".parse().expect("address")),
            error,
        }
    }

    #[test]
    fn a_json_line_reads_back_as_the_fields_it_was_given() {
        let at = UNIX_EPOCH + Duration::new(1_796_685_501, 123_456_789);
        let error = "upstream \"core-2\" went away";
        let text = line(true, &sample(Some(&error)), at);
        assert!(
            text.ends_with('\n') && text.matches('\n').count() == 1,
            "{text}"
        );
        let v: serde_json::Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(v["timestamp"], "2026-12-07T23:18:21.123456Z");
        assert_eq!(v["level"], "INFO");
        assert_eq!(v["target"], "access");
        let f = &v["fields"];
        assert_eq!(f["message"], "answered");
        assert_eq!(f["request_id"], "checkout-7f3a.1:retry-0");
        assert_eq!(f["method"], "POST");
        assert_eq!(f["path"], "/vouchers/SALE\"\\\n\u{1}é/reservations");
        assert_eq!(f["route"], "reserve");
        assert_eq!(f["status"], 201);
        assert_eq!(f["outcome"], "forwarded");
        assert_eq!(f["duration_ms"].as_f64(), Some(12.345));
        assert_eq!(f["client"], "10.0.200.7:51234");
        assert_eq!(f["error"], error);
    }

    #[test]
    fn fields_left_out_are_absent_and_ipv6_clients_are_written_whole() {
        let mut l = sample(None);
        l.client = Some("[2001:db8::1]:443".parse().expect("address"));
        l.status = 0;
        l.duration = Duration::from_micros(7);
        let v: serde_json::Value = serde_json::from_str(&line(true, &l, UNIX_EPOCH)).expect("JSON");
        assert_eq!(v["timestamp"], "1970-01-01T00:00:00.000000Z");
        assert_eq!(v["fields"]["client"], "[2001:db8::1]:443");
        assert_eq!(v["fields"]["status"], 0);
        assert_eq!(v["fields"]["duration_ms"].as_f64(), Some(0.007));
        assert!(v["fields"].get("error").is_none(), "{v}");
        l.client = None;
        let v: serde_json::Value = serde_json::from_str(&line(true, &l, UNIX_EPOCH)).expect("JSON");
        assert!(v["fields"].get("client").is_none(), "{v}");
    }

    #[test]
    fn a_text_line_reads_like_the_tracing_lines_around_it() {
        let at = UNIX_EPOCH + Duration::new(951_782_400, 5_000); // 2000-02-29, a leap day
        let text = line(false, &sample(None), at);
        assert_eq!(
            text,
            "2000-02-29T00:00:00.000005Z  INFO access: answered \
             request_id=\"checkout-7f3a.1:retry-0\" method=\"POST\" \
             path=\"/vouchers/SALE\\\"\\\\\\n\\u0001é/reservations\" route=\"reserve\" \
             status=201 outcome=\"forwarded\" duration_ms=12.345 client=\"10.0.200.7:51234\"\n"
        );
    }

    #[test]
    fn dates_agree_with_a_day_by_day_count() {
        // Every day from 1970 to 2100 against a calendar walked one day at a time.
        let (mut y, mut m, mut d) = (1970u64, 1u32, 1u32);
        for days in 0..47_482u64 {
            assert_eq!(civil_date(days), (y, m, d), "day {days}");
            let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
            let len = match m {
                2 if leap => 29,
                2 => 28,
                4 | 6 | 9 | 11 => 30,
                _ => 31,
            };
            d += 1;
            if d > len {
                d = 1;
                m += 1;
                if m > 12 {
                    m = 1;
                    y += 1;
                }
            }
        }
    }
}
