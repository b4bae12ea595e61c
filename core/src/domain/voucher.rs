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

/// What an operator set a voucher to. Where its window puts it ([`Phase`]) is read from the
/// window and the clock, never stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VoucherState {
    /// Takes reservations within its window.
    Active,
    /// The kill switch: refuses new reservations (`VOUCHER_PAUSED`) until resumed; holders'
    /// retries, confirms and releases go on.
    Paused,
    /// For good: refuses reservations (`VOUCHER_ARCHIVED`) and leaves the lists.
    Archived,
}

impl VoucherState {
    pub const ALL: [VoucherState; 3] = [Self::Active, Self::Paused, Self::Archived];

    pub fn parse(raw: &str) -> Result<Self, FieldError> {
        match raw {
            "active" => Ok(Self::Active),
            "paused" => Ok(Self::Paused),
            "archived" => Ok(Self::Archived),
            _ => Err(FieldError::new(
                "state",
                "must be \"active\", \"paused\" or \"archived\"",
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Paused => "paused",
            Self::Archived => "archived",
        }
    }
}

/// Where a voucher's window puts it at an instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Scheduled,
    Live,
    Ended,
}

impl Phase {
    pub fn parse(raw: &str) -> Result<Self, FieldError> {
        match raw {
            "scheduled" => Ok(Self::Scheduled),
            "live" => Ok(Self::Live),
            "ended" => Ok(Self::Ended),
            _ => Err(FieldError::new(
                "phase",
                "must be \"scheduled\", \"live\" or \"ended\"",
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Scheduled => "scheduled",
            Self::Live => "live",
            Self::Ended => "ended",
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
        check_window(starts_at, ends_at)?;
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

/// The window's instants lie in the years PostgreSQL and the gate both take, in order.
fn check_window(starts_at: DateTime<Utc>, ends_at: DateTime<Utc>) -> Result<(), FieldError> {
    for (field, at) in [("startsAt", starts_at), ("endsAt", ends_at)] {
        if !(NewVoucher::EARLIEST..=NewVoucher::LATEST).contains(&at.timestamp()) {
            return Err(FieldError::new(
                field,
                "must be between 1970-01-01T00:00:00Z and 9999-12-31T23:59:59Z",
            ));
        }
    }
    if starts_at >= ends_at {
        return Err(FieldError::new("endsAt", "must be after startsAt"));
    }
    Ok(())
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

/// A stored voucher definition, at one `version`. An operator's change ([`VoucherChange`],
/// a pause, a resume, an archive) makes the next version; the code, mode, per-customer
/// limit and creation time never change. Copies of it (the core's catalog, a flash gate's
/// meta) may lag behind: what takes a use reads the state and the limit from the row
/// itself (`store::batch`).
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
    pub state: VoucherState,
    /// Grows by one with each change: the `ETag`, and what a gate compares.
    pub version: i64,
    pub updated_at: DateTime<Utc>,
}

/// An operator's change of a voucher's definition (`PATCH`); `None` leaves a field alone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VoucherChange {
    pub starts_at: Option<DateTime<Utc>>,
    pub ends_at: Option<DateTime<Utc>>,
    pub total_limit: Option<i64>,
    pub discount_amount: Option<Money>,
    pub min_order_amount: Option<Money>,
}

/// Whether a change may lower the limit. With the broker deciding, a flash gate's 201s
/// rest on the gate alone and its acknowledged uses reach PostgreSQL later: PostgreSQL's
/// count is not what the gate has given, and a limit lowered to it could be below uses
/// already promised. There, the limit only goes up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lowering {
    ToUsesHeld,
    Refused,
}

/// Why a change is refused: the field, and what the voucher allows instead
/// (`409 CHANGE_NOT_ALLOWED`), or a value that is no good whatever the voucher
/// (`400 INVALID_REQUEST`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChangeRefused {
    NotAllowed(FieldError),
    Invalid(FieldError),
}

impl VoucherChange {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// The voucher this change makes of `current`, at `now` with `held` uses held
    /// (PostgreSQL's count, read under the row's lock): the end moves any time, the start
    /// and the terms (discount, minimum) only before the start, the limit goes up at will
    /// and down to no less than the uses held (nor below the per-customer limit). An
    /// archived voucher changes no more.
    pub fn apply(
        &self,
        current: &Voucher,
        now: DateTime<Utc>,
        held: i32,
        lowering: Lowering,
    ) -> Result<Voucher, ChangeRefused> {
        use ChangeRefused::{Invalid, NotAllowed};
        if current.state == VoucherState::Archived {
            return Err(NotAllowed(FieldError::new(
                "state",
                "an archived voucher cannot be changed",
            )));
        }
        let started = now >= current.starts_at;
        let before_start = |field: &'static str| {
            if started {
                Err(NotAllowed(FieldError::new(
                    field,
                    "can only change before the voucher's start",
                )))
            } else {
                Ok(())
            }
        };
        let mut next = current.clone();
        if let Some(starts_at) = self.starts_at {
            before_start("startsAt")?;
            next.starts_at = starts_at;
        }
        if let Some(ends_at) = self.ends_at {
            next.ends_at = ends_at;
        }
        check_window(next.starts_at, next.ends_at).map_err(Invalid)?;
        if let Some(discount) = self.discount_amount {
            before_start("discountAmount")?;
            next.discount_amount = discount;
        }
        if let Some(min_order) = self.min_order_amount {
            before_start("minOrderAmount")?;
            next.min_order_amount = min_order;
        }
        if let Some(limit) = self.total_limit {
            let limit =
                parse_limit("totalLimit", limit, NewVoucher::MAX_TOTAL_LIMIT).map_err(Invalid)?;
            if limit < current.total_limit && lowering == Lowering::Refused {
                return Err(NotAllowed(FieldError::new(
                    "totalLimit",
                    "can only go up on a flash voucher whose sale the broker decides",
                )));
            }
            if limit < held {
                return Err(NotAllowed(FieldError::new(
                    "totalLimit",
                    format!("must be at least the {held} uses held now"),
                )));
            }
            if limit < current.per_user_limit {
                return Err(Invalid(FieldError::new(
                    "totalLimit",
                    format!("must be at least perUserLimit ({})", current.per_user_limit),
                )));
            }
            next.total_limit = limit;
        }
        Ok(next)
    }
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
    /// Where the window puts the voucher at `now`.
    pub fn phase(&self, now: DateTime<Utc>) -> Phase {
        if now < self.starts_at {
            Phase::Scheduled
        } else if now < self.ends_at {
            Phase::Live
        } else {
            Phase::Ended
        }
    }

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
            state: VoucherState::Active,
            version: 1,
            updated_at: now,
        }
    }

    fn refused_field(result: Result<Voucher, ChangeRefused>) -> (bool, String) {
        match result {
            Ok(_) => panic!("the change must be refused"),
            Err(ChangeRefused::NotAllowed(e)) => (true, e.field.into_owned()),
            Err(ChangeRefused::Invalid(e)) => (false, e.field.into_owned()),
        }
    }

    #[test]
    fn a_change_follows_the_lifecycle_rules() {
        let v = voucher(0);
        let now = Utc::now();
        let later = now + Duration::hours(5);
        // The end moves while live; the limit goes up, or down to the uses held.
        let moved = VoucherChange {
            ends_at: Some(later),
            total_limit: Some(4),
            ..VoucherChange::default()
        }
        .apply(&v, now, 4, Lowering::ToUsesHeld)
        .expect("allowed while live");
        assert_eq!((moved.ends_at, moved.total_limit), (later, 4));
        let below = VoucherChange {
            total_limit: Some(3),
            ..VoucherChange::default()
        };
        assert_eq!(
            refused_field(below.apply(&v, now, 4, Lowering::ToUsesHeld)),
            (true, "totalLimit".into())
        );
        // Terms and the start only before the start.
        for change in [
            VoucherChange {
                discount_amount: Some(Money::from_db(5)),
                ..VoucherChange::default()
            },
            VoucherChange {
                min_order_amount: Some(Money::from_db(5)),
                ..VoucherChange::default()
            },
            VoucherChange {
                starts_at: Some(now - Duration::minutes(5)),
                ..VoucherChange::default()
            },
        ] {
            assert!(
                refused_field(change.apply(&v, now, 0, Lowering::ToUsesHeld)).0,
                "{change:?}"
            );
            let early = v.starts_at - Duration::seconds(1);
            assert!(
                change.apply(&v, early, 0, Lowering::ToUsesHeld).is_ok(),
                "{change:?} before the start"
            );
        }
        // A window out of order is invalid whatever the voucher.
        let backwards = VoucherChange {
            ends_at: Some(v.starts_at),
            ..VoucherChange::default()
        };
        assert_eq!(
            refused_field(backwards.apply(&v, now, 0, Lowering::ToUsesHeld)),
            (false, "endsAt".into())
        );
        // Nothing changes an archived voucher.
        let archived = Voucher {
            state: VoucherState::Archived,
            ..v.clone()
        };
        let longer = VoucherChange {
            ends_at: Some(later),
            ..VoucherChange::default()
        };
        assert_eq!(
            refused_field(longer.apply(&archived, now, 0, Lowering::ToUsesHeld)),
            (true, "state".into())
        );
    }

    #[test]
    fn the_phase_follows_the_half_open_window() {
        let v = voucher(0);
        assert_eq!(
            v.phase(v.starts_at - Duration::milliseconds(1)),
            Phase::Scheduled
        );
        assert_eq!(v.phase(v.starts_at), Phase::Live);
        assert_eq!(v.phase(v.ends_at), Phase::Ended);
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
