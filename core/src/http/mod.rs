//! The HTTP API: routes, the OpenAPI document generated from them, health endpoints and
//! the separate metrics router.
//!
//! The router and the OpenAPI document are built from the same `routes!` calls, so the
//! document cannot list a route the service does not serve, or miss one it does.

mod access;
pub mod extract;
mod health;
mod ledger;
mod lifecycle;
pub mod openapi;
pub mod reservations;
mod serve;
mod timestamps;
mod vouchers;

use std::sync::Arc;

use axum::http::header::CONTENT_TYPE;
use axum::response::Response;
use axum::routing::get;
use axum::{middleware, Router};
use serde::Serialize;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::OpenApi as OpenApiDoc;
use utoipa::{Modify, OpenApi, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use std::sync::atomic::AtomicBool;

use crate::metrics::{self, Metrics};
use crate::service::VoucherService;
use crate::Error;
pub use serve::serve;
use voucher_contract::request::RequestIds;

/// What every handler can reach, behind one `Arc`: axum clones the state for every
/// extractor and handler of every request, and a clone of the parts themselves (the
/// service's pool, catalog, channels and metrics, each an `Arc` or a channel end) was two
/// atomic operations per part: the state's clone and the service's drop held 0.53% and
/// 0.81% of a core's samples in `reports/perf/CORE.md`, 0.90% each in a later
/// `RATE=5000 ./loadtest/perf-core.sh` run, and left its top 40 with the `Arc`.
#[derive(Clone)]
pub struct AppState(Arc<State>);

impl AppState {
    pub fn new(state: State) -> Self {
        Self(Arc::new(state))
    }
}

impl std::ops::Deref for AppState {
    type Target = State;

    fn deref(&self) -> &State {
        &self.0
    }
}

/// The parts of [`AppState`].
pub struct State {
    pub service: VoucherService,
    /// The bearer tokens accepted, with their scopes.
    pub credentials: crate::auth::Credentials,
    /// Set on SIGTERM: `readyz` answers 503 from then on, while requests are still served.
    pub draining: Arc<AtomicBool>,
    /// Bounds the reservations this core works on at once (`[admission]`).
    pub admission: voucher_admission::Limiter,
}

/// Every error answer: `{"error": CODE, "message": text}`, plus `field` on
/// INVALID_REQUEST and `reason` on NOT_ELIGIBLE.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    /// Stable code to switch on.
    #[schema(example = "OUT_OF_STOCK")]
    error: String,
    /// Human-readable text; may change.
    message: String,
    /// For INVALID_REQUEST and CHANGE_NOT_ALLOWED: the field at fault.
    #[schema(nullable = false)]
    field: Option<String>,
    /// For NOT_ELIGIBLE: NOT_STARTED, EXPIRED or BELOW_MIN_ORDER.
    #[schema(nullable = false)]
    reason: Option<String>,
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Voucher gate",
        description = "Reserve, confirm and release uses of limited vouchers; never more uses than the limit."
    ),
    components(schemas(ErrorBody)),
    modifiers(&AdminAuth),
    tags(
        (name = "vouchers", description = "Voucher definitions and counts"),
        (name = "ledger", description = "A voucher's reservations for finance: pages by status, one order, the CSV export (vouchers:read and orders:read)"),
        (name = "lifecycle", description = "Listing, changing, pausing, resuming and archiving vouchers, and their audit trail (admin)"),
        (name = "reservations", description = "Uses of a voucher held for orders"),
        (name = "health", description = "Liveness and readiness"),
    )
)]
struct ApiDoc;

struct AdminAuth;

impl Modify for AdminAuth {
    fn modify(&self, openapi: &mut OpenApiDoc) {
        let components = openapi.components.get_or_insert_with(Default::default);
        // One bearer scheme; each call names the scope its token must hold
        // (`vouchers:write`, `vouchers:read`, `orders:read`, `audit:read`; see `auth`).
        components.add_security_scheme(
            "token",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "A named token (`voucher-core tokens create`) or a configured one; \
                         each call lists the scope it needs",
                    ))
                    .build(),
            ),
        );
    }
}

/// Every route of the API, with its document: the one table both are made from.
fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(vouchers::create_voucher, lifecycle::list_vouchers))
        .routes(routes!(vouchers::get_voucher, lifecycle::change_voucher))
        .routes(routes!(lifecycle::pause_voucher))
        .routes(routes!(lifecycle::resume_voucher))
        .routes(routes!(lifecycle::archive_voucher))
        .routes(routes!(lifecycle::voucher_audit))
        .routes(routes!(ledger::reservation_lookup, reservations::release))
        .routes(routes!(ledger::reservation_export))
        .routes(routes!(vouchers::reload_gate))
        .routes(routes!(vouchers::order_ids))
        .routes(routes!(vouchers::order_filter))
        .routes(routes!(reservations::reserve, ledger::reservation_page))
        .routes(routes!(reservations::confirm))
        .routes(routes!(health::healthz))
        .routes(routes!(health::readyz))
}

/// The OpenAPI document the API serves at `/openapi.json`, as JSON: what
/// `voucher-core openapi` prints and the repository's `openapi.json` holds.
pub fn openapi_json() -> serde_json::Value {
    openapi::complete(&routes().split_for_parts().1)
}

/// The public router, and the OpenAPI document that describes it.
pub fn api_router(
    state: AppState,
    metrics: Arc<Metrics>,
    max_body_bytes: usize,
    access_log: bool,
) -> (Router, OpenApiDoc) {
    let (router, doc) = routes().with_state(state).split_for_parts();
    // What the middleware needs, behind one `Arc`: one clone per request.
    let access = Arc::new(access::Access {
        log: access_log,
        ids: RequestIds::new(uuid::Uuid::new_v4().as_u64_pair().0),
        metrics,
        body_limit: extract::BodyLimit(max_body_bytes),
    });
    // Rendered once; each answer shares the bytes. (axum clones the router's handlers for
    // every connection it serves: a handler holding the document as a JSON tree cost each
    // connection a deep copy of it, 660 KB, measured: 1,024 connections took a core from
    // 19 MiB to 705 MiB of resident memory, against 44 MiB on the metrics listener.)
    let served_doc = bytes::Bytes::from(
        serde_json::to_vec(&openapi::complete(&doc)).unwrap_or_else(|_| b"{}".to_vec()),
    );
    let router = router
        .route(
            "/openapi.json",
            get(move || {
                let body = served_doc.clone();
                async move { ([(CONTENT_TYPE, "application/json")], body) }
            }),
        )
        .fallback(|| async { Error::RouteNotFound })
        .method_not_allowed_fallback(|| async { Error::MethodNotAllowed })
        .layer(middleware::from_fn(move |request, next| {
            access::track(access.clone(), request, next)
        }));
    (router, doc)
}

/// The one place a failed request is logged, with the error's whole cause chain (errors
/// carry their cause up to here instead of logging on the way); called by the API's
/// middleware (`access::track`) for every answer. Method and path are fields of the line
/// itself: with a log filter at `warn`, the request's span, which carries them, is off.
fn log_failure(method: &axum::http::Method, path: &str, response: &Response) {
    let Some(error) = response.extensions().get::<Arc<Error>>() else {
        return;
    };
    let status = response.status();
    // Refused at the admission limit: counted (voucher_admission_refused_total), not
    // logged, or an overload would also be a flood of log lines.
    if status.is_server_error() && !matches!(**error, Error::Overloaded) {
        let chain = error.chain();
        if status == axum::http::StatusCode::SERVICE_UNAVAILABLE {
            tracing::warn!(%method, path, code = error.code(), error = %chain, "request failed");
        } else {
            tracing::error!(%method, path, code = error.code(), error = %chain, "request failed");
        }
    }
}

/// The router of the metrics listener.
pub fn metrics_router(scrape: metrics::Scrape) -> Router {
    Router::new()
        .route("/metrics", get(metrics::serve))
        .with_state(scrape)
}
