//! envd's `filesystem.Filesystem` service, unary calls: `Stat` and `ListDir` need `observe`,
//! `MakeDir`, `Move` and `Remove` need `edit`, each the room's file operation
//! (`Ops::entry_op`, `Ops::move_entry`, `Ops::file_op`), as through REST `/files`.

use super::connect::{self, Code, ConnectError};
use super::{rfc3339, workspace_path, EnvdCaller};
use crate::http::{ApiError, AppState};
use crate::ops::OpError;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use coderoom_authz::Capability;
use coderoom_sandbox::proto::{Entry, EntryKind, Op, Reply};
use serde_json::{json, Value};

pub(super) fn routes() -> Router<AppState> {
    Router::new().route("/api/e2b/envd/filesystem.Filesystem/{method}", post(call))
}

async fn call(
    State(app): State<AppState>,
    Path(method): Path<String>,
    caller: Result<EnvdCaller, ConnectError>,
    body: Bytes,
) -> Response {
    let asked = caller.and_then(|c| Ok((c, connect::plain(&body)?)));
    let r = match asked {
        Ok((caller, req)) => answer(&app, &caller, &method, &req).await,
        Err(e) => Err(e),
    };
    match r {
        Ok(v) => connect::unary(v),
        Err(e) => e.into_response(),
    }
}

fn path_of(req: &Value, field: &str) -> Result<String, ConnectError> {
    let raw = req.get(field).and_then(Value::as_str).unwrap_or_default();
    workspace_path(raw)
}

async fn answer(
    app: &AppState,
    caller: &EnvdCaller,
    method: &str,
    req: &Value,
) -> Result<Value, ConnectError> {
    let (room, actor) = (&caller.room, &caller.actor);
    let refused = |e: OpError| ConnectError::from(ApiError::from(e));
    match method {
        "Stat" => {
            let path = path_of(req, "path")?;
            Ok(entry_json(
                &describe(app, caller, &path).await.map_err(refused)?,
            ))
        }
        "ListDir" => {
            let path = path_of(req, "path")?;
            let depth = req
                .get("depth")
                .and_then(Value::as_u64)
                .map_or(1, |d| u32::try_from(d.max(1)).unwrap_or(u32::MAX));
            let make = |path| Op::ListDir { path, depth };
            let reply = app
                .ops
                .entry_op(room, actor, (&path, Capability::Observe), make)
                .await
                .map_err(refused)?;
            Ok(match reply {
                Reply::Entries { entries, .. } => {
                    json!({ "entries": entries.iter().map(entry_info).collect::<Vec<_>>() })
                }
                _ => json!({}),
            })
        }
        // What was made or moved is described afresh (nothing, if it cannot be).
        "MakeDir" => {
            let path = path_of(req, "path")?;
            let make = |path| Op::MakeDir { path };
            app.ops
                .file_op(room, actor, (&path, Capability::Edit, None), make)
                .await
                .map_err(refused)?;
            Ok(describe(app, caller, &path)
                .await
                .map_or(json!({}), |r| entry_json(&r)))
        }
        "Move" => {
            let (from, to) = (path_of(req, "source")?, path_of(req, "destination")?);
            app.ops
                .move_entry(room, actor, &from, &to)
                .await
                .map_err(refused)?;
            Ok(describe(app, caller, &to)
                .await
                .map_or(json!({}), |r| entry_json(&r)))
        }
        "Remove" => {
            let path = path_of(req, "path")?;
            let make = |path| Op::RemoveFile { path };
            app.ops
                .file_op(room, actor, (&path, Capability::Edit, None), make)
                .await
                .map_err(refused)?;
            Ok(json!({}))
        }
        _ => Err(ConnectError::new(
            Code::Unimplemented,
            format!(
                "filesystem.Filesystem/{} is not supported by this server (see docs/e2b.md)",
                method.chars().take(60).collect::<String>()
            ),
        )),
    }
}

/// What is at workspace path `path` (`Stat`, needing `observe`).
async fn describe(app: &AppState, caller: &EnvdCaller, path: &str) -> Result<Reply, OpError> {
    let make = |path| Op::Stat { path };
    app.ops
        .entry_op(
            &caller.room,
            &caller.actor,
            (path, Capability::Observe),
            make,
        )
        .await
}

/// A `Stat`-shaped answer: `{"entry": EntryInfo}`, or nothing for another reply.
fn entry_json(reply: &Reply) -> Value {
    match reply {
        Reply::Entry(e) => json!({ "entry": entry_info(e) }),
        _ => json!({}),
    }
}

/// `EntryInfo` as proto3 JSON (int64 as a string, enums by name, the path as the SDK names it).
fn entry_info(e: &Entry) -> Value {
    let name = e.path.rsplit('/').next().unwrap_or_default();
    let path = if e.path.is_empty() {
        "/home/user".to_owned()
    } else {
        format!("/home/user/{}", e.path)
    };
    let (kind, letter) = match e.kind {
        EntryKind::File => ("FILE_TYPE_FILE", '-'),
        EntryKind::Dir => ("FILE_TYPE_DIRECTORY", 'd'),
        EntryKind::Symlink => ("FILE_TYPE_SYMLINK", 'l'),
        EntryKind::Other => ("FILE_TYPE_UNSPECIFIED", '-'),
    };
    let mut v = json!({
        "name": if e.path.is_empty() { "user" } else { name },
        "type": kind,
        "path": path,
        "size": e.size.to_string(),
        "mode": e.mode,
        "permissions": permissions(letter, e.mode),
        "owner": owner(e.uid),
        "group": owner(e.gid),
        "modifiedTime": rfc3339(i64::try_from(e.mtime_ns / 1_000_000).unwrap_or(0)),
    });
    if let Some(target) = &e.target {
        v["symlinkTarget"] = json!(target);
        v["isSymlink"] = json!(true);
    }
    v
}

/// Room code is `user` (uid 1000 inside); the sandbox's machinery is `root`.
fn owner(id: u32) -> String {
    match id {
        0 => "root".into(),
        1000 => "user".into(),
        other => other.to_string(),
    }
}

/// `ls -l`'s permission string.
fn permissions(kind: char, mode: u32) -> String {
    let mut s = String::with_capacity(10);
    s.push(kind);
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_read_as_the_sdk_expects() {
        assert_eq!(permissions('-', 0o644), "-rw-r--r--");
        assert_eq!(permissions('d', 0o755), "drwxr-xr-x");
        let e = Entry {
            path: "src/a.py".into(),
            kind: EntryKind::File,
            size: 12,
            mode: 0o644,
            uid: 1000,
            gid: 1000,
            mtime_ns: 0,
            target: None,
        };
        let v = entry_info(&e);
        assert_eq!(v["name"], "a.py");
        assert_eq!(v["path"], "/home/user/src/a.py");
        assert_eq!(v["size"], "12");
        assert_eq!(v["type"], "FILE_TYPE_FILE");
        assert_eq!(v["owner"], "user");
    }
}
