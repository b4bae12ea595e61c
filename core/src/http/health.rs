//! Liveness and readiness, for load balancers and orchestrators.

use axum::extract::State;
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

use std::time::Duration;

use super::{AppState, ErrorBody};
use crate::flash::events::monitor::ConsumerStatus;
use crate::{Error, Result};

/// Liveness: the process answers. The edge answers `/healthz` itself with the same body.
#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    #[schema(example = "ok", pattern = "^ok$")]
    status: &'static str,
}

/// Readiness: the dependencies answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct Readiness {
    #[schema(example = "ready", pattern = "^ready$")]
    status: &'static str,
    /// With flash mode: how far each partition's writing into PostgreSQL is behind.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    consumer: Option<ConsumerStatus>,
}

/// The process is up and serving.
#[utoipa::path(get, path = "/healthz", tag = "health",
    responses((status = 200, description = "Alive (answered by the edge itself when asked there)", body = Health)))]
pub async fn healthz() -> Json<Health> {
    Json(Health { status: "ok" })
}

/// How recently the consumer monitor must have read the broker for this core to be ready:
/// several of its rounds, so one slow round on a loaded machine does not flap readiness.
const BROKER_READ_WITHIN: Duration = Duration::from_secs(15);

/// The service can serve reservations: its database answers, and with flash mode Redis
/// answers and the broker was read recently. With flash mode the body also says how far
/// each partition's writing is behind (`consumer`).
#[utoipa::path(get, path = "/readyz", tag = "health",
    responses(
        (status = 200, description = "Ready", body = Readiness),
        (status = 503, description = "SERVICE_UNAVAILABLE: a dependency is down, or the process is draining before it stops", body = ErrorBody),
    ))]
pub async fn readyz(State(state): State<AppState>) -> Result<Json<Readiness>> {
    if state.draining.load(std::sync::atomic::Ordering::Relaxed) {
        return Err(Error::unavailable("draining (shutting down)"));
    }
    state.service.store().ping().await?;
    let Some(flash) = state.service.flash() else {
        return Ok(Json(Readiness {
            status: "ready",
            consumer: None,
        }));
    };
    flash.gate().ping().await?;
    let health = flash.consumer_health();
    if !health.broker_reachable(BROKER_READ_WITHIN) {
        return Err(Error::unavailable("event broker (not read recently)"));
    }
    Ok(Json(Readiness {
        status: "ready",
        consumer: Some(health.status()),
    }))
}
