//! Previews (the policy; the preview origin that serves them is `http::previews`): a port
//! inside the room's sandbox, opened to the room's members by a holder of `publish`, or to
//! everyone with someone else's approval as well (it waits as `pending_approval`, its
//! approvers told by mail, and becomes active once approved, its lifetime starting then).

use crate::ids::{RoomId, UserId};
use crate::ops::approvals::Allowed;
use crate::ops::record::{Act, Entry, Verdict};
use crate::ops::{Actor, OpError, Ops, Outcome};
use crate::store::{Change, PreviewRow, PreviewState};
use coderoom_authz::{Action, Capability};
use serde_json::json;

/// Longest a preview may live.
const MAX_TTL_S: i64 = 7 * 24 * 3600;
/// Shortest.
const MIN_TTL_S: i64 = 10;
/// Previews one room holds (revoked and expired ones included, until they are swept).
const MAX_PREVIEWS: usize = 50;

/// A preview as asked for (the body of `POST .../previews`, MCP `request_preview`'s arguments).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NewPreview {
    pub(crate) port: u16,
    pub(crate) visibility: String,
    pub(crate) ttl_s: i64,
}

/// `3600` -> "1 hour", and so on, for mails and pages.
pub(crate) fn human_span(s: i64) -> String {
    let (n, unit) = match s {
        s if s % 86_400 == 0 => (s / 86_400, "day"),
        s if s % 3600 == 0 => (s / 3600, "hour"),
        s if s % 60 == 0 => (s / 60, "minute"),
        s => (s, "second"),
    };
    format!("{n} {unit}{}", if n == 1 { "" } else { "s" })
}

impl Ops {
    /// Makes a preview of `new.port` as `actor`. A room preview is active at once; a public
    /// one waits for its approval (`approval_id` of the row), which its approvers are told of.
    pub(crate) async fn create_preview(
        &self,
        room_id: &RoomId,
        actor: &Actor,
        new: NewPreview,
    ) -> Result<PreviewRow, OpError> {
        if new.port == 0 || new.port == coderoom_sandbox::proto::EGRESS_PORT {
            return Err(OpError::Bad(
                "port must be a port a program inside listens on",
            ));
        }
        if !(MIN_TTL_S..=MAX_TTL_S).contains(&new.ttl_s) {
            return Err(OpError::Bad("ttl_s must be from 10 to 604800 (a week)"));
        }
        let public = match new.visibility.as_str() {
            "room" => false,
            "public" => true,
            _ => return Err(OpError::Bad("visibility is \"room\" or \"public\"")),
        };
        let details = json!({ "port": new.port, "visibility": new.visibility, "ttl_s": new.ttl_s });
        // One act, one name: a public preview is `public_preview` whether it is refused, waits
        // for its approval or is made; a room preview is `publish`.
        let (by, approval, decided) = if public {
            let action = Action::PublicPreview {
                params: details.to_string(),
                approval: None,
            };
            match self
                .ask(room_id, actor, action.clone(), details.clone())
                .await?
            {
                Outcome::Pending(id) => {
                    self.tell_approvers(room_id, actor, new.port, new.ttl_s)
                        .await?;
                    (actor.id.clone(), Some(id), action)
                }
                // Never without an approval; kept total for the type.
                Outcome::Done(Allowed { proof, .. }) => {
                    (UserId::known(proof.actor()), None, action)
                }
            }
        } else {
            let action = Action::Use(Capability::Publish);
            let proof = self
                .authorize(room_id, actor, action.clone(), details.clone())
                .await?;
            (UserId::known(proof.actor()), None, action)
        };
        if self.store.previews(room_id).await?.len() >= MAX_PREVIEWS {
            return Err(OpError::Invalid(format!(
                "a room holds at most {MAX_PREVIEWS} previews"
            )));
        }
        let now = self.now_ms();
        let mut id = [0u8; 16];
        rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut id);
        let row = PreviewRow {
            id: hex::encode(id),
            room_id: room_id.clone(),
            port: i64::from(new.port),
            visibility: new.visibility,
            state: if approval.is_some() {
                PreviewState::PendingApproval
            } else {
                PreviewState::Active
            },
            approval_id: approval,
            ttl_ms: new.ttl_s * 1000,
            created_by: by.to_string(),
            created_at: now,
            expires_at: now + new.ttl_s * 1000,
            hits: 0,
        };
        let mut details = details;
        details["id"] = json!(row.id);
        details["approval_id"] = json!(row.approval_id);
        let entry = Entry::of(&decided, Verdict::Allow, details);
        self.record(room_id, &by, entry, Change::CreatePreview(row.clone()))
            .await?;
        Ok(row)
    }

    /// Mails everyone who may approve a public preview (the requester's own party aside) that one waits for
    /// them; the room shows it in its Approvals and Previews panels.
    async fn tell_approvers(
        &self,
        room_id: &RoomId,
        requester: &Actor,
        port: u16,
        ttl_s: i64,
    ) -> Result<(), OpError> {
        let state = self.store.room_state(room_id).await?;
        let name = self
            .store
            .room(room_id)
            .await?
            .map(|r| r.name)
            .unwrap_or_default();
        let now = self.now_ms();
        let link = format!("{}/rooms/{room_id}", self.public_origin);
        for p in self.store.participants(room_id).await? {
            let may = state
                .capabilities_of(&p.user_id, now)
                .contains(Capability::Approve);
            // Not the requester's own party (an agent's sponsor cannot approve for it).
            if state.same_party(&requester.id, &p.user_id) || !may {
                continue;
            }
            self.mailer.send(crate::accounts::mail::Mail {
                to: p.email,
                subject: "A public preview waits for your approval".into(),
                body: format!(
                    "{} asks to make port {port} of the room \"{name}\" public for {}\r\n\
                     (anyone with its link could open it).\r\n\r\n\
                     Approve or deny it in the room: {link}\r\n",
                    requester.email,
                    human_span(ttl_s),
                ),
            });
        }
        Ok(())
    }

    /// The room's preview `pid` (not found when it is another room's).
    pub(crate) async fn preview(&self, room_id: &RoomId, pid: &str) -> Result<PreviewRow, OpError> {
        match self.store.preview(pid).await? {
            Some(p) if p.room_id == room_id.as_str() => Ok(p),
            _ => Err(OpError::NotFound),
        }
    }

    /// Revokes preview `pid` as `actor` (needs `publish`): the row as it was. The preview
    /// origin ends its connections (the caller's part: it holds them).
    pub(crate) async fn revoke_preview(
        &self,
        room_id: &RoomId,
        actor: &Actor,
        pid: &str,
    ) -> Result<PreviewRow, OpError> {
        let p = self.preview(room_id, pid).await?;
        let details = json!({ "id": p.id, "port": p.port, "visibility": p.visibility });
        let proof = self
            .authorize(
                room_id,
                actor,
                Action::Use(Capability::Publish),
                details.clone(),
            )
            .await?;
        let entry = Entry::act(Act::RevokePreview, Verdict::Allow, details);
        let change = Change::SetPreviewState {
            id: p.id.clone(),
            state: PreviewState::Revoked,
            expires_at: p.expires_at,
        };
        self.record(room_id, proof.actor(), entry, change).await?;
        Ok(p)
    }

    /// A public preview waiting for an approval that has been given becomes active now (its
    /// lifetime starts then); the approval is spent with the change.
    pub(crate) async fn activate_if_approved(&self, p: PreviewRow) -> Result<PreviewRow, OpError> {
        let (Some(approval), PreviewState::PendingApproval) = (&p.approval_id, p.state) else {
            return Ok(p);
        };
        let Some(a) = self.store.approval(&p.room_id, approval).await? else {
            return Ok(p);
        };
        if a.used || !matches!(a.decided, Some((_, true))) {
            return Ok(p);
        }
        // Approved by someone the rule accepts: not the requester, nor an agent's sponsor.
        let state = self.store.room_state(&p.room_id).await?;
        if !coderoom_authz::granted_by_another(&a, &state) {
            return Ok(p);
        }
        let expires_at = self.now_ms() + p.ttl_ms;
        let change = Change::SetPreviewState {
            id: p.id.clone(),
            state: PreviewState::Active,
            expires_at,
        }
        .spending(approval.clone());
        let details = json!({ "id": p.id, "approval_id": approval });
        let entry = Entry::act(Act::ActivatePreview, Verdict::Allow, details);
        match self.record(&p.room_id, "system", entry, change).await {
            Ok(_) | Err(OpError::Store(crate::store::StoreError::Conflict)) => {}
            Err(e) => return Err(e),
        }
        Ok(self.store.preview(&p.id).await?.unwrap_or(p))
    }
}
