//! Liveness and readiness, for load balancers and orchestrators.

use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

use super::{AppState, ErrorBody};
use crate::Result;

/// The process is up and serving.
#[utoipa::path(get, path = "/healthz", tag = "health",
    responses((status = 200, description = "Alive")))]
pub async fn healthz() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

/// The service can serve reservations: its database (and Redis, with flash mode) answers.
#[utoipa::path(get, path = "/readyz", tag = "health",
    responses(
        (status = 200, description = "Ready"),
        (status = 503, description = "SERVICE_UNAVAILABLE: a dependency is down", body = ErrorBody),
    ))]
pub async fn readyz(State(state): State<AppState>) -> Result<Json<Value>> {
    state.service.store().ping().await?;
    if let Some(flash) = state.service.flash() {
        flash.gate().ping().await?;
    }
    Ok(Json(json!({ "status": "ready" })))
}
