//! Spend: meters, budgets and the gate metered work passes. A budgeted room needs `spend` to
//! start metered work; at a budget a person's exec and an agent's get 402 naming the meter and
//! the budget; raising needs someone else's approval; the room's sandbox stops when its
//! sandbox seconds are spent (and does not start again); `GET /spend` sums are exactly the sums
//! of the `metered` audit records, and survive a restart.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// The `metered` audit records' charges, summed per (who, meter).
fn audited(records: &[Value]) -> BTreeMap<(String, String), i64> {
    let mut sums = BTreeMap::new();
    for r in records.iter().filter(|r| r["action"] == "metered") {
        for c in r["details"]["charges"].as_array().unwrap() {
            let key = (
                c["who"].as_str().unwrap().to_owned(),
                c["meter"].as_str().unwrap().to_owned(),
            );
            *sums.entry(key).or_default() += c["amount"].as_i64().unwrap();
        }
    }
    sums
}

/// `GET /spend`'s participants' use, per (who, meter), leaving out zeros.
fn shown(spend: &Value) -> BTreeMap<(String, String), i64> {
    let mut sums = BTreeMap::new();
    for p in spend["participants"].as_array().unwrap() {
        for (meter, n) in p["used"].as_object().unwrap() {
            let n = n.as_i64().unwrap();
            if n > 0 {
                sums.insert((p["who"].as_str().unwrap().to_owned(), meter.clone()), n);
            }
        }
    }
    sums
}

fn budget_body(budget: Value, approval: Option<&str>) -> String {
    let mut b = json!({ "budget": budget });
    if let Some(a) = approval {
        b["approval_id"] = a.into();
    }
    b.to_string()
}

on_each_backend!(
    budgets_stop_metered_work,
    budgets_stop_metered_work_and_spend_sums_match_the_audit
);

async fn budgets_stop_metered_work_and_spend_sums_match_the_audit(backend: &Backend) {
    let storage = Storage::new(backend).await;
    let t = team(&storage).await;
    let (server, room) = (&t.server, &t.room);
    let budget = format!("/api/rooms/{room}/budget");
    let spend = format!("/api/rooms/{room}/spend");

    // Before any budget, editors run commands freely; it is metered all the same.
    let (status, v) = exec(server, &t.ben, room, "echo one").await;
    assert_eq!(status, 200, "{v}");
    let s = get_json(server, &t.cy, &spend).await;
    assert_eq!(s["budget"], Value::Null);
    assert_eq!(s["used"]["execs"], 1, "{s}");

    // A budget needs `spend` (Ben has none); Ana sets one: lowering, at once.
    let (status, _) = put(
        server,
        &t.ben,
        &budget,
        &budget_body(json!({ "execs": 3 }), None),
    )
    .await;
    assert_eq!(status, 403);
    for bad in [json!({ "dollars": 3 }), json!({ "execs": -1 }), json!([3])] {
        let (status, v) = put(server, &t.ana, &budget, &budget_body(bad.clone(), None)).await;
        assert_eq!(status, 400, "{bad}: {v}");
    }
    let (status, v) = put(
        server,
        &t.ana,
        &budget,
        &budget_body(json!({ "execs": 3 }), None),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["budget"], json!({ "execs": 3 }));
    assert_eq!(v["remaining"]["execs"], 2);
    let view = get_json(server, &t.ben, &format!("/api/rooms/{room}")).await;
    assert_eq!(view["budget"], json!({ "execs": 3 }));

    // In a budgeted room, starting metered work needs `spend`: refused and audited.
    let (status, v) = exec(server, &t.ben, room, "echo two").await;
    assert_eq!(status, 403, "{v}");
    let grant = r#"{"grant":["spend"]}"#;
    assert_eq!(set_role(server, &t.ana, room, &t.ben_id, grant).await, 200);
    let (status, v) = exec(server, &t.ben, room, "echo two").await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = exec(server, &t.ana, room, "echo three").await;
    assert_eq!(status, 200, "{v}");
    // The budget is reached: a clear 402, for anyone, naming the meter and the budget.
    let (status, v) = exec(server, &t.ben, room, "echo four > /workspace/four").await;
    assert_eq!(status, 402, "{v}");
    assert_eq!(
        (&v["meter"], &v["used"], &v["budget"], &v["scope"]),
        (&json!("execs"), &json!(3), &json!(3), &json!("room"))
    );
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("budget of commands is spent"),
        "{v}"
    );
    // Nothing already made is lost: the files are there.
    let (status, _) = http(
        &server.url(&format!("/api/rooms/{room}/files/four")),
        "GET",
        Some(&t.ana),
        None,
    )
    .await;
    assert_eq!(status, 404, "the refused command ran");

    // Raising needs an approval by someone else; the raise then applies, once.
    let (status, v) = put(
        server,
        &t.ana,
        &budget,
        &budget_body(json!({ "execs": 7 }), None),
    )
    .await;
    assert_eq!(status, 202, "{v}");
    let approval = v["approval_id"].as_str().unwrap().to_owned();
    let decision = format!("/api/rooms/{room}/approvals/{approval}/decision");
    let (status, _) = post(server, &t.ana, &decision, r#"{"approve":true}"#).await;
    assert_eq!(status, 403, "a requester never approves its own raise");
    let grant = r#"{"grant":["approve"]}"#;
    assert_eq!(set_role(server, &t.ana, room, &t.ben_id, grant).await, 200);
    let (status, v) = post(server, &t.ben, &decision, r#"{"approve":true}"#).await;
    assert_eq!(status, 200, "{v}");
    // Bound to exactly that raise.
    let (status, _) = put(
        server,
        &t.ana,
        &budget,
        &budget_body(json!({ "execs": 500 }), Some(&approval)),
    )
    .await;
    assert_eq!(status, 403);
    let (status, v) = put(
        server,
        &t.ana,
        &budget,
        &budget_body(json!({ "execs": 7 }), Some(&approval)),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = exec(server, &t.ben, room, "echo four").await;
    assert_eq!(status, 200, "{v}");

    // Egress past its budget: the proxy answers 402 with the reason, and nothing goes out.
    let limits = json!({ "execs": 7, "egress_bytes": 0 });
    let (status, v) = put(server, &t.ana, &budget, &budget_body(limits, None)).await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = exec(server, &t.ana, room, "curl -sS -i http://nothing.test/").await;
    assert_eq!(status, 200, "{v}");
    let out = v["stdout"].as_str().unwrap();
    assert!(out.starts_with("HTTP/1.1 402 Payment Required"), "{out}");
    assert!(out.contains("budget of egress bytes is spent"), "{out}");

    // An agent with a budget of its own: held to it whatever the room has left.
    let (status, a) = post(
        server,
        &t.ana,
        &format!("/api/rooms/{room}/agents"),
        &json!({
            "name": "runner", "capabilities": ["observe", "edit", "type", "spend"],
            "ttl_s": 3600, "budget": { "execs": 1 }
        })
        .to_string(),
    )
    .await;
    assert_eq!(status, 201, "{a}");
    let agent = a["token"].as_str().unwrap().to_owned();
    let agent_id = a["agent_id"].as_str().unwrap().to_owned();
    let (status, v) = exec(server, &agent, room, "echo by-agent").await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = exec(server, &agent, room, "echo again").await;
    assert_eq!(status, 402, "{v}");
    assert_eq!(
        (&v["scope"], &v["meter"]),
        (&json!("agent"), &json!("execs"))
    );
    // Nor can it type a command in the terminal instead.
    let mut keys = term(server, room, &agent).await;
    keys.until("joined", |t| t.has_event("sandbox")).await;
    keys.send(b"echo typed-$((20+22))\n").await;
    keys.until("refused: its budget", |t| {
        t.events.iter().any(|e| {
            e["type"] == "floor_refused"
                && e["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains("this agent's budget of commands is spent"))
        })
    })
    .await;
    drop(keys);
    // Ana still may (the room has one left), then the room is at its limit.
    let (status, v) = exec(server, &t.ana, room, "true").await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = exec(server, &t.ana, room, "true").await;
    assert_eq!((status, &v["scope"]), (402, &json!("room")), "{v}");

    // Sandbox seconds: a budget just above what was used stops the running sandbox within a
    // few seconds (snapshotted), and it does not start again.
    let s = get_json(server, &t.ana, &spend).await;
    let used = s["used"]["sandbox_seconds"].as_u64().unwrap();
    assert!(s["by_tier"].is_object(), "{s}");
    let limits = json!({ "execs": 7, "egress_bytes": 0, "sandbox_seconds": used + 2 });
    let (status, v) = put(server, &t.ana, &budget, &budget_body(limits, None)).await;
    assert_eq!(status, 200, "{v}");
    let mut term = term(server, room, &t.ana).await;
    term.until("the room told its sandbox time is spent", |t| {
        t.events
            .iter()
            .any(|e| e["type"] == "spent" && e["meter"] == "sandbox_seconds")
    })
    .await;
    let mut stopped = false;
    for _ in 0..200 {
        let s = get_json(server, &t.ana, &format!("/api/rooms/{room}/sandbox")).await;
        if s["state"] == "stopped" {
            assert!(
                s["reason"]
                    .as_str()
                    .unwrap()
                    .contains("sandbox seconds is spent"),
                "{s}"
            );
            stopped = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(stopped, "the sandbox kept running past its budget");
    let (status, v) = post(
        server,
        &t.ana,
        &format!("/api/rooms/{room}/sandbox/start"),
        "{}",
    )
    .await;
    assert_eq!(
        (status, &v["meter"]),
        (402, &json!("sandbox_seconds")),
        "{v}"
    );

    // GET /spend is exactly the sum of the `metered` audit records, and execs match the `exec`
    // records that ran.
    let s = get_json(server, &t.ana, &spend).await;
    let records = audit(server, &t.ana, room).await;
    assert_eq!(shown(&s), audited(&records), "{s}");
    let execs = records
        .iter()
        .filter(|r| r["action"] == "run_command" && r["decision"] == "allow")
        .count();
    assert_eq!(s["used"]["execs"].as_u64().unwrap(), execs as u64, "{s}");
    assert_eq!(s["used"]["execs"], 7);
    // Sandbox time is the room's, by tier: it reached the budget.
    assert!(
        s["by_tier"]["namespace"].as_u64().unwrap() >= used + 2,
        "{s}"
    );
    let runner = s["participants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["who"] == agent_id.as_str())
        .unwrap();
    assert_eq!(runner["kind"], "agent");
    assert_eq!(runner["name"], "runner (agent)");
    assert_eq!(runner["budget"], json!({ "execs": 1 }));
    assert!(records.iter().any(|r| r["action"] == "budget_reached"));
    // Meters are in /metrics.
    assert!(server.metric("coderoom_spend_total{meter=\"execs\"}").await >= 7.0);
    assert!(
        server
            .metric("coderoom_budget_refusals_total{meter=\"execs\"}")
            .await
            >= 3.0
    );

    // Durable: after a restart the figures are the same, and so are the budgets.
    drop(term);
    let Room { server, .. } = t;
    server.terminate().await;
    let server = Server::start(&storage, &[]).await;
    let again = get_json(&server, &t_ana(&storage).await, &spend).await;
    assert_eq!(shown(&again), shown(&s));
    assert_eq!(
        again["budget"],
        json!({ "execs": 7, "egress_bytes": 0, "sandbox_seconds": used + 2 })
    );
}

async fn t_ana(storage: &Storage) -> String {
    storage.token("ana@example.com").await
}

/// Commands sent at once cannot all pass the last one the budget has left: exactly as many run
/// as were left, the others get 402.
#[tokio::test]
async fn commands_at_once_never_pass_the_last_one_left() {
    let storage = Storage::new(&Backend::Sqlite).await;
    let t = team(&storage).await;
    let (server, room) = (&t.server, &t.room);
    let (status, v) = put(
        server,
        &t.ana,
        &format!("/api/rooms/{room}/budget"),
        &budget_body(json!({ "execs": 3 }), None),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let runs = (0..8).map(|i| {
        exec(
            server,
            &t.ana,
            room,
            if i % 2 == 0 { "true" } else { "echo x" },
        )
    });
    let statuses: Vec<u16> = futures_util::future::join_all(runs)
        .await
        .into_iter()
        .map(|(s, _)| s)
        .collect();
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        3,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 402).count(),
        5,
        "{statuses:?}"
    );
    let s = get_json(server, &t.ana, &format!("/api/rooms/{room}/spend")).await;
    assert_eq!(s["used"]["execs"], 3, "{s}");
    // An agent's budget cannot cap sandbox time (the room's).
    let (status, v) = post(
        server,
        &t.ana,
        &format!("/api/rooms/{room}/agents"),
        r#"{"name":"x","capabilities":["observe"],"ttl_s":3600,"budget":{"sandbox_seconds":5}}"#,
    )
    .await;
    assert_eq!(status, 400, "{v}");
}
