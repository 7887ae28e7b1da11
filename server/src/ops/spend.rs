//! The room's spend: what it used of each meter, by whom, and its budgets; setting the room's
//! budget or an agent's (`spend`; a raise also someone else's approval); and what happens when
//! a budget is reached (see `crate::spend`).

use crate::ids::{RoomId, UserId};
use crate::ops::approvals::Allowed;
use crate::ops::record::{Act, Entry, Verdict};
use crate::ops::{Actor, OpError, Ops, Outcome};
use crate::spend::{Budget, Meter, Reached};
use crate::store::Change;
use crate::terminal::TermEvent;
use coderoom_authz::Action;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

fn meters_json(used: impl Fn(Meter) -> u64) -> Value {
    Value::Object(
        Meter::ALL
            .into_iter()
            .map(|m| (m.as_str().to_owned(), json!(used(m))))
            .collect::<Map<_, _>>(),
    )
}

impl Ops {
    /// `{"budget", "used", "remaining", "by_tier", "participants": [...]}`: everything charged so
    /// far is written first, so the figures are the sums of the room's `metered` audit records.
    pub(crate) async fn spend_view(&self, room_id: &RoomId) -> Result<Value, OpError> {
        let used = self.spend.written(room_id).await?;
        let budget = self.spend.budget(room_id).await?;
        let people: BTreeMap<String, String> = self
            .store
            .participants(room_id)
            .await?
            .into_iter()
            .map(|p| (p.user_id, p.email))
            .collect();
        let agents = self.store.agents(room_id).await?;
        let total = |m: Meter| crate::spend::total(&used, m);
        let mut whos: Vec<&String> = used.keys().map(|(w, _)| w).collect();
        whos.dedup();
        let mut by_tier = Map::new();
        let participants: Vec<Value> = whos
            .into_iter()
            .map(|who| {
                let of = |m: Meter| used.get(&(who.clone(), m)).copied().unwrap_or(0);
                let agent = agents.iter().find(|a| &a.agent_id == who);
                let (kind, name, budget) = if let Some(tier) = who.strip_prefix("sandbox:") {
                    by_tier.insert(tier.to_owned(), json!(of(Meter::SandboxSeconds)));
                    ("sandbox", format!("the sandbox ({tier} tier)"), Value::Null)
                } else if let Some(a) = agent {
                    let b = Budget::parse(&a.budget).unwrap_or_default();
                    ("agent", format!("{} (agent)", a.name), b.to_json())
                } else if let Some(email) = people.get(who) {
                    ("person", email.clone(), Value::Null)
                } else {
                    match who.as_str() {
                        "terminal" => ("code", "the shared terminal".to_owned(), Value::Null),
                        "readiness" => ("code", "the readiness step".to_owned(), Value::Null),
                        "sandbox" | "other" => ("code", "code in the sandbox".to_owned(), Value::Null),
                        // A participant since removed: still shown, by id.
                        _ => ("person", who.clone(), Value::Null),
                    }
                };
                json!({ "who": who, "kind": kind, "name": name, "used": meters_json(of), "budget": budget })
            })
            .collect();
        let remaining = Value::Object(
            Meter::ALL
                .into_iter()
                .filter_map(|m| {
                    budget
                        .limit(m)
                        .map(|l| (m.as_str().to_owned(), json!(l.saturating_sub(total(m)))))
                })
                .collect::<Map<_, _>>(),
        );
        Ok(json!({
            "budget": if budget.is_empty() { Value::Null } else { budget.to_json() },
            "used": meters_json(total),
            "remaining": remaining,
            "by_tier": by_tier,
            "participants": participants,
        }))
    }

    /// Sets the room's budget (`agent`: `None`) or an agent's to `budget` (`null`: none) as
    /// `actor`. Lowering takes effect at once; a raise waits for someone else's approval and
    /// takes effect when asked again with it. The room's spend as it then is.
    pub(crate) async fn set_budget(
        &self,
        room_id: &RoomId,
        actor: &Actor,
        (budget, agent): (&Value, Option<String>),
        approval_id: Option<&str>,
    ) -> Result<Outcome<Value>, OpError> {
        let after = Budget::parse(budget).map_err(|e| OpError::Invalid(e.0))?;
        if agent.is_some() {
            crate::ops::agents::agent_budget(&after)?;
        }
        let before = match &agent {
            None => self.spend.budget(room_id).await?,
            Some(id) => match self.store.agent(id).await? {
                Some(a) if a.room_id == room_id.as_str() => {
                    Budget::parse(&a.budget).unwrap_or_default()
                }
                _ => return Err(OpError::NotFound),
            },
        };
        // A limit lifted or increased is a raise; a first budget, or a lower one, is not.
        let raise = before.raised_by(&after);
        let params = json!({ "agent": agent, "budget": after.to_json() }).to_string();
        let approval = self.presented(room_id, approval_id).await?;
        let action = Action::SetBudget {
            params,
            approval,
            raise,
        };
        let details = json!({
            "agent": agent,
            "before": before.to_json(),
            "after": after.to_json(),
            "raise": raise,
        });
        let Allowed { proof, approval } =
            match self.ask(room_id, actor, action, details.clone()).await? {
                Outcome::Done(allowed) => allowed,
                Outcome::Pending(id) => return Ok(Outcome::Pending(id)),
            };
        let stored = after.to_json().to_string();
        let change = match &agent {
            None => Change::SetBudget {
                room_id: room_id.clone(),
                budget: (!after.is_empty()).then_some(stored),
            },
            Some(id) => Change::SetAgentBudget {
                user_id: UserId::known(id.clone()),
                budget: stored,
            },
        };
        let mut details = details;
        details["approval_id"] = json!(approval);
        let entry = Entry::of(proof.action(), Verdict::Allow, details);
        self.record_allowed(room_id, &proof, entry, change, &approval)
            .await?;
        self.spend
            .budget_set(room_id, agent.as_deref(), after.clone());
        let event = TermEvent::Budget {
            agent,
            budget: after.to_json(),
        };
        self.sandboxes.notice(room_id, event).await;
        Ok(Outcome::Done(self.spend_view(room_id).await?))
    }
}

/// Tells each room of a budget it reached (a `spent` terminal event and an audit record), and
/// stops the sandbox of a room out of sandbox seconds (snapshotted first: nothing is lost).
pub(crate) fn announce(app: Ops, mut reached: tokio::sync::mpsc::UnboundedReceiver<Reached>) {
    tokio::spawn(async move {
        while let Some(r) = reached.recv().await {
            // Each on its own: one room's stop (a snapshot) holds up no other room's notice.
            tokio::spawn(reached_one(app.clone(), r));
        }
    });
}

/// One budget reached: recorded, told to the room, and a room out of sandbox time stopped
/// (announced again a while later when its stop failed, so it is tried again).
async fn reached_one(app: Ops, r: Reached) {
    let Some(room_id) = RoomId::parse(&r.room_id) else {
        return;
    };
    let message = r.exhausted.to_string();
    let details = json!({
        "agent": r.agent,
        "meter": r.exhausted.meter,
        "used": r.exhausted.used,
        "budget": r.exhausted.budget,
        "scope": r.exhausted.scope,
    });
    let entry = Entry::act(Act::BudgetReached, Verdict::Allow, details);
    if let Err(e) = app.record(&room_id, "system", entry, Change::None).await {
        tracing::error!(room = %room_id, error = %e, "cannot audit a budget reached");
    }
    let event = TermEvent::Spent {
        agent: r.agent.clone(),
        exhausted: r.exhausted.clone(),
        reason: message.clone(),
    };
    app.sandboxes.notice(&room_id, event).await;
    // An agent out of egress or model tokens (charged after the fact, as they are used) has
    // what it started stopped: its code uses no more. Commands and tool calls are charged
    // before they run, so the one that reached the budget was allowed and goes on; the next
    // is refused.
    if let (Some(agent), Meter::EgressBytes | Meter::ModelTokens) = (&r.agent, r.exhausted.meter) {
        app.stop_units(&room_id, agent, "its budget ran out").await;
    }
    if r.agent.is_none() && r.exhausted.meter == Meter::SandboxSeconds {
        if let Err(e) = app
            .sandboxes
            .stop_because(&room_id, "system", message)
            .await
        {
            // Its snapshot failed: it keeps running (nothing is lost) and is asked again.
            tracing::warn!(room = %room_id, error = %e, "cannot stop a sandbox out of budget; again in 30 s");
            tokio::time::sleep(std::time::Duration::from_secs(30)).await;
            app.spend.untell(&room_id, None, Meter::SandboxSeconds);
        }
    }
}
