//! How a request is read, where the edge and the core must read it the same way: the
//! identifiers of a path or a body, a path segment's percent-decoding, a JSON body's
//! Content-Type, and the body of a reservation.
//!
//! The edge answers for the core only when a core would give the same answer, so it reads
//! a reservation with these very functions before it looks at a sold-out flag: a spelling
//! the core would decode to a voucher meets that voucher's flag, and a body the core would
//! refuse with 400 is never answered 409 here.

use std::borrow::Cow;

mod canonical;

use serde::Deserialize;

/// The rule of one kind of identifier: a short ASCII string of letters, digits, `-`, `_`
/// and the `extra` characters (safe as a Redis key part, a log field and a `VARCHAR`).
#[derive(Debug, Clone, Copy)]
pub struct IdRule {
    /// The field's JSON name, as the client sent it.
    pub field: &'static str,
    pub max_len: usize,
    /// ASCII characters only ([`IdRule::new`] refuses any other at compile time).
    pub extra: &'static [char],
    /// Which ASCII bytes the rule allows, by value: one lookup per byte. Checking each
    /// `char` against the letters, digits and `extra` in turn cost the edge's reject path
    /// about 800 instructions per reservation (two ids), the table under half of that
    /// (`reports/callgrind/EDGE.md`).
    allowed: [bool; 128],
}

impl IdRule {
    pub const fn new(field: &'static str, max_len: usize, extra: &'static [char]) -> Self {
        let mut allowed = [false; 128];
        let mut b = 0;
        while b < 128 {
            let c = b as u8;
            allowed[b] = c.is_ascii_alphanumeric() || c == b'-' || c == b'_';
            b += 1;
        }
        let mut i = 0;
        while i < extra.len() {
            assert!(
                extra[i].is_ascii(),
                "an identifier's extra characters are ASCII"
            );
            allowed[extra[i] as usize] = true;
            i += 1;
        }
        Self {
            field,
            max_len,
            extra,
            allowed,
        }
    }

    /// `Err(reason)` when `raw` breaks the rule.
    pub fn check(&self, raw: &str) -> Result<(), String> {
        if raw.is_empty() {
            return Err("must not be empty".into());
        }
        if raw.len() > self.max_len {
            return Err(format!("must be at most {} characters", self.max_len));
        }
        if !self.allows_all(raw.as_bytes()) {
            let also: String = self.extra.iter().map(|c| format!(" '{c}'")).collect();
            return Err(format!(
                "may contain only ASCII letters, digits, '-', '_'{also}"
            ));
        }
        Ok(())
    }

    /// Whether every byte of `raw` may (a byte of a multi-byte character never may).
    pub fn allows_all(&self, raw: &[u8]) -> bool {
        raw.iter()
            .all(|&b| self.allowed.get(usize::from(b)).copied().unwrap_or(false))
    }

    /// The rule as a regular expression, for the OpenAPI document's `pattern`.
    pub fn pattern(&self) -> String {
        let extra: String = self.extra.iter().collect();
        format!("^[A-Za-z0-9_{extra}-]{{1,{}}}$", self.max_len)
    }

    /// The rule in words, for the OpenAPI document's descriptions.
    pub fn describe(&self) -> String {
        let extra: String = self.extra.iter().map(|c| format!(" {c}")).collect();
        format!("1 to {} of A-Z a-z 0-9 - _{extra}", self.max_len)
    }
}

/// A voucher code such as `FLASH100`: 1 to 32 characters, case-sensitive.
pub const VOUCHER_CODE: IdRule = IdRule::new("code", 32, &[]);
/// The caller's order id, the idempotency key of a reservation: 1 to 64 characters.
pub const ORDER_ID: IdRule = IdRule::new("orderId", 64, &['.', ':']);
/// The caller's customer id: 1 to 64 characters.
pub const CUSTOMER_ID: IdRule = IdRule::new("customerId", 64, &['.', ':']);

/// A client's `x-request-id` that is kept: 1 to 64 characters (a UUID, a trace id, a load
/// balancer's id).
pub const REQUEST_ID: IdRule = IdRule::new("x-request-id", 64, &['.', ':']);

/// Upper bound on any amount of money the API takes (minor units): far above any real
/// order, far below overflow.
pub const MAX_MONEY: i64 = 1_000_000_000_000_000;

/// A path segment as the core's router hands it to a handler: percent-decoded, and `None`
/// when the decoded bytes are not UTF-8 (the core refuses those with 400).
pub fn decode_segment(raw: &str) -> Option<String> {
    // Without a '%' the segment is its own decoding (and text already): the edge asks
    // this of every reservation, nearly always of a code spelled plainly.
    if !raw.contains('%') {
        return Some(raw.to_owned());
    }
    percent_encoding::percent_decode_str(raw)
        .decode_utf8()
        .ok()
        .map(|s| s.into_owned())
}

/// Makes request ids for requests that came without a valid one: 32 hexadecimal digits, a
/// random prefix drawn once per process (the caller's `seed`) then a counter. Unique
/// across processes as the prefixes are, and free to make: drawing 128 random bits per
/// request cost the edge a `getrandom` system call for each one (measured with strace).
pub struct RequestIds {
    prefix: u64,
    next: std::sync::atomic::AtomicU64,
}

impl RequestIds {
    pub fn new(seed: u64) -> Self {
        Self {
            prefix: seed,
            next: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// The next id: the prefix and a counter, 16 lower-case hex digits each, as bytes
    /// (ASCII): the edge makes them a header value, which copies them once. Written a byte
    /// (two digits) at a time from a table: `format!` took about 1,500 instructions an id,
    /// a digit at a time into a `String` about 300, this about 90
    /// (`reports/callgrind/EDGE.md`).
    pub fn next(&self) -> [u8; 32] {
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut id = [0u8; 32];
        let bytes = self.prefix.to_be_bytes().into_iter().chain(n.to_be_bytes());
        for (digits, byte) in id.chunks_exact_mut(2).zip(bytes) {
            digits.copy_from_slice(&HEX_PAIRS[usize::from(byte)]);
        }
        id
    }
}

/// Each byte's two lower-case hexadecimal digits.
static HEX_PAIRS: [[u8; 2]; 256] = {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut pairs = [[0u8; 2]; 256];
    let mut byte = 0;
    while byte < 256 {
        pairs[byte] = [HEX[byte >> 4], HEX[byte & 0xf]];
        byte += 1;
    }
    pairs
};

/// A request's path as the access logs write it: its first 256 characters.
pub fn logged_path(path: &str) -> &str {
    match path.char_indices().nth(256) {
        Some((end, _)) => &path[..end],
        None => path,
    }
}

/// Whether a client's `x-request-id` is kept ([`REQUEST_ID`]). Anything else is replaced by
/// a new id, so that no client can put text of its choice, or a megabyte, into every log
/// line.
pub fn valid_request_id(raw: &[u8]) -> bool {
    (1..=REQUEST_ID.max_len).contains(&raw.len()) && REQUEST_ID.allows_all(raw)
}

/// Whether a Content-Type header names JSON (`application/json`, any parameters), the only
/// body type the API takes. The spelling nearly every client sends is compared first, as
/// it is: the edge asks this of every reservation.
pub fn is_json(content_type: &str) -> bool {
    content_type == "application/json"
        || content_type
            .split(';')
            .next()
            .is_some_and(|mime| mime.trim().eq_ignore_ascii_case("application/json"))
}

/// The body of `POST /vouchers/{code}/reservations`, as a core's handler reads it.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReserveBody {
    /// Text, or a non-negative whole number (clients that keep customer ids as a `long`
    /// send them so) kept as its decimal digits: `42` and `"42"` are the same customer.
    #[serde(deserialize_with = "owned_customer_id")]
    pub customer_id: String,
    pub order_id: String,
    pub order_amount: i64,
}

/// The same body as the edge reads it, its text borrowed from the body where the body
/// holds it as it is (no escape): the edge only looks at it before it answers, so copying
/// it was two allocations on its reject path (`reports/callgrind/EDGE.md`).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ReserveFields<'a> {
    #[serde(borrow, deserialize_with = "customer_id")]
    customer_id: Cow<'a, str>,
    #[serde(borrow)]
    order_id: Cow<'a, str>,
    order_amount: i64,
}

/// A customer id read straight from the JSON token. `#[serde(untagged)]` would take the
/// same two forms, but it first copies the value into serde's buffered `Content` and then
/// tries each form on the copy: on the edge's reject path that was the larger part of
/// reading a reservation's body, and its error ("did not match any variant") named neither
/// form.
fn customer_id<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Cow<'de, str>, D::Error> {
    struct Form;
    impl<'de> serde::de::Visitor<'de> for Form {
        type Value = Cow<'de, str>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("text or a non-negative whole number")
        }
        fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
            Ok(Cow::Borrowed(v))
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
            Ok(Cow::Owned(v.to_owned()))
        }
        fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Self::Value, E> {
            Ok(Cow::Owned(v))
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
            Ok(Cow::Owned(v.to_string()))
        }
    }
    deserializer.deserialize_any(Form)
}

fn owned_customer_id<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<String, D::Error> {
    customer_id(deserializer).map(Cow::into_owned)
}

/// A reservation body that passed every check a core makes before it looks at the
/// voucher, its text borrowed from the body it was read from where it could be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedReserve<'a> {
    pub customer_id: Cow<'a, str>,
    pub order_id: Cow<'a, str>,
    pub order_amount: i64,
}

/// Why a body's field was refused: the field's JSON name and the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldRefusal {
    pub field: &'static str,
    pub reason: String,
}

impl ReserveBody {
    /// The field checks, in the order a core makes them after the JSON is read.
    pub fn check(self) -> Result<CheckedReserve<'static>, FieldRefusal> {
        check_fields(CheckedReserve {
            customer_id: Cow::Owned(self.customer_id),
            order_id: Cow::Owned(self.order_id),
            order_amount: self.order_amount,
        })
    }

    /// Reads a whole body as a core does: a JSON object (serde would also build a struct
    /// from an array of its fields; the API takes objects only), nothing after it, every
    /// field checked. `None` for anything a core answers 400.
    ///
    /// The spelling nearly every client sends is read in one pass ([`canonical`]); any
    /// other goes to serde_json. There, the body is checked as UTF-8 once, then read as
    /// text: read as bytes, serde_json checks each string on its own (five a reservation),
    /// which cost more than one pass over the whole body. Both refuse the same bodies: a
    /// byte that is not UTF-8 is an error inside a string and outside one.
    pub fn read_checked(bytes: &[u8]) -> Option<CheckedReserve<'_>> {
        if let Some(read) = canonical::read(bytes) {
            return Some(read);
        }
        if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return None;
        }
        let text = std::str::from_utf8(bytes).ok()?;
        let fields = serde_json::from_str::<ReserveFields<'_>>(text).ok()?;
        check_fields(CheckedReserve {
            customer_id: fields.customer_id,
            order_id: fields.order_id,
            order_amount: fields.order_amount,
        })
        .ok()
    }
}

/// The checks of a read body's fields, the core's and the edge's alike.
fn check_fields(body: CheckedReserve<'_>) -> Result<CheckedReserve<'_>, FieldRefusal> {
    for (rule, value) in [
        (&CUSTOMER_ID, &body.customer_id),
        (&ORDER_ID, &body.order_id),
    ] {
        rule.check(value).map_err(|reason| FieldRefusal {
            field: rule.field,
            reason,
        })?;
    }
    let amount = |reason: &str| FieldRefusal {
        field: "orderAmount",
        reason: reason.into(),
    };
    if body.order_amount <= 0 {
        return Err(amount("must be greater than 0"));
    }
    if body.order_amount > MAX_MONEY {
        return Err(amount(&format!("must be at most {MAX_MONEY}")));
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_the_prefix_and_a_counter_in_hex() {
        let ids = RequestIds::new(0x0123_4567_89ab_cdef);
        assert_eq!(&ids.next(), b"0123456789abcdef0000000000000000");
        assert_eq!(&ids.next(), b"0123456789abcdef0000000000000001");
        let last = RequestIds::new(u64::MAX);
        last.next
            .store(0xfedc_ba98_7654_3210, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(
            last.next().as_slice(),
            format!("{:016x}{:016x}", u64::MAX, 0xfedc_ba98_7654_3210u64).as_bytes()
        );
        assert!(valid_request_id(&ids.next()));
        // Every byte value, in both halves, as `format!` writes it.
        for byte in 0..=255u64 {
            let ids = RequestIds::new(byte << 8 | byte);
            ids.next
                .store(byte << 56, std::sync::atomic::Ordering::Relaxed);
            assert_eq!(
                ids.next().as_slice(),
                format!("{:016x}{:016x}", byte << 8 | byte, byte << 56).as_bytes()
            );
        }
    }

    #[test]
    fn the_rules_patterns_and_words() {
        assert_eq!(VOUCHER_CODE.pattern(), "^[A-Za-z0-9_-]{1,32}$");
        assert_eq!(ORDER_ID.pattern(), "^[A-Za-z0-9_.:-]{1,64}$");
        assert_eq!(ORDER_ID.describe(), "1 to 64 of A-Z a-z 0-9 - _ . :");
        assert!(valid_request_id(b"a.b:c-d_e"));
        assert!(!valid_request_id(b"a b"));
        assert!(!valid_request_id("é".as_bytes()));
        assert!(!valid_request_id(&[b'a'; 65]));
    }

    #[test]
    fn made_ids_are_valid_and_distinct_and_logged_paths_are_capped() {
        let ids = RequestIds::new(0xfeed);
        let (a, b) = (ids.next(), ids.next());
        assert_eq!(&a, b"000000000000feed0000000000000000");
        assert!(a != b && valid_request_id(&a) && valid_request_id(&b));
        let long = "é".repeat(300);
        assert_eq!(logged_path(&long).chars().count(), 256);
        assert_eq!(logged_path("/vouchers/A"), "/vouchers/A");
    }

    #[test]
    fn request_ids_are_short_and_plain() {
        assert!(valid_request_id(b"3f0c2a9e-5b1d-4c8e-9a51-0d6f1e2b7c44"));
        assert!(valid_request_id(
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        ));
        assert!(!valid_request_id(b""));
        assert!(!valid_request_id(&[b'a'; 65]));
        assert!(!valid_request_id(b"id\n{\"level\":\"ERROR\"}"));
        assert!(!valid_request_id(b"a b"));
    }

    #[test]
    fn identifiers_follow_their_rules() {
        assert!(VOUCHER_CODE.check("FLASH100").is_ok());
        assert!(VOUCHER_CODE.check("").is_err());
        assert!(VOUCHER_CODE.check(&"A".repeat(33)).is_err());
        assert!(VOUCHER_CODE.check("a:b").is_err());
        assert!(ORDER_ID.check("order-2026:11.29_1").is_ok());
        assert!(ORDER_ID.check("naïve").is_err());
        assert!(CUSTOMER_ID.check("{tag}").is_err());
    }

    #[test]
    fn segments_decode_as_the_core_router_decodes_them() {
        assert_eq!(decode_segment("%44EMO").as_deref(), Some("DEMO"));
        assert_eq!(decode_segment("DEMO").as_deref(), Some("DEMO"));
        assert_eq!(decode_segment("%ff").as_deref(), None, "not UTF-8");
        assert_eq!(decode_segment("a%2Fb").as_deref(), Some("a/b"));
    }

    #[test]
    fn a_body_is_read_only_when_a_core_would_take_it() {
        let ok = br#"{"customerId":42,"orderId":"o-1","orderAmount":100}"#;
        assert_eq!(
            ReserveBody::read_checked(ok),
            Some(CheckedReserve {
                customer_id: "42".into(),
                order_id: "o-1".into(),
                order_amount: 100
            })
        );
        // Text, escapes included, is the customer's id as written; the largest whole number
        // is its digits.
        let text = br#"{"customerId":"c\u0031","orderId":"o-1","orderAmount":100}"#;
        assert_eq!(
            ReserveBody::read_checked(text).map(|r| r.customer_id),
            Some(Cow::Owned("c1".into())),
            "an escape is decoded into a copy"
        );
        // Without an escape, the text is the body's own.
        let plain =
            ReserveBody::read_checked(br#"{"customerId":"c1","orderId":"o-1","orderAmount":1}"#);
        assert!(matches!(
            plain.map(|r| (r.customer_id, r.order_id)),
            Some((Cow::Borrowed("c1"), Cow::Borrowed("o-1")))
        ));
        let largest = br#"{"customerId":18446744073709551615,"orderId":"o-1","orderAmount":1}"#;
        assert_eq!(
            ReserveBody::read_checked(largest).map(|r| r.customer_id.into_owned()),
            Some(u64::MAX.to_string())
        );
        for bad in [
            &br#"[42,"o-1",100]"#[..],
            br#"{"customerId":"c","orderId":"o-1","orderAmount":0}"#,
            br#"{"customerId":"c","orderId":"o 1","orderAmount":1}"#,
            br#"{"customerId":"c","orderId":"o-1","orderAmount":1,"x":1}"#,
            br#"{"customerId":"c","orderId":"o-1","orderAmount":1} {}"#,
            br#"{"customerId":-1,"orderId":"o-1","orderAmount":1}"#,
            br#"{"customerId":4.2,"orderId":"o-1","orderAmount":1}"#,
            br#"{"customerId":18446744073709551616,"orderId":"o-1","orderAmount":1}"#,
            br#"{"customerId":null,"orderId":"o-1","orderAmount":1}"#,
            br#"{"customerId":["c"],"orderId":"o-1","orderAmount":1}"#,
            br#"{"customerId":"c","orderId":"o-1"}"#,
            b"\xff",
        ] {
            assert_eq!(ReserveBody::read_checked(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn json_is_recognised_with_parameters_and_any_case() {
        assert!(is_json("application/json"));
        assert!(is_json("Application/JSON; charset=utf-8"));
        assert!(!is_json("text/plain"));
        assert!(!is_json("application/jsonx"));
    }
}
