//! Vouchers: their definition, what makes an order eligible, and their live counts.

use chrono::{DateTime, Utc};

use super::{FieldError, Money, VoucherCode};

/// How reservations for a voucher are decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VoucherMode {
    /// One PostgreSQL transaction per reservation: right for ordinary vouchers.
    Standard,
    /// The Redis gate decides, PostgreSQL is written behind it: for flash sales.
    Flash,
}

impl VoucherMode {
    pub fn parse(raw: &str) -> Result<Self, FieldError> {
        match raw {
            "standard" => Ok(Self::Standard),
            "flash" => Ok(Self::Flash),
            _ => Err(FieldError::new("mode", "must be \"standard\" or \"flash\"")),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Standard => "standard",
            Self::Flash => "flash",
        }
    }
}

/// A voucher as an operator asked for it, every field already checked.
#[derive(Debug, Clone)]
pub struct NewVoucher {
    pub code: VoucherCode,
    pub discount_amount: Money,
    pub min_order_amount: Money,
    pub total_limit: i32,
    pub per_user_limit: i32,
    pub starts_at: DateTime<Utc>,
    pub ends_at: DateTime<Utc>,
    pub mode: VoucherMode,
}

impl NewVoucher {
    /// Largest `totalLimit` accepted: the counters are 32-bit in PostgreSQL.
    pub const MAX_TOTAL_LIMIT: i64 = 100_000_000;
    /// The window's instants must lie in years 1970 to 9999 (Unix seconds): chrono parses
    /// years PostgreSQL refuses (-5000), and gate times are milliseconds since 1970.
    const EARLIEST: i64 = 0;
    const LATEST: i64 = 253_402_300_799;

    /// Checks the fields that depend on each other; single fields are parsed by their types.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        code: VoucherCode,
        discount_amount: Money,
        min_order_amount: Money,
        total_limit: i64,
        per_user_limit: i64,
        starts_at: DateTime<Utc>,
        ends_at: DateTime<Utc>,
        mode: VoucherMode,
    ) -> Result<Self, FieldError> {
        let total_limit = parse_limit("totalLimit", total_limit, Self::MAX_TOTAL_LIMIT)?;
        let per_user_limit = parse_limit("perUserLimit", per_user_limit, i64::from(total_limit))
            .map_err(|e| {
                FieldError::new(e.field, format!("{} (and at most totalLimit)", e.reason))
            })?;
        for (field, at) in [("startsAt", starts_at), ("endsAt", ends_at)] {
            if !(Self::EARLIEST..=Self::LATEST).contains(&at.timestamp()) {
                return Err(FieldError::new(
                    field,
                    "must be between 1970-01-01T00:00:00Z and 9999-12-31T23:59:59Z",
                ));
            }
        }
        if starts_at >= ends_at {
            return Err(FieldError::new("endsAt", "must be after startsAt"));
        }
        Ok(Self {
            code,
            discount_amount,
            min_order_amount,
            total_limit,
            per_user_limit,
            starts_at,
            ends_at,
            mode,
        })
    }
}

fn parse_limit(field: &'static str, raw: i64, max: i64) -> Result<i32, FieldError> {
    if raw < 1 || raw > max {
        return Err(FieldError::new(
            field,
            format!("must be between 1 and {max}"),
        ));
    }
    i32::try_from(raw).map_err(|_| FieldError::new(field, "is too large"))
}

/// A stored voucher definition. None of these fields change after creation, which is why
/// they may be cached; the counts that do change live in [`VoucherStats`].
#[derive(Debug, Clone)]
pub struct Voucher {
    pub code: VoucherCode,
    pub discount_amount: Money,
    pub min_order_amount: Money,
    pub total_limit: i32,
    pub per_user_limit: i32,
    pub starts_at: DateTime<Utc>,
    pub ends_at: DateTime<Utc>,
    pub mode: VoucherMode,
    pub created_at: DateTime<Utc>,
}

/// Why an order may not use a voucher (422 NOT_ELIGIBLE, with this as `reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ineligibility {
    NotStarted,
    Expired,
    BelowMinOrder,
}

impl Ineligibility {
    pub fn code(self) -> &'static str {
        match self {
            Self::NotStarted => "NOT_STARTED",
            Self::Expired => "EXPIRED",
            Self::BelowMinOrder => "BELOW_MIN_ORDER",
        }
    }
}

impl Voucher {
    /// Whether an order of `order_amount` placed at `now` may use this voucher.
    /// The window is half-open: `startsAt <= now < endsAt`.
    pub fn check_eligible(
        &self,
        now: DateTime<Utc>,
        order_amount: Money,
    ) -> Result<(), Ineligibility> {
        if now < self.starts_at {
            return Err(Ineligibility::NotStarted);
        }
        if now >= self.ends_at {
            return Err(Ineligibility::Expired);
        }
        if order_amount < self.min_order_amount {
            return Err(Ineligibility::BelowMinOrder);
        }
        Ok(())
    }

    /// The discount granted to an order: the voucher's amount, never more than the order.
    pub fn discount_for(&self, order_amount: Money) -> Money {
        self.discount_amount.min(order_amount)
    }
}

/// The live counts of a voucher, read from PostgreSQL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VoucherStats {
    /// Uses held (reserved + confirmed).
    pub used_count: i32,
    pub reserved: i64,
    pub confirmed: i64,
    /// Flash vouchers: uses left according to the Redis gate (`None` when not loaded).
    pub gate_remaining: Option<i64>,
}

#[cfg(test)]
mod tests {
    use chrono::Duration;

    use super::*;

    fn voucher(min_order: i64) -> Voucher {
        let now = Utc::now();
        Voucher {
            code: VoucherCode::parse("V1").expect("valid code"),
            discount_amount: Money::from_db(100),
            min_order_amount: Money::from_db(min_order),
            total_limit: 10,
            per_user_limit: 1,
            starts_at: now - Duration::hours(1),
            ends_at: now + Duration::hours(1),
            mode: VoucherMode::Standard,
            created_at: now,
        }
    }

    #[test]
    fn eligibility_follows_window_and_minimum() {
        let v = voucher(500);
        let now = Utc::now();
        let amount = Money::from_db(500);
        assert_eq!(v.check_eligible(now, amount), Ok(()));
        assert_eq!(
            v.check_eligible(now, Money::from_db(499)),
            Err(Ineligibility::BelowMinOrder)
        );
        assert_eq!(
            v.check_eligible(v.starts_at - Duration::seconds(1), amount),
            Err(Ineligibility::NotStarted)
        );
        assert_eq!(
            v.check_eligible(v.ends_at, amount),
            Err(Ineligibility::Expired)
        );
    }

    #[test]
    fn discount_never_exceeds_order() {
        let v = voucher(0);
        assert_eq!(v.discount_for(Money::from_db(40)).minor_units(), 40);
        assert_eq!(v.discount_for(Money::from_db(4000)).minor_units(), 100);
    }

    #[test]
    fn per_user_limit_is_bounded_by_total_limit() {
        let now = Utc::now();
        let make = |total, per_user| {
            NewVoucher::new(
                VoucherCode::parse("V1").expect("valid code"),
                Money::from_db(1),
                Money::from_db(0),
                total,
                per_user,
                now,
                now + Duration::hours(1),
                VoucherMode::Standard,
            )
        };
        assert!(make(10, 10).is_ok());
        assert_eq!(
            make(10, 11).map(|_| ()).expect_err("must be refused").field,
            "perUserLimit"
        );
        assert_eq!(
            make(0, 1).map(|_| ()).expect_err("must be refused").field,
            "totalLimit"
        );
    }
}
