//! A voucher's reservations for the people who count money (`vouchers:read` and `orders:read`): pages by
//! status, one order, and the CSV export of any size, streamed in constant memory.

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::header::{CONTENT_DISPOSITION, CONTENT_TYPE};
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, SecondsFormat, Utc};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::extract::{ApiPath, ApiQuery, LedgerReader};
use super::{AppState, ErrorBody};
use crate::domain::{FieldError, OrderId, ReservationStatus, VoucherCode};
use crate::store::LedgerRow;
use crate::{Error, Result};

/// Most items one page holds, and how many without `limit`.
const MAX_PAGE: i64 = 1000;
const DEFAULT_PAGE: i64 = 100;

/// Which reservations to list.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PageParams {
    /// RESERVED, CONFIRMED or RELEASED.
    status: String,
    /// Items per page, 1 to 1000 (default 100).
    limit: Option<i64>,
    /// The previous page's `nextCursor`.
    cursor: Option<String>,
}

/// One reservation, with both amounts and every timestamp.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LedgerEntry {
    order_id: String,
    customer_id: String,
    #[schema(example = "CONFIRMED", pattern = "^(RESERVED|CONFIRMED|RELEASED)$")]
    status: String,
    order_amount: i64,
    discount_amount: i64,
    reserved_at: DateTime<Utc>,
    expires_at: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    confirmed_at: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    released_at: Option<DateTime<Utc>>,
}

impl From<LedgerRow> for LedgerEntry {
    fn from(r: LedgerRow) -> Self {
        Self {
            order_id: r.order_id,
            customer_id: r.customer_id,
            status: r.status,
            order_amount: r.order_amount,
            discount_amount: r.discount_amount,
            reserved_at: r.reserved_at,
            expires_at: r.expires_at,
            confirmed_at: r.confirmed_at,
            released_at: r.released_at,
        }
    }
}

/// One page of reservations, in the order they were taken.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReservationPage {
    items: Vec<LedgerEntry>,
    #[serde(skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
}

fn invalid_cursor() -> Error {
    Error::InvalidRequest(FieldError::new("cursor", "is not a cursor of this list"))
}

/// A voucher's reservations in one status, page by page (`vouchers:read` and `orders:read`).
#[utoipa::path(
    get, path = "/vouchers/{code}/reservations", tag = "ledger",
    params(("code" = String, Path), PageParams),
    security(("token" = ["vouchers:read", "orders:read"])),
    responses(
        (status = 200, description = "One page", body = ReservationPage),
        (status = 400, description = "INVALID_REQUEST (with `field`)", body = ErrorBody),
        (status = 401, description = "UNAUTHORIZED", body = ErrorBody),
        (status = 403, description = "FORBIDDEN", body = ErrorBody),
        (status = 404, description = "VOUCHER_NOT_FOUND", body = ErrorBody),
        (status = 503, description = "SERVICE_UNAVAILABLE, with Retry-After", body = ErrorBody),
    )
)]
#[tracing::instrument(name = "reservation_page", skip_all, fields(code = %code))]
pub async fn reservation_page(
    State(state): State<AppState>,
    _reader: LedgerReader,
    ApiPath(code): ApiPath<String>,
    ApiQuery(params): ApiQuery<PageParams>,
) -> Result<Json<ReservationPage>> {
    let code = VoucherCode::parse(code)?;
    let status = ReservationStatus::parse(&params.status)?;
    let limit = match params.limit {
        None => DEFAULT_PAGE,
        Some(n) if (1..=MAX_PAGE).contains(&n) => n,
        Some(_) => {
            return Err(Error::InvalidRequest(FieldError::new(
                "limit",
                format!("must be between 1 and {MAX_PAGE}"),
            )))
        }
    };
    let after = params
        .cursor
        .as_deref()
        .map(|c| {
            c.parse::<i64>()
                .ok()
                .filter(|id| *id >= 0)
                .ok_or_else(invalid_cursor)
        })
        .transpose()?;
    let rows = state
        .service
        .ledger_page(&code, status, after, limit)
        .await?;
    let full = i64::try_from(rows.len()).unwrap_or(i64::MAX) == limit;
    let next_cursor = rows.last().filter(|_| full).map(|r| r.id.to_string());
    Ok(Json(ReservationPage {
        items: rows.into_iter().map(LedgerEntry::from).collect(),
        next_cursor,
    }))
}

/// A voucher's reservation for one order (`vouchers:read` and `orders:read`).
#[utoipa::path(
    get, path = "/vouchers/{code}/reservations/{orderId}", tag = "ledger",
    params(("code" = String, Path), ("orderId" = String, Path)),
    security(("token" = ["vouchers:read", "orders:read"])),
    responses(
        (status = 200, description = "The reservation", body = LedgerEntry),
        (status = 400, description = "INVALID_REQUEST", body = ErrorBody),
        (status = 401, description = "UNAUTHORIZED", body = ErrorBody),
        (status = 403, description = "FORBIDDEN", body = ErrorBody),
        (status = 404, description = "RESERVATION_NOT_FOUND or VOUCHER_NOT_FOUND", body = ErrorBody),
        (status = 503, description = "SERVICE_UNAVAILABLE, with Retry-After", body = ErrorBody),
    )
)]
#[tracing::instrument(name = "reservation_lookup", skip_all, fields(code = %code))]
pub async fn reservation_lookup(
    State(state): State<AppState>,
    _reader: LedgerReader,
    ApiPath((code, order_id)): ApiPath<(String, String)>,
) -> Result<Json<LedgerEntry>> {
    let code = VoucherCode::parse(code)?;
    let order_id = OrderId::parse(order_id)?;
    let row = state.service.ledger_row(&code, &order_id).await?;
    row.map(|r| Json(LedgerEntry::from(r)))
        .ok_or(Error::ReservationNotFound)
}

/// Which reservations to export.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ExportParams {
    /// RESERVED, CONFIRMED or RELEASED; every reservation without it.
    status: Option<String>,
}

/// The columns of the export, in order.
const CSV_HEADER: [&str; 9] = [
    "order_id",
    "customer_id",
    "status",
    "order_amount",
    "discount_amount",
    "reserved_at",
    "expires_at",
    "confirmed_at",
    "released_at",
];

/// One chunk of rows as CSV (amounts in minor units, times in RFC 3339 UTC, empty for a
/// time that is not there).
fn csv_chunk(rows: &[LedgerRow], header: bool) -> std::result::Result<Bytes, csv::Error> {
    let mut out = csv::Writer::from_writer(Vec::with_capacity(rows.len() * 160));
    if header {
        out.write_record(CSV_HEADER)?;
    }
    let at = |t: &DateTime<Utc>| t.to_rfc3339_opts(SecondsFormat::Micros, true);
    let maybe = |t: &Option<DateTime<Utc>>| t.as_ref().map(at).unwrap_or_default();
    for r in rows {
        out.write_record([
            r.order_id.as_str(),
            r.customer_id.as_str(),
            r.status.as_str(),
            &r.order_amount.to_string(),
            &r.discount_amount.to_string(),
            &at(&r.reserved_at),
            &at(&r.expires_at),
            &maybe(&r.confirmed_at),
            &maybe(&r.released_at),
        ])?;
    }
    out.into_inner()
        .map(Bytes::from)
        .map_err(|e| csv::Error::from(e.into_error()))
}

/// Every reservation of a voucher as CSV, streamed (`vouchers:read` and `orders:read`).
///
/// Any size, in constant memory: rows are read from PostgreSQL as the client takes them.
/// A failure after the first bytes ends the answer early (its last line is then
/// incomplete); the rows are in the order they were taken, so an export can be checked
/// against the voucher's counts.
#[utoipa::path(
    get, path = "/vouchers/{code}/export", tag = "ledger",
    params(("code" = String, Path), ExportParams),
    security(("token" = ["vouchers:read", "orders:read"])),
    responses(
        (status = 200, description = "CSV with a header line: order_id, customer_id, status, \
            order_amount, discount_amount, reserved_at, expires_at, confirmed_at, released_at",
            content_type = "text/csv", body = String),
        (status = 400, description = "INVALID_REQUEST", body = ErrorBody),
        (status = 401, description = "UNAUTHORIZED", body = ErrorBody),
        (status = 403, description = "FORBIDDEN", body = ErrorBody),
        (status = 404, description = "VOUCHER_NOT_FOUND", body = ErrorBody),
        (status = 503, description = "SERVICE_UNAVAILABLE, with Retry-After", body = ErrorBody),
    )
)]
#[tracing::instrument(name = "reservation_export", skip_all, fields(code = %code))]
pub async fn reservation_export(
    State(state): State<AppState>,
    _reader: LedgerReader,
    ApiPath(code): ApiPath<String>,
    ApiQuery(params): ApiQuery<ExportParams>,
) -> Result<Response> {
    let code = VoucherCode::parse(code)?;
    let status = params
        .status
        .as_deref()
        .map(ReservationStatus::parse)
        .transpose()?;
    let mut chunks = state.service.ledger_stream(&code, status).await?;
    // The first chunk before the answer starts: a database that cannot be reached is a
    // 503, not a 200 that ends at once.
    let first = match chunks.recv().await {
        Some(chunk) => chunk?,
        None => Vec::new(),
    };
    let head = csv_chunk(&first, true).map_err(Error::internal)?;
    let rest = futures::stream::unfold(chunks, |mut chunks| async move {
        let chunk = chunks.recv().await?;
        let bytes = match chunk {
            Ok(rows) => csv_chunk(&rows, false).map_err(std::io::Error::other),
            Err(e) => {
                tracing::warn!(error = %e.chain(), "export cut short");
                Err(std::io::Error::other(e.to_string()))
            }
        };
        Some((bytes, chunks))
    });
    let body = futures::stream::once(async move { Ok::<_, std::io::Error>(head) }).chain(rest);
    let filename = format!(
        "attachment; filename=\"{}-reservations.csv\"",
        code.as_str()
    );
    Ok((
        [
            (
                CONTENT_TYPE,
                HeaderValue::from_static("text/csv; charset=utf-8"),
            ),
            (
                CONTENT_DISPOSITION,
                HeaderValue::from_str(&filename).map_err(Error::internal)?,
            ),
        ],
        Body::from_stream(body),
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_is_csv_with_empty_cells_for_missing_times() {
        let at = DateTime::parse_from_rfc3339("2026-12-01T10:00:00Z")
            .expect("time")
            .with_timezone(&Utc);
        let row = LedgerRow {
            id: 1,
            order_id: "o,1".into(),
            customer_id: "c\"1".into(),
            status: "CONFIRMED".into(),
            order_amount: 250_000,
            discount_amount: 100_000,
            reserved_at: at,
            expires_at: at,
            confirmed_at: Some(at),
            released_at: None,
        };
        let text = String::from_utf8(csv_chunk(&[row], true).expect("csv").to_vec()).expect("utf8");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], CSV_HEADER.join(","));
        assert_eq!(
            lines[1],
            "\"o,1\",\"c\"\"1\",CONFIRMED,250000,100000,2026-12-01T10:00:00.000000Z,\
             2026-12-01T10:00:00.000000Z,2026-12-01T10:00:00.000000Z,"
        );
    }
}
