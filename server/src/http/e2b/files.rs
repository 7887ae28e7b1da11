//! envd's plain-HTTP file calls: `GET /files?path=P` (the bytes) and `POST /files?path=P`
//! (multipart, field `file`, each part named by its path; or the body itself as
//! `application/octet-stream`). Each file is the room's file operation (`Ops::file_op`):
//! reading needs `observe`, writing `edit`, as through REST `/files`.

use super::{workspace_path, EnvdCaller, PlaneError};
use crate::http::files::MAX_FILE_BYTES;
use crate::http::{ApiError, AppState};
use axum::extract::{DefaultBodyLimit, FromRequest, Multipart, Query, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use axum::routing::get;
use axum::{Json, Router};
use coderoom_authz::Capability;
use coderoom_sandbox::proto::{Op, Reply};
use serde::Deserialize;
use serde_json::{json, Value};

/// Files one upload may hold.
const MAX_FILES: usize = 256;

pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/e2b/envd/files", get(read).post(write))
        .layer(DefaultBodyLimit::max(MAX_FILE_BYTES as usize + (64 << 10)))
}

#[derive(Deserialize)]
struct FileQuery {
    path: Option<String>,
}

fn no_path() -> PlaneError {
    PlaneError(StatusCode::BAD_REQUEST, "no path given".into())
}

async fn read(
    State(app): State<AppState>,
    caller: EnvdCaller,
    Query(q): Query<FileQuery>,
) -> Result<Response, PlaneError> {
    let path = workspace_path(q.path.as_deref().ok_or_else(no_path)?)?;
    let make = |path| Op::ReadFile {
        path,
        max_bytes: MAX_FILE_BYTES,
    };
    let what = (path.as_str(), Capability::Observe, None);
    match app
        .ops
        .file_op(&caller.room, &caller.actor, what, make)
        .await
        .map_err(ApiError::from)?
    {
        Reply::File(data) => Ok((
            [(header::CONTENT_TYPE, "application/octet-stream")],
            data.into_vec(),
        )
            .into_response()),
        _ => Err(ApiError::Internal.into()),
    }
}

async fn write(
    State(app): State<AppState>,
    caller: EnvdCaller,
    Query(q): Query<FileQuery>,
    req: Request,
) -> Result<Response, PlaneError> {
    let multipart = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("multipart/form-data"));
    let encoding = req
        .headers()
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().to_ascii_lowercase());
    let gzip = match encoding.as_deref() {
        None | Some("" | "identity") => false,
        Some("gzip") => true,
        Some(other) => {
            return Err(PlaneError(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!(
                    "uploads are plain or gzip, not {}",
                    other.chars().take(40).collect::<String>()
                ),
            ))
        }
    };
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    if multipart && gzip {
        return Err(PlaneError(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "a gzip upload is one file as application/octet-stream".into(),
        ));
    }
    if multipart {
        let mut form = Multipart::from_request(req, &app)
            .await
            .map_err(|e| PlaneError(StatusCode::BAD_REQUEST, e.body_text()))?;
        while let Some(field) = form
            .next_field()
            .await
            .map_err(|e| PlaneError(StatusCode::BAD_REQUEST, e.body_text()))?
        {
            if field.name() != Some("file") {
                continue;
            }
            let path = field
                .file_name()
                .map(str::to_owned)
                .or_else(|| q.path.clone())
                .ok_or_else(no_path)?;
            let data = field
                .bytes()
                .await
                .map_err(|e| PlaneError(StatusCode::BAD_REQUEST, e.body_text()))?;
            if files.len() >= MAX_FILES {
                return Err(PlaneError(
                    StatusCode::BAD_REQUEST,
                    format!("at most {MAX_FILES} files in one upload"),
                ));
            }
            files.push((path, data.to_vec()));
        }
    } else {
        let path = q.path.clone().ok_or_else(no_path)?;
        let data = axum::body::to_bytes(req.into_body(), MAX_FILE_BYTES as usize)
            .await
            .map_err(|_| {
                PlaneError(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "the file is too large".into(),
                )
            })?;
        let data = if gzip { gunzip(&data)? } else { data.to_vec() };
        files.push((path, data));
    }
    let mut written: Vec<Value> = Vec::new();
    for (raw, data) in files {
        let path = workspace_path(&raw)?;
        let what = (path.as_str(), Capability::Edit, Some(data.len()));
        let make = |path| Op::WriteFile {
            path,
            data: serde_bytes::ByteBuf::from(data),
        };
        app.ops
            .file_op(&caller.room, &caller.actor, what, make)
            .await
            .map_err(ApiError::from)?;
        let name = path.rsplit('/').next().unwrap_or_default().to_owned();
        written.push(json!({ "name": name, "type": "file", "path": format!("/home/user/{path}") }));
    }
    Ok(Json(written).into_response())
}

/// A gzip upload's bytes, at most a file's largest.
fn gunzip(data: &[u8]) -> Result<Vec<u8>, PlaneError> {
    use std::io::Read as _;
    let mut out = Vec::new();
    let limit = MAX_FILE_BYTES + 1;
    flate2::read::GzDecoder::new(data)
        .take(limit)
        .read_to_end(&mut out)
        .map_err(|_| {
            PlaneError(
                StatusCode::BAD_REQUEST,
                "the upload is not valid gzip".into(),
            )
        })?;
    if out.len() as u64 >= limit {
        return Err(PlaneError(
            StatusCode::PAYLOAD_TOO_LARGE,
            "the file is too large".into(),
        ));
    }
    Ok(out)
}
