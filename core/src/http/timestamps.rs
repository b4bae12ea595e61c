//! Timestamps in answers, as chrono's own `Serialize` writes them (RFC 3339, `Z`, the
//! fraction only as long as it needs: none, milliseconds, microseconds or nanoseconds),
//! written into a string first and handed to the serializer once.
//!
//! chrono's `Serialize` writes through `collect_str`, one character at a time, and
//! serde_json checks each character for escaping on its own: about 2,650 instructions a
//! timestamp, two in every 201 of a reservation (`reports/callgrind/REPORT.md`).

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serializer;

/// `#[serde(serialize_with = "timestamps::rfc3339")]`.
pub fn rfc3339<S: Serializer>(at: &DateTime<Utc>, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&at.to_rfc3339_opts(SecondsFormat::AutoSi, true))
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    #[derive(serde::Serialize)]
    struct Ours(#[serde(serialize_with = "rfc3339")] DateTime<Utc>);

    #[test]
    fn the_text_is_chronos_own() {
        let second = Utc
            .with_ymd_and_hms(2026, 12, 3, 17, 4, 5)
            .single()
            .expect("a time");
        for nanos in [
            0,
            7_000_000,
            123_000_000,
            123_456_000,
            1_000,
            123_456_789,
            999_999_999,
        ] {
            let at = second + chrono::Duration::nanoseconds(nanos);
            let chronos = serde_json::to_string(&at).expect("chrono's");
            let ours = serde_json::to_string(&Ours(at)).expect("ours");
            assert_eq!(ours, chronos, "{nanos} ns past the second");
        }
    }
}
