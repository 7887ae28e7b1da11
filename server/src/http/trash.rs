//! The room's trash (`crate::ops::trash`): `GET /api/rooms/{id}/trash` lists the files deleted
//! from the document (`observe`), `POST /api/rooms/{id}/trash/{tid}/restore` puts one back
//! (`edit`).

use crate::http::extract::{Caller, Ids, OnRoom};
use crate::http::{ApiError, AppState};
use crate::ids::{IssuedId, RoomId};
use crate::ops::trash::{Restored, Trashed};
use axum::routing::{get, post};
use axum::{Json, Router};

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/rooms/{id}/trash", get(list))
        .route("/api/rooms/{id}/trash/{tid}/restore", post(restore))
}

async fn list(on: OnRoom) -> Result<Json<Vec<Trashed>>, ApiError> {
    Ok(Json(on.ops.trash(&on.room, &on.actor).await?))
}

async fn restore(
    by: Caller,
    Ids((room_id, tid)): Ids<(RoomId, IssuedId)>,
) -> Result<Json<Restored>, ApiError> {
    Ok(Json(
        by.ops
            .restore_trashed(&room_id, &by.actor, tid.as_str())
            .await?,
    ))
}
