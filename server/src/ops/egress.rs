//! The room's network allowlist: shown to anyone who may observe the room; changed as a whole
//! by a holder of `approve` (joining a room never widens what its sandbox reaches); one rule
//! added by a holder of `approve` at once, or by a holder of `edit` with someone else's
//! approval of exactly that rule. Read, decided and written under the audit lock, so a
//! concurrent change is never lost.

use crate::egress::policy::{Rule, PRESETS};
use crate::egress::Policy;
use crate::ids::RoomId;
use crate::ops::approvals::Allowed;
use crate::ops::record::{Act, Entry, Verdict};
use crate::ops::{Actor, OpError, Ops, Outcome};
use crate::store::Change;
use coderoom_authz::{Action, Capability};
use serde_json::{json, Value};

/// What a change of the policy did, for the audit record.
fn diff(before: &Policy, after: &Policy) -> Value {
    let added: Vec<&String> = after
        .allow
        .iter()
        .chain(&after.presets)
        .filter(|r| !before.allow.contains(r) && !before.presets.contains(r))
        .collect();
    let removed: Vec<&String> = before
        .allow
        .iter()
        .chain(&before.presets)
        .filter(|r| !after.allow.contains(r) && !after.presets.contains(r))
        .collect();
    json!({
        "allow": after.allow, "presets": after.presets, "added": added, "removed": removed,
    })
}

fn stored(room_id: &RoomId, p: &Policy) -> Result<Change, OpError> {
    Ok(Change::SetEgress {
        room_id: room_id.clone(),
        policy: serde_json::to_string(p).map_err(|_| OpError::Internal)?,
    })
}

impl Ops {
    /// The room's egress as it is shown: its allowlist, presets, recent refusals and counters
    /// (not found unless `actor` may observe the room).
    pub(crate) async fn egress(&self, room_id: &RoomId, actor: &Actor) -> Result<Value, OpError> {
        self.capabilities(room_id, actor).await?;
        Ok(self.egress_view(room_id).await)
    }

    async fn egress_view(&self, room_id: &RoomId) -> Value {
        let policy = self.egress.policy(room_id).await;
        let presets: Vec<Value> = PRESETS
            .iter()
            .map(|(name, label, hosts)| json!({ "name": name, "label": label, "hosts": hosts }))
            .collect();
        let mut v = json!({
            "allow": policy.allow,
            "presets": policy.presets,
            "available_presets": presets,
        });
        if let (Some(out), Value::Object(activity)) =
            (v.as_object_mut(), self.egress.activity(room_id))
        {
            out.extend(activity);
        }
        v
    }

    /// Replaces the policy (either list `None`: unchanged); needs `approve`.
    pub(crate) async fn set_egress(
        &self,
        room_id: &RoomId,
        actor: &Actor,
        allow: Option<Vec<String>>,
        presets: Option<Vec<String>>,
    ) -> Result<Value, OpError> {
        let locked = self.audit.lock().await;
        let before = self.egress.policy(room_id).await;
        let after = Policy {
            allow: allow.unwrap_or_else(|| before.allow.clone()),
            presets: presets.unwrap_or_else(|| before.presets.clone()),
        }
        .checked()
        .map_err(|e| OpError::Invalid(e.to_string()))?;
        let details = diff(&before, &after);
        let action = Action::Use(Capability::Approve);
        let proof = self
            .authorize_locked(&locked, room_id, actor, action, details.clone())
            .await?;
        let entry = Entry::act(Act::SetEgress, Verdict::Allow, details);
        self.write(
            &locked,
            room_id,
            proof.actor(),
            entry,
            stored(room_id, &after)?,
        )
        .await?;
        drop(locked);
        Ok(self.egress_view(room_id).await)
    }

    /// Adds one rule (see the module's text); the approval is spent with the change.
    pub(crate) async fn allow_egress(
        &self,
        room_id: &RoomId,
        actor: &Actor,
        rule: &str,
        approval_id: Option<&str>,
    ) -> Result<Outcome<Value>, OpError> {
        let rule = rule.trim().to_ascii_lowercase();
        Rule::parse(&rule).map_err(|e| OpError::Invalid(e.to_string()))?;
        let params = json!({ "rule": rule }).to_string();
        let approval = self.presented(room_id, approval_id).await?;
        let action = Action::AllowEgress { params, approval };
        let Allowed { proof, approval } = match self
            .ask(room_id, actor, action, json!({ "rule": rule }))
            .await?
        {
            Outcome::Done(allowed) => allowed,
            Outcome::Pending(id) => return Ok(Outcome::Pending(id)),
        };
        let locked = self.audit.lock().await;
        let before = self.egress.policy(room_id).await;
        let mut after = before.clone();
        if !after.allow.contains(&rule) {
            after.allow.push(rule.clone());
        }
        let after = after
            .checked()
            .map_err(|e| OpError::Invalid(e.to_string()))?;
        let mut details = diff(&before, &after);
        details["approval_id"] = json!(approval);
        // The approval is spent with the change, in one transaction.
        let change = stored(room_id, &after)?.spending(approval);
        let entry = Entry::of(proof.action(), Verdict::Allow, details);
        self.write(&locked, room_id, proof.actor(), entry, change)
            .await
            .map_err(OpError::spent_approval)?;
        drop(locked);
        Ok(Outcome::Done(self.egress_view(room_id).await))
    }
}
