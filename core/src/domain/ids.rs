//! Identifiers that arrive from clients: voucher codes, order ids, customer ids.
//!
//! All three are short ASCII strings with a restricted alphabet, so they are safe to use
//! as Redis key parts, metric-free log fields and PostgreSQL `VARCHAR`s of known width.
//! Their rules live in `voucher_contract::request`, where the edge reads them too.

use std::fmt;

use voucher_contract::request::{self, IdRule};

use super::FieldError;

/// Checks `raw` against `rule`, the one the edge reads requests with too.
fn check_token(rule: &IdRule, raw: &str) -> Result<(), FieldError> {
    rule.check(raw)
        .map_err(|reason| FieldError::new(rule.field, reason))
}

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident, rule = $rule:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            pub const MAX_LEN: usize = $rule.max_len;

            pub fn parse(raw: impl Into<String>) -> Result<Self, FieldError> {
                let raw = raw.into();
                check_token(&$rule, &raw)?;
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
    VoucherCode, rule = request::VOUCHER_CODE
);
string_id!(
    /// The caller's order id, the idempotency key of a reservation: 1 to 64 characters.
    OrderId, rule = request::ORDER_ID
);
string_id!(
    /// The caller's customer id: 1 to 64 characters.
    CustomerId, rule = request::CUSTOMER_ID
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
