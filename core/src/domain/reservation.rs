//! Reservations: one use of a voucher held for one order.

use chrono::{DateTime, Utc};

use super::{CustomerId, Money, OrderId, VoucherCode};

/// Where a reservation is in its life. RESERVED and CONFIRMED hold a use; RELEASED gave it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReservationStatus {
    Reserved,
    Confirmed,
    Released,
}

impl ReservationStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reserved => "RESERVED",
            Self::Confirmed => "CONFIRMED",
            Self::Released => "RELEASED",
        }
    }

    /// A status a client names (a filter of the reservation lists).
    pub fn parse(raw: &str) -> Result<Self, super::FieldError> {
        Self::from_db(raw).ok_or_else(|| {
            super::FieldError::new("status", "must be RESERVED, CONFIRMED or RELEASED")
        })
    }

    /// For values read back from our own database (a CHECK constraint limits them).
    pub(crate) fn from_db(raw: &str) -> Option<Self> {
        match raw {
            "RESERVED" => Some(Self::Reserved),
            "CONFIRMED" => Some(Self::Confirmed),
            "RELEASED" => Some(Self::Released),
            _ => None,
        }
    }
}

/// A checked request to reserve one use.
#[derive(Debug, Clone)]
pub struct ReservationRequest {
    pub voucher_code: VoucherCode,
    pub customer_id: CustomerId,
    pub order_id: OrderId,
    pub order_amount: Money,
}

/// A stored reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    pub order_id: OrderId,
    pub voucher_code: VoucherCode,
    pub customer_id: CustomerId,
    pub order_amount: Money,
    pub discount_amount: Money,
    pub status: ReservationStatus,
    pub reserved_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

impl Reservation {
    /// Whether `other` holds the same use as this one: the same order on the same voucher
    /// for the same customer and amount (whatever its status or times).
    pub fn is_same_use(&self, other: &Reservation) -> bool {
        self.order_id == other.order_id
            && self.voucher_code == other.voucher_code
            && self.customer_id == other.customer_id
            && self.order_amount == other.order_amount
    }

    /// Whether `request` is a retry of the request that made this reservation. The same
    /// orderId with another voucher, customer or amount is a conflict, never a second use.
    pub fn is_retry_of(&self, request: &ReservationRequest) -> bool {
        self.order_id == request.order_id
            && self.voucher_code == request.voucher_code
            && self.customer_id == request.customer_id
            && self.order_amount == request.order_amount
    }
}
