//! Reserve, confirm and release one use of a voucher.

use axum::extract::State;
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;
use voucher_contract::headers;
use voucher_contract::request::ReserveBody;

use super::extract::{ApiJson, ApiPath};
use super::{timestamps, AppState, ErrorBody};
use crate::domain::{
    CustomerId, FieldError, Money, OrderId, Reservation, ReservationRequest, VoucherCode,
};
use crate::store::ReserveOutcome;
use crate::Result;

/// Set on a 201 that answers a retry: nothing was consumed.
const REPLAYED_HEADER: HeaderName = HeaderName::from_static(headers::IDEMPOTENT_REPLAYED);

/// A request to hold one use of the voucher for an order: the document's picture of
/// `voucher_contract::request::ReserveBody`, which is what the handler reads (the edge
/// reads it too). The API tests send every field of this schema.
#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
#[allow(dead_code)]
pub struct Reserve {
    /// A string, or a whole number (as clients that keep customer ids as `long` send it):
    /// `42` and `"42"` are the same customer.
    #[schema(value_type = String, example = "customer-42")]
    customer_id: String,
    /// Made by the caller; the idempotency key: a retry with the same orderId and body
    /// gets the same answer and consumes nothing.
    #[schema(example = "order-2026-0001")]
    order_id: String,
    /// Order total in minor units, > 0.
    #[schema(example = 250000, minimum = 1, maximum = 1_000_000_000_000_000_i64)]
    order_amount: i64,
}

/// The checked request: the contract's field checks, then the domain's types.
fn parse_reserve(body: ReserveBody, code: String) -> Result<ReservationRequest> {
    let voucher_code = VoucherCode::parse(code)?;
    let body = body
        .check()
        .map_err(|r| FieldError::new(r.field, r.reason))?;
    Ok(ReservationRequest {
        voucher_code,
        customer_id: CustomerId::parse(body.customer_id.into_owned())?,
        order_id: OrderId::parse(body.order_id.into_owned())?,
        order_amount: Money::positive("orderAmount", body.order_amount)?,
    })
}

/// A reservation as the API shows it.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReservationView {
    order_id: String,
    voucher_code: String,
    customer_id: String,
    order_amount: i64,
    /// The discount granted: the voucher's amount, never more than the order.
    discount_amount: i64,
    /// RESERVED, CONFIRMED or RELEASED.
    #[schema(example = "RESERVED")]
    status: &'static str,
    #[serde(serialize_with = "timestamps::rfc3339")]
    reserved_at: DateTime<Utc>,
    /// When an unconfirmed reservation is released by the expiry job.
    #[serde(serialize_with = "timestamps::rfc3339")]
    expires_at: DateTime<Utc>,
}

impl From<&Reservation> for ReservationView {
    fn from(r: &Reservation) -> Self {
        Self {
            order_id: r.order_id.to_string(),
            voucher_code: r.voucher_code.to_string(),
            customer_id: r.customer_id.to_string(),
            order_amount: r.order_amount.minor_units(),
            discount_amount: r.discount_amount.minor_units(),
            status: r.status.as_str(),
            reserved_at: r.reserved_at,
            expires_at: r.expires_at,
        }
    }
}

/// Reserve one use of a voucher for an order.
#[utoipa::path(
    post, path = "/vouchers/{code}/reservations", tag = "reservations",
    params(("code" = String, Path)),
    request_body = Reserve,
    responses(
        (status = 201, description = "Reserved; also the answer to a retry of the same request \
            (header Idempotent-Replayed: true), whose status is the reservation's current one",
            body = ReservationView),
        (status = 400, description = "INVALID_REQUEST (with `field`) or MALFORMED_JSON", body = ErrorBody),
        (status = 404, description = "VOUCHER_NOT_FOUND", body = ErrorBody),
        (status = 409, description = "OUT_OF_STOCK, ALREADY_USED (customer at its per-user limit) \
            or ORDER_ID_CONFLICT (the orderId belongs to another request)", body = ErrorBody),
        (status = 413, description = "PAYLOAD_TOO_LARGE", body = ErrorBody),
        (status = 415, description = "UNSUPPORTED_MEDIA_TYPE", body = ErrorBody),
        (status = 422, description = "NOT_ELIGIBLE with `reason`: NOT_STARTED, EXPIRED, BELOW_MIN_ORDER", body = ErrorBody),
        (status = 503, description = "SERVICE_UNAVAILABLE or OVERLOADED (the core is at its \
            admission limit and did nothing for the request), with Retry-After", body = ErrorBody),
    )
)]
#[tracing::instrument(name = "reserve", skip_all, fields(code = %code))]
pub async fn reserve(
    State(state): State<AppState>,
    ApiPath(code): ApiPath<String>,
    ApiJson(body): ApiJson<ReserveBody>,
) -> Result<Response> {
    let request = parse_reserve(body, code)?;
    // After the checks of the request (a bad one is answered 4xx whatever the load), before
    // anything touches the gate or the database: a refused request took nothing. Over the
    // limit it waits up to `admission.queue_timeout` for a place.
    let permit = state
        .admission
        .acquire()
        .await
        .ok_or(crate::Error::Overloaded)?;
    let outcome = state.service.reserve(&request).await;
    permit.complete();
    let outcome = outcome?;
    let view = Json(ReservationView::from(outcome.reservation()));
    let mut response = (StatusCode::CREATED, view).into_response();
    if matches!(outcome, ReserveOutcome::Retried(_)) {
        response
            .headers_mut()
            .insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
    }
    Ok(response)
}

/// Confirm a reservation (payment succeeded). Idempotent.
#[utoipa::path(
    post, path = "/vouchers/{code}/reservations/{orderId}/confirm", tag = "reservations",
    params(
        ("code" = String, Path),
        ("orderId" = String, Path),
    ),
    responses(
        (status = 200, description = "CONFIRMED (also when it already was)", body = ReservationView),
        (status = 400, description = "INVALID_REQUEST", body = ErrorBody),
        (status = 404, description = "RESERVATION_NOT_FOUND", body = ErrorBody),
        (status = 409, description = "ALREADY_RELEASED", body = ErrorBody),
        (status = 503, description = "SERVICE_UNAVAILABLE, with Retry-After", body = ErrorBody),
    )
)]
#[tracing::instrument(name = "confirm", skip_all, fields(code = %code, order_id = %order_id))]
pub async fn confirm(
    State(state): State<AppState>,
    ApiPath((code, order_id)): ApiPath<(String, String)>,
) -> Result<Json<ReservationView>> {
    settle(&state, code, order_id, Settle::Confirm).await
}

/// Release a reservation (order cancelled) and give its use back. Idempotent.
#[utoipa::path(
    delete, path = "/vouchers/{code}/reservations/{orderId}", tag = "reservations",
    params(
        ("code" = String, Path),
        ("orderId" = String, Path),
    ),
    responses(
        (status = 200, description = "RELEASED (also when it already was)", body = ReservationView),
        (status = 400, description = "INVALID_REQUEST", body = ErrorBody),
        (status = 404, description = "RESERVATION_NOT_FOUND", body = ErrorBody),
        (status = 409, description = "ALREADY_CONFIRMED", body = ErrorBody),
        (status = 503, description = "SERVICE_UNAVAILABLE, with Retry-After", body = ErrorBody),
    )
)]
#[tracing::instrument(name = "release", skip_all, fields(code = %code, order_id = %order_id))]
pub async fn release(
    State(state): State<AppState>,
    ApiPath((code, order_id)): ApiPath<(String, String)>,
) -> Result<Json<ReservationView>> {
    settle(&state, code, order_id, Settle::Release).await
}

/// What happens to a held use once the order is decided.
#[derive(Debug, Clone, Copy)]
enum Settle {
    Confirm,
    Release,
}

/// Confirm and release have one shape: the path's ids parsed, the use case run on the
/// order's row, the reservation as it now stands answered.
async fn settle(
    state: &AppState,
    code: String,
    order_id: String,
    how: Settle,
) -> Result<Json<ReservationView>> {
    let (code, order_id) = (VoucherCode::parse(code)?, OrderId::parse(order_id)?);
    let reservation = match how {
        Settle::Confirm => state.service.confirm(&code, &order_id).await?,
        Settle::Release => state.service.release(&code, &order_id).await?,
    };
    Ok(Json(ReservationView::from(&reservation)))
}
