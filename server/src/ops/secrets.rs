//! Secrets: a room's credentials for outside services, added by a holder of `add_secret`
//! (with someone else's approval of exactly its rule where the room's policy asks), removed
//! by one, the policy set by a holder of `approve`. A value is sealed before anything else
//! happens to it (`crate::secrets`); no response, log line or audit record carries it.

use crate::ids::RoomId;
use crate::ops::approvals::Allowed;
use crate::ops::record::{Act, Entry, Verdict};
use crate::ops::{Actor, OpError, Ops, Outcome};
use crate::store::{Change, SecretRule, StoreError};
use coderoom_authz::{Action, Capability};
use serde_json::json;

/// Largest value (an API key, a token).
const MAX_VALUE_BYTES: usize = 8 << 10;
/// Hosts one secret may go to.
const MAX_HOSTS: usize = 32;
/// Secrets one room may hold.
pub(crate) const MAX_SECRETS: usize = 100;

/// A secret as asked for. No `Debug`: it holds the value.
pub(crate) struct NewSecret {
    pub(crate) name: String,
    pub(crate) value: String,
    pub(crate) hosts: Vec<String>,
    pub(crate) header: String,
    pub(crate) format: String,
}

/// A secret's name: what code inside sees as the placeholder's name (`CODEROOM_SECRET_<NAME>`,
/// holding a placeholder the egress proxy swaps for the value on the way out).
pub(crate) fn valid_name(name: &str) -> bool {
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

impl Ops {
    /// Adds (or replaces) secret `new` as `actor`: its rule, or the approval it waits for.
    pub(crate) async fn add_secret(
        &self,
        room_id: &RoomId,
        actor: &Actor,
        new: NewSecret,
        approval_id: Option<&str>,
    ) -> Result<Outcome<SecretRule>, OpError> {
        if !valid_name(&new.name) {
            return Err(OpError::Bad(
                "name must be 1 to 64 of A-Z, 0-9 and _, not starting with a digit",
            ));
        }
        if new.value.is_empty()
            || new.value.len() > MAX_VALUE_BYTES
            || new.value.bytes().any(|b| b.is_ascii_control())
        {
            return Err(OpError::Bad(
                "value must be 1 to 8192 bytes without control characters",
            ));
        }
        let mut hosts: Vec<String> = new.hosts.iter().map(|h| h.to_ascii_lowercase()).collect();
        hosts.sort();
        hosts.dedup();
        if hosts.is_empty() || hosts.len() > MAX_HOSTS || !hosts.iter().all(|h| valid_host(h)) {
            return Err(OpError::Bad(
                "hosts must list 1 to 32 host names (a leading *. allowed; no addresses or ports)",
            ));
        }
        if !valid_header(&new.header) {
            return Err(OpError::Bad(
                "header must be a request header name the proxy does not own",
            ));
        }
        if new.format.matches("{}").count() != 1
            || new.format.len() > 256
            || new.format.bytes().any(|b| b.is_ascii_control())
        {
            return Err(OpError::Bad(
                "format must hold {} (the value) exactly once, in at most 256 printable bytes",
            ));
        }
        let details = json!({ "name": new.name, "hosts": hosts, "header": new.header });
        // Where the room's policy asks, someone else approves exactly this rule (never the
        // value: the one who asked sends it again with the approval; nothing is kept meanwhile).
        let params = json!({
            "name": new.name, "hosts": hosts, "header": new.header, "format": new.format,
        })
        .to_string();
        let action = Action::AddSecret {
            params,
            approval: self.presented(room_id, approval_id).await?,
            approval_required: self.store.secrets_need_approval(room_id).await?,
        };
        let Allowed { proof, approval } =
            match self.ask(room_id, actor, action, details.clone()).await? {
                Outcome::Done(allowed) => allowed,
                Outcome::Pending(id) => return Ok(Outcome::Pending(id)),
            };
        let existing = self.store.secret_rules(room_id).await?;
        let replaces = existing.iter().any(|r| r.name == new.name);
        if !replaces && existing.len() >= MAX_SECRETS {
            return Err(OpError::Bad("a room holds at most 100 secrets"));
        }
        let sealed = self.vault.seal(room_id, &new.name, new.value.as_bytes());
        drop(new.value);
        let rule = SecretRule {
            name: new.name,
            hosts,
            header: new.header,
            format: new.format,
            created_by: proof.actor().to_owned(),
            created_at: self.now_ms(),
            last_used_at: None,
        };
        let mut details = details;
        details["replaced"] = json!(replaces);
        details["approval_id"] = json!(approval);
        let change = Change::PutSecret {
            room_id: room_id.clone(),
            rule: rule.clone(),
            sealed,
        };
        // The approval is spent with the secret, in one transaction.
        let entry = Entry::of(proof.action(), Verdict::Allow, details);
        self.record_allowed(room_id, &proof, entry, change, &approval)
            .await?;
        // A running sandbox gets the new placeholder for its next commands.
        self.sandboxes.egress_changed(room_id).await;
        Ok(Outcome::Done(rule))
    }

    /// Removes secret `name` as `actor` (needs `add_secret`); not found when there is none.
    pub(crate) async fn remove_secret(
        &self,
        room_id: &RoomId,
        actor: &Actor,
        name: &str,
    ) -> Result<(), OpError> {
        if !valid_name(name) {
            return Err(OpError::NotFound);
        }
        let details = json!({ "name": name });
        let proof = self
            .authorize(
                room_id,
                actor,
                Action::Use(Capability::AddSecret),
                details.clone(),
            )
            .await?;
        let entry = Entry::act(Act::RemoveSecret, Verdict::Allow, details);
        let change = Change::RemoveSecret {
            room_id: room_id.clone(),
            name: name.to_owned(),
        };
        match self.record(room_id, proof.actor(), entry, change).await {
            Ok(_) => {
                self.sandboxes.egress_changed(room_id).await;
                Ok(())
            }
            Err(OpError::Store(StoreError::Conflict)) => Err(OpError::NotFound),
            Err(e) => Err(e),
        }
    }

    /// Whether adding a secret needs someone else's approval of its rule (room governance:
    /// needs `approve`).
    pub(crate) async fn set_secrets_policy(
        &self,
        room_id: &RoomId,
        actor: &Actor,
        needs_approval: bool,
    ) -> Result<serde_json::Value, OpError> {
        let details = json!({ "add_needs_approval": needs_approval });
        let change = Change::SetSecretsPolicy {
            room_id: room_id.clone(),
            needs_approval,
        };
        let entry = Entry::act(Act::SetSecretsPolicy, Verdict::Allow, details.clone());
        self.use_and_record(room_id, actor, Capability::Approve, entry, change)
            .await?;
        Ok(details)
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
