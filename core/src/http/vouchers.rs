//! `POST /vouchers` (admin) and `GET /vouchers/{code}`.

use axum::extract::State;
use axum::http::header::{CONTENT_TYPE, ETAG};
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::extract::{etag, ApiJson, ApiPath, OrdersReader, VoucherWriter};
use super::{AppState, ErrorBody};
use crate::domain::{Money, NewVoucher, Voucher, VoucherCode, VoucherMode, VoucherStats};
use crate::Result;
use voucher_contract::headers::VOUCHER_STATE;

/// A voucher to create.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateVoucher {
    /// The voucher's code, case-sensitive.
    #[schema(example = "FLASH100")]
    code: String,
    /// Discount in minor units, > 0.
    #[schema(example = 100000, minimum = 1, maximum = 1_000_000_000_000_000_i64)]
    discount_amount: i64,
    /// Smallest order total that may use the voucher, in minor units. Default 0.
    #[serde(default)]
    #[schema(minimum = 0, maximum = 1_000_000_000_000_000_i64)]
    min_order_amount: i64,
    /// Uses the voucher may ever hold at once (reserved + confirmed).
    #[schema(example = 1000, minimum = 1, maximum = 100_000_000)]
    total_limit: i64,
    /// Uses one customer may hold at once, at most totalLimit. Default 1.
    #[serde(default = "one")]
    #[schema(minimum = 1, maximum = 100_000_000)]
    per_user_limit: i64,
    starts_at: DateTime<Utc>,
    ends_at: DateTime<Utc>,
    /// `standard` (default) or `flash`.
    #[serde(default = "standard")]
    #[schema(example = "standard", pattern = "^(standard|flash)$")]
    mode: String,
}

fn one() -> i64 {
    1
}
fn standard() -> String {
    "standard".into()
}

impl CreateVoucher {
    fn parse(self) -> Result<NewVoucher> {
        Ok(NewVoucher::new(
            VoucherCode::parse(self.code)?,
            Money::positive("discountAmount", self.discount_amount)?,
            Money::not_negative("minOrderAmount", self.min_order_amount)?,
            self.total_limit,
            self.per_user_limit,
            self.starts_at,
            self.ends_at,
            VoucherMode::parse(&self.mode)?,
        )?)
    }
}

/// An answer with the voucher's `ETag` header.
pub(super) type WithEtag<T> = ([(HeaderName, String); 1], T);

/// A voucher with its live counts. Its `version` is also the answer's `ETag`, which a
/// change names in `If-Match`.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct VoucherView {
    code: String,
    /// `active`, `paused` or `archived`: what an operator set.
    #[schema(example = "active", pattern = "^(active|paused|archived)$")]
    state: &'static str,
    /// `scheduled`, `live` or `ended`: where the window puts the voucher now.
    #[schema(example = "live", pattern = "^(scheduled|live|ended)$")]
    phase: &'static str,
    /// Grows by one with every change.
    #[schema(example = 1, minimum = 1)]
    version: i64,
    updated_at: DateTime<Utc>,
    discount_amount: i64,
    min_order_amount: i64,
    total_limit: i32,
    per_user_limit: i32,
    starts_at: DateTime<Utc>,
    ends_at: DateTime<Utc>,
    mode: &'static str,
    created_at: DateTime<Utc>,
    /// Uses held: reserved + confirmed.
    used_count: i32,
    /// totalLimit - usedCount.
    remaining: i32,
    reserved: i64,
    confirmed: i64,
    /// Flash vouchers: uses left at the Redis gate (absent when the gate is not loaded).
    #[serde(skip_serializing_if = "Option::is_none")]
    gate_remaining: Option<i64>,
}

impl VoucherView {
    pub(super) fn new(v: Voucher, stats: VoucherStats) -> Self {
        Self {
            remaining: v.total_limit - stats.used_count,
            state: v.state.as_str(),
            phase: v.phase(Utc::now()).as_str(),
            version: v.version,
            updated_at: v.updated_at,
            code: v.code.to_string(),
            discount_amount: v.discount_amount.minor_units(),
            min_order_amount: v.min_order_amount.minor_units(),
            total_limit: v.total_limit,
            per_user_limit: v.per_user_limit,
            starts_at: v.starts_at,
            ends_at: v.ends_at,
            mode: v.mode.as_str(),
            created_at: v.created_at,
            used_count: stats.used_count,
            reserved: stats.reserved,
            confirmed: stats.confirmed,
            gate_remaining: stats.gate_remaining,
        }
    }
}

/// Create a voucher (admin).
#[utoipa::path(
    post, path = "/vouchers", tag = "vouchers",
    request_body = CreateVoucher,
    security(("token" = ["vouchers:write"])),
    responses(
        (status = 201, description = "Created", body = VoucherView,
            headers(("ETag" = String, description = "The voucher's version, for If-Match"))),
        (status = 400, description = "INVALID_REQUEST (with `field`) or MALFORMED_JSON", body = ErrorBody),
        (status = 401, description = "UNAUTHORIZED: no bearer token", body = ErrorBody),
        (status = 403, description = "FORBIDDEN: wrong bearer token", body = ErrorBody),
        (status = 409, description = "VOUCHER_EXISTS", body = ErrorBody),
        (status = 413, description = "PAYLOAD_TOO_LARGE", body = ErrorBody),
        (status = 415, description = "UNSUPPORTED_MEDIA_TYPE", body = ErrorBody),
        (status = 503, description = "SERVICE_UNAVAILABLE, with Retry-After", body = ErrorBody),
    )
)]
#[tracing::instrument(name = "create_voucher", skip_all)]
pub async fn create_voucher(
    State(state): State<AppState>,
    VoucherWriter(actor): VoucherWriter,
    ApiJson(body): ApiJson<CreateVoucher>,
) -> Result<(StatusCode, WithEtag<Json<VoucherView>>)> {
    let voucher = state.service.create(body.parse()?, &actor).await?;
    let stats = VoucherStats {
        used_count: 0,
        reserved: 0,
        confirmed: 0,
        gate_remaining: None,
    };
    Ok((
        StatusCode::CREATED,
        (
            [(ETAG, etag(voucher.version))],
            Json(VoucherView::new(voucher, stats)),
        ),
    ))
}

/// A voucher with its counts.
#[utoipa::path(
    get, path = "/vouchers/{code}", tag = "vouchers",
    params(("code" = String, Path)),
    responses(
        (status = 200, description = "The voucher", body = VoucherView,
            headers(("ETag" = String, description = "The voucher's version, for If-Match"))),
        (status = 400, description = "INVALID_REQUEST: malformed code", body = ErrorBody),
        (status = 404, description = "VOUCHER_NOT_FOUND", body = ErrorBody),
        (status = 503, description = "SERVICE_UNAVAILABLE, with Retry-After", body = ErrorBody),
    )
)]
#[tracing::instrument(name = "get_voucher", skip_all, fields(code = %code))]
pub async fn get_voucher(
    State(state): State<AppState>,
    ApiPath(code): ApiPath<String>,
) -> Result<WithEtag<Json<VoucherView>>> {
    let code = VoucherCode::parse(code)?;
    let (voucher, stats) = state.service.get(&code).await?;
    Ok((
        [(ETAG, etag(voucher.version))],
        Json(VoucherView::new(voucher, stats)),
    ))
}

/// The answer to a gate reload.
#[derive(Debug, Serialize, ToSchema)]
pub struct GateReload {
    #[schema(example = "FLASH100")]
    code: String,
    /// Always `REBUILDING`: the rebuild runs once PostgreSQL holds every published event.
    #[schema(example = "REBUILDING", pattern = "^REBUILDING$")]
    status: &'static str,
}

/// The orderIds with a reservation on a voucher.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct OrderIds {
    #[schema(example = "FLASH100")]
    code: String,
    /// Every orderId with a reservation, whatever its state.
    #[schema(example = json!(["order-1001", "order-1002"]))]
    order_ids: Vec<String>,
}

/// Rebuild a flash voucher's gate from PostgreSQL (admin).
#[utoipa::path(
    post, path = "/vouchers/{code}/gate/reload", tag = "vouchers",
    params(("code" = String, Path)),
    security(("token" = ["vouchers:write"])),
    responses(
        (status = 202, description = "The gate was dropped; it is rebuilt once PostgreSQL holds every \
            published event. Reservations get 503 until then.", body = GateReload),
        (status = 400, description = "INVALID_REQUEST: not a flash voucher", body = ErrorBody),
        (status = 401, description = "UNAUTHORIZED", body = ErrorBody),
        (status = 403, description = "FORBIDDEN", body = ErrorBody),
        (status = 404, description = "VOUCHER_NOT_FOUND", body = ErrorBody),
        (status = 503, description = "SERVICE_UNAVAILABLE, with Retry-After", body = ErrorBody),
    )
)]
#[tracing::instrument(name = "reload_gate", skip_all, fields(code = %code))]
pub async fn reload_gate(
    State(state): State<AppState>,
    VoucherWriter(actor): VoucherWriter,
    ApiPath(code): ApiPath<String>,
) -> Result<(StatusCode, Json<GateReload>)> {
    let code = VoucherCode::parse(code)?;
    state.service.reload_gate(&code, &actor).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(GateReload {
            code: code.to_string(),
            status: "REBUILDING",
        }),
    ))
}

/// The orderIds that have a reservation on this voucher, whatever its state (the admin
/// token or the orders token; the edge forwards retries of these while the voucher is sold
/// out).
#[utoipa::path(
    get, path = "/vouchers/{code}/orders", tag = "vouchers",
    params(("code" = String, Path)),
    security(("token" = ["orders:read"])),
    responses(
        (status = 200, description = "Every orderId with a reservation", body = OrderIds),
        (status = 400, description = "INVALID_REQUEST", body = ErrorBody),
        (status = 401, description = "UNAUTHORIZED", body = ErrorBody),
        (status = 403, description = "FORBIDDEN", body = ErrorBody),
        (status = 404, description = "VOUCHER_NOT_FOUND", body = ErrorBody),
        (status = 503, description = "SERVICE_UNAVAILABLE, with Retry-After", body = ErrorBody),
    )
)]
#[tracing::instrument(name = "order_ids", skip_all, fields(code = %code))]
pub async fn order_ids(
    State(state): State<AppState>,
    _reader: OrdersReader,
    ApiPath(code): ApiPath<String>,
) -> Result<Json<OrderIds>> {
    let code = VoucherCode::parse(code)?;
    let order_ids = state.service.order_ids(&code).await?;
    Ok(Json(OrderIds {
        code: code.to_string(),
        order_ids,
    }))
}

/// Every orderId that has a reservation on this voucher as a Bloom filter (no false
/// negatives, about 1% false positives), with the uses left when it was read: what the
/// edge fetches when a voucher sells out. About 1.2 bytes per order, read from Redis in
/// pieces. The admin token or the orders token.
#[utoipa::path(
    get, path = "/vouchers/{code}/orders/filter", tag = "vouchers",
    params(("code" = String, Path)),
    security(("token" = ["orders:read"])),
    responses(
        (status = 200, description = "The filter (`VGOF` version 1: hashes, uses left, bits, \
            then the bits as little-endian 64-bit words)", content_type = "application/octet-stream",
            body = Vec<u8>,
            headers(("x-voucher-state" = String, description = "The voucher's state as read \
                with the filter (`active`, `paused`, `archived`): whether its answer is \
                OUT_OF_STOCK or VOUCHER_PAUSED (VOUCHER_ARCHIVED)"))),
        (status = 400, description = "INVALID_REQUEST", body = ErrorBody),
        (status = 401, description = "UNAUTHORIZED", body = ErrorBody),
        (status = 403, description = "FORBIDDEN", body = ErrorBody),
        (status = 404, description = "VOUCHER_NOT_FOUND", body = ErrorBody),
        (status = 503, description = "SERVICE_UNAVAILABLE, with Retry-After", body = ErrorBody),
    )
)]
#[tracing::instrument(name = "order_filter", skip_all, fields(code = %code))]
pub async fn order_filter(
    State(state): State<AppState>,
    _reader: OrdersReader,
    ApiPath(code): ApiPath<String>,
) -> Result<Response> {
    let code = VoucherCode::parse(code)?;
    let (filter, voucher_state) = state.service.order_filter(&code).await?;
    Ok((
        [
            (
                CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            ),
            (
                HeaderName::from_static(VOUCHER_STATE),
                HeaderValue::from_static(voucher_state.as_str()),
            ),
        ],
        filter.encode(),
    )
        .into_response())
}
