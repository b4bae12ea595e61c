//! The admin calls of a voucher's lifecycle: `GET /vouchers` (a filtered list, page by
//! page), `PATCH /vouchers/{code}`, `POST /vouchers/{code}/pause`, `/resume`, `/archive`,
//! and `GET /vouchers/{code}/audit`.
//!
//! A change names the version it read (`If-Match`, the `ETag` of GET): a definition change
//! must (428 without it), a change of state may; a stale one gets 412, never a silent
//! overwrite. Every answer carries the voucher's new `ETag`.

use axum::extract::State;
use axum::http::header::ETAG;
use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::extract::{
    etag, ApiJson, ApiPath, ApiQuery, AuditReader, IfMatch, VoucherReader, VoucherWriter,
};
use super::vouchers::{VoucherView, WithEtag};
use super::{AppState, ErrorBody};
use crate::domain::{
    FieldError, Money, Phase, Voucher, VoucherChange, VoucherCode, VoucherMode, VoucherState,
};
use crate::store::{AuditEvent, StateChange, VoucherFilter};
use crate::{Error, Result};

/// Most items one page holds, and how many without `limit`.
const MAX_PAGE: i64 = 500;
const DEFAULT_PAGE: i64 = 100;

/// Which vouchers to list.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListParams {
    /// `standard` or `flash`.
    mode: Option<String>,
    /// `active`, `paused` or `archived`. Without it, every voucher but the archived ones.
    state: Option<String>,
    /// `scheduled`, `live` or `ended`, by the window and the database's clock.
    phase: Option<String>,
    /// Items per page, 1 to 500 (default 100).
    limit: Option<i64>,
    /// The previous page's `nextCursor`.
    cursor: Option<String>,
}

/// The cursor is the last code of a page, hex-encoded: opaque to clients, and any byte
/// string a client makes of it is still only a code to start after.
fn encode_cursor(code: &str) -> String {
    code.bytes().map(|b| format!("{b:02x}")).collect()
}

fn decode_cursor(cursor: &str) -> Result<String> {
    let invalid =
        || Error::InvalidRequest(FieldError::new("cursor", "is not a cursor of this list"));
    if cursor.len() % 2 != 0 || cursor.len() > 2 * 64 {
        return Err(invalid());
    }
    let bytes = (0..cursor.len())
        .step_by(2)
        .map(|i| {
            cursor
                .get(i..i + 2)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        })
        .collect::<Option<Vec<u8>>>()
        .ok_or_else(invalid)?;
    String::from_utf8(bytes).map_err(|_| invalid())
}

fn page_size(limit: Option<i64>) -> Result<i64> {
    match limit {
        None => Ok(DEFAULT_PAGE),
        Some(n) if (1..=MAX_PAGE).contains(&n) => Ok(n),
        Some(_) => Err(Error::InvalidRequest(FieldError::new(
            "limit",
            format!("must be between 1 and {MAX_PAGE}"),
        ))),
    }
}

impl ListParams {
    fn parse(self) -> Result<VoucherFilter> {
        Ok(VoucherFilter {
            mode: self.mode.as_deref().map(VoucherMode::parse).transpose()?,
            state: self.state.as_deref().map(VoucherState::parse).transpose()?,
            phase: self.phase.as_deref().map(Phase::parse).transpose()?,
            after: self.cursor.as_deref().map(decode_cursor).transpose()?,
            limit: page_size(self.limit)?,
        })
    }
}

/// A voucher in a list: its definition and the uses it holds.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct VoucherSummary {
    code: String,
    #[schema(example = "flash", pattern = "^(standard|flash)$")]
    mode: &'static str,
    #[schema(example = "active", pattern = "^(active|paused|archived)$")]
    state: &'static str,
    #[schema(example = "live", pattern = "^(scheduled|live|ended)$")]
    phase: &'static str,
    version: i64,
    discount_amount: i64,
    min_order_amount: i64,
    total_limit: i32,
    per_user_limit: i32,
    /// Uses held: reserved + confirmed.
    used_count: i32,
    starts_at: DateTime<Utc>,
    ends_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

impl VoucherSummary {
    fn new(v: Voucher, used_count: i32, now: DateTime<Utc>) -> Self {
        Self {
            code: v.code.to_string(),
            mode: v.mode.as_str(),
            state: v.state.as_str(),
            phase: v.phase(now).as_str(),
            version: v.version,
            discount_amount: v.discount_amount.minor_units(),
            min_order_amount: v.min_order_amount.minor_units(),
            total_limit: v.total_limit,
            per_user_limit: v.per_user_limit,
            used_count,
            starts_at: v.starts_at,
            ends_at: v.ends_at,
            updated_at: v.updated_at,
        }
    }
}

/// One page of vouchers.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct VoucherPage {
    items: Vec<VoucherSummary>,
    /// Where the next page starts; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
}

/// The vouchers, in code order, filtered by mode, state and phase (`vouchers:read`).
#[utoipa::path(
    get, path = "/vouchers", tag = "lifecycle",
    params(ListParams),
    security(("token" = ["vouchers:read"])),
    responses(
        (status = 200, description = "One page", body = VoucherPage),
        (status = 400, description = "INVALID_REQUEST (with `field`)", body = ErrorBody),
        (status = 401, description = "UNAUTHORIZED", body = ErrorBody),
        (status = 403, description = "FORBIDDEN", body = ErrorBody),
        (status = 503, description = "SERVICE_UNAVAILABLE, with Retry-After", body = ErrorBody),
    )
)]
#[tracing::instrument(name = "list_vouchers", skip_all)]
pub async fn list_vouchers(
    State(state): State<AppState>,
    _reader: VoucherReader,
    ApiQuery(params): ApiQuery<ListParams>,
) -> Result<Json<VoucherPage>> {
    let filter = params.parse()?;
    let vouchers = state.service.list(&filter).await?;
    let full = i64::try_from(vouchers.len()).unwrap_or(i64::MAX) == filter.limit;
    let next_cursor = vouchers
        .last()
        .filter(|_| full)
        .map(|(v, _)| encode_cursor(v.code.as_str()));
    let now = Utc::now();
    Ok(Json(VoucherPage {
        items: vouchers
            .into_iter()
            .map(|(v, used)| VoucherSummary::new(v, used, now))
            .collect(),
        next_cursor,
    }))
}

/// A change of a voucher's definition; a field left out stays as it is.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ChangeVoucher {
    /// Only before the start.
    starts_at: Option<DateTime<Utc>>,
    /// Any time (earlier ends the sale sooner).
    ends_at: Option<DateTime<Utc>>,
    /// Up at will; down to no less than the uses held.
    #[schema(minimum = 1, maximum = 100_000_000)]
    total_limit: Option<i64>,
    /// Only before the start.
    #[schema(minimum = 1, maximum = 1_000_000_000_000_000_i64)]
    discount_amount: Option<i64>,
    /// Only before the start.
    #[schema(minimum = 0, maximum = 1_000_000_000_000_000_i64)]
    min_order_amount: Option<i64>,
}

impl ChangeVoucher {
    fn parse(self) -> Result<VoucherChange> {
        Ok(VoucherChange {
            starts_at: self.starts_at,
            ends_at: self.ends_at,
            total_limit: self.total_limit,
            discount_amount: self
                .discount_amount
                .map(|d| Money::positive("discountAmount", d))
                .transpose()?,
            min_order_amount: self
                .min_order_amount
                .map(|m| Money::not_negative("minOrderAmount", m))
                .transpose()?,
        })
    }
}

type Changed = WithEtag<Json<VoucherView>>;

/// The answer to a change: the voucher as it is now, with its new `ETag`.
/// Read afterwards, so the counts are real; a read that fails is the 503 the call
/// documents (the change may be committed: read the voucher again).
async fn answer(state: &AppState, voucher: Voucher) -> Result<Changed> {
    let (voucher, stats) = state.service.get(&voucher.code).await?;
    Ok((
        [(ETAG, etag(voucher.version))],
        Json(VoucherView::new(voucher, stats)),
    ))
}

/// Change a voucher's window, limit or terms (`vouchers:write`), naming the version read.
///
/// In flash mode the gate takes the change in one step while requests arrive, and every
/// edge drops its sold-out flag when the limit goes up.
#[utoipa::path(
    patch, path = "/vouchers/{code}", tag = "lifecycle",
    params(("code" = String, Path), ("If-Match" = String, Header, description = "The ETag read")),
    request_body = ChangeVoucher,
    security(("token" = ["vouchers:write"])),
    responses(
        (status = 200, description = "Changed (or nothing to change)", body = VoucherView,
            headers(("ETag" = String, description = "The voucher's new version"))),
        (status = 400, description = "INVALID_REQUEST (with `field`) or MALFORMED_JSON", body = ErrorBody),
        (status = 401, description = "UNAUTHORIZED", body = ErrorBody),
        (status = 403, description = "FORBIDDEN", body = ErrorBody),
        (status = 404, description = "VOUCHER_NOT_FOUND", body = ErrorBody),
        (status = 409, description = "CHANGE_NOT_ALLOWED (with `field`): the limit below the \
            uses held, the start or terms after the start, an archived voucher", body = ErrorBody),
        (status = 412, description = "PRECONDITION_FAILED: the voucher changed since", body = ErrorBody),
        (status = 415, description = "UNSUPPORTED_MEDIA_TYPE", body = ErrorBody),
        (status = 428, description = "PRECONDITION_REQUIRED: no If-Match", body = ErrorBody),
        (status = 503, description = "SERVICE_UNAVAILABLE, with Retry-After: the change may \
            be committed (read the voucher again); its gate takes it within the \
            reconciliation interval", body = ErrorBody),
    )
)]
#[tracing::instrument(name = "change_voucher", skip_all, fields(code = %code))]
pub async fn change_voucher(
    State(state): State<AppState>,
    VoucherWriter(actor): VoucherWriter,
    ApiPath(code): ApiPath<String>,
    IfMatch(expected): IfMatch,
    ApiJson(body): ApiJson<ChangeVoucher>,
) -> Result<Changed> {
    let code = VoucherCode::parse(code)?;
    let expected = expected.ok_or(Error::PreconditionRequired)?;
    let change = body.parse()?;
    let voucher = state
        .service
        .change(&code, expected, &change, &actor)
        .await?;
    answer(&state, voucher).await
}

async fn change_state(
    state: AppState,
    actor: crate::store::Actor,
    code: String,
    expected: Option<i64>,
    change: StateChange,
) -> Result<Changed> {
    let code = VoucherCode::parse(code)?;
    let voucher = state
        .service
        .change_state(&code, change, expected, &actor)
        .await?;
    answer(&state, voucher).await
}

/// Pause a voucher (`vouchers:write`): the kill switch.
///
/// Once answered, no new use is taken: every core refuses new reservations with 409
/// VOUCHER_PAUSED (PostgreSQL refuses the uses of every later commit, and a flash gate
/// has the pause before this answer), and edges answer it themselves once they have the
/// voucher's order filter. Holders' retries, confirms and releases go on. Pausing a paused
/// voucher changes nothing.
#[utoipa::path(
    post, path = "/vouchers/{code}/pause", tag = "lifecycle",
    params(("code" = String, Path), ("If-Match" = Option<String>, Header, description = "The ETag read (optional)")),
    security(("token" = ["vouchers:write"])),
    responses(
        (status = 200, description = "Paused", body = VoucherView,
            headers(("ETag" = String, description = "The voucher's new version"))),
        (status = 400, description = "INVALID_REQUEST", body = ErrorBody),
        (status = 401, description = "UNAUTHORIZED", body = ErrorBody),
        (status = 403, description = "FORBIDDEN", body = ErrorBody),
        (status = 404, description = "VOUCHER_NOT_FOUND", body = ErrorBody),
        (status = 409, description = "CHANGE_NOT_ALLOWED: archived", body = ErrorBody),
        (status = 412, description = "PRECONDITION_FAILED", body = ErrorBody),
        (status = 503, description = "SERVICE_UNAVAILABLE, with Retry-After: retry (the \
            pause may be committed, and a retry hands it to the gate)", body = ErrorBody),
    )
)]
#[tracing::instrument(name = "pause_voucher", skip_all, fields(code = %code))]
pub async fn pause_voucher(
    State(state): State<AppState>,
    VoucherWriter(actor): VoucherWriter,
    ApiPath(code): ApiPath<String>,
    IfMatch(expected): IfMatch,
) -> Result<Changed> {
    change_state(state, actor, code, expected, StateChange::Pause).await
}

/// Resume a paused voucher (`vouchers:write`). Edges drop their flags for it.
#[utoipa::path(
    post, path = "/vouchers/{code}/resume", tag = "lifecycle",
    params(("code" = String, Path), ("If-Match" = Option<String>, Header, description = "The ETag read (optional)")),
    security(("token" = ["vouchers:write"])),
    responses(
        (status = 200, description = "Active", body = VoucherView,
            headers(("ETag" = String, description = "The voucher's new version"))),
        (status = 400, description = "INVALID_REQUEST", body = ErrorBody),
        (status = 401, description = "UNAUTHORIZED", body = ErrorBody),
        (status = 403, description = "FORBIDDEN", body = ErrorBody),
        (status = 404, description = "VOUCHER_NOT_FOUND", body = ErrorBody),
        (status = 409, description = "CHANGE_NOT_ALLOWED: archived", body = ErrorBody),
        (status = 412, description = "PRECONDITION_FAILED", body = ErrorBody),
        (status = 503, description = "SERVICE_UNAVAILABLE, with Retry-After", body = ErrorBody),
    )
)]
#[tracing::instrument(name = "resume_voucher", skip_all, fields(code = %code))]
pub async fn resume_voucher(
    State(state): State<AppState>,
    VoucherWriter(actor): VoucherWriter,
    ApiPath(code): ApiPath<String>,
    IfMatch(expected): IfMatch,
) -> Result<Changed> {
    change_state(state, actor, code, expected, StateChange::Resume).await
}

/// Archive a voucher with no active reservation (`vouchers:write`): it leaves the lists and refuses
/// reservations (409 VOUCHER_ARCHIVED) for good; its confirmed uses stay readable.
#[utoipa::path(
    post, path = "/vouchers/{code}/archive", tag = "lifecycle",
    params(("code" = String, Path), ("If-Match" = Option<String>, Header, description = "The ETag read (optional)")),
    security(("token" = ["vouchers:write"])),
    responses(
        (status = 200, description = "Archived", body = VoucherView,
            headers(("ETag" = String, description = "The voucher's new version"))),
        (status = 400, description = "INVALID_REQUEST", body = ErrorBody),
        (status = 401, description = "UNAUTHORIZED", body = ErrorBody),
        (status = 403, description = "FORBIDDEN", body = ErrorBody),
        (status = 404, description = "VOUCHER_NOT_FOUND", body = ErrorBody),
        (status = 409, description = "CHANGE_NOT_ALLOWED: active reservations", body = ErrorBody),
        (status = 412, description = "PRECONDITION_FAILED", body = ErrorBody),
        (status = 503, description = "SERVICE_UNAVAILABLE, with Retry-After", body = ErrorBody),
    )
)]
#[tracing::instrument(name = "archive_voucher", skip_all, fields(code = %code))]
pub async fn archive_voucher(
    State(state): State<AppState>,
    VoucherWriter(actor): VoucherWriter,
    ApiPath(code): ApiPath<String>,
    IfMatch(expected): IfMatch,
) -> Result<Changed> {
    change_state(state, actor, code, expected, StateChange::Archive).await
}

/// Which audit events to read.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AuditParams {
    /// Items per page, 1 to 500 (default 100).
    limit: Option<i64>,
    /// The previous page's `nextCursor`.
    cursor: Option<String>,
}

/// One admin change.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuditEntry {
    id: i64,
    at: DateTime<Utc>,
    /// The name of the credential that made it.
    actor: String,
    /// `create`, `change`, `pause`, `resume`, `archive` or `reload_gate`.
    action: String,
    code: String,
    /// The voucher before (absent for `create`).
    #[schema(value_type = Option<Object>)]
    before: Option<serde_json::Value>,
    #[schema(value_type = Option<Object>)]
    after: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    request_id: Option<String>,
}

impl AuditEntry {
    fn new(e: AuditEvent) -> Self {
        let json = |text: Option<String>| text.and_then(|t| serde_json::from_str(&t).ok());
        Self {
            id: e.id,
            at: e.at,
            actor: e.actor,
            action: e.action,
            code: e.voucher_code,
            before: json(e.before),
            after: json(e.after),
            request_id: e.request_id,
        }
    }
}

/// One page of audit entries.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuditPage {
    items: Vec<AuditEntry>,
    #[serde(skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
}

/// Every admin change of a voucher, oldest first (`audit:read`).
#[utoipa::path(
    get, path = "/vouchers/{code}/audit", tag = "lifecycle",
    params(("code" = String, Path), AuditParams),
    security(("token" = ["audit:read"])),
    responses(
        (status = 200, description = "One page", body = AuditPage),
        (status = 400, description = "INVALID_REQUEST", body = ErrorBody),
        (status = 401, description = "UNAUTHORIZED", body = ErrorBody),
        (status = 403, description = "FORBIDDEN", body = ErrorBody),
        (status = 404, description = "VOUCHER_NOT_FOUND", body = ErrorBody),
        (status = 503, description = "SERVICE_UNAVAILABLE, with Retry-After", body = ErrorBody),
    )
)]
#[tracing::instrument(name = "voucher_audit", skip_all, fields(code = %code))]
pub async fn voucher_audit(
    State(state): State<AppState>,
    _reader: AuditReader,
    ApiPath(code): ApiPath<String>,
    ApiQuery(params): ApiQuery<AuditParams>,
) -> Result<Json<AuditPage>> {
    let code = VoucherCode::parse(code)?;
    let limit = page_size(params.limit)?;
    let after = params
        .cursor
        .as_deref()
        .map(|c| {
            c.parse::<i64>().ok().filter(|id| *id >= 0).ok_or_else(|| {
                Error::InvalidRequest(FieldError::new("cursor", "is not a cursor of this list"))
            })
        })
        .transpose()?;
    let events = state.service.audit(&code, after, limit).await?;
    let full = i64::try_from(events.len()).unwrap_or(i64::MAX) == limit;
    let next_cursor = events.last().filter(|_| full).map(|e| e.id.to_string());
    Ok(Json(AuditPage {
        items: events.into_iter().map(AuditEntry::new).collect(),
        next_cursor,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_round_trips_and_refuses_what_it_did_not_make() {
        let cursor = encode_cursor("FLASH-100_x");
        assert_eq!(decode_cursor(&cursor).ok().as_deref(), Some("FLASH-100_x"));
        for bad in ["abc", "zz", "ff", &"00".repeat(65)] {
            assert!(decode_cursor(bad).is_err(), "{bad}");
        }
    }
}
