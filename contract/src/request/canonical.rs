//! A reservation's body in the one spelling nearly every client sends, read without serde:
//! `{"customerId":C,"orderId":"O","orderAmount":N}`, keys in that order, no whitespace,
//! `C` a quoted identifier or a whole number, `O` a quoted identifier, `N` a whole number.
//!
//! Why: the edge reads every reservation's body before it may answer for a core, and
//! serde_json's reading of it (keys matched by name, strings scanned for escapes, then the
//! identifiers checked) was 1,867 instructions of each answer on the edge's reject path;
//! with this one pass first it is about 870 (callgrind, `reports/callgrind/EDGE.md`).
//!
//! The rule that keeps it safe: this only ever *accepts*. Every byte it does not expect
//! (whitespace, another key order, an escape, a sign, a fraction, a leading zero, a number
//! too large, an identifier outside its rule, anything after the `}`) gives `None`, and the
//! caller reads the body with serde as before. A body it accepts is one serde reads to the
//! very same fields, which passed the same checks: an identifier within its rule has no
//! `"` or `\`, so its bytes are its text; a number without a leading zero is its own
//! decimal digits. A test compares both readings on generated bodies.

use std::borrow::Cow;

use super::{CheckedReserve, IdRule, CUSTOMER_ID, MAX_MONEY, ORDER_ID};

/// The body's fields when `body` is in the canonical spelling and passes every check;
/// `None` otherwise (not a refusal: serde decides then).
pub(super) fn read(body: &[u8]) -> Option<CheckedReserve<'_>> {
    // Checked as UTF-8 once, as a whole, then taken apart as text: three checks of the
    // parts cost more than this one.
    let text = std::str::from_utf8(body).ok()?;
    let mut rest = text.strip_prefix(r#"{"customerId":"#)?;
    let customer_id = if let Some(quoted) = rest.strip_prefix('"') {
        let (id, after) = identifier(quoted, &CUSTOMER_ID)?;
        rest = after;
        id
    } else {
        // A whole number is the customer's id as its decimal digits, which, without a
        // leading zero, are the text as sent.
        let (digits, _, after) = whole_number(rest, u64::MAX)?;
        rest = after;
        digits
    };
    rest = rest.strip_prefix(r#","orderId":""#)?;
    let (order_id, after) = identifier(rest, &ORDER_ID)?;
    rest = after.strip_prefix(r#","orderAmount":"#)?;
    let (_, order_amount, after) = whole_number(rest, MAX_MONEY.unsigned_abs())?;
    if after != "}" || order_amount == 0 {
        return None;
    }
    Some(CheckedReserve {
        customer_id: Cow::Borrowed(customer_id),
        order_id: Cow::Borrowed(order_id),
        order_amount: i64::try_from(order_amount).ok()?,
    })
}

/// An identifier within `rule` up to its closing quote (the opening one already taken),
/// and what follows the quote.
fn identifier<'a>(text: &'a str, rule: &IdRule) -> Option<(&'a str, &'a str)> {
    let (id, after) = text.split_once('"')?;
    rule.check(id).ok()?;
    Some((id, after))
}

/// A whole number of at most `max` written as JSON writes it (digits, no leading zero):
/// its digits, its value and what follows it.
fn whole_number(text: &str, max: u64) -> Option<(&str, u64, &str)> {
    let end = text
        .bytes()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, after) = text.split_at_checked(end)?;
    if digits.is_empty() || (digits.len() > 1 && digits.starts_with('0')) {
        return None;
    }
    // A fraction or an exponent makes it another number: serde's to read.
    if after.starts_with(['.', 'e', 'E']) {
        return None;
    }
    // Digits only, so `parse` reads exactly them (no sign); past u64 it fails.
    let value: u64 = digits.parse().ok()?;
    if value > max {
        return None;
    }
    Some((digits, value, after))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::ReserveBody;

    #[test]
    fn the_canonical_spelling_is_read_here() {
        let body = br#"{"customerId":"c-1","orderId":"o:1.x","orderAmount":250000}"#;
        assert_eq!(
            read(body),
            Some(CheckedReserve {
                customer_id: "c-1".into(),
                order_id: "o:1.x".into(),
                order_amount: 250_000
            })
        );
        let number = br#"{"customerId":18446744073709551615,"orderId":"o","orderAmount":1}"#;
        assert_eq!(
            read(number).map(|r| r.customer_id),
            Some(u64::MAX.to_string().into())
        );
        let zero = br#"{"customerId":0,"orderId":"o","orderAmount":1}"#;
        assert_eq!(read(zero).map(|r| r.customer_id), Some("0".into()));
    }

    #[test]
    fn any_other_spelling_is_left_to_serde() {
        for other in [
            &br#"{ "customerId":"c","orderId":"o","orderAmount":1}"#[..],
            br#"{"orderId":"o","customerId":"c","orderAmount":1}"#,
            br#"{"customerId":"c\u0031","orderId":"o","orderAmount":1}"#,
            br#"{"customerId":"c","orderId":"o","orderAmount":1} "#,
            br#"{"customerId":"c","orderId":"o","orderAmount":01}"#,
            br#"{"customerId":"c","orderId":"o","orderAmount":1.0}"#,
            br#"{"customerId":"c","orderId":"o","orderAmount":1e3}"#,
            br#"{"customerId":01,"orderId":"o","orderAmount":1}"#,
            br#"{"customerId":18446744073709551616,"orderId":"o","orderAmount":1}"#,
            br#"{"customerId":"c","orderId":"o","orderAmount":1000000000000000001}"#,
            br#"{"customerId":"c","orderId":"o","orderAmount":0}"#,
            br#"{"customerId":"","orderId":"o","orderAmount":1}"#,
            br#"{"customerId":"c","orderId":"o 1","orderAmount":1}"#,
        ] {
            assert_eq!(read(other), None, "{}", String::from_utf8_lossy(other));
        }
    }

    /// Every body this reads, serde reads to the same fields: bodies made of the canonical
    /// form's pieces and of what breaks it (escapes, signs, spaces, large numbers, other
    /// characters), from a fixed seed.
    #[test]
    fn a_body_read_here_is_read_by_serde_to_the_same_fields() {
        let ids = [
            "\"c\"",
            "\"c-1.x:y_Z\"",
            "\"\"",
            "\"a b\"",
            "\"c\\u0031\"",
            "\"\\\"\"",
            "\"é\"",
            "0",
            "7",
            "01",
            "-1",
            "1.5",
            "1e2",
            "18446744073709551615",
            "18446744073709551616",
            "null",
            "\"x\"",
            &format!("\"{}\"", "a".repeat(64)),
            &format!("\"{}\"", "a".repeat(65)),
        ];
        let amounts = [
            "1",
            "250000",
            "0",
            "-5",
            "01",
            "1.0",
            "1e3",
            "1000000000000000000",
            "1000000000000000001",
            "9223372036854775808",
            "\"1\"",
        ];
        let ends = ["}", "} ", "}x", "", ",\"x\":1}", " }"];
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut pick = |n: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            usize::try_from(state % n as u64).unwrap_or(0)
        };
        let mut read_here = 0;
        for _ in 0..100_000 {
            let body = format!(
                "{{\"customerId\":{},\"orderId\":{},\"orderAmount\":{}{}",
                ids[pick(ids.len())],
                ids[pick(ids.len())],
                amounts[pick(amounts.len())],
                ends[pick(ends.len())],
            );
            let bytes = body.as_bytes();
            if let Some(here) = read(bytes) {
                read_here += 1;
                let by_serde = serde_json::from_slice::<ReserveBody>(bytes)
                    .ok()
                    .and_then(|b| b.check().ok());
                assert_eq!(Some(here), by_serde, "{body}");
            }
        }
        assert!(read_here > 200, "only {read_here} bodies were canonical");
    }
}
