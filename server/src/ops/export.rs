//! Exporting room content: named files' texts, or the whole workspace as a `.tar.gz` (see
//! [`crate::sandbox::download`]). Needs `export` and someone else's approval of exactly these
//! parameters, like every export: the first ask waits (`pending_approval`); the requester then
//! repeats it presenting the approval, which it spends once.

use crate::ids::{IssuedId, RoomId};
use crate::ops::approvals::Allowed;
use crate::ops::commands::Lapse;
use crate::ops::record::{Entry, Verdict};
use crate::ops::{Actor, OpError, Ops, Outcome};
use crate::store::{Change, StoreError};
use coderoom_authz::{Action, Authorized, Capability};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use yrs::{GetString, Map, Transact};

/// Most files one export names.
const MAX_EXPORT_FILES: usize = 100;
/// Longest path in a file list.
const MAX_PATH: usize = 1024;

/// An export as asked for (the body of `POST .../exports`).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExportAsked {
    files: Option<Vec<String>>,
    #[serde(default)]
    workspace: bool,
    approval_id: Option<String>,
}

/// What an export gives.
#[derive(Debug)]
pub(crate) enum Exported {
    /// Each named file's text (`None`: not in the room).
    Files(BTreeMap<String, Option<String>>),
    /// The workspace archive: an open file already unlinked, its size, the name to offer, and
    /// the switch that ends its sending once the caller may no longer export.
    Workspace {
        file: tokio::fs::File,
        bytes: u64,
        file_name: String,
        lapse: Lapse,
    },
}

/// The canonical parameters: `{"workspace": true}`, or the set of files, sorted.
fn export_params(body: &ExportAsked) -> Result<String, OpError> {
    let files =
        match (&body.files, body.workspace) {
            (None, true) => return Ok(json!({ "workspace": true }).to_string()),
            (Some(files), false) => files,
            _ => return Err(OpError::Bad(
                "name the files, or ask for the workspace (\"workspace\": true): one of the two",
            )),
        };
    if files.is_empty() || files.len() > MAX_EXPORT_FILES {
        return Err(OpError::Bad("files must list 1 to 100 paths"));
    }
    if files
        .iter()
        .any(|f| f.is_empty() || f.len() > MAX_PATH || f.contains('\0'))
    {
        return Err(OpError::Bad("invalid path in files"));
    }
    let mut files = files.to_vec();
    files.sort();
    files.dedup();
    Ok(json!({ "files": files }).to_string())
}

impl Ops {
    /// Exports what `asked` names as `actor`: membership and `export` first (a refusal is
    /// recorded there), then the approval of exactly these parameters.
    pub(crate) async fn export(
        &self,
        room_id: &RoomId,
        actor: &Actor,
        asked: ExportAsked,
    ) -> Result<Outcome<Exported>, OpError> {
        self.authorize(room_id, actor, Action::Use(Capability::Export), json!({}))
            .await?;
        let params = export_params(&asked)?;
        let approval = self
            .presented(room_id, asked.approval_id.as_deref())
            .await?;
        let action = Action::Export {
            params: params.clone(),
            approval,
        };
        let details: Value = serde_json::from_str(&params).unwrap_or(Value::Null);
        let Allowed { proof, approval } =
            match self.ask(room_id, actor, action, details.clone()).await? {
                Outcome::Done(allowed) => allowed,
                Outcome::Pending(id) => return Ok(Outcome::Pending(id)),
            };
        let Some(names) = &asked.files else {
            // Written, then sent, only while the caller may export: a revoke or removal stops
            // it wherever it is.
            let lapse = self.when_right_lapses(room_id, actor, Capability::Export);
            let written = tokio::select! {
                w = workspace_download(self, room_id, &proof, details, &approval) => w?,
                () = lapse.stop.cancelled() => return Err(OpError::Refused(LAPSED.into())),
            };
            let WrittenDownload {
                file,
                bytes,
                file_name,
            } = written;
            return Ok(Outcome::Done(Exported::Workspace {
                file,
                bytes,
                file_name,
                lapse,
            }));
        };
        let details = json!({ "approval_id": approval, "params": details });
        let entry = Entry::of(proof.action(), Verdict::Allow, details);
        self.record_allowed(room_id, &proof, entry, Change::None, &approval)
            .await?;
        let files = read_files(self, room_id, names).await?;
        Ok(Outcome::Done(Exported::Files(files)))
    }
}

/// Why a workspace download stopped part way.
pub(crate) const LAPSED: &str =
    "your right to export from this room ended during the download: it was stopped";

/// A written workspace download, ready to send.
struct WrittenDownload {
    file: tokio::fs::File,
    bytes: u64,
    file_name: String,
}

/// Removes the files named when dropped (a download's scratch files, however it ends).
struct Scratch(Vec<std::path::PathBuf>);

impl Drop for Scratch {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// The approved workspace export: the archive is written (the running sandbox's workspace, else
/// its latest snapshot) with the document laid over it, then the export is recorded with what
/// it holds (spending the approval), then sent. Scratch space is `DATA_DIR/exports/<server>/`,
/// emptied at every start of that server too.
async fn workspace_download(
    app: &Ops,
    room_id: &RoomId,
    proof: &Authorized,
    params: Value,
    approval_id: &str,
) -> Result<WrittenDownload, OpError> {
    let dir = exports_dir(&app.data_dir, &app.server.id);
    tokio::fs::create_dir_all(&dir).await.map_err(store_io)?;
    let id = IssuedId::fresh();
    let raw = dir.join(format!("{id}.tar"));
    let out = dir.join(format!("{id}.tar.gz"));
    let _scratch = Scratch(vec![raw.clone(), out.clone()]);
    let (_, meta) = app.sandboxes.archive(room_id, raw.clone()).await?;
    let texts = doc_texts(app, room_id).await?;
    let mtime = u64::try_from(app.clock.now_ms() / 1000).unwrap_or(0);
    let target = out.clone();
    let bundled = tokio::task::spawn_blocking(move || {
        crate::sandbox::download::bundle(&raw, &meta.agreed, &texts, mtime, &target)
    })
    .await
    .map_err(|_| OpError::Internal)?
    .map_err(|e| {
        tracing::warn!(room = %room_id, error = %e, "cannot write the workspace download");
        if e.kind() == std::io::ErrorKind::InvalidData {
            // The archive came from inside the sandbox: what was wrong with it is logged only.
            OpError::Sandbox(crate::sandbox::SandboxError::Call(
                coderoom_sandbox::CallError::Protocol,
            ))
        } else {
            store_io(e)
        }
    })?;
    let details = json!({
        "approval_id": approval_id,
        "params": params,
        "bytes": bundled.bytes,
        "files": bundled.files,
        "from_document": bundled.from_document,
        "skipped": bundled.skipped,
    });
    let entry = Entry::of(proof.action(), Verdict::Allow, details);
    app.record_allowed(room_id, proof, entry, Change::None, approval_id)
        .await?;
    // Open, then let the scratch guard unlink it: the open file is read to its end.
    let file = tokio::fs::File::open(&out).await.map_err(store_io)?;
    let room = app.store.room(room_id).await?;
    let name = download_name(room.as_ref().map_or("", |r| r.name.as_str()));
    Ok(WrittenDownload {
        file,
        bytes: bundled.bytes,
        file_name: format!("{name}.tar.gz"),
    })
}

/// Where this server writes downloads before they are sent: a directory of its own, since
/// servers sharing a database may share the data directory too.
pub(crate) fn exports_dir(data_dir: &std::path::Path, server: &str) -> std::path::PathBuf {
    data_dir.join("exports").join(server)
}

/// A file name from a room's name: letters, digits, `.`, `_` and `-` kept, anything else a `-`
/// (nothing that could end the header's quoted string), never empty.
fn download_name(room: &str) -> String {
    let name: String = room
        .chars()
        .take(64)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect();
    let name = name.trim_matches(|c| c == '-' || c == '.');
    if name.is_empty() {
        "workspace".to_owned()
    } else {
        name.to_owned()
    }
}

fn store_io(e: std::io::Error) -> OpError {
    OpError::Store(StoreError::Io(e))
}

/// The named files' text as stored (what every peer has been sent).
async fn read_files(
    app: &Ops,
    room_id: &RoomId,
    names: &[String],
) -> Result<BTreeMap<String, Option<String>>, OpError> {
    let all = doc_texts(app, room_id).await?;
    Ok(names
        .iter()
        .map(|name| (name.clone(), all.get(name).cloned()))
        .collect())
}

/// Every file the room's document holds (path -> text), as stored: what every peer was sent.
async fn doc_texts(app: &Ops, room_id: &RoomId) -> Result<BTreeMap<String, String>, OpError> {
    let stored = app.store.load_doc(room_id).await?;
    let (doc, _) = crate::room::task::doc_from_stored(&stored)
        .map_err(|_| OpError::Store(StoreError::Corrupt))?;
    let files = doc.get_or_insert_map("files");
    let txn = doc.transact();
    Ok(files
        .iter(&txn)
        .filter_map(|(name, value)| match value {
            yrs::Out::YText(t) => Some((name.to_owned(), t.get_string(&txn))),
            _ => None,
        })
        .collect())
}
