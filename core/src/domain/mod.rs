//! Domain types. Untrusted input is parsed into these once, at the edge of the program
//! (the HTTP handlers); everything behind them can rely on a value being valid.

use std::borrow::Cow;

use chrono::{DateTime, TimeZone, Utc};

mod ids;
mod money;
mod reservation;
mod voucher;

pub use ids::{CustomerId, OrderId, VoucherCode};
pub use money::Money;
pub use reservation::{Reservation, ReservationRequest, ReservationStatus};
pub use voucher::{
    ChangeRefused, Ineligibility, Lowering, NewVoucher, Phase, Voucher, VoucherChange, VoucherMode,
    VoucherState, VoucherStats,
};

/// Why one field of a request was refused. Becomes `400 INVALID_REQUEST` with the field name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// The JSON name of the field, as the client sent it (`orderAmount`, `code`).
    pub field: Cow<'static, str>,
    pub reason: String,
}

impl FieldError {
    pub fn new(field: impl Into<Cow<'static, str>>, reason: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// The instant `ms` milliseconds after the epoch, as Redis records and events carry time.
/// Out-of-range values (never written by us) read as the epoch rather than panicking.
pub fn utc_from_millis(ms: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ms).single().unwrap_or_default()
}
