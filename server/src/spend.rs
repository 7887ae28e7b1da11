//! Spend: meters per room and per participant, budgets, and the audit records they sum from.
//!
//! Metered work is charged here as it happens (in memory, so a check is immediate): sandbox
//! seconds (the room's, by tier: charged to `sandbox:<tier>`), commands run (`execs`), bytes
//! through the egress proxy (`egress_bytes`), model tokens providers report (`model_tokens`)
//! and agents' MCP tool calls (`tool_calls`), each to whoever caused it. Every
//! `--spend-flush-ms` (and before `GET /spend` answers, and at shutdown) each room's charges since
//! the last flush become one `metered` audit record listing them, written in the same
//! transaction as the running sums in the `spend` table: what `GET /spend` shows is exactly
//! the sum of the room's `metered` records.
//!
//! A budget (the room's, and each agent's) caps meters; work that would go on past a cap is
//! refused with [`Exhausted`] (HTTP 402), and the first charge that reaches a cap is announced
//! (the room hears of it, and a room out of sandbox seconds has its sandbox stopped, its
//! workspace snapshotted: nothing made is lost).

use crate::audit::Audit;
use crate::ids::RoomId;
use crate::store::{Change, Store, StoreError};
use serde::Serialize;
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

type Family = prometheus_client::metrics::family::Family<
    Vec<(String, String)>,
    prometheus_client::metrics::counter::Counter,
>;

/// How often running sandboxes are charged their time.
const TICK: Duration = Duration::from_secs(1);
/// Largest limit a budget may set for one meter (beyond it, set none).
const MAX_LIMIT: u64 = 1 << 50;

/// What is metered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Meter {
    SandboxSeconds,
    Execs,
    EgressBytes,
    ModelTokens,
    ToolCalls,
}

impl Meter {
    pub(crate) const ALL: [Meter; 5] = [
        Meter::SandboxSeconds,
        Meter::Execs,
        Meter::EgressBytes,
        Meter::ModelTokens,
        Meter::ToolCalls,
    ];

    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Meter::SandboxSeconds => "sandbox_seconds",
            Meter::Execs => "execs",
            Meter::EgressBytes => "egress_bytes",
            Meter::ModelTokens => "model_tokens",
            Meter::ToolCalls => "tool_calls",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Meter> {
        Meter::ALL.into_iter().find(|m| m.as_str() == s)
    }

    /// In words, for messages.
    const fn words(self) -> &'static str {
        match self {
            Meter::SandboxSeconds => "sandbox seconds",
            Meter::Execs => "commands",
            Meter::EgressBytes => "egress bytes",
            Meter::ModelTokens => "model tokens",
            Meter::ToolCalls => "tool calls",
        }
    }
}

/// Why a budget was not accepted (for the person who sent it).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct BadBudget(pub String);

/// Why metered work was refused: a budget is spent, or spend cannot be read now.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct OverBudget(pub String);

/// Limits per meter; a meter without one is not limited.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Budget(BTreeMap<Meter, u64>);

impl Budget {
    /// A budget as the API takes it: `{"execs": 10, ...}` with known meters and whole numbers
    /// (`null`: no limit). `null` or a missing budget is an empty one.
    pub(crate) fn parse(v: &Value) -> Result<Budget, BadBudget> {
        let obj = match v {
            Value::Null => return Ok(Budget::default()),
            Value::Object(o) => o,
            _ => return Err(BadBudget("budget must be an object of meter limits".into())),
        };
        let mut limits = BTreeMap::new();
        for (k, v) in obj {
            let meter = Meter::parse(k).ok_or_else(|| {
                BadBudget(format!(
                    "unknown meter {k:?} in budget (meters: {})",
                    Meter::ALL.map(Meter::as_str).join(", ")
                ))
            })?;
            match v {
                Value::Null => {}
                v => {
                    let n = v.as_u64().filter(|n| *n <= MAX_LIMIT).ok_or_else(|| {
                        BadBudget(format!(
                            "budget {k} must be a whole number from 0 to 2^50, or null"
                        ))
                    })?;
                    limits.insert(meter, n);
                }
            }
        }
        Ok(Budget(limits))
    }

    /// As stored and shown.
    pub(crate) fn to_json(&self) -> Value {
        Value::Object(
            self.0
                .iter()
                .map(|(m, n)| (m.as_str().to_owned(), json!(n)))
                .collect::<Map<_, _>>(),
        )
    }

    pub(crate) fn limit(&self, m: Meter) -> Option<u64> {
        self.0.get(&m).copied()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `after` allows more than `self` on some meter (a limit lifted or raised).
    pub(crate) fn raised_by(&self, after: &Budget) -> bool {
        self.0
            .iter()
            .any(|(m, n)| after.limit(*m).is_none_or(|a| a > *n))
    }
}

/// Whose budget a refusal is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Scope {
    Room,
    Agent,
}

/// Metered work refused: the meter's use has reached its budget.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Exhausted {
    pub scope: Scope,
    pub meter: Meter,
    pub used: u64,
    pub budget: u64,
}

impl std::fmt::Display for Exhausted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let whose = match self.scope {
            Scope::Room => "the room's",
            Scope::Agent => "this agent's",
        };
        write!(
            f,
            "{whose} budget of {} is spent ({} used of {}); raising it needs an approval (PUT /api/rooms/{{id}}/budget)",
            self.meter.words(),
            self.used,
            self.budget
        )
    }
}

/// A budget just reached, for the room to hear of (and, for sandbox seconds, to stop).
#[derive(Debug, Clone)]
pub(crate) struct Reached {
    pub room_id: RoomId,
    /// The agent whose budget it is (`None`: the room's).
    pub agent: Option<String>,
    pub exhausted: Exhausted,
}

/// One room's meters.
#[derive(Debug, Default)]
struct RoomSpend {
    /// Whether `used` includes what storage holds (read on first need).
    loaded: bool,
    /// Use per (who, meter): stored plus pending.
    used: Used,
    /// Charged since the last flush.
    pending: Used,
    budget: Budget,
    /// Agents' budgets, read on first need (`None`: not an agent).
    agents: HashMap<String, Option<Budget>>,
    /// Caps already announced (scope owner, meter): each is told once until raised.
    told: HashSet<(Option<String>, Meter)>,
    /// Milliseconds of sandbox time not yet charged as a whole second, per tier.
    sandbox_ms: BTreeMap<&'static str, u64>,
}

/// Use per (who, meter), as the room's figures hold it.
pub(crate) type Used = BTreeMap<(String, Meter), u64>;

/// Everyone's use of `m`, summed.
pub(crate) fn total(used: &Used, m: Meter) -> u64 {
    used.iter()
        .filter(|((_, meter), _)| *meter == m)
        .map(|(_, n)| *n)
        .fold(0u64, u64::saturating_add)
}

impl RoomSpend {
    fn room_used(&self, m: Meter) -> u64 {
        total(&self.used, m)
    }

    fn used_by(&self, who: &str, m: Meter) -> u64 {
        self.used.get(&(who.to_owned(), m)).copied().unwrap_or(0)
    }

    /// The first budget `who`'s next use of `m` would go past.
    fn exhausted(&self, who: &str, m: Meter) -> Option<(Option<String>, Exhausted)> {
        let over = |scope, used: u64, limit: u64| {
            (used >= limit).then_some(Exhausted {
                scope,
                meter: m,
                used,
                budget: limit,
            })
        };
        if let Some(e) = self
            .budget
            .limit(m)
            .and_then(|limit| over(Scope::Room, self.room_used(m), limit))
        {
            return Some((None, e));
        }
        let agent = self.agents.get(who)?.as_ref()?;
        let e = over(Scope::Agent, self.used_by(who, m), agent.limit(m)?)?;
        Some((Some(who.to_owned()), e))
    }
}

/// A running sandbox, charged its time each tick.
struct Running {
    tier: &'static str,
    generation: u64,
    since: tokio::time::Instant,
}

struct Inner {
    store: Store,
    audit: Audit,
    rooms: Mutex<HashMap<RoomId, RoomSpend>>,
    running: Mutex<HashMap<RoomId, Running>>,
    /// Deleted rooms: charges that arrive late (a sandbox's last second) are dropped.
    gone: Mutex<HashSet<RoomId>>,
    /// One flush at a time, so what is read as written is written.
    flushing: tokio::sync::Mutex<()>,
    reached: mpsc::UnboundedSender<Reached>,
    metrics: crate::metrics::Metrics,
}

/// Every room's meters and budgets. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Spend {
    inner: Arc<Inner>,
}

impl Spend {
    /// The meters, and where budgets just reached are announced.
    pub(crate) fn new(
        store: Store,
        audit: Audit,
        metrics: crate::metrics::Metrics,
    ) -> (Spend, mpsc::UnboundedReceiver<Reached>) {
        let (reached, rx) = mpsc::unbounded_channel();
        let spend = Spend {
            inner: Arc::new(Inner {
                store,
                audit,
                rooms: Mutex::default(),
                running: Mutex::default(),
                gone: Mutex::default(),
                flushing: tokio::sync::Mutex::default(),
                reached,
                metrics,
            }),
        };
        (spend, rx)
    }

    fn rooms(&self) -> std::sync::MutexGuard<'_, HashMap<RoomId, RoomSpend>> {
        self.inner.rooms.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn running(&self) -> std::sync::MutexGuard<'_, HashMap<RoomId, Running>> {
        self.inner.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads the room's stored use and budget, once.
    async fn load(&self, room_id: &RoomId) -> Result<(), StoreError> {
        if self.gone(room_id) || self.rooms().get(room_id).is_some_and(|r| r.loaded) {
            return Ok(());
        }
        let (rows, budget) = self.inner.store.spend_of(room_id).await?;
        let budget = match budget {
            Some(b) => Budget::parse(&serde_json::from_str(&b).map_err(|_| StoreError::Corrupt)?)
                .map_err(|_| StoreError::Corrupt)?,
            None => Budget::default(),
        };
        let mut rooms = self.rooms();
        let r = rooms.entry(room_id.to_owned()).or_default();
        if r.loaded {
            return Ok(());
        }
        for (who, meter, amount) in rows {
            let Some(m) = Meter::parse(&meter) else {
                continue;
            };
            let n = r.used.entry((who, m)).or_default();
            *n = n.saturating_add(u64::try_from(amount).unwrap_or(0));
        }
        r.budget = budget;
        r.loaded = true;
        Ok(())
    }

    /// Reads `who`'s agent budget, once (people have none).
    async fn load_agent(&self, room_id: &RoomId, who: &str) -> Result<(), StoreError> {
        if who.is_empty()
            || self
                .rooms()
                .get(room_id)
                .is_some_and(|r| r.agents.contains_key(who))
        {
            return Ok(());
        }
        let budget = match self.inner.store.agent(who).await? {
            Some(a) if a.room_id == *room_id => {
                Some(Budget::parse(&a.budget).map_err(|_| StoreError::Corrupt)?)
            }
            _ => None,
        };
        // A budget set meanwhile wins over what was read before it.
        self.rooms()
            .entry(room_id.to_owned())
            .or_default()
            .agents
            .entry(who.to_owned())
            .or_insert(budget);
        Ok(())
    }

    /// Whether `who` may start work metered by `meters`: refused once the room's budget (or
    /// `who`'s, for an agent) of any of them is used up. `who` empty: the room's only.
    pub(crate) async fn check(
        &self,
        room_id: &RoomId,
        who: &str,
        meters: &[Meter],
    ) -> Result<Result<(), Exhausted>, StoreError> {
        self.load(room_id).await?;
        self.load_agent(room_id, who).await?;
        let rooms = self.rooms();
        let Some(r) = rooms.get(room_id) else {
            return Ok(Ok(()));
        };
        for m in meters {
            if let Some((_, e)) = r.exhausted(who, *m) {
                self.counted(&self.inner.metrics.budget_refusals, *m, 1);
                return Ok(Err(e));
            }
        }
        Ok(Ok(()))
    }

    /// A room this server just made: known to have no budget and no spending, without a read.
    pub(crate) fn created(&self, room_id: &RoomId) {
        self.rooms().entry(room_id.to_owned()).or_default().loaded = true;
    }

    /// Whether the room has a budget (then starting metered work needs `spend`).
    pub(crate) async fn has_budget(&self, room_id: &RoomId) -> Result<bool, StoreError> {
        self.load(room_id).await?;
        Ok(self
            .rooms()
            .get(room_id)
            .is_some_and(|r| !r.budget.is_empty()))
    }

    fn gone(&self, room_id: &RoomId) -> bool {
        self.inner
            .gone
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(room_id)
    }

    fn counted(&self, metric: &Family, meter: Meter, amount: u64) {
        metric
            .get_or_create(&vec![("meter".to_owned(), meter.as_str().to_owned())])
            .inc_by(amount);
    }

    /// Charges `amount` of `meter` to `who` in the room. Announces a budget it reaches.
    pub(crate) fn charge(&self, room_id: &RoomId, who: &str, meter: Meter, amount: u64) {
        if amount == 0 || self.gone(room_id) {
            return;
        }
        self.counted(&self.inner.metrics.spend, meter, amount);
        let mut rooms = self.rooms();
        let r = rooms.entry(room_id.to_owned()).or_default();
        self.add(r, room_id, (who, meter), amount);
    }

    /// Checks and charges in one step, so callers at once cannot all pass a check the first
    /// of them used up: refused (nothing charged) when a budget of `meter` for `who` is used
    /// up, else charged (`amount` 0: checked only).
    pub(crate) async fn try_charge(
        &self,
        room_id: &RoomId,
        who: &str,
        meter: Meter,
        amount: u64,
    ) -> Result<Result<(), Exhausted>, StoreError> {
        self.load(room_id).await?;
        self.load_agent(room_id, who).await?;
        if self.gone(room_id) {
            return Ok(Ok(()));
        }
        let refused = {
            let mut rooms = self.rooms();
            let r = rooms.entry(room_id.to_owned()).or_default();
            match r.exhausted(who, meter) {
                Some((_, e)) => Some(e),
                None if amount == 0 => None,
                None => {
                    self.add(r, room_id, (who, meter), amount);
                    None
                }
            }
        };
        Ok(match refused {
            Some(e) => {
                self.counted(&self.inner.metrics.budget_refusals, meter, 1);
                Err(e)
            }
            None => {
                self.counted(&self.inner.metrics.spend, meter, amount);
                Ok(())
            }
        })
    }

    /// Takes back a charge for work that did not happen after all (when it is still unwritten;
    /// a written one stands, so the figures stay the sums of the records).
    pub(crate) fn refund(&self, room_id: &RoomId, who: &str, meter: Meter, amount: u64) {
        let mut rooms = self.rooms();
        let Some(r) = rooms.get_mut(room_id) else {
            return;
        };
        let key = (who.to_owned(), meter);
        if r.pending.get(&key).is_some_and(|p| *p >= amount) {
            if let Some(p) = r.pending.get_mut(&key) {
                *p -= amount;
            }
            if let Some(u) = r.used.get_mut(&key) {
                *u = u.saturating_sub(amount);
            }
        }
    }

    /// Adds a charge to the room's figures; announces a budget it reaches.
    fn add(&self, r: &mut RoomSpend, room_id: &RoomId, (who, meter): (&str, Meter), amount: u64) {
        let key = (who.to_owned(), meter);
        let p = r.pending.entry(key.clone()).or_default();
        *p = p.saturating_add(amount);
        let u = r.used.entry(key).or_default();
        *u = u.saturating_add(amount);
        if !r.loaded {
            // Budgets are not known yet: the next check reads them and refuses from there.
            return;
        }
        if let Some((agent, exhausted)) = r.exhausted(who, meter) {
            if r.told.insert((agent.clone(), meter)) {
                let _ = self.inner.reached.send(Reached {
                    room_id: room_id.to_owned(),
                    agent,
                    exhausted,
                });
            }
        }
    }

    /// Announces the room's reached budget of `meter` again at its next charge (its stop
    /// failed).
    pub(crate) fn untell(&self, room_id: &RoomId, agent: Option<String>, meter: Meter) {
        if let Some(r) = self.rooms().get_mut(room_id) {
            r.told.remove(&(agent, meter));
        }
    }

    /// The room's sandbox (started as `generation`, of `tier`) runs from now.
    pub(crate) fn sandbox_running(&self, room_id: &RoomId, tier: &'static str, generation: u64) {
        self.running().insert(
            room_id.to_owned(),
            Running {
                tier,
                generation,
                since: tokio::time::Instant::now(),
            },
        );
    }

    /// The room's sandbox `generation` ended: its last moments are charged.
    pub(crate) fn sandbox_ended(&self, room_id: &RoomId, generation: u64) {
        let ended = {
            let mut running = self.running();
            match running.get(room_id) {
                Some(r) if r.generation == generation => running.remove(room_id),
                _ => None,
            }
        };
        if let Some(r) = ended {
            self.charge_time(room_id, r.tier, r.since.elapsed(), true);
        }
    }

    /// Charges sandbox time in whole seconds; `last`: the remainder too, rounded up.
    fn charge_time(&self, room_id: &RoomId, tier: &'static str, elapsed: Duration, last: bool) {
        if self.gone(room_id) {
            return;
        }
        let ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
        let secs = {
            let mut rooms = self.rooms();
            let r = rooms.entry(room_id.to_owned()).or_default();
            let acc = r.sandbox_ms.entry(tier).or_default();
            *acc = acc.saturating_add(ms);
            let mut secs = *acc / 1000;
            *acc %= 1000;
            if last && *acc > 0 {
                secs += 1;
                *acc = 0;
            }
            secs
        };
        self.charge(
            room_id,
            &format!("sandbox:{tier}"),
            Meter::SandboxSeconds,
            secs,
        );
    }

    /// Charges every running sandbox the time since the last tick.
    fn tick(&self) {
        let now = tokio::time::Instant::now();
        let due: Vec<(RoomId, &'static str, Duration)> = self
            .running()
            .iter_mut()
            .map(|(room, r)| {
                let d = now.saturating_duration_since(r.since);
                r.since = now;
                (room.clone(), r.tier, d)
            })
            .collect();
        for (room, tier, d) in due {
            self.charge_time(&room, tier, d, false);
        }
    }

    /// Writes the room's charges since the last flush: one `metered` audit record and the sums,
    /// in one transaction. On failure they stay pending for the next flush.
    pub(crate) async fn flush(&self, room_id: &RoomId) -> Result<(), StoreError> {
        let _one = self.inner.flushing.lock().await;
        self.flush_locked(room_id).await
    }

    /// [`Spend::flush`], holding the flush lock.
    async fn flush_locked(&self, room_id: &RoomId) -> Result<(), StoreError> {
        if self.gone(room_id) {
            return Ok(());
        }
        self.load(room_id).await?;
        let pending = match self.rooms().get_mut(room_id) {
            Some(r) if !r.pending.is_empty() => std::mem::take(&mut r.pending),
            _ => return Ok(()),
        };
        let charges: Vec<(String, String, i64)> = pending
            .iter()
            .map(|((who, m), n)| {
                (
                    who.clone(),
                    m.as_str().to_owned(),
                    i64::try_from(*n).unwrap_or(i64::MAX),
                )
            })
            .collect();
        let details = json!({
            "charges": charges
                .iter()
                .map(|(who, meter, amount)| json!({ "who": who, "meter": meter, "amount": amount }))
                .collect::<Vec<_>>(),
        });
        let change = Change::Spend {
            room_id: room_id.clone(),
            charges,
        };
        let written = self
            .inner
            .audit
            .record(room_id, "system", "metered", "allow", "", details, change)
            .await;
        if let Err(e) = written {
            // Not lost: back to pending, written with the next flush.
            let mut rooms = self.rooms();
            let r = rooms.entry(room_id.to_owned()).or_default();
            for (k, n) in pending {
                let p = r.pending.entry(k).or_default();
                *p = p.saturating_add(n);
            }
            return Err(e);
        }
        Ok(())
    }

    /// Flushes every room with charges.
    pub(crate) async fn flush_all(&self) {
        let due: Vec<RoomId> = self
            .rooms()
            .iter()
            .filter(|(_, r)| !r.pending.is_empty())
            .map(|(k, _)| k.clone())
            .collect();
        for room in due {
            if let Err(e) = self.flush(&room).await {
                tracing::error!(room = %room, error = %e, "cannot write the room's spend; kept for the next try");
            }
        }
    }

    /// Charges running sandboxes every second and writes charges every `flush_every`; at
    /// shutdown, call [`Spend::stop`] after the sandboxes are down.
    pub(crate) fn start(&self, flush_every: Duration, shutdown: CancellationToken) {
        let this = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(TICK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut flush = tokio::time::interval(flush_every);
            flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            flush.tick().await;
            loop {
                tokio::select! {
                    _ = tick.tick() => this.tick(),
                    _ = flush.tick() => this.flush_all().await,
                    () = shutdown.cancelled() => break,
                }
            }
        });
    }

    /// At shutdown: charges what ran until now and writes every pending charge.
    pub(crate) async fn stop(&self) {
        let running: Vec<(RoomId, u64)> = self
            .running()
            .iter()
            .map(|(k, r)| (k.clone(), r.generation))
            .collect();
        for (room, generation) in running {
            self.sandbox_ended(&room, generation);
        }
        self.flush_all().await;
    }

    /// Sets the room's budget (`agent`: that agent's) after its change was recorded; caps it
    /// raised may be announced again.
    pub(crate) fn budget_set(&self, room_id: &RoomId, agent: Option<&str>, budget: Budget) {
        let mut rooms = self.rooms();
        let r = rooms.entry(room_id.to_owned()).or_default();
        match agent {
            None => r.budget = budget,
            Some(a) => {
                r.agents.insert(a.to_owned(), Some(budget));
            }
        }
        let owner = agent.map(str::to_owned);
        r.told.retain(|(o, _)| *o != owner);
    }

    /// The room's budget now.
    pub(crate) async fn budget(&self, room_id: &RoomId) -> Result<Budget, StoreError> {
        self.load(room_id).await?;
        Ok(self
            .rooms()
            .get(room_id)
            .map(|r| r.budget.clone())
            .unwrap_or_default())
    }

    /// What the room used, per (who, meter), as written: everything charged so far is written
    /// first, and what is charged meanwhile is left out, so the figures are exactly the sums of
    /// the room's `metered` audit records.
    pub(crate) async fn written(&self, room_id: &RoomId) -> Result<Used, StoreError> {
        let _one = self.inner.flushing.lock().await;
        self.flush_locked(room_id).await?;
        let rooms = self.rooms();
        let Some(r) = rooms.get(room_id) else {
            return Ok(BTreeMap::new());
        };
        Ok(r.used
            .iter()
            .map(|(k, n)| {
                let pending = r.pending.get(k).copied().unwrap_or(0);
                (k.clone(), n.saturating_sub(pending))
            })
            .filter(|(_, n)| *n > 0)
            .collect())
    }

    /// Forgets a deleted room (and drops whatever is charged to it later).
    pub(crate) fn forget(&self, room_id: &RoomId) {
        self.inner
            .gone
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(room_id.to_owned());
        self.rooms().remove(room_id);
        self.running().remove(room_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_parse_strictly_and_know_a_raise() {
        let b = Budget::parse(&json!({ "execs": 3, "tool_calls": null })).unwrap();
        assert_eq!(b.limit(Meter::Execs), Some(3));
        assert_eq!(b.limit(Meter::ToolCalls), None);
        assert_eq!(b.to_json(), json!({ "execs": 3 }));
        assert!(Budget::parse(&json!({ "dollars": 3 })).is_err());
        assert!(Budget::parse(&json!({ "execs": -1 })).is_err());
        assert!(Budget::parse(&json!({ "execs": 1.5 })).is_err());
        assert!(Budget::parse(&json!([1])).is_err());
        assert_eq!(Budget::parse(&Value::Null).unwrap(), Budget::default());
        let more = Budget::parse(&json!({ "execs": 4 })).unwrap();
        let lifted = Budget::default();
        let less = Budget::parse(&json!({ "execs": 2, "egress_bytes": 10 })).unwrap();
        assert!(b.raised_by(&more));
        assert!(b.raised_by(&lifted));
        assert!(!b.raised_by(&less));
        assert!(!b.raised_by(&b));
        assert!(!Budget::default().raised_by(&less));
    }

    #[test]
    fn room_and_agent_budgets_are_both_held() {
        let mut r = RoomSpend {
            loaded: true,
            budget: Budget::parse(&json!({ "execs": 5 })).unwrap(),
            ..RoomSpend::default()
        };
        r.agents.insert(
            "agent".into(),
            Some(Budget::parse(&json!({ "execs": 2 })).unwrap()),
        );
        r.used.insert(("agent".into(), Meter::Execs), 2);
        r.used.insert(("ana".into(), Meter::Execs), 1);
        let (owner, e) = r.exhausted("agent", Meter::Execs).unwrap();
        assert_eq!(
            (owner.as_deref(), e.scope, e.used, e.budget),
            (Some("agent"), Scope::Agent, 2, 2)
        );
        assert!(r.exhausted("ana", Meter::Execs).is_none());
        r.used.insert(("ben".into(), Meter::Execs), 2);
        let (owner, e) = r.exhausted("ana", Meter::Execs).unwrap();
        assert_eq!(
            (owner, e.scope, e.used, e.budget),
            (None, Scope::Room, 5, 5)
        );
        assert!(e
            .to_string()
            .contains("the room's budget of commands is spent (5 used of 5)"));
    }
}
