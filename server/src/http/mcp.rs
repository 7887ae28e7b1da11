//! The MCP endpoint, `/api/rooms/{id}/mcp` (streamable HTTP, stateless, JSON answers; the
//! `rmcp` crate): an agent (or a person, with a bearer token) works in the room through tools.
//! Every request is authenticated like any API call (the agent's token opens its room only);
//! every tool call is decided exactly as the same action by a person (reading needs
//! `observe`, writing `edit`, running `type`), fails with a message the agent can read, and is
//! audited (`tool_call`, with the agent's sponsor). Writes go through the room's document, as
//! a participant: people see the edit arrive live, with the agent in presence and its cursor
//! where it wrote, and concurrent edits merge.

use crate::http::bucket::Bucket;
use crate::http::extract::Ids;
use crate::http::guard::room_capabilities;
use crate::http::{ApiError, AppState, AuthUser};
use crate::ids::RoomId;
use crate::ops::export::{ExportAsked, Exported};
use crate::ops::record::{Act, Entry, Verdict};
use crate::ops::typing::{Typed, Typist};
use crate::ops::Outcome;
use crate::room::visit::{texts_of, Visit};
use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use bytes::Bytes;
use coderoom_authz::Capability;
use rmcp::model::{
    object, CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListResourcesResult, ListToolsResult, PaginatedRequestParams, ReadResourceRequestParams,
    ReadResourceResponse, ReadResourceResult, Resource, ResourceContents, ServerCapabilities,
    ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long an agent stays in presence after an edit (its cursor where it wrote).
const PRESENT_AFTER_EDIT: Duration = Duration::from_secs(5);
/// Most matches `search` answers.
const MAX_MATCHES: usize = 200;
/// Largest request body.
const MAX_BODY: usize = 4 << 20;
/// Resource URIs: `room:///path/in/the/workspace`.
const RESOURCE_PREFIX: &str = "room:///";
/// How long a call waits for an approval when it does not say (`wait_s`), and at most.
const WAIT_S: u64 = 60;
const MAX_WAIT_S: u64 = 300;
/// Terminal output `terminal_read` answers by default, and at most.
const READ_BYTES: usize = 8 << 10;
const MAX_READ_BYTES: usize = 64 << 10;
/// Longest a terminal line may be, and longest `terminal_send` waits for output.
const MAX_LINE_BYTES: usize = 4 << 10;
const MAX_TERMINAL_WAIT_MS: u64 = 10_000;

/// Who is calling, in which room: put in each request by [`authenticate`].
#[derive(Clone)]
struct Caller {
    user: AuthUser,
    room: RoomId,
}

pub(crate) fn routes(app: &AppState) -> Router<AppState> {
    // The endpoint is authenticated (bearer tokens; cookies with the Origin check), so rmcp's
    // Host allowlist against DNS rebinding is not needed and would refuse real deployments.
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .disable_allowed_hosts()
        .with_max_request_body_bytes(MAX_BODY)
        .with_cancellation_token(app.shutdown.child_token());
    let state = app.clone();
    let calls = Arc::new(Calls {
        rate: f64::from(app.limits.agent_tool_calls_per_s.max(1)),
        buckets: Mutex::default(),
    });
    let service = StreamableHttpService::new(
        move || {
            Ok(Mcp {
                app: state.clone(),
                calls: calls.clone(),
            })
        },
        Arc::new(NeverSessionManager::default()),
        config,
    );
    Router::new()
        .nest_service("/api/rooms/{id}/mcp", service)
        .route_layer(middleware::from_fn_with_state(app.clone(), authenticate))
}

/// Authenticates the request like any API call and names the room; 401 / 403 / 404 as usual.
async fn authenticate(
    State(app): State<AppState>,
    user: AuthUser,
    Ids(room): Ids<RoomId>,
    mut req: Request,
    next: Next,
) -> Response {
    if let Err(e) = room_capabilities(&app, &room, &user).await {
        return e.into_response();
    }
    req.extensions_mut().insert(Caller { user, room });
    next.run(req).await
}

#[derive(Clone)]
struct Mcp {
    app: AppState,
    calls: Arc<Calls>,
}

/// Callers' tool-call buckets (`--agent-tool-calls-per-s`).
struct Calls {
    rate: f64,
    buckets: Mutex<HashMap<String, Arc<Bucket>>>,
}

/// Callers whose buckets are kept; past it the full ones (idle callers) are forgotten.
const MAX_CALLERS: usize = 10_000;

impl Calls {
    /// Takes one call of `user`'s; else how long until there is one.
    fn take(&self, user: &str) -> Result<(), Duration> {
        let bucket = {
            let mut all = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
            if all.len() >= MAX_CALLERS {
                all.clear();
            }
            all.entry(user.to_owned())
                .or_insert_with(|| Arc::new(Bucket::new(self.rate, self.rate * 5.0)))
                .clone()
        };
        bucket.try_take()
    }
}

fn caller(ctx: &RequestContext<RoleServer>) -> Result<Caller, ErrorData> {
    ctx.extensions
        .get::<axum::http::request::Parts>()
        .and_then(|p| p.extensions.get::<Caller>())
        .cloned()
        .ok_or_else(|| ErrorData::internal_error("the request was not authenticated", None))
}

/// Why a tool call failed, in words the agent can read and act on.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct ToolError(String);

impl From<String> for ToolError {
    fn from(s: String) -> Self {
        ToolError(s)
    }
}

impl From<&str> for ToolError {
    fn from(s: &str) -> Self {
        ToolError(s.to_owned())
    }
}

impl From<ApiError> for ToolError {
    fn from(e: ApiError) -> Self {
        ToolError(match e {
            ApiError::Forbidden => "refused: you do not hold the capability this needs".into(),
            ApiError::Denied(why) => format!("refused: {why}"),
            ApiError::Spent(e) => format!("refused: {e}"),
            ApiError::NotFound => "not found (or you are no longer in this room)".into(),
            ApiError::Unauthorized => "your token no longer works".into(),
            other => other.to_string(),
        })
    }
}

impl From<crate::ops::OpError> for ToolError {
    fn from(e: crate::ops::OpError) -> Self {
        ToolError::from(ApiError::from(e))
    }
}

impl From<crate::room::visit::VisitError> for ToolError {
    fn from(e: crate::room::visit::VisitError) -> Self {
        ToolError(e.to_string())
    }
}

/// A tool's answer: text for the agent, or why it failed.
type Answer = Result<String, ToolError>;

fn arg<'a>(args: &'a Map<String, Value>, name: &str) -> Result<&'a str, ToolError> {
    args.get(name)
        .and_then(Value::as_str)
        .ok_or_else(|| ToolError(format!("`{name}` (a string) is required")))
}

/// The tools this endpoint offers: a closed set, each decided and performed by the
/// application layer like the same act through any other door.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum McpTool {
    ListFiles,
    ReadFile,
    WriteFile,
    EditFile,
    Search,
    Exec,
    AllowHost,
    RequestPreview,
    ListParticipants,
    ReadManifest,
    ReadSpend,
    TerminalRead,
    TerminalSend,
    ExportFiles,
}

impl McpTool {
    const ALL: [McpTool; 14] = [
        McpTool::ListFiles,
        McpTool::ReadFile,
        McpTool::WriteFile,
        McpTool::EditFile,
        McpTool::Search,
        McpTool::Exec,
        McpTool::AllowHost,
        McpTool::RequestPreview,
        McpTool::ListParticipants,
        McpTool::ReadManifest,
        McpTool::ReadSpend,
        McpTool::TerminalRead,
        McpTool::TerminalSend,
        McpTool::ExportFiles,
    ];

    /// Its name on the wire.
    const fn name(self) -> &'static str {
        match self {
            McpTool::ListFiles => "list_files",
            McpTool::ReadFile => "read_file",
            McpTool::WriteFile => "write_file",
            McpTool::EditFile => "edit_file",
            McpTool::Search => "search",
            McpTool::Exec => "exec",
            McpTool::AllowHost => "allow_host",
            McpTool::RequestPreview => "request_preview",
            McpTool::ListParticipants => "list_participants",
            McpTool::ReadManifest => "read_manifest",
            McpTool::ReadSpend => "read_spend",
            McpTool::TerminalRead => "terminal_read",
            McpTool::TerminalSend => "terminal_send",
            McpTool::ExportFiles => "export_files",
        }
    }

    fn parse(name: &str) -> Option<McpTool> {
        McpTool::ALL.into_iter().find(|t| t.name() == name)
    }
}

fn tool(t: McpTool, description: &'static str, schema: Value) -> Tool {
    Tool::new(t.name(), description, object(schema))
}

fn tools() -> Vec<Tool> {
    let path =
        json!({ "type": "string", "description": "Workspace-relative path, e.g. src/main.rs" });
    vec![
        tool(
            McpTool::ListFiles,
            "List the room's text files (its shared document).",
            json!({ "type": "object", "properties": {} }),
        ),
        tool(
            McpTool::ReadFile,
            "Read a text file of the room.",
            json!({ "type": "object", "properties": { "path": path }, "required": ["path"] }),
        ),
        tool(
            McpTool::WriteFile,
            "Create or replace a text file; people in the room see the change live (as minimal edits, so their cursors stay put).",
            json!({ "type": "object", "properties": { "path": path, "content": { "type": "string" } }, "required": ["path", "content"] }),
        ),
        tool(
            McpTool::EditFile,
            "Replace the one occurrence of old_text in a file with new_text (fails when it occurs zero or several times).",
            json!({ "type": "object", "properties": { "path": path, "old_text": { "type": "string" }, "new_text": { "type": "string" } }, "required": ["path", "old_text", "new_text"] }),
        ),
        tool(
            McpTool::Search,
            "Find lines containing a string in the room's text files.",
            json!({ "type": "object", "properties": { "query": { "type": "string" } }, "required": ["query"] }),
        ),
        tool(
            McpTool::Exec,
            "Run a command in the room's sandbox (argv, no shell unless you run one) and return its exit code and output.",
            json!({ "type": "object", "properties": {
                "argv": { "type": "array", "items": { "type": "string" } },
                "cwd": { "type": "string" },
                "timeout_ms": { "type": "integer", "minimum": 1, "maximum": 600000 },
                "approval_id": { "type": "string", "description": "An approval of exactly this command, from an earlier call that waited too little" },
                "wait_s": { "type": "integer", "minimum": 0, "maximum": 300, "description": "How long to wait for an approval when one is needed (default 60)" } }, "required": ["argv"] }),
        ),
        tool(
            McpTool::AllowHost,
            "Let the sandbox reach a host (e.g. api.example.com or *.example.org:8443) through the room's egress proxy. Without approve, this asks for an approval and waits (wait_s, default 60) for someone to decide.",
            json!({ "type": "object", "properties": { "rule": { "type": "string" }, "wait_s": { "type": "integer", "minimum": 0, "maximum": 300 } }, "required": ["rule"] }),
        ),
        tool(
            McpTool::RequestPreview,
            "Serve a port of the sandbox as a preview: visibility room (members) or public (waits, wait_s, for someone else's approval). Answers its URL once live.",
            json!({ "type": "object", "properties": {
                "port": { "type": "integer", "minimum": 1, "maximum": 65535 },
                "visibility": { "type": "string", "enum": ["room", "public"] },
                "ttl_s": { "type": "integer", "minimum": 10, "maximum": 604800 },
                "wait_s": { "type": "integer", "minimum": 0, "maximum": 300 } }, "required": ["port", "visibility", "ttl_s"] }),
        ),
        tool(
            McpTool::ExportFiles,
            "Take text files of the room out of it, as they are now. Needs export and someone else's approval of exactly these files: waits wait_s (default 60) for it; call again with approval_id once it is approved. Answers {\"files\": {path: text or null}}.",
            json!({ "type": "object", "properties": {
                "files": { "type": "array", "items": { "type": "string" }, "minItems": 1, "maxItems": 100 },
                "approval_id": { "type": "string", "description": "An approval of exactly this export, from an earlier call" },
                "wait_s": { "type": "integer", "minimum": 0, "maximum": 300 } }, "required": ["files"] }),
        ),
        tool(
            McpTool::TerminalRead,
            "The shared terminal's recent output (escape sequences removed), as everyone in the room sees it.",
            json!({ "type": "object", "properties": { "max_bytes": { "type": "integer", "minimum": 1, "maximum": 65536 } } }),
        ),
        tool(
            McpTool::TerminalSend,
            "Type text into the shared terminal (end it with \\n to run a line) and answer the output that follows within wait_ms (default 1000). Everyone sees it, attributed to you.",
            json!({ "type": "object", "properties": {
                "text": { "type": "string" },
                "wait_ms": { "type": "integer", "minimum": 0, "maximum": 10000 },
                "wait_s": { "type": "integer", "minimum": 0, "maximum": 300, "description": "How long to wait for an approval when one is needed (default 60)" } }, "required": ["text"] }),
        ),
        tool(
            McpTool::ListParticipants,
            "The room's people and agents with their roles and capabilities.",
            json!({ "type": "object", "properties": {} }),
        ),
        tool(
            McpTool::ReadManifest,
            "The room's manifest: its name, limits, sandbox, readiness and your capabilities.",
            json!({ "type": "object", "properties": {} }),
        ),
        tool(
            McpTool::ReadSpend,
            "What the room used of each meter (sandbox seconds, commands, egress bytes, model tokens, tool calls), who used it, the room's budget and your own.",
            json!({ "type": "object", "properties": {} }),
        ),
    ]
}

impl Mcp {
    /// How the caller shows in presence and the terminal: an agent by its name, marked as one;
    /// a person by their email.
    async fn shown_name(&self, c: &Caller) -> String {
        match self.app.ops.store.agent(&c.user.id).await {
            Ok(Some(a)) => format!("{} (agent)", a.name),
            _ => c.user.email.clone(),
        }
    }

    /// The room's files, read as a participant would see them now.
    async fn texts(
        &self,
        c: &Caller,
    ) -> Result<std::collections::BTreeMap<String, String>, ToolError> {
        room_capabilities(&self.app, &c.room, &c.user).await?;
        let visit = Visit::start(
            &self.app.ops.rooms,
            &self.app.limits,
            &c.room,
            (&c.user.id, &c.user.email),
        )
        .await?;
        let texts = texts_of(&visit.doc);
        visit.leave().await;
        Ok(texts)
    }

    /// Writes `path` through the room's document as the caller (it needs `edit`).
    async fn write(&self, c: &Caller, path: &str, content: String) -> Answer {
        let actor = c.user.actor(&self.app).await?;
        let checked = self
            .app
            .ops
            .may_touch_file(&c.room, &actor, path, Capability::Edit, Some(content.len()))
            .await?;
        let path = checked.as_str();
        let name = self.shown_name(c).await;
        let mut visit = Visit::start(
            &self.app.ops.rooms,
            &self.app.limits,
            &c.room,
            (&c.user.id, &name),
        )
        .await?;
        let changed = visit.write_file(path, &content).await?;
        // In presence, its cursor at the end of what it wrote, for a few seconds.
        visit.announce_at(path).await;
        self.app.tracker.spawn(async move {
            tokio::time::sleep(PRESENT_AFTER_EDIT).await;
            visit.leave().await;
        });
        Ok(if changed {
            format!("wrote {path} ({} bytes)", content.len())
        } else {
            format!("{path} already read so: nothing changed")
        })
    }

    async fn call(&self, c: &Caller, name: &str, args: &Map<String, Value>) -> Answer {
        let Some(tool) = McpTool::parse(name) else {
            return Err(format!("no tool named {name}").into());
        };
        match tool {
            McpTool::ListFiles => {
                let texts = self.texts(c).await?;
                Ok(texts.keys().cloned().collect::<Vec<_>>().join("\n"))
            }
            McpTool::ReadFile => {
                let path = arg(args, "path")?;
                let texts = self.texts(c).await?;
                texts
                    .get(path)
                    .cloned()
                    .ok_or_else(|| ToolError(format!("no text file {path} in the room")))
            }
            McpTool::WriteFile => {
                let content = arg(args, "content")?.to_owned();
                self.write(c, arg(args, "path")?, content).await
            }
            McpTool::EditFile => {
                let (path, old, new) = (
                    arg(args, "path")?,
                    arg(args, "old_text")?,
                    arg(args, "new_text")?,
                );
                if old.is_empty() {
                    return Err("old_text must not be empty".into());
                }
                let texts = self.texts(c).await?;
                let text = texts
                    .get(path)
                    .ok_or_else(|| ToolError(format!("no text file {path} in the room")))?;
                match text.matches(old).count() {
                    1 => self.write(c, path, text.replacen(old, new, 1)).await,
                    0 => Err(format!("old_text does not occur in {path}").into()),
                    n => Err(
                        format!("old_text occurs {n} times in {path}: include more context").into(),
                    ),
                }
            }
            McpTool::Search => {
                let query = arg(args, "query")?;
                if query.is_empty() {
                    return Err("query must not be empty".into());
                }
                let texts = self.texts(c).await?;
                let hits: Vec<String> = texts
                    .iter()
                    .flat_map(|(path, text)| {
                        text.lines()
                            .enumerate()
                            .filter(|(_, l)| l.contains(query))
                            .map(move |(i, l)| format!("{path}:{}: {l}", i + 1))
                    })
                    .take(MAX_MATCHES)
                    .collect();
                Ok(if hits.is_empty() {
                    "no matches".into()
                } else {
                    hits.join("\n")
                })
            }
            McpTool::Exec => {
                let wait = wait_of(args)?;
                let mut args = args.clone();
                args.remove("wait_s");
                let req = serde_json::from_value::<crate::http::sandbox::ExecRequest>(
                    Value::Object(args),
                )
                .map_err(|e| ToolError(format!("bad arguments: {e}")))?;
                let (cmd, presented) = req.command();
                let actor = c.user.actor(&self.app).await?;
                let run = |approval: Option<String>| {
                    let cmd = cmd.clone();
                    let (ops, room, actor) = (&self.app.ops, &c.room, &actor);
                    async move { ops.run_command(room, actor, cmd, approval.as_deref()).await }
                };
                let out = match run(presented).await? {
                    Outcome::Done(out) => out,
                    Outcome::Pending(id) => {
                        self.decided(c, &id, wait, "the command did not run")
                            .await?;
                        match run(Some(id)).await? {
                            Outcome::Done(out) => out,
                            Outcome::Pending(_) => {
                                return Err("the command still needs an approval".into())
                            }
                        }
                    }
                };
                serde_json::to_string_pretty(&out).map_err(|e| ToolError(e.to_string()))
            }
            McpTool::AllowHost => {
                let wait = wait_of(args)?;
                let rule = arg(args, "rule")?;
                let actor = c.user.actor(&self.app).await?;
                let ops = &self.app.ops;
                if let Outcome::Pending(id) = ops.allow_egress(&c.room, &actor, rule, None).await? {
                    self.decided(c, &id, wait, "the host stays closed").await?;
                    if let Outcome::Pending(_) =
                        ops.allow_egress(&c.room, &actor, rule, Some(&id)).await?
                    {
                        return Err("the host still needs an approval".into());
                    }
                }
                Ok(format!("{rule} is allowed"))
            }
            McpTool::RequestPreview => {
                let wait = wait_of(args)?;
                let body: crate::ops::previews::NewPreview = serde_json::from_value(json!({
                    "port": args.get("port"),
                    "visibility": args.get("visibility"),
                    "ttl_s": args.get("ttl_s"),
                }))
                .map_err(|e| ToolError(format!("bad arguments: {e}")))?;
                crate::http::previews::enabled(&self.app)?;
                let actor = c.user.actor(&self.app).await?;
                let p = self.app.ops.create_preview(&c.room, &actor, body).await?;
                if let Some(id) = &p.approval_id {
                    self.decided(c, id, wait, "the preview stays closed")
                        .await?;
                }
                let opened = crate::http::previews::link(&self.app, &c.room, &actor, &p.id).await?;
                let url = self.app.previews.origin.as_ref().map(|o| o.url(&p.id));
                Ok(format!(
                    "preview {} is {}: {}",
                    json!(p.id),
                    opened["state"],
                    json!(url)
                ))
            }
            McpTool::ExportFiles => {
                let wait = wait_of(args)?;
                let asked = |approval: Option<&str>| {
                    serde_json::from_value::<ExportAsked>(json!({
                        "files": args.get("files"),
                        "approval_id": approval,
                    }))
                    .map_err(|e| ToolError(format!("bad arguments: {e}")))
                };
                let presented = args.get("approval_id").and_then(Value::as_str);
                let actor = c.user.actor(&self.app).await?;
                let ops = &self.app.ops;
                let mut exported = ops.export(&c.room, &actor, asked(presented)?).await?;
                if let Outcome::Pending(id) = &exported {
                    self.decided(c, id, wait, "nothing was exported").await?;
                    exported = ops.export(&c.room, &actor, asked(Some(id))?).await?;
                }
                match exported {
                    Outcome::Done(Exported::Files(files)) => {
                        serde_json::to_string_pretty(&json!({ "files": files }))
                            .map_err(|e| ToolError(e.to_string()))
                    }
                    Outcome::Done(Exported::Workspace { .. }) => {
                        Err("the workspace archive downloads over REST only".into())
                    }
                    Outcome::Pending(_) => Err("the export still needs an approval".into()),
                }
            }
            McpTool::ListParticipants | McpTool::ReadManifest => {
                let room = crate::http::rooms::room_view(&self.app, &c.user, &c.room).await?;
                let mut v = serde_json::to_value(&room).map_err(|e| ToolError(e.to_string()))?;
                if tool == McpTool::ListParticipants {
                    let agents = self
                        .app
                        .ops
                        .store
                        .agents(&c.room)
                        .await
                        .map_err(|e| ToolError::from(ApiError::from(e)))?;
                    v = json!({
                        "participants": v["participants"],
                        "agents": agents.into_iter().filter(|a| a.revoked_at.is_none()).collect::<Vec<_>>(),
                    });
                }
                serde_json::to_string_pretty(&v).map_err(|e| ToolError(e.to_string()))
            }
            McpTool::ReadSpend => {
                room_capabilities(&self.app, &c.room, &c.user).await?;
                let v = self.app.ops.spend_view(&c.room).await?;
                serde_json::to_string_pretty(&v).map_err(|e| ToolError(e.to_string()))
            }
            McpTool::TerminalRead => {
                let actor = c.user.actor(&self.app).await?;
                self.app.ops.capabilities(&c.room, &actor).await?;
                let max = match args.get("max_bytes") {
                    None | Some(Value::Null) => READ_BYTES,
                    Some(v) => v
                        .as_u64()
                        .and_then(|n| usize::try_from(n).ok())
                        .filter(|n| (1..=MAX_READ_BYTES).contains(n))
                        .ok_or("max_bytes is 1 to 65536")?,
                };
                let (hub, joined) = self
                    .app
                    .ops
                    .join_terminal(&c.room, &actor, (80, 24))
                    .await?;
                let tail =
                    joined.scrollback[joined.scrollback.len().saturating_sub(max)..].to_vec();
                self.app
                    .ops
                    .sandboxes
                    .leave(&c.room, &hub, joined.viewer)
                    .await;
                Ok(plain(&tail))
            }
            McpTool::TerminalSend => {
                let text = arg(args, "text")?;
                if text.is_empty() || text.len() > MAX_LINE_BYTES {
                    return Err("text is 1 to 4096 bytes".into());
                }
                let wait_ms = match args.get("wait_ms") {
                    None | Some(Value::Null) => 1000,
                    Some(v) => v
                        .as_u64()
                        .filter(|n| *n <= MAX_TERMINAL_WAIT_MS)
                        .ok_or("wait_ms is 0 to 10000")?,
                };
                let approval_wait = wait_of(args)?;
                self.terminal_send(c, text, wait_ms, approval_wait).await
            }
        }
    }
}

impl Mcp {
    /// Types `text` (its newlines as Enter) into the room's terminal as the caller, through the
    /// same operation as the terminal socket (`crate::ops::typing`), and answers what the
    /// terminal printed within `wait_ms`. A line that waits for an approval is typed once it
    /// is approved (waiting at most `approval_wait`).
    async fn terminal_send(
        &self,
        c: &Caller,
        text: &str,
        wait_ms: u64,
        approval_wait: Duration,
    ) -> Answer {
        let data = Bytes::from(text.replace('\n', "\r"));
        let actor = c.user.actor(&self.app).await?;
        let (rights, _) = self
            .app
            .ops
            .rights(&c.room, &actor, Capability::Type)
            .await?;
        let (hub, mut joined) = self
            .app
            .ops
            .join_terminal(&c.room, &actor, (80, 24))
            .await?;
        // Shown in the terminal by its name, marked as an agent.
        let name = self.shown_name(c).await;
        let mut typist = Typist::new(actor, hub, joined.viewer).shown_as(name);
        let mut retried = false;
        let commands = loop {
            let may_type = rights.may_act(self.app.ops.clock.now_ms());
            let typed = self
                .app
                .ops
                .type_keys(&c.room, &mut typist, may_type, data.clone())
                .await;
            let why = match typed {
                Ok(Typed::Sent { commands }) => break commands,
                Ok(Typed::NoType) => {
                    "refused: missing capability type; nothing was typed".to_owned()
                }
                Ok(Typed::Refused(why)) => format!("refused: {why}; nothing was typed"),
                Ok(Typed::Pending(id)) if !retried => {
                    retried = true;
                    match self
                        .decided(c, &id, approval_wait, "nothing was typed")
                        .await
                    {
                        Ok(()) => continue,
                        Err(e) => e.0,
                    }
                }
                Ok(Typed::Pending(_)) => "the line still needs an approval".to_owned(),
                Err(e) => ToolError::from(ApiError::from(e)).0,
            };
            self.app.ops.leave_terminal(&c.room, typist).await;
            return Err(ToolError(why));
        };
        let mut out = Vec::new();
        let until = tokio::time::Instant::now() + Duration::from_millis(wait_ms);
        while out.len() < MAX_READ_BYTES {
            match tokio::time::timeout_at(until, joined.rx.recv()).await {
                Ok(Some(crate::terminal::TermOut::Output(b))) => out.extend_from_slice(&b),
                Ok(Some(crate::terminal::TermOut::Event(said))) => {
                    // Someone else has the terminal: nothing was typed.
                    if let crate::terminal::TermEvent::FloorRefused { reason, .. } = &said.event {
                        self.app.ops.untyped(&c.room, &typist, commands);
                        self.app.ops.leave_terminal(&c.room, typist).await;
                        return Err(format!("refused: {reason}; nothing was typed").into());
                    }
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
        self.app.ops.leave_terminal(&c.room, typist).await;
        Ok(plain(&out))
    }
}

/// Terminal bytes as plain text: escape sequences (CSI, OSC, two-byte escapes) removed, carriage
/// returns dropped, invalid UTF-8 replaced.
fn plain(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(ch) = chars.next() {
        match ch {
            '\u{1b}' => match chars.next() {
                // CSI: parameters and intermediates up to a final byte in @..~.
                Some('[') => {
                    for c in chars.by_ref() {
                        if ('@'..='~').contains(&c) {
                            break;
                        }
                    }
                }
                // OSC: up to BEL or ESC \.
                Some(']') => {
                    while let Some(c) = chars.next() {
                        if c == '\u{7}' || (c == '\u{1b}' && chars.next_if_eq(&'\\').is_some()) {
                            break;
                        }
                    }
                }
                _ => {}
            },
            '\r' => {}
            c => out.push(c),
        }
    }
    out
}

/// A call's `wait_s` (default [`WAIT_S`], at most [`MAX_WAIT_S`]).
fn wait_of(args: &Map<String, Value>) -> Result<Duration, ToolError> {
    match args.get("wait_s") {
        None | Some(Value::Null) => Ok(Duration::from_secs(WAIT_S)),
        Some(v) => v
            .as_u64()
            .filter(|s| *s <= MAX_WAIT_S)
            .map(Duration::from_secs)
            .ok_or_else(|| ToolError(format!("wait_s is 0 to {MAX_WAIT_S}"))),
    }
}

impl Mcp {
    /// Waits (at most `wait`) until approval `id` is decided: `Ok` once approved; a denial,
    /// an expiry or the wait running out is an error saying so (`otherwise`: what that means).
    async fn decided(
        &self,
        c: &Caller,
        id: &str,
        wait: Duration,
        otherwise: &str,
    ) -> Result<(), ToolError> {
        use crate::ops::approvals::Waited;
        let waited = self
            .app
            .ops
            .wait_for_decision(&c.room, id, wait)
            .await
            .map_err(|e| match e {
                crate::ops::OpError::NotFound => ToolError(format!("approval {id} is gone")),
                e => ToolError::from(ApiError::from(e)),
            })?;
        match waited {
            Waited::Approved => Ok(()),
            Waited::Denied(by) => Err(ToolError(format!("denied (by {by}): {otherwise}"))),
            Waited::Expired => Err(ToolError(format!("approval {id} expired: {otherwise}"))),
            Waited::Undecided => Err(ToolError(format!(
                "no decision yet: approval {id} waits for someone who holds approve; \
                 call again with approval_id {id} once it is approved"
            ))),
        }
    }
}

impl ServerHandler for Mcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .build(),
        )
        .with_server_info(Implementation::new("coderoom", env!("CARGO_PKG_VERSION")))
        .with_instructions(
            "You are a participant of a Coderoom room: its files are shared live with people. \
             Each tool is allowed or refused by your capabilities, like a person's action.",
        )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let c = caller(&context)?;
        // Bounded per caller; a refusal here is not audited (it would let a caller fill the
        // chain), the agent reads when to try again.
        if let Err(wait) = self.calls.take(&c.user.id) {
            return Ok(CallToolResult::error(vec![ContentBlock::text(format!(
                "too many tool calls: try again in {} ms",
                wait.as_millis().max(1)
            ))])
            .into());
        }
        // Each call is metered; past the room's (or this agent's) budget of tool calls it is
        // refused, saying which budget (told to the room once, when it was reached).
        match self
            .app
            .ops
            .spend
            .try_charge(&c.room, &c.user.id, crate::spend::Meter::ToolCalls, 1)
            .await
        {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                return Ok(
                    CallToolResult::error(vec![ContentBlock::text(format!("refused: {e}"))]).into(),
                )
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot read the room's spend");
                return Ok(CallToolResult::error(vec![ContentBlock::text(
                    "the room's spend cannot be read now; try again",
                )])
                .into());
            }
        }
        let args = request.arguments.unwrap_or_default();
        let name = request.name.to_string();
        let answer = self.call(&c, &name, &args).await;
        let mut details = json!({ "tool": name, "ok": answer.is_ok() });
        if let Some(path) = args.get("path").and_then(Value::as_str) {
            details["path"] = json!(path);
        }
        let entry = match &answer {
            Ok(_) => Entry::act(Act::ToolCall, Verdict::Allow, details),
            Err(e) => Entry::act(Act::ToolCall, Verdict::Deny, details).because(e.to_string()),
        };
        let _ = self
            .app
            .ops
            .record(&c.room, &c.user.id, entry, crate::store::Change::None)
            .await;
        Ok(match answer {
            Ok(text) => CallToolResult::success(vec![ContentBlock::text(text)]),
            Err(e) => CallToolResult::error(vec![ContentBlock::text(e.0)]),
        }
        .into())
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let c = caller(&context)?;
        let texts = self
            .texts(&c)
            .await
            .map_err(|e| ErrorData::invalid_request(e.0, None))?;
        Ok(ListResourcesResult::with_all_items(
            texts
                .keys()
                .map(|p| {
                    Resource::new(format!("{RESOURCE_PREFIX}{p}"), p.clone())
                        .with_mime_type("text/plain")
                })
                .collect(),
        ))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let c = caller(&context)?;
        let path = request
            .uri
            .strip_prefix(RESOURCE_PREFIX)
            .ok_or_else(|| ErrorData::resource_not_found("not a room:/// URI", None))?;
        let texts = self
            .texts(&c)
            .await
            .map_err(|e| ErrorData::invalid_request(e.0, None))?;
        let text = texts
            .get(path)
            .ok_or_else(|| ErrorData::resource_not_found(format!("no file {path}"), None))?;
        Ok(ReadResourceResult::new(vec![ResourceContents::text(
            text.clone(),
            request.uri.clone(),
        )])
        .into())
    }
}

#[cfg(test)]
mod tests {
    use super::plain;

    #[test]
    fn terminal_output_reads_as_plain_text() {
        let raw = b"\x1b[?2004hcoder@coderoom:~$ echo hi\r\n\x1b[1;32mhi\x1b[0m\r\n\x1b]0;title\x07done\xff";
        assert_eq!(plain(raw), "coder@coderoom:~$ echo hi\nhi\ndone\u{fffd}");
    }
}
