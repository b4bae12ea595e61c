//! Identifiers that arrive from clients: voucher codes, order ids, customer ids.
//!
//! All three are short ASCII strings with a restricted alphabet, so they are safe to use
//! as Redis key parts, metric-free log fields and PostgreSQL `VARCHAR`s of known width.

use std::fmt;

use super::FieldError;

/// Checks length and alphabet shared by the identifiers below.
fn check_token(
    field: &'static str,
    raw: &str,
    max_len: usize,
    extra: &[char],
) -> Result<(), FieldError> {
    if raw.is_empty() {
        return Err(FieldError::new(field, "must not be empty"));
    }
    if raw.len() > max_len {
        return Err(FieldError::new(
            field,
            format!("must be at most {max_len} characters"),
        ));
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_' || extra.contains(&c);
    if !raw.chars().all(allowed) {
        let also: String = extra.iter().map(|c| format!(" '{c}'")).collect();
        return Err(FieldError::new(
            field,
            format!("may contain only ASCII letters, digits, '-', '_'{also}"),
        ));
    }
    Ok(())
}

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident, field = $field:literal, max = $max:expr, extra = $extra:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            pub const MAX_LEN: usize = $max;

            pub fn parse(raw: impl Into<String>) -> Result<Self, FieldError> {
                let raw = raw.into();
                check_token($field, &raw, Self::MAX_LEN, $extra)?;
                Ok(Self(raw))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

string_id!(
    /// A voucher code such as `FLASH100`: 1 to 32 characters, case-sensitive.
    VoucherCode, field = "code", max = 32, extra = &[]
);
string_id!(
    /// The caller's order id, the idempotency key of a reservation: 1 to 64 characters.
    OrderId, field = "orderId", max = 64, extra = &['.', ':']
);
string_id!(
    /// The caller's customer id: 1 to 64 characters.
    CustomerId, field = "customerId", max = 64, extra = &['.', ':']
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_ordinary_ids() {
        assert!(VoucherCode::parse("FLASH100").is_ok());
        assert!(OrderId::parse("order-2026:11.29_1").is_ok());
        assert!(CustomerId::parse("c-42").is_ok());
    }

    #[test]
    fn refuses_empty_long_and_odd_characters() {
        assert_eq!(
            VoucherCode::parse("").expect_err("must be refused").field,
            "code"
        );
        assert!(VoucherCode::parse("A".repeat(33)).is_err());
        assert!(VoucherCode::parse("A".repeat(32)).is_ok());
        assert!(VoucherCode::parse("with space").is_err());
        assert!(
            VoucherCode::parse("a:b").is_err(),
            "':' is not allowed in codes"
        );
        assert!(OrderId::parse("o".repeat(65)).is_err());
        assert!(OrderId::parse("naïve").is_err());
        assert!(
            CustomerId::parse("{tag}").is_err(),
            "braces would break Redis hash tags"
        );
    }
}
