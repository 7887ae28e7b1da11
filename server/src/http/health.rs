//! Operations: `GET /healthz` and `GET /metrics`.

use crate::http::AppState;
use crate::metrics::Metrics;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
}

async fn healthz(State(app): State<AppState>) -> impl IntoResponse {
    match app.ops.store.ping().await {
        Ok(()) => (StatusCode::OK, "ok\n"),
        Err(e) => {
            tracing::warn!(error = %e, "health check: database does not answer");
            (StatusCode::SERVICE_UNAVAILABLE, "database unavailable\n")
        }
    }
}

async fn metrics(State(metrics): State<Metrics>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        metrics.render(),
    )
}
