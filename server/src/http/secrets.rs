//! Secrets: `POST /api/rooms/{id}/secrets` (needs `add_secret`), `GET` (their rules, never
//! their values), `DELETE /api/rooms/{id}/secrets/{name}`. A value is sealed before anything else
//! happens to it (`crate::secrets`); no response, log line or audit record carries it.

use crate::http::extract::Ids;
use crate::http::guard::{authorize, room_capabilities};
use crate::http::ApiError;
use crate::http::AppState;
use crate::http::AuthUser;
use crate::ids::RoomId;
use crate::ops::record::{Act, Entry, Verdict};
use crate::store::{Change, SecretRule, StoreError};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{delete, get};
use axum::Json;
use axum::Router;
use coderoom_authz::{Action, Capability};
use serde::Deserialize;
use serde_json::json;

/// Largest value (an API key, a token).
const MAX_VALUE_BYTES: usize = 8 << 10;
/// Hosts one secret may go to.
const MAX_HOSTS: usize = 32;
/// Secrets one room may hold.
pub(crate) const MAX_SECRETS: usize = 100;

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/rooms/{id}/secrets", get(list).post(add))
        .route("/api/rooms/{id}/secrets/{name}", delete(remove))
        .route(
            "/api/rooms/{id}/secrets-policy",
            axum::routing::put(set_policy),
        )
}

/// The request. No `Debug`: it holds the value.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AddSecret {
    name: String,
    value: String,
    hosts: Vec<String>,
    #[serde(default = "default_header")]
    header: String,
    #[serde(default = "default_format")]
    format: String,
    /// An approval of exactly this rule, where the room's policy asks for one.
    #[serde(default)]
    approval_id: Option<String>,
}

fn default_header() -> String {
    "Authorization".into()
}

fn default_format() -> String {
    "Bearer {}".into()
}

/// A secret's name: what code inside sees as the placeholder's name (`CODEROOM_SECRET_<NAME>`,
/// holding a placeholder the egress proxy swaps for the value on the way out).
fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
        && !name.starts_with(|c: char| c.is_ascii_digit())
}

/// A host a rule may name: a DNS name, optionally `*.` and a name under it (no ports, no
/// addresses: the proxy resolves names itself).
fn valid_host(host: &str) -> bool {
    let name = host.strip_prefix("*.").unwrap_or(host);
    (1..=253).contains(&name.len())
        && name.contains('.')
        && name.split('.').all(|label| {
            (1..=63).contains(&label.len())
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
        && !name
            .split('.')
            .all(|l| l.bytes().all(|b| b.is_ascii_digit()))
}

/// An HTTP header name (a token), and not one the proxy or the connection owns.
fn valid_header(header: &str) -> bool {
    const OWNED: [&str; 6] = [
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "upgrade",
        "proxy-authorization",
    ];
    (1..=64).contains(&header.len())
        && header
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
        && !OWNED.contains(&header.to_ascii_lowercase().as_str())
}

async fn add(
    State(app): State<AppState>,
    user: AuthUser,
    Ids(room_id): Ids<RoomId>,
    Json(body): Json<AddSecret>,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse as _;
    if !valid_name(&body.name) {
        return Err(ApiError::BadRequest(
            "name must be 1 to 64 of A-Z, 0-9 and _, not starting with a digit",
        ));
    }
    if body.value.is_empty()
        || body.value.len() > MAX_VALUE_BYTES
        || body.value.bytes().any(|b| b.is_ascii_control())
    {
        return Err(ApiError::BadRequest(
            "value must be 1 to 8192 bytes without control characters",
        ));
    }
    let mut hosts: Vec<String> = body.hosts.iter().map(|h| h.to_ascii_lowercase()).collect();
    hosts.sort();
    hosts.dedup();
    if hosts.is_empty() || hosts.len() > MAX_HOSTS || !hosts.iter().all(|h| valid_host(h)) {
        return Err(ApiError::BadRequest(
            "hosts must list 1 to 32 host names (a leading *. allowed; no addresses or ports)",
        ));
    }
    if !valid_header(&body.header) {
        return Err(ApiError::BadRequest(
            "header must be a request header name the proxy does not own",
        ));
    }
    if body.format.matches("{}").count() != 1
        || body.format.len() > 256
        || body.format.bytes().any(|b| b.is_ascii_control())
    {
        return Err(ApiError::BadRequest(
            "format must hold {} (the value) exactly once, in at most 256 printable bytes",
        ));
    }
    let details = json!({ "name": body.name, "hosts": hosts, "header": body.header });
    // Where the room's policy asks, someone else approves exactly this rule (never the value:
    // the one who asked sends it again with the approval; nothing is kept meanwhile).
    let params = json!({
        "name": body.name, "hosts": hosts, "header": body.header, "format": body.format,
    })
    .to_string();
    let action = Action::AddSecret {
        params,
        approval: crate::http::approvals::presented(&app, &room_id, body.approval_id.as_deref())
            .await?,
        approval_required: app.store.secrets_need_approval(&room_id).await?,
    };
    let (proof, approval) =
        match crate::http::approvals::gate(&app, &room_id, &user, action, details.clone()).await? {
            crate::http::approvals::Gate::Allowed { proof, approval } => (proof, approval),
            crate::http::approvals::Gate::Pending(response) => return Ok(response),
        };
    let existing = app.store.secret_rules(&room_id).await?;
    let replaces = existing.iter().any(|r| r.name == body.name);
    if !replaces && existing.len() >= MAX_SECRETS {
        return Err(ApiError::BadRequest("a room holds at most 100 secrets"));
    }
    let sealed = app.vault.seal(&room_id, &body.name, body.value.as_bytes());
    drop(body.value);
    let rule = SecretRule {
        name: body.name,
        hosts,
        header: body.header,
        format: body.format,
        created_by: proof.actor().to_owned(),
        created_at: app.clock.now_ms(),
        last_used_at: None,
    };
    let mut details = details;
    details["replaced"] = json!(replaces);
    details["approval_id"] = json!(approval);
    let change = Change::PutSecret {
        room_id: room_id.to_string(),
        rule: rule.clone(),
        sealed,
    };
    // The approval is spent with the secret, in one transaction.
    let change = change.spending(approval);
    match app
        .audit
        .record(
            &room_id,
            proof.actor(),
            "add_secret",
            "allow",
            "",
            details,
            change,
        )
        .await
    {
        Ok(_) => {}
        Err(StoreError::Conflict) => {
            return Err(ApiError::Denied(
                coderoom_authz::DenyReason::AlreadyDecided.to_string(),
            ))
        }
        Err(e) => return Err(e.into()),
    }
    // A running sandbox gets the new placeholder for its next commands.
    app.sandboxes.egress_changed(&room_id).await;
    Ok((StatusCode::CREATED, Json(rule)).into_response())
}

/// `PUT /api/rooms/{id}/secrets-policy` `{"add_needs_approval": true | false}`: whether adding
/// a secret needs someone else's approval of its rule. Room governance: needs `approve`.
/// Audited.
async fn set_policy(
    State(app): State<AppState>,
    user: AuthUser,
    Ids(room_id): Ids<RoomId>,
    Json(body): Json<SecretsPolicy>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let details = json!({ "add_needs_approval": body.add_needs_approval });
    let change = Change::SetSecretsPolicy {
        room_id: room_id.to_string(),
        needs_approval: body.add_needs_approval,
    };
    let actor = user.actor(&app).await?;
    let entry = Entry::act(Act::SetSecretsPolicy, Verdict::Allow, details.clone());
    app.ops
        .use_and_record(&room_id, &actor, Capability::Approve, entry, change)
        .await?;
    Ok(Json(details))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SecretsPolicy {
    add_needs_approval: bool,
}

async fn list(
    State(app): State<AppState>,
    user: AuthUser,
    Ids(room_id): Ids<RoomId>,
) -> Result<Json<Vec<SecretRule>>, ApiError> {
    room_capabilities(&app, &room_id, &user).await?;
    Ok(Json(app.store.secret_rules(&room_id).await?))
}

async fn remove(
    State(app): State<AppState>,
    user: AuthUser,
    Path((room, name)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let room_id = RoomId::parse(&room).ok_or(ApiError::NotFound)?;
    if !valid_name(&name) {
        return Err(ApiError::NotFound);
    }
    let details = json!({ "name": name });
    let proof = authorize(
        &app,
        &room_id,
        &user,
        Action::Use(Capability::AddSecret),
        details.clone(),
    )
    .await?;
    match app
        .audit
        .record(
            &room_id,
            proof.actor(),
            "remove_secret",
            "allow",
            "",
            details,
            Change::RemoveSecret {
                room_id: room_id.to_string(),
                name,
            },
        )
        .await
    {
        Ok(_) => {
            app.sandboxes.egress_changed(&room_id).await;
            Ok(StatusCode::NO_CONTENT)
        }
        Err(StoreError::Conflict) => Err(ApiError::NotFound),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_are_checked() {
        assert!(valid_name("OPENAI_KEY") && valid_name("A1"));
        assert!(
            !valid_name("lower") && !valid_name("1ST") && !valid_name("") && !valid_name("A-B")
        );
        assert!(valid_host("api.example.com") && valid_host("*.crates.io"));
        for bad in [
            "localhost",
            "127.0.0.1",
            "api.example.com:443",
            "*.",
            "a..b",
            "-a.com",
            "EXAMPLE.COM x",
        ] {
            assert!(!valid_host(bad), "{bad}");
        }
        assert!(valid_header("Authorization") && valid_header("x-api-key"));
        for bad in ["Host", "content-length", "X Key", ""] {
            assert!(!valid_header(bad), "{bad}");
        }
    }
}
