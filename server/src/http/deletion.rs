//! Room deletion (`crate::ops::deletion`): an owner asks (`DELETE /api/rooms/{id}`), a system
//! admin confirms (`POST /api/deletions/{id}/confirm`), and anyone of them reads its receipt
//! (`GET /api/deletions/{id}`).

use crate::http::extract::Caller;
use crate::http::extract::Ids;
use crate::http::extract::OnRoom;
use crate::http::{ApiError, AppState};
use crate::ids::IssuedId;
use crate::ops::deletion::{Deletion, Requested};
use axum::http::StatusCode;
use axum::routing::post;
use axum::Json;
use axum::Router;

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/deletions/{id}/confirm", post(confirm))
        .route("/api/deletions/{id}", axum::routing::get(get))
}

pub(crate) async fn request(on: OnRoom) -> Result<(StatusCode, Json<Requested>), ApiError> {
    let requested = on.ops.request_deletion(&on.room, &on.actor).await?;
    Ok((StatusCode::ACCEPTED, Json(requested)))
}

async fn confirm(by: Caller, Ids(id): Ids<IssuedId>) -> Result<Json<Deletion>, ApiError> {
    Ok(Json(by.ops.confirm_deletion(&by.actor, &id).await?))
}

async fn get(by: Caller, Ids(id): Ids<IssuedId>) -> Result<Json<Deletion>, ApiError> {
    Ok(Json(by.ops.deletion(&by.actor, &id).await?))
}
