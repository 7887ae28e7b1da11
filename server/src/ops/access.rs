//! Who may do what in a room: invites, participant changes and removals, and reading the
//! audit log. Each is decided by `coderoom_authz::decide`, recorded (allowed or refused) in the
//! room's audit chain in the same transaction as the change, and told to the loaded room and
//! the open sockets so it applies from their next frame.

use crate::accounts::sessions::hash_token;
use crate::ids::{RoomId, UserId};
use crate::ops::record::{Act, Entry, Verdict};
use crate::ops::{Actor, OpError, Ops};
use crate::room::RoomCmd;
use crate::store::{Change, InviteRow, StoreError};
use coderoom_authz::{decide, Action, Capability, CapabilitySet, Decision, Participant, Role};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// Invites one person may send by email in an hour (each one a mail to any address).
const MAX_EMAILED_INVITES_PER_HOUR: i64 = 20;
/// Longest invite lifetime.
const MAX_INVITE_TTL_S: u64 = 30 * 24 * 3600;
/// Most uses one invite may allow.
const MAX_INVITE_USES: i64 = 1000;

/// A change of a participant's rights, as asked for (the body of `PATCH .../participants/ID`).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RightsChange {
    pub(crate) role: Option<String>,
    #[serde(default)]
    pub(crate) grant: Vec<String>,
    #[serde(default)]
    pub(crate) revoke: Vec<String>,
    /// When the granted capabilities lapse (Unix ms); absent for no expiry.
    pub(crate) expires_at: Option<i64>,
}

/// `POST /api/rooms/{id}/invites`: what the invite is to hold and who it is for.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct InviteAsked {
    pub(crate) role: String,
    pub(crate) ttl_s: u64,
    pub(crate) max_uses: i64,
    /// The capabilities it grants, chosen (never more than its issuer holds); absent: the
    /// role's.
    #[serde(default)]
    pub(crate) capabilities: Option<Vec<String>>,
    /// The one address it is for: mailed the link, and the only account that may accept it.
    #[serde(default)]
    pub(crate) email: Option<String>,
}

/// Longest display name, in characters.
const MAX_DISPLAY_NAME: usize = 64;

/// A display name as kept: trimmed, `None` when blank; refused when it is too long, holds
/// control or direction-changing characters (which can make it read as someone else's), or an
/// `@` (which can make it read as someone's email).
pub(crate) fn display_name(raw: Option<&str>) -> Result<Option<String>, OpError> {
    let Some(name) = raw.map(str::trim).filter(|n| !n.is_empty()) else {
        return Ok(None);
    };
    if name.chars().count() > MAX_DISPLAY_NAME {
        return Err(OpError::Bad("a display name is at most 64 characters"));
    }
    // Invisible and direction-changing characters (format, line and paragraph separators):
    // with them a name can look like another.
    let hidden = |c: char| {
        matches!(c, '\u{00AD}' | '\u{061C}' | '\u{180E}' | '\u{200B}'..='\u{200F}'
            | '\u{2028}'..='\u{202E}' | '\u{2060}'..='\u{206F}' | '\u{FEFF}' | '\u{FFF9}'..='\u{FFFB}')
    };
    if name.chars().any(|c| c.is_control() || hidden(c)) {
        return Err(OpError::Bad(
            "a display name holds no control, invisible or direction characters",
        ));
    }
    // `@` and its look-alikes.
    if name.contains(['@', '\u{FF20}', '\u{FE6B}']) {
        return Err(OpError::Bad(
            "a display name holds no @ (it would read as an email)",
        ));
    }
    Ok(Some(name.to_owned()))
}

/// Chosen capabilities by name: known ones, `observe` among them.
fn chosen_capabilities(names: &[String]) -> Result<CapabilitySet, OpError> {
    let mut set = CapabilitySet::EMPTY;
    for n in names {
        let cap: Capability = n
            .trim()
            .parse()
            .map_err(|_| OpError::Invalid(format!("unknown capability {n:?}")))?;
        set = set.with(cap);
    }
    if !set.contains(Capability::Observe) {
        return Err(OpError::Bad("an invite's capabilities include observe"));
    }
    Ok(set)
}

/// A participant of `role` holding exactly `caps`, each no longer than `issuer` holds it
/// (`until`): the role's preset where the issuer holds it for good, the rest granted with the
/// issuer's expiry, what the preset has beyond `caps` removed. An invite never turns someone's
/// rights until tomorrow into rights for good.
fn participant_holding(
    role: Role,
    caps: CapabilitySet,
    until: impl Fn(Capability) -> coderoom_authz::Until,
) -> Participant {
    use coderoom_authz::Until;
    let preset = role.capabilities();
    let mut p = Participant::with_role(role);
    for cap in Capability::ALL {
        let expires_at = match until(cap) {
            Until::Forever => None,
            Until::At(t) => Some(t),
            Until::Never => {
                if preset.contains(cap) {
                    p.removed = p.removed.with(cap);
                }
                continue;
            }
        };
        let wanted = caps.contains(cap);
        if preset.contains(cap) && (!wanted || expires_at.is_some()) {
            p.removed = p.removed.with(cap);
        }
        if wanted && (!preset.contains(cap) || expires_at.is_some()) {
            p.extra.push(coderoom_authz::Grant {
                capability: cap,
                expires_at,
            });
        }
    }
    p
}

/// Why an invite can no longer be used at `now` (revoked, used up, expired), as a sentence for
/// the person holding the link; `None` while it can.
pub(crate) fn unusable(invite: &InviteRow, now: i64) -> Option<&'static str> {
    if invite.revoked_at.is_some() {
        Some("This invite link was revoked.")
    } else if invite.uses >= invite.max_uses {
        Some("This invite link is used up: it was already used as many times as it allows.")
    } else if invite.expires_at <= now {
        Some("This invite link has expired.")
    } else {
        None
    }
}

fn invite_token_ok(token: &str) -> bool {
    token.len() == 68
        && token.starts_with("inv_")
        && token[4..].bytes().all(|b| b.is_ascii_hexdigit())
}

impl Ops {
    /// The invite a link's token names (looked up by the token's hash), and that hash.
    pub(crate) async fn invite_by_token(
        &self,
        token: &str,
    ) -> Result<(String, InviteRow), OpError> {
        if !invite_token_ok(token) {
            return Err(OpError::NotFound);
        }
        let token_hash = hash_token(token);
        let invite = self
            .store
            .invite(&token_hash)
            .await?
            .ok_or(OpError::NotFound)?;
        Ok((token_hash, invite))
    }

    /// Makes an invite link for `role` (`invite`, and nothing beyond what `actor` holds).
    pub(crate) async fn create_invite(
        &self,
        room_id: &RoomId,
        actor: &Actor,
        asked: InviteAsked,
    ) -> Result<InviteCreated, OpError> {
        let InviteAsked {
            role,
            ttl_s,
            max_uses,
            capabilities,
            email,
        } = asked;
        let role: Role = role
            .parse()
            .map_err(|_| OpError::Bad("role must be owner, editor or viewer"))?;
        if ttl_s == 0 || ttl_s > MAX_INVITE_TTL_S {
            return Err(OpError::Bad("ttl_s must be 1 to 2592000"));
        }
        if !(1..=MAX_INVITE_USES).contains(&max_uses) {
            return Err(OpError::Bad("max_uses must be 1 to 1000"));
        }
        let chosen = match &capabilities {
            None => None,
            Some(names) => Some(chosen_capabilities(names)?),
        };
        let email = match email.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(e) => Some(
                crate::accounts::email::canonicalize(e)
                    .map_err(|_| OpError::Bad("email is not an email address"))?,
            ),
        };
        if email.is_some() && max_uses != 1 {
            return Err(OpError::Bad("an invite sent to an address has one use"));
        }
        if email.is_some()
            && self
                .store
                .emailed_invites_since(&actor.id, self.now_ms() - 3_600_000)
                .await?
                >= MAX_EMAILED_INVITES_PER_HOUR
        {
            return Err(OpError::Refused(format!(
                "at most {MAX_EMAILED_INVITES_PER_HOUR} invites an hour go by email: send a link instead"
            )));
        }
        // Chosen capabilities name their own role: the largest whose preset they hold (an
        // invite labelled "owner" never holds only observe).
        let role = match chosen {
            Some(c) => [Role::Owner, Role::Editor, Role::Viewer]
                .into_iter()
                .find(|r| r.capabilities().iter().all(|cap| c.contains(cap)))
                .unwrap_or(Role::Viewer),
            None => role,
        };
        let grants = chosen.unwrap_or_else(|| role.capabilities());
        let mut details = json!({ "role": role.as_str(), "ttl_s": ttl_s, "max_uses": max_uses });
        if chosen.is_some() {
            details["capabilities"] = json!(grants.names());
        }
        if let Some(e) = &email {
            details["email"] = json!(e);
        }
        let action = Action::CreateInvite { grants };
        let locked = self.audit.lock().await;
        let proof = self
            .authorize_locked(&locked, room_id, actor, action, details.clone())
            .await?;
        let mut raw = [0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut raw);
        let token = format!("inv_{}", hex::encode(raw));
        let ttl_ms = i64::try_from(ttl_s * 1000).unwrap_or(i64::MAX);
        let change = Change::CreateInvite {
            token_hash: hash_token(&token),
            room_id: room_id.clone(),
            role: role.as_str().into(),
            created_by: UserId::known(proof.actor()),
            expires_at: self.now_ms() + ttl_ms,
            max_uses,
            capabilities: chosen.map(|c| c.names().join(",")),
            email: email.clone(),
        };
        let entry = Entry::of(proof.action(), Verdict::Allow, details);
        self.write(&locked, room_id, proof.actor(), entry, change)
            .await?;
        drop(locked);
        let url = format!("{}/invite/{token}", self.public_origin);
        if let Some(to) = &email {
            let room = self
                .store
                .room(room_id)
                .await?
                .map(|r| r.name)
                .unwrap_or_default();
            let what = grants.names().join(", ");
            self.mailer.send(crate::accounts::mail::Mail {
                to: to.clone(),
                subject: format!("{} invites you to the room \"{room}\"", actor.email),
                body: format!(
                    "{} invites you to the room \"{room}\" on Coderoom, to {what}.\r\n\r\n\
                     Join with this link (log in as {to}; it works once, until it expires):\r\n\
                     {url}\r\n",
                    actor.email
                ),
            });
        }
        Ok(InviteCreated {
            token,
            url,
            sent_to: email,
        })
    }

    /// Sets the name account `user` is shown by in rooms (blank clears it): the name kept.
    pub(crate) async fn set_display_name(
        &self,
        user: &str,
        raw: Option<&str>,
    ) -> Result<Option<String>, OpError> {
        let name = display_name(raw)?;
        if let Some(n) = &name {
            if self.store.display_name_taken(user, n).await? {
                return Err(OpError::Conflict(
                    "someone else is shown by that name: choose another".into(),
                ));
            }
        }
        self.store.set_display_name(user, name.as_deref()).await?;
        Ok(name)
    }

    /// Joins `actor` to the room an invite link names, with its role, as its issuer may still
    /// grant it. A link that no longer works (used up, expired, revoked, its issuer's rights
    /// gone) is [`OpError::Gone`]; someone already in keeps their rights.
    pub(crate) async fn accept_invite(
        &self,
        actor: &Actor,
        token: &str,
    ) -> Result<Joined, OpError> {
        let locked = self.audit.lock().await;
        let (token_hash, invite) = self.invite_by_token(token).await?;
        let now = self.now_ms();
        if unusable(&invite, now).is_some() {
            return Err(OpError::Gone);
        }
        let role: Role = invite
            .role
            .parse()
            .map_err(|_| OpError::Store(StoreError::Corrupt))?;
        if invite.email.as_ref().is_some_and(|e| *e != actor.email) {
            return Err(OpError::Refused(
                "this invite was sent to another address: log in as the one it was sent to".into(),
            ));
        }
        let chosen = match &invite.capabilities {
            None => None,
            Some(names) => Some(
                chosen_capabilities(&names.split(',').map(str::to_owned).collect::<Vec<_>>())
                    .map_err(|_| OpError::Store(StoreError::Corrupt))?,
            ),
        };
        let state = self.store.room_state(&invite.room_id).await?;
        if state.participants.contains_key(actor.id.as_str()) {
            // Already in: an invite never changes existing rights.
            return Ok(Joined {
                room_id: invite.room_id.to_string(),
            });
        }
        let grants = chosen.unwrap_or_else(|| role.capabilities());
        let action = Action::AcceptInvite {
            issuer: invite.created_by.clone(),
            grants,
        };
        let details = json!({ "role": role.as_str(), "issuer": invite.created_by });
        let proof = match decide(&actor.principal(), &action, &state, now) {
            Decision::Allow(p) => p,
            Decision::Deny(reason) => {
                let entry = Entry::of(&action, Verdict::Deny, details).because(reason.to_string());
                self.write(&locked, &invite.room_id, &actor.id, entry, Change::None)
                    .await?;
                return Err(OpError::Gone);
            }
            Decision::NeedsApproval(_) => return Err(OpError::Gone),
        };
        let change = Change::AcceptInvite {
            token_hash,
            room_id: invite.room_id.clone(),
            user_id: UserId::known(proof.actor()),
            participant: participant_holding(role, grants, |cap| {
                state.until(&invite.created_by, cap, now)
            }),
            now,
        };
        let entry = Entry::of(proof.action(), Verdict::Allow, details);
        match self
            .write(&locked, &invite.room_id, proof.actor(), entry, change)
            .await
        {
            Ok(_) => {
                drop(locked);
                // Everyone in the room sees the newcomer at once (their people panels look
                // again).
                crate::ops::events::access_changed(
                    self,
                    invite.room_id.clone(),
                    proof.actor().to_owned(),
                    None,
                )
                .await;
                Ok(Joined {
                    room_id: invite.room_id.to_string(),
                })
            }
            // Used up, revoked, or the user was removed after the link was made.
            Err(OpError::Store(StoreError::Conflict)) => Err(OpError::Gone),
            Err(e) => Err(e),
        }
    }

    /// Withdraws an invite link: its creator may; so may anyone who could have created it.
    pub(crate) async fn revoke_invite(&self, actor: &Actor, token: &str) -> Result<(), OpError> {
        let locked = self.audit.lock().await;
        let (token_hash, invite) = self.invite_by_token(token).await?;
        if invite.created_by != actor.id {
            let action = Action::Use(Capability::Invite);
            let room_id =
                RoomId::parse(&invite.room_id).ok_or(OpError::Store(StoreError::Corrupt))?;
            self.authorize_locked(
                &locked,
                &room_id,
                actor,
                action,
                json!({ "revoke_invite": true }),
            )
            .await?;
        }
        let change = Change::RevokeInvite {
            token_hash,
            now: self.now_ms(),
        };
        let entry = Entry::act(
            Act::RevokeInvite,
            Verdict::Allow,
            json!({ "role": invite.role }),
        );
        self.write(&locked, &invite.room_id, &actor.id, entry, change)
            .await?;
        Ok(())
    }

    /// Changes `target`'s rights as `actor` asks (a role, capabilities granted until a time or
    /// revoked); its sockets and its agents follow at once.
    pub(crate) async fn change_participant(
        &self,
        room_id: &RoomId,
        actor: &Actor,
        target: &UserId,
        asked: RightsChange,
    ) -> Result<ParticipantRights, OpError> {
        let grant = CapabilitySet::parse_names(&asked.grant)
            .map_err(|_| OpError::Bad("unknown capability"))?;
        let revoke = CapabilitySet::parse_names(&asked.revoke)
            .map_err(|_| OpError::Bad("unknown capability"))?;
        let now = self.now_ms();
        if asked.expires_at.is_some_and(|t| t <= now) {
            return Err(OpError::Bad("expires_at must be in the future"));
        }
        if asked.expires_at.is_some() && grant.is_empty() {
            return Err(OpError::Bad("expires_at applies to granted capabilities"));
        }
        if asked.role.is_none() && grant.is_empty() && revoke.is_empty() {
            return Err(OpError::Bad(
                "give a role, or capabilities to grant or revoke",
            ));
        }
        let role = asked
            .role
            .as_deref()
            .map(str::parse::<Role>)
            .transpose()
            .map_err(|_| OpError::Bad("role must be owner, editor or viewer"))?;
        let locked = self.audit.lock().await;
        let state = self.store.room_state(room_id).await?;
        let before = state.participants.get(target.as_str()).cloned();
        let base = match (role, &before) {
            (Some(r), _) => Participant::with_role(r),
            (None, Some(p)) => p.clone(),
            // Decided below (outsiders get not found, participants "no such participant").
            (None, None) => Participant::with_role(Role::Viewer),
        };
        let after = base.granting(grant, asked.expires_at).revoking(revoke);
        let details = json!({
            "target": target,
            "from": before.as_ref().map(|p| p.capabilities(now).names()),
            "to": after.capabilities(now).names(),
            "expires_at": asked.expires_at,
        });
        let action = Action::ChangeParticipant {
            target: target.to_string(),
            after: after.clone(),
        };
        let proof = self
            .authorize_locked(&locked, room_id, actor, action, details.clone())
            .await?;
        let change = Change::SetParticipant {
            room_id: room_id.clone(),
            user_id: target.clone(),
            participant: after.clone(),
        };
        let entry = Entry::of(proof.action(), Verdict::Allow, details);
        self.write(&locked, room_id, proof.actor(), entry, change)
            .await?;
        drop(locked);
        let rights = crate::room::task::Rights::of(&after, Capability::Edit, now);
        self.rights_followed(room_id, target, rights, Some(actor.email.clone()))
            .await;
        Ok(ParticipantRights {
            capabilities: after.capabilities(now).names(),
            user_id: target.to_string(),
        })
    }

    /// Removes `target` from the room as `actor` decides (authorized and recorded in the
    /// room's chain); their sockets in the room close, and the agents they sponsor there lose
    /// their rights.
    pub(crate) async fn remove_participant(
        &self,
        room_id: &RoomId,
        actor: &Actor,
        target: &UserId,
    ) -> Result<(), OpError> {
        let details = json!({ "target": target });
        let action = Action::RemoveParticipant {
            target: target.to_string(),
        };
        let locked = self.audit.lock().await;
        let proof = self
            .authorize_locked(&locked, room_id, actor, action, details.clone())
            .await?;
        let change = Change::RemoveParticipant {
            room_id: room_id.clone(),
            user_id: target.clone(),
            now: self.now_ms(),
        };
        let entry = Entry::of(proof.action(), Verdict::Allow, details);
        self.write(&locked, room_id, proof.actor(), entry, change)
            .await?;
        drop(locked);
        let none = crate::room::task::Rights::NONE;
        self.rights_followed(room_id, target, none, Some(actor.email.clone()))
            .await;
        Ok(())
    }

    /// What follows a change of `target`'s rights to `rights`: the sockets here and on the
    /// other servers told (with who made it), the loaded room given them, and the agents
    /// `target` sponsors following.
    async fn rights_followed(
        &self,
        room_id: &RoomId,
        target: &UserId,
        rights: crate::room::task::Rights,
        by: Option<String>,
    ) {
        crate::ops::events::access_changed(self, room_id.clone(), target.to_string(), by).await;
        self.rooms
            .notify(
                room_id,
                RoomCmd::Access {
                    user_id: target.to_string(),
                    rights,
                    decided: std::time::Instant::now(),
                },
            )
            .await;
        let agents = self.sponsored_by(room_id, target).await;
        self.agents_changed(room_id, &agents).await;
    }

    /// The room's audit chain, for participants who observe and for system admins (who
    /// revoke and delete); not found for anyone else.
    pub(crate) async fn room_audit(
        &self,
        room_id: &RoomId,
        actor: &Actor,
    ) -> Result<Vec<AuditEntry>, OpError> {
        let who = actor.principal();
        let state = self.store.room_state(room_id).await?;
        let allowed = who.is_admin
            || matches!(
                decide(
                    &who,
                    &Action::Use(Capability::Observe),
                    &state,
                    self.now_ms()
                ),
                Decision::Allow(_)
            );
        if !allowed || self.store.room(room_id).await?.is_none() {
            return Err(OpError::NotFound);
        }
        self.chain_entries(room_id).await
    }

    /// Every record of audit chain `chain` (a room's id, or `system`), as the API gives them.
    pub(crate) async fn chain_entries(&self, chain: &str) -> Result<Vec<AuditEntry>, OpError> {
        let records = self.store.audit_records(chain).await?;
        // Agents by name, a revoked one too: their account's address is made up.
        let agents: std::collections::HashMap<String, (String, String)> = match RoomId::parse(chain)
        {
            Some(room) => self
                .store
                .agents(&room)
                .await?
                .into_iter()
                .map(|a| (a.agent_id.to_string(), (a.name, a.sponsor.to_string())))
                .collect(),
            None => Default::default(),
        };
        // People by email, a removed one too (the log outlives their participation).
        let mut emails: std::collections::HashMap<String, Option<String>> = Default::default();
        let mut names: std::collections::HashMap<String, Option<String>> = Default::default();
        let mut entries = Vec::with_capacity(records.len());
        for r in records {
            let details: Value = serde_json::from_str(&r.fields.details).unwrap_or(Value::Null);
            let target = details["target"].as_str().map(str::to_owned);
            let mut email_of = async |id: &str| -> Result<Option<String>, OpError> {
                if let Some(known) = emails.get(id) {
                    return Ok(known.clone());
                }
                let found = self.store.user_email(id).await?;
                emails.insert(id.to_owned(), found.clone());
                Ok(found)
            };
            let actor_email = email_of(&r.fields.actor).await?;
            let actor_name = match names.get(&r.fields.actor) {
                Some(n) => n.clone(),
                None => {
                    let n = self.store.display_name(&r.fields.actor).await?;
                    names.insert(r.fields.actor.clone(), n.clone());
                    n
                }
            };
            let actor_agent = match agents.get(&r.fields.actor) {
                Some((name, sponsor)) => Some(AgentNamed {
                    name: name.clone(),
                    sponsor_email: email_of(sponsor).await?,
                }),
                None => None,
            };
            let target_email = match &target {
                Some(t) => email_of(t).await?,
                None => None,
            };
            entries.push(AuditEntry {
                seq: r.seq,
                at: r.fields.at,
                details,
                actor: r.fields.actor,
                actor_email,
                actor_name,
                actor_agent,
                target_email,
                action: r.fields.action,
                decision: r.fields.decision,
                reason: r.fields.reason,
                details_json: r.fields.details,
                prev_hash: r.prev_hash,
                hash: r.hash,
            });
        }
        Ok(entries)
    }
}

/// `POST /api/rooms/{id}/invites`: the link, shown once.
#[derive(Serialize)]
pub(crate) struct InviteCreated {
    pub(crate) token: String,
    pub(crate) url: String,
    /// The address the link was mailed to, when it was sent to one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) sent_to: Option<String>,
}

/// `PATCH /api/rooms/{id}/participants/{user_id}`: what the participant may do now.
#[derive(Serialize)]
pub(crate) struct ParticipantRights {
    user_id: String,
    capabilities: Vec<&'static str>,
}

/// `POST /api/invites/{token}/accept`: the room the caller is now in.
#[derive(Serialize)]
pub(crate) struct Joined {
    pub(crate) room_id: String,
}

/// An agent as an audit record names it.
#[derive(Serialize)]
pub(crate) struct AgentNamed {
    name: String,
    sponsor_email: Option<String>,
}

/// One record of `GET /api/rooms/{id}/audit`.
#[derive(Serialize)]
pub(crate) struct AuditEntry {
    seq: i64,
    at: i64,
    actor: String,
    /// The actor's email, when the actor is an account (not covered by the hash).
    #[serde(skip_serializing_if = "Option::is_none")]
    actor_email: Option<String>,
    /// The name the actor chose to be shown by, when they did (not covered by the hash).
    #[serde(skip_serializing_if = "Option::is_none")]
    actor_name: Option<String>,
    /// When the actor is one of the room's agents: its name and its sponsor's email (not
    /// covered by the hash).
    #[serde(skip_serializing_if = "Option::is_none")]
    actor_agent: Option<AgentNamed>,
    /// The email of the account `details.target` names, when it does.
    #[serde(skip_serializing_if = "Option::is_none")]
    target_email: Option<String>,
    action: String,
    decision: String,
    reason: String,
    details: Value,
    /// The exact text the hash covers, so a client can verify the chain itself.
    details_json: String,
    prev_hash: String,
    hash: String,
}

#[cfg(test)]
mod display_name_tests {
    use super::display_name;

    #[test]
    fn a_display_name_is_trimmed_bounded_and_never_reads_as_someone_else() {
        assert_eq!(display_name(None).unwrap(), None);
        assert_eq!(display_name(Some("   ")).unwrap(), None);
        assert_eq!(
            display_name(Some("  Ana Lima ")).unwrap().as_deref(),
            Some("Ana Lima")
        );
        assert_eq!(
            display_name(Some(&"é".repeat(64)))
                .unwrap()
                .map(|n| n.chars().count()),
            Some(64)
        );
        for bad in [
            "é".repeat(65),
            "bob@example.com".into(),
            "Ana\nLima".into(),
            "Ana\u{202e}amiL".into(),
            "\u{2066}Ana".into(),
        ] {
            assert!(display_name(Some(&bad)).is_err(), "{bad:?}");
        }
    }
}

#[cfg(test)]
mod invite_tests {
    use super::participant_holding;
    use coderoom_authz::{Capability, CapabilitySet, Role, Until};

    #[test]
    fn an_invite_grants_nothing_longer_than_its_issuer_holds_it() {
        let now = 1_000;
        // The issuer holds observe and edit for good, approve until 5_000, nothing else.
        let issuer = |cap: Capability| match cap {
            Capability::Observe | Capability::Edit | Capability::Type => Until::Forever,
            Capability::Approve => Until::At(5_000),
            _ => Until::Never,
        };
        let chosen =
            CapabilitySet::of(&[Capability::Observe, Capability::Edit, Capability::Approve]);
        let p = participant_holding(Role::Editor, chosen, issuer);
        assert_eq!(p.until(Capability::Observe, now), Until::Forever);
        assert_eq!(p.until(Capability::Edit, now), Until::Forever);
        assert_eq!(p.until(Capability::Approve, now), Until::At(5_000));
        assert_eq!(p.until(Capability::Approve, 6_000), Until::Never);
        // Not chosen: not held, though the role's preset has it.
        assert_eq!(p.until(Capability::Type, now), Until::Never);
        assert_eq!(p.capabilities(now), chosen);
        // An owner invite from someone whose owner rights lapse: each lapses with theirs.
        let p = participant_holding(Role::Owner, Role::Owner.capabilities(), |cap| match cap {
            Capability::Observe => Until::Forever,
            _ => Until::At(2_000),
        });
        assert_eq!(p.until(Capability::Observe, 3_000), Until::Forever);
        assert_eq!(p.until(Capability::Delete, now), Until::At(2_000));
        assert_eq!(
            p.capabilities(3_000),
            CapabilitySet::of(&[Capability::Observe])
        );
    }
}
