//! The egress proxy: the only way out of a sandbox. Code inside connects to the agent's
//! forwarder (its `HTTP_PROXY`); the agent carries the connection to the control plane, and
//! here it is judged and, when allowed, connected.
//!
//! A connection goes out only when the room's policy names its host and port, and every address
//! the host resolves to is public and not one of this machine's own; the connection then goes
//! to the address that was checked (never resolved again). Everything is counted per room, the
//! last refusals are kept for the Network panel, and the audit chain gets one aggregated record
//! per room and decision per interval (bounded, whatever code inside does).

pub(crate) mod addr;
mod intercept;
pub(crate) mod policy;
mod proxy;
mod redact;
pub(crate) mod tls;
mod usage;

use crate::audit::Audit;
use crate::ids::RoomId;
use crate::store::{Change, Store};
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub(crate) use policy::Policy;

/// Distinct (decision, host, port, reason) entries one room's audit window keeps; the rest are
/// counted together.
const MAX_WINDOW_ENTRIES: usize = 200;
/// Entries one aggregated audit record lists (the most frequent first).
const MAX_AUDITED_ENTRIES: usize = 50;
/// Refusals kept per room for the Network panel.
const MAX_RECENT_DENIED: usize = 20;

/// What a test made a name resolve to (`--egress-test-resolve`, the tests' builds only).
#[cfg(feature = "egress-test-resolve")]
#[derive(Debug, Clone)]
enum Override {
    /// DNS answers: checked like any others.
    Answers(Vec<IpAddr>),
    /// A stand-in server for the name: connections go there, unchecked (the test chose it).
    StandIn(SocketAddr),
}

/// Resolves names for the proxy: the system resolver (in the tests' builds, unless a test
/// overrode the name).
#[derive(Debug, Default)]
pub(crate) struct Resolver {
    #[cfg(feature = "egress-test-resolve")]
    overrides: HashMap<String, Override>,
}

/// Where a name leads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Addresses to check, then connect to (on the requested port).
    Addrs(Vec<IpAddr>),
    /// A stand-in a test set (the tests' builds only).
    #[cfg(feature = "egress-test-resolve")]
    StandIn(SocketAddr),
}

impl Resolver {
    /// A resolver with `NAME=ADDR[+ADDR...]` (answers) or `NAME=IP:PORT` (a stand-in) entries
    /// (the tests' builds only: see `--egress-test-resolve`).
    #[cfg(feature = "egress-test-resolve")]
    pub(crate) fn with_overrides(entries: &[String]) -> anyhow::Result<Resolver> {
        let mut overrides = HashMap::new();
        for entry in entries.iter().filter(|e| !e.trim().is_empty()) {
            let (name, to) = entry
                .split_once('=')
                .ok_or_else(|| anyhow::anyhow!("--egress-test-resolve {entry:?}: NAME=ADDR"))?;
            let name = match addr::parse_host(name) {
                Ok(addr::Host::Name(n)) => n,
                _ => anyhow::bail!("--egress-test-resolve {entry:?}: not a host name"),
            };
            let o = if let Ok(stand_in) = to.parse::<SocketAddr>() {
                Override::StandIn(stand_in)
            } else {
                let answers = to
                    .split('+')
                    .map(|a| a.parse::<IpAddr>())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|_| anyhow::anyhow!("--egress-test-resolve {entry:?}: bad address"))?;
                Override::Answers(answers)
            };
            overrides.insert(name, o);
        }
        if !overrides.is_empty() {
            tracing::warn!(
                names = overrides.len(),
                "egress names resolved by --egress-test-resolve, not DNS (for tests)"
            );
        }
        Ok(Resolver { overrides })
    }

    /// What `name` leads to.
    pub(crate) async fn resolve(&self, name: &str, port: u16) -> std::io::Result<Answer> {
        #[cfg(feature = "egress-test-resolve")]
        match self.overrides.get(name) {
            Some(Override::Answers(a)) => return Ok(Answer::Addrs(a.clone())),
            Some(Override::StandIn(s)) => return Ok(Answer::StandIn(*s)),
            None => {}
        }
        let addrs: Vec<IpAddr> = tokio::net::lookup_host((name, port))
            .await?
            .map(|a| a.ip())
            .collect();
        Ok(Answer::Addrs(addrs))
    }
}

/// Why the control plane will not connect somewhere: the proxy's reason, for the person who
/// asked.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct Unreachable(pub String);

/// Connections and bytes.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) struct Tally {
    pub connections: u64,
    pub bytes_out: u64,
    pub bytes_in: u64,
}

impl Tally {
    fn add(&mut self, other: Tally) {
        self.connections = self.connections.saturating_add(other.connections);
        self.bytes_out = self.bytes_out.saturating_add(other.bytes_out);
        self.bytes_in = self.bytes_in.saturating_add(other.bytes_in);
    }
}

/// How one connection went, for the meters.
#[derive(Debug, Clone)]
pub(crate) struct Outcome {
    /// Who it is counted to (`sandbox`: code inside, unattributed).
    pub who: String,
    pub host: String,
    pub port: u16,
    pub allowed: bool,
    /// Why it was refused or failed; empty when it went through.
    pub reason: String,
    pub bytes_out: u64,
    pub bytes_in: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Key {
    allowed: bool,
    host: String,
    port: u16,
    reason: String,
}

#[derive(Debug, Default)]
struct RoomMeter {
    /// Since the last audit record.
    window: HashMap<Key, Tally>,
    /// Beyond [`MAX_WINDOW_ENTRIES`]: allowed, refused.
    window_more: [Tally; 2],
    /// Model tokens reported since the last audit record (the durable record spend reads).
    window_tokens: usage::Tokens,
    /// Secrets' values taken out of answers since the last audit record, by secret name.
    window_redacted: BTreeMap<String, u64>,
    /// Since the server started, per participant.
    totals: BTreeMap<String, Totals>,
    recent_denied: VecDeque<Value>,
}

/// One participant's counters.
#[derive(Debug, Default, Clone, Copy, Serialize)]
struct Totals {
    allowed: Tally,
    denied: Tally,
    /// Tokens model providers reported for requests the proxy added a secret to.
    model_tokens: usage::Tokens,
}

/// Participants counted apart per room; later ones are counted as `other`.
const MAX_COUNTED: usize = 64;

impl RoomMeter {
    /// `who`'s counters (`other` past [`MAX_COUNTED`] participants).
    fn totals_of(&mut self, who: String) -> &mut Totals {
        let who = if self.totals.len() < MAX_COUNTED || self.totals.contains_key(&who) {
            who
        } else {
            "other".to_owned()
        };
        self.totals.entry(who).or_default()
    }
}

struct Inner {
    store: Store,
    audit: Audit,
    clock: crate::clock::Clock,
    /// Bytes and tokens are charged to whoever's connection carried them.
    spend: crate::spend::Spend,
    resolver: Resolver,
    meters: Mutex<HashMap<RoomId, RoomMeter>>,
    /// Opens the secrets the proxy adds.
    vault: Arc<crate::secrets::Vault>,
    /// How upstreams' certificates are checked.
    upstream_tls: Arc<rustls::ClientConfig>,
    /// Each room's egress authority, made on first need.
    authorities: Mutex<HashMap<RoomId, Arc<tls::RoomCa>>>,
    /// Each room's connection places.
    places: Mutex<HashMap<RoomId, Arc<tokio::sync::Semaphore>>>,
}

/// Connections the proxy carries at once for one room.
const MAX_PROXIED: usize = 64;

/// Whom a connection counts to: the agent's attribution (a participant's id, `terminal`,
/// `readiness`) when it is a plain name, else `sandbox` (code inside that left its session, or
/// an attribution that does not look like one).
fn attributed(actor: &str) -> String {
    let plain = !actor.is_empty()
        && actor.len() <= 64
        && actor
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if plain {
        actor.to_owned()
    } else {
        "sandbox".to_owned()
    }
}

/// What code inside sees in place of the room's secret `name`: `CODEROOM_SECRET_<NAME>` holds
/// it, and the proxy swaps it for the value in requests to the secret's hosts. Not a secret
/// (it opens nothing by itself), but distinct per room and name.
pub(crate) fn placeholder(room_id: &RoomId, name: &str) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(format!("coderoom placeholder\0{room_id}\0{name}"));
    format!("crs_placeholder_{name}_{}", &hex::encode(digest)[..16])
}

/// Whether a secret rule's host (`api.example.com`, `*.example.com`) covers `host`.
fn rule_covers(pattern: &str, host: &str) -> bool {
    match pattern.strip_prefix("*.") {
        Some(suffix) => {
            host.len() > suffix.len() + 1
                && host.ends_with(suffix)
                && host[..host.len() - suffix.len()].ends_with('.')
        }
        None => pattern == host,
    }
}

/// The control plane's egress proxy. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Egress {
    inner: Arc<Inner>,
}

impl Egress {
    pub(crate) fn new(
        (store, audit, clock): (Store, Audit, crate::clock::Clock),
        spend: crate::spend::Spend,
        resolver: Resolver,
        vault: Arc<crate::secrets::Vault>,
        upstream_tls: Arc<rustls::ClientConfig>,
    ) -> Egress {
        Egress {
            inner: Arc::new(Inner {
                store,
                audit,
                clock,
                spend,
                resolver,
                meters: Mutex::default(),
                vault,
                upstream_tls,
                authorities: Mutex::default(),
                places: Mutex::default(),
            }),
        }
    }

    /// Where the control plane itself may connect for `host:port` (a repository's server):
    /// the address checks code inside gets, without the room's allowlist (the caller's right
    /// to connect a repository decides). The host as read, the address to use (pinned), and
    /// whether it is a test stand-in.
    pub(crate) async fn checked_address(
        &self,
        host_raw: &str,
        port: u16,
    ) -> Result<(addr::Host, SocketAddr), Unreachable> {
        let host = addr::parse_host(host_raw).map_err(|why| Unreachable(why.to_owned()))?;
        let to = proxy::checked_address(self, &host, port)
            .await
            .map_err(|r| Unreachable(r.reason))?;
        Ok((host, to))
    }

    /// The room's egress authority (made on first need, kept while the server runs).
    pub(crate) fn authority(&self, room_id: &RoomId) -> Result<Arc<tls::RoomCa>, tls::TlsError> {
        let mut all = self
            .inner
            .authorities
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(ca) = all.get(room_id) {
            return Ok(ca.clone());
        }
        let ca = Arc::new(tls::RoomCa::new(room_id)?);
        all.insert(room_id.to_owned(), ca.clone());
        Ok(ca)
    }

    /// The variables code inside gets for the room's secrets: `CODEROOM_SECRET_<NAME>` =
    /// its placeholder.
    pub(crate) async fn room_env(&self, room_id: &RoomId) -> Vec<(String, String)> {
        match self.inner.store.secret_rules(room_id).await {
            Ok(rules) => rules
                .iter()
                .map(|r| {
                    (
                        format!("CODEROOM_SECRET_{}", r.name),
                        placeholder(room_id, &r.name),
                    )
                })
                .collect(),
            Err(e) => {
                tracing::error!(room = %room_id, error = %e, "cannot read the room's secret rules");
                Vec::new()
            }
        }
    }

    /// The secrets the proxy adds to requests for `host` (opened now; a value that does not
    /// open is left out and logged by name).
    pub(crate) async fn injections(
        &self,
        room_id: &RoomId,
        host: &str,
    ) -> Vec<intercept::Injection> {
        let rules = match self.inner.store.secret_rules(room_id).await {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(room = %room_id, error = %e, "cannot read the room's secret rules");
                return Vec::new();
            }
        };
        let mut out = Vec::new();
        for rule in rules
            .iter()
            .filter(|r| r.hosts.iter().any(|p| rule_covers(p, host)))
        {
            let sealed = match self.inner.store.sealed_secret(room_id, &rule.name).await {
                Ok(Some(s)) => s,
                _ => continue,
            };
            let Some(raw) = self
                .inner
                .vault
                .open(room_id, &rule.name, &sealed)
                .ok()
                .and_then(|v| String::from_utf8(v).ok())
            else {
                tracing::error!(room = %room_id, secret = %rule.name, "cannot open the secret; not added");
                continue;
            };
            let header = hyper::header::HeaderName::from_bytes(rule.header.as_bytes());
            let value = hyper::header::HeaderValue::from_str(&rule.format.replace("{}", &raw));
            let (Ok(header), Ok(mut value)) = (header, value) else {
                tracing::error!(room = %room_id, secret = %rule.name, "the secret's header is not valid; not added");
                continue;
            };
            value.set_sensitive(true);
            out.push(intercept::Injection {
                name: rule.name.clone(),
                header,
                value,
                raw,
                placeholder: placeholder(room_id, &rule.name),
            });
        }
        out
    }

    /// The header line (`Name: value`) the room's secret `name` makes under its rule, for
    /// the control plane's own requests (a repository's server). `None`: no such secret.
    pub(crate) async fn secret_header(
        &self,
        room_id: &RoomId,
        name: &str,
    ) -> Result<Option<String>, Unreachable> {
        let unavailable = || Unreachable(format!("the secret {name} cannot be opened"));
        let Some(rule) = self
            .inner
            .store
            .secret_rules(room_id)
            .await
            .map_err(|_| unavailable())?
            .into_iter()
            .find(|r| r.name == name)
        else {
            return Ok(None);
        };
        let sealed = self
            .inner
            .store
            .sealed_secret(room_id, name)
            .await
            .map_err(|_| unavailable())?
            .ok_or_else(unavailable)?;
        let raw = self
            .inner
            .vault
            .open(room_id, name, &sealed)
            .ok()
            .and_then(|v| String::from_utf8(v).ok())
            .ok_or_else(unavailable)?;
        self.used_secrets(room_id, &[name.to_owned()]).await;
        Ok(Some(format!(
            "{}: {}",
            rule.header,
            rule.format.replace("{}", &raw)
        )))
    }

    /// Records that the proxy added these secrets (their `last_used_at`).
    pub(crate) async fn used_secrets(&self, room_id: &RoomId, names: &[String]) {
        let now = self.inner.clock.now_ms();
        for name in names {
            if let Err(e) = self.inner.store.touch_secret(room_id, name, now).await {
                tracing::warn!(room = %room_id, secret = %name, error = %e, "cannot record a secret's use");
            }
        }
    }

    fn meters(&self) -> std::sync::MutexGuard<'_, HashMap<RoomId, RoomMeter>> {
        self.inner.meters.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What takes room `room_id`'s outbound connections: each is served on a task of its own,
    /// at most [`MAX_PROXIED`] at once per room (a task holds its place until it ends, however
    /// its stream ended); one more is closed at once and counted as refused.
    pub(crate) fn taker(&self, room_id: RoomId) -> coderoom_sandbox::OutboundFn {
        let this = self.clone();
        let places = self.places(&room_id);
        Arc::new(move |conn, actor| {
            let (this, room) = (this.clone(), room_id.clone());
            let who = attributed(&actor);
            match places.clone().try_acquire_owned() {
                Ok(place) => {
                    tokio::spawn(async move {
                        proxy::serve(&this, &room, &who, conn).await;
                        drop(place);
                    });
                }
                Err(_) => {
                    drop(conn);
                    this.record(
                        &room,
                        Outcome {
                            who,
                            host: "(any)".into(),
                            port: 0,
                            allowed: false,
                            reason: format!("more than {MAX_PROXIED} connections at once"),
                            bytes_out: 0,
                            bytes_in: 0,
                        },
                    );
                }
            }
        })
    }

    /// The room's connection places (one semaphore per room, shared by its sandboxes).
    fn places(&self, room_id: &RoomId) -> Arc<tokio::sync::Semaphore> {
        let mut all = self.inner.places.lock().unwrap_or_else(|e| e.into_inner());
        all.entry(room_id.to_owned())
            .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(MAX_PROXIED)))
            .clone()
    }

    /// The room's policy as stored; a room without one (or an unreadable one) allows nothing.
    pub(crate) async fn policy(&self, room_id: &RoomId) -> Policy {
        match self.inner.store.egress_policy(room_id).await {
            Ok(Some(json)) => serde_json::from_str::<Policy>(&json)
                .ok()
                .and_then(|p| p.checked().ok())
                .unwrap_or_default(),
            Ok(None) => Policy::default(),
            Err(e) => {
                tracing::error!(room = %room_id, error = %e, "cannot read the egress policy; refusing");
                Policy::default()
            }
        }
    }

    /// Refused when the room's budget (or the connection's agent's) of egress bytes or model
    /// tokens is used up.
    pub(crate) async fn within_budget(
        &self,
        room_id: &RoomId,
        who: &str,
    ) -> Result<(), crate::spend::OverBudget> {
        use crate::spend::Meter;
        match self
            .inner
            .spend
            .check(room_id, who, &[Meter::EgressBytes, Meter::ModelTokens])
            .await
        {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(crate::spend::OverBudget(e.to_string())),
            Err(e) => {
                tracing::error!(room = %room_id, error = %e, "cannot read the room's spend; refusing");
                Err(crate::spend::OverBudget(
                    "the room's spend cannot be read now".into(),
                ))
            }
        }
    }

    /// Counts one connection.
    pub(crate) fn record(&self, room_id: &RoomId, o: Outcome) {
        let now = self.inner.clock.now_ms();
        self.inner.spend.charge(
            room_id,
            &o.who,
            crate::spend::Meter::EgressBytes,
            o.bytes_in.saturating_add(o.bytes_out),
        );
        let mut meters = self.meters();
        let m = meters.entry(room_id.to_owned()).or_default();
        let tally = Tally {
            connections: 1,
            bytes_out: o.bytes_out,
            bytes_in: o.bytes_in,
        };
        let key = Key {
            allowed: o.allowed,
            host: o.host.clone(),
            port: o.port,
            reason: o.reason.clone(),
        };
        let slot = usize::from(!o.allowed);
        if m.window.len() < MAX_WINDOW_ENTRIES || m.window.contains_key(&key) {
            m.window.entry(key).or_default().add(tally);
        } else {
            m.window_more[slot].add(tally);
        }
        let t = m.totals_of(o.who);
        if o.allowed {
            t.allowed.add(tally);
        } else {
            t.denied.add(tally);
        }
        if !o.allowed {
            if m.recent_denied.len() == MAX_RECENT_DENIED {
                m.recent_denied.pop_front();
            }
            m.recent_denied.push_back(json!({
                "at": now, "host": o.host, "port": o.port, "reason": o.reason,
            }));
        }
    }

    /// `GET /api/rooms/{id}/egress`'s live part: recent refusals (newest first) and totals.
    pub(crate) fn activity(&self, room_id: &RoomId) -> Value {
        let meters = self.meters();
        let Some(m) = meters.get(room_id) else {
            return json!({ "recent_denied": [], "totals": {} });
        };
        json!({
            "recent_denied": m.recent_denied.iter().rev().collect::<Vec<_>>(),
            "totals": m.totals,
        })
    }

    /// Counts tokens a model provider reported for the room.
    pub(crate) fn record_tokens(&self, room_id: &RoomId, who: &str, tokens: usage::Tokens) {
        self.inner.spend.charge(
            room_id,
            who,
            crate::spend::Meter::ModelTokens,
            tokens.input.saturating_add(tokens.output),
        );
        let mut meters = self.meters();
        let m = meters.entry(room_id.to_owned()).or_default();
        m.totals_of(who.to_owned()).model_tokens.add(tokens);
        m.window_tokens.add(tokens);
    }

    /// Counts the secrets' values taken out of an answer (`counts`: per secret name; never the
    /// values), for the room's next egress record.
    pub(crate) fn record_redacted(&self, room_id: &RoomId, counts: Vec<(String, u64)>) {
        if counts.is_empty() {
            return;
        }
        let mut meters = self.meters();
        let m = meters.entry(room_id.to_owned()).or_default();
        for (name, n) in counts {
            tracing::info!(room = %room_id, secret = %name, times = n, "a secret's value was taken out of an answer");
            *m.window_redacted.entry(name).or_default() += n;
        }
    }

    /// Forgets a deleted room's counters and its authority.
    pub(crate) fn forget(&self, room_id: &RoomId) {
        self.meters().remove(room_id);
        self.inner
            .authorities
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(room_id);
    }

    /// Writes each room's aggregated record(s) for the window that ends now.
    pub(crate) async fn flush(&self, window_ms: u64) {
        type Window = (
            RoomId,
            HashMap<Key, Tally>,
            [Tally; 2],
            usage::Tokens,
            BTreeMap<String, u64>,
        );
        let windows: Vec<Window> = self
            .meters()
            .iter_mut()
            .filter(|(_, m)| {
                !m.window.is_empty()
                    || m.window_more != [Tally::default(); 2]
                    || m.window_tokens != usage::Tokens::default()
                    || !m.window_redacted.is_empty()
            })
            .map(|(room, m)| {
                (
                    room.clone(),
                    std::mem::take(&mut m.window),
                    std::mem::take(&mut m.window_more),
                    std::mem::take(&mut m.window_tokens),
                    std::mem::take(&mut m.window_redacted),
                )
            })
            .collect();
        for (room, window, more, tokens, redacted) in windows {
            for allowed in [true, false] {
                let slot = usize::from(!allowed);
                let mut entries: Vec<(&Key, &Tally)> = window
                    .iter()
                    .filter(|(k, _)| k.allowed == allowed)
                    .collect();
                let no_tokens =
                    !allowed || (tokens == usage::Tokens::default() && redacted.is_empty());
                if entries.is_empty() && more[slot] == Tally::default() && no_tokens {
                    continue;
                }
                entries.sort_by(|a, b| b.1.connections.cmp(&a.1.connections).then(a.0.cmp(b.0)));
                let mut rest = more[slot];
                for (_, t) in entries.iter().skip(MAX_AUDITED_ENTRIES) {
                    rest.add(**t);
                }
                let listed: Vec<Value> = entries
                    .iter()
                    .take(MAX_AUDITED_ENTRIES)
                    .map(|(k, t)| {
                        json!({
                            "host": k.host, "port": k.port, "reason": k.reason,
                            "connections": t.connections, "bytes_out": t.bytes_out,
                            "bytes_in": t.bytes_in,
                        })
                    })
                    .collect();
                let mut details =
                    json!({ "window_ms": window_ms, "connections": listed, "more": rest });
                if allowed {
                    details["model_tokens"] = json!(tokens);
                    if !redacted.is_empty() {
                        details["secrets_redacted"] = json!(redacted);
                    }
                }
                let (decision, reason) = if allowed {
                    ("allow", "")
                } else {
                    ("deny", "not allowed by the room's egress policy")
                };
                if let Err(e) = self
                    .inner
                    .audit
                    .record(
                        &room,
                        "sandbox",
                        "egress",
                        decision,
                        reason,
                        details,
                        Change::None,
                    )
                    .await
                {
                    // A room deleted meanwhile has no chain left to write to.
                    tracing::debug!(room = %room, error = %e, "cannot audit egress");
                }
            }
        }
    }

    /// Writes the aggregated audit records every `every` until shutdown (the caller flushes
    /// once more after the sandboxes stop).
    pub(crate) fn start_auditor(
        &self,
        every: Duration,
        shutdown: tokio_util::sync::CancellationToken,
    ) {
        let this = self.clone();
        let window_ms = u64::try_from(every.as_millis()).unwrap_or(u64::MAX);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = tokio::time::sleep(every) => this.flush(window_ms).await,
                }
            }
        });
    }
}

/// This machine's own addresses (every interface's), which the proxy never connects to.
pub(crate) fn host_addresses() -> Vec<IpAddr> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    addrs
        .filter_map(|a| a.address)
        .filter_map(|a| {
            a.as_sockaddr_in()
                .map(|v4| IpAddr::V4(v4.ip()))
                .or_else(|| a.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip())))
        })
        .collect()
}
