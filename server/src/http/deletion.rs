//! Room deletion (`crate::ops::deletion`): an owner asks (`DELETE /api/rooms/{id}`), a system
//! admin confirms (`POST /api/deletions/{id}/confirm`), and anyone of them reads its receipt
//! (`GET /api/deletions/{id}`).

use crate::http::extract::Acting;
use crate::http::extract::Ids;
use crate::http::{ApiError, AppState};
use crate::ids::{IssuedId, RoomId};
use crate::ops::deletion::{Deletion, Requested};
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::Json;
use axum::Router;

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/deletions/{id}/confirm", post(confirm))
        .route("/api/deletions/{id}", axum::routing::get(get))
}

pub(crate) async fn request(
    State(app): State<AppState>,
    Acting(actor): Acting,
    Ids(room_id): Ids<RoomId>,
) -> Result<(StatusCode, Json<Requested>), ApiError> {
    let requested = app.ops.request_deletion(&room_id, &actor).await?;
    Ok((StatusCode::ACCEPTED, Json(requested)))
}

async fn confirm(
    State(app): State<AppState>,
    Acting(actor): Acting,
    Ids(id): Ids<IssuedId>,
) -> Result<Json<Deletion>, ApiError> {
    Ok(Json(app.ops.confirm_deletion(&actor, &id).await?))
}

async fn get(
    State(app): State<AppState>,
    Acting(actor): Acting,
    Ids(id): Ids<IssuedId>,
) -> Result<Json<Deletion>, ApiError> {
    Ok(Json(app.ops.deletion(&actor, &id).await?))
}
