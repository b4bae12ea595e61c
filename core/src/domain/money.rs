//! Amounts of money in minor units (integers: no floating point near money).

use serde::Serialize;

use super::FieldError;

/// A non-negative amount in minor units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct Money(i64);

impl Money {
    /// Upper bound on any amount we accept: far above any real order, far below overflow.
    pub const MAX: i64 = voucher_contract::request::MAX_MONEY;

    /// An amount that must be greater than zero (a discount, an order total).
    pub fn positive(field: &'static str, raw: i64) -> Result<Self, FieldError> {
        if raw <= 0 {
            return Err(FieldError::new(field, "must be greater than 0"));
        }
        Self::not_negative(field, raw)
    }

    /// An amount that may be zero (a minimum order).
    pub fn not_negative(field: &'static str, raw: i64) -> Result<Self, FieldError> {
        if raw < 0 {
            return Err(FieldError::new(field, "must not be negative"));
        }
        if raw > Self::MAX {
            return Err(FieldError::new(
                field,
                format!("must be at most {}", Self::MAX),
            ));
        }
        Ok(Self(raw))
    }

    /// For values read back from our own database, whose constraints already hold them valid.
    pub(crate) fn from_db(raw: i64) -> Self {
        Self(raw)
    }

    pub fn minor_units(self) -> i64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positive_refuses_zero_and_negative() {
        assert!(Money::positive("discountAmount", 0).is_err());
        assert!(Money::positive("discountAmount", -5).is_err());
        assert_eq!(
            Money::positive("discountAmount", 100).map(Money::minor_units),
            Ok(100)
        );
    }

    #[test]
    fn not_negative_accepts_zero_and_caps_size() {
        assert!(Money::not_negative("minOrderAmount", 0).is_ok());
        assert!(Money::not_negative("minOrderAmount", Money::MAX + 1).is_err());
    }
}
