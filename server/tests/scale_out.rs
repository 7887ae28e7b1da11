//! Scale-out (issue 18): several `coderoom serve` processes on one PostgreSQL. A room is owned
//! by one server at a time (a lease with a fencing token); connections reaching another server
//! are forwarded to the owner; when the owner dies its rooms move once the lease lapses, and a
//! stale owner (paused past its lease) cannot append: the database refuses it, and it closes
//! the room.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use std::time::{Duration, Instant};

/// Short leases, so failover tests take seconds.
const LEASE_MS: &str = "2000";

/// `n` servers on `storage`'s database, each with a data directory of its own (kept beside
/// them), with short leases and `root@example.com` as a system admin.
async fn cluster(storage: &Storage, n: usize) -> (Vec<Server>, Vec<Storage>) {
    let args = [
        "--room-lease-ms",
        LEASE_MS,
        "--admin-emails",
        "root@example.com",
    ];
    let mut servers = vec![Server::start(storage, &args).await];
    let mut others = Vec::new();
    for _ in 1..n {
        let s = storage.sharing();
        servers.push(Server::start(&s, &args).await);
        others.push(s);
    }
    (servers, others)
}

/// The room's owner `token` asks, through `server`, for `room` to be deleted; the deletion's id.
async fn ask_deletion(server: &Server, token: &str, room: &str) -> String {
    let (status, body) = http(
        &server.url(&format!("/api/rooms/{room}")),
        "DELETE",
        Some(token),
        None,
    )
    .await;
    assert_eq!(status, 202, "{body}");
    serde_json::from_str::<serde_json::Value>(&body).unwrap()["deletion_id"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Connects to `server` until it serves the room (a server whose room's owner just died answers
/// 503 until the lease lapses), for at most `within`.
async fn connect_within(server: &Server, room: &str, token: &str, within: Duration) -> Client {
    let started = Instant::now();
    loop {
        match Client::try_connect_synced(server, room, token).await {
            Ok(c) => return c,
            Err(e) if started.elapsed() < within => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("no connection to the room within {within:?}: {e}"),
        }
    }
}

/// Receives until `c`'s `file` satisfies `pred`, for at most 15 s.
async fn until_text(c: &mut Client, file: &str, pred: impl Fn(&str) -> bool) {
    let r = tokio::time::timeout(TIMEOUT, async {
        while !pred(&c.content(file)) {
            if let Event::Closed(code) = c.next().await {
                panic!(
                    "closed ({code:?}) while waiting; {file} reads {:?}",
                    c.content(file)
                );
            }
        }
    })
    .await;
    assert!(r.is_ok(), "{file} reads {:?}", c.content(file));
}

fn signal(server: &Server, sig: &str) {
    let pid = server.child.id().unwrap().to_string();
    let ok = std::process::Command::new("kill")
        .args([sig, &pid])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {pid}");
}

/// Three servers: clients of one room on different servers converge (the others forward to the
/// owner); kill -9 of the owner while a client types moves the room to another server within
/// the lease and a second, with everything a peer had received kept, and every client converges after
/// reconnecting.
#[tokio::test]
async fn a_room_follows_its_owner_and_survives_its_death() {
    let Some(pg) = postgres() else { return };
    let storage = Storage::new(&pg).await;
    let ana = storage.token("ana@example.com").await;
    let (mut servers, _dirs) = cluster(&storage, 3).await;
    let room = create_room(&servers[1], &ana).await;

    // The first client makes server 0 the owner; the others reach it through servers 1 and 2.
    let mut c0 = Client::connect(&servers[0], &room, &ana).await;
    c0.synced().await;
    let mut c1 = Client::connect(&servers[1], &room, &ana).await;
    c1.synced().await;
    let mut c2 = Client::connect(&servers[2], &room, &ana).await;
    c2.synced().await;
    assert!(servers[1].metric("coderoom_requests_forwarded_total").await >= 1.0);
    assert!(servers[2].metric("coderoom_requests_forwarded_total").await >= 1.0);
    assert_eq!(servers[0].metric("coderoom_rooms_loaded").await, 1.0);
    assert_eq!(servers[1].metric("coderoom_rooms_loaded").await, 0.0);
    c1.insert("a.txt", 0, "one;").await;
    until_text(&mut c0, "a.txt", |t| t.contains("one;")).await;
    until_text(&mut c2, "a.txt", |t| t.contains("one;")).await;
    c2.insert("a.txt", 0, "two;").await;
    until_text(&mut c1, "a.txt", |t| t.contains("two;")).await;
    until_text(&mut c0, "a.txt", |t| {
        t.contains("two;") && t.contains("one;")
    })
    .await;

    // Server 1's client types while the owner is killed; server 2's client keeps what it is
    // sent, until its connection ends.
    let typist = tokio::spawn(async move {
        let mut i = 0;
        loop {
            let at = c1.content("a.txt").chars().count() as u32;
            c1.insert("a.txt", at, &format!("k{i};")).await;
            i += 1;
            tokio::select! {
                e = c1.next() => if let Event::Closed(_) = e { return i },
                () = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
        }
    });
    until_text(&mut c2, "a.txt", |t| t.contains("k5;")).await;
    let owner = servers.remove(0);
    drop(c0);
    owner.kill9().await;
    let killed = Instant::now();
    let typed = typist.await.unwrap();
    assert!(typed > 5, "the typist stopped early");
    let received = loop {
        match c2.next().await {
            Event::Closed(_) => break c2.content("a.txt"),
            Event::Y(_) => {}
        }
    };
    assert!(received.contains("k5;"), "{received}");

    // Reconnecting through either survivor reaches the room again once the lease lapses.
    let lease = Duration::from_millis(LEASE_MS.parse().unwrap());
    // The owner renewed its lease at most a lease before it died: by then the lease has lapsed
    // and a survivor takes the room; a second more covers the reload and the client's retry.
    let bound = lease + Duration::from_secs(1);
    let mut d1 = connect_within(&servers[0], &room, &ana, bound).await;
    let moved_after = killed.elapsed();
    let mut d2 = connect_within(&servers[1], &room, &ana, lease * 2).await;
    let after = d1.content("a.txt");
    for piece in received.split(';').filter(|p| !p.is_empty()) {
        assert!(
            after.contains(&format!("{piece};")),
            "{piece} was received by a peer but is gone: {after}"
        );
    }
    d1.insert("a.txt", 0, "three;").await;
    until_text(&mut d2, "a.txt", |t| t.contains("three;")).await;
    assert_eq!(d1.content("a.txt").len(), d2.content("a.txt").len());
    let loaded: f64 = servers[0].metric("coderoom_rooms_loaded").await
        + servers[1].metric("coderoom_rooms_loaded").await;
    assert_eq!(loaded, 1.0, "exactly one survivor holds the room");
    eprintln!("the room moved {moved_after:?} after the kill (lease {lease:?})");
    assert!(moved_after < bound, "{moved_after:?}");
    storage.drop_db().await;
}

/// A stale owner: paused (SIGSTOP) past its lease while another server takes the room over,
/// then resumed. Its next append is refused by the database (nothing of it lands), and it
/// closes the room's sockets with 1012 so that their clients reconnect to the new owner.
#[tokio::test]
async fn a_stale_owner_cannot_append_and_lets_go() {
    let Some(pg) = postgres() else { return };
    let storage = Storage::new(&pg).await;
    let ana = storage.token("ana@example.com").await;
    let (servers, _dirs) = cluster(&storage, 2).await;
    let room = create_room(&servers[0], &ana).await;
    let mut stale = Client::connect(&servers[0], &room, &ana).await;
    stale.synced().await;
    stale.insert("a.txt", 0, "before;").await;
    let mut fresh = Client::connect(&servers[1], &room, &ana).await;
    fresh.synced().await;
    until_text(&mut fresh, "a.txt", |t| t == "before;").await;
    drop(fresh);

    signal(&servers[0], "-STOP");
    let lease = Duration::from_millis(LEASE_MS.parse().unwrap());
    tokio::time::sleep(lease + Duration::from_millis(500)).await;
    let mut fresh = connect_within(&servers[1], &room, &ana, lease * 4).await;
    assert_eq!(fresh.content("a.txt"), "before;");
    assert_eq!(servers[1].metric("coderoom_rooms_loaded").await, 1.0);
    fresh.insert("a.txt", 7, "new owner;").await;
    until_text(&mut fresh, "a.txt", |t| t.contains("new owner;")).await;

    // The stale owner wakes up to an edit from its old client.
    stale.insert("a.txt", 0, "stale;").await;
    signal(&servers[0], "-CONT");
    assert_eq!(
        stale.closed().await,
        Some(1012),
        "the stale owner lets its clients go"
    );
    let stored = storage
        .query_i64(
            "SELECT COUNT(*) FROM doc_updates WHERE room_id = $1 AND position('stale;' in encode(data, 'escape')) > 0",
            &[Arg::from(&room)],
        )
        .await;
    assert_eq!(stored, 0, "nothing of the stale owner's edit is in the log");
    assert_eq!(servers[0].metric("coderoom_rooms_moved_total").await, 1.0);
    assert_eq!(servers[0].metric("coderoom_rooms_loaded").await, 0.0);
    // Its clients reconnect (here, to the stale server: it forwards to the new owner).
    let again = connect_within(&servers[0], &room, &ana, lease * 2).await;
    assert_eq!(again.content("a.txt"), "before;new owner;");
    storage.drop_db().await;
}

/// Revoking a participant through a server that does not own the room closes their sockets,
/// wherever they are connected, within a second.
#[tokio::test]
async fn revoking_through_a_non_owner_closes_sockets_within_a_second() {
    let Some(pg) = postgres() else { return };
    let storage = Storage::new(&pg).await;
    let ana = storage.token("ana@example.com").await;
    let ben = storage.token("ben@example.com").await;
    let (servers, _dirs) = cluster(&storage, 3).await;
    let room = create_room(&servers[0], &ana).await;
    let (status, inv) = invite(&servers[0], &ana, &room, "editor", 1).await;
    assert_eq!(status, 201);
    assert_eq!(accept(&servers[2], &ben, &inv).await, 200);
    let ben_id = me(&servers[0], &ben).await;
    let mut owner_side = Client::connect(&servers[0], &room, &ana).await;
    owner_side.synced().await;
    let mut via_other = Client::connect(&servers[1], &room, &ben).await;
    via_other.synced().await;
    // A client claiming to be a forwarding server is not served by a server that does not own
    // the room (that would make it a second owner): 503, and it retries.
    let auth = format!("Bearer {ana}");
    let spoofed = request(
        &servers[1].url(&format!("/api/rooms/{room}/exec")),
        "POST",
        &[("Authorization", &auth), ("x-coderoom-forwarded-by", "x")],
        Some(r#"{"argv":["true"]}"#),
    )
    .await;
    assert_eq!(spoofed.status, 503, "{}", spoofed.body);
    assert_eq!(servers[1].metric("coderoom_rooms_loaded").await, 0.0);
    // At the owner the header is no credential either: a forged "forwarded" request is
    // authenticated and decided as any other (no token: 401; a token without the right: 403).
    let exec_at_owner = servers[0].url(&format!("/api/rooms/{room}/exec"));
    let forged = request(
        &exec_at_owner,
        "POST",
        &[("x-coderoom-forwarded-by", "x")],
        Some(r#"{"argv":["true"]}"#),
    )
    .await;
    assert_eq!(forged.status, 401, "{}", forged.body);
    let carol = storage.token("carol@example.com").await;
    let forged = request(
        &exec_at_owner,
        "POST",
        &[
            ("Authorization", &format!("Bearer {carol}")),
            ("x-coderoom-forwarded-by", "x"),
        ],
        Some(r#"{"argv":["true"]}"#),
    )
    .await;
    assert!(
        forged.status == 403 || forged.status == 404,
        "a stranger's forged request: {} {}",
        forged.status,
        forged.body
    );
    let started = Instant::now();
    let url = servers[2].url(&format!("/api/rooms/{room}/participants/{ben_id}"));
    let (status, body) = http(&url, "DELETE", Some(&ana), None).await;
    assert_eq!(status, 204, "{body}");
    assert_eq!(via_other.closed().await, Some(4003));
    let took = started.elapsed();
    assert!(took < Duration::from_secs(1), "{took:?}");
    storage.drop_db().await;
}

/// Events every server hears (`LISTEN/NOTIFY`): a logout, and an account revoked everywhere by
/// an admin, each through a server that holds none of the sockets, close them within a second
/// where they are. A session ended while a server was not listening (its connection to the
/// database cut, the session removed with no announcement at all) is found by the catch-up
/// when it listens again.
#[tokio::test]
async fn logouts_and_revocations_reach_every_server() {
    let Some(pg) = postgres() else { return };
    let storage = Storage::new(&pg).await;
    let ana = storage.token("ana@example.com").await;
    let ben = storage.token("ben@example.com").await;
    let cy = storage.token("cy@example.com").await;
    let dee = storage.token("dee@example.com").await;
    let root = storage.token("root@example.com").await;
    let (servers, _dirs) = cluster(&storage, 3).await;
    let room = create_room(&servers[0], &ana).await;
    let (status, inv) = invite(&servers[0], &ana, &room, "editor", 5).await;
    assert_eq!(status, 201);
    for who in [&ben, &cy, &dee] {
        assert_eq!(accept(&servers[0], who, &inv).await, 200);
    }
    let cy_id = me(&servers[0], &cy).await;
    let mut owner = Client::connect(&servers[0], &room, &ana).await;
    owner.synced().await;
    let mut b = Client::connect(&servers[0], &room, &ben).await;
    b.synced().await;
    let mut c = Client::connect(&servers[0], &room, &cy).await;
    c.synced().await;
    let mut d = Client::connect(&servers[0], &room, &dee).await;
    d.synced().await;

    // Ben logs out through server 1.
    let started = Instant::now();
    let (status, _) = http(
        &servers[1].url("/api/auth/logout"),
        "POST",
        Some(&ben),
        None,
    )
    .await;
    assert_eq!(status, 204);
    assert_eq!(b.closed().await, Some(4001));
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );

    // An admin revokes Cy everywhere through server 2.
    let started = Instant::now();
    let revoke = servers[2].url(&format!("/api/admin/users/{cy_id}/revoke"));
    let (status, body) = http(&revoke, "POST", Some(&root), None).await;
    assert_eq!(status, 200, "{body}");
    let code = c.closed().await;
    assert!(matches!(code, Some(4001 | 4003)), "{code:?}");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );

    // Server 0's listening connection is cut, and Dee's session removed behind every server's
    // back: nothing announces it; the catch-up finds it.
    storage
        .execute(
            "DELETE FROM sessions WHERE user_id = (SELECT id FROM users WHERE email = $1)",
            &[Arg::from("dee@example.com")],
        )
        .await;
    let cut = storage
        .query_i64(
            "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE datname = current_database() AND query LIKE 'LISTEN%'",
            &[],
        )
        .await;
    assert!(
        cut >= 3,
        "every server listens ({cut} listening connections cut)"
    );
    assert_eq!(d.closed().await, Some(4001));
    // Ana, whose session stands, stays.
    owner.insert("t", 0, "still here").await;
    let mut check = Client::connect(&servers[1], &room, &ana).await;
    check.synced().await;
    assert_eq!(check.content("t"), "still here");
    storage.drop_db().await;
}

/// A deletion confirmed through a server that does not hold the room is carried out where the
/// room is: its sockets close with 4004 and its running sandbox is destroyed (the receipt says
/// so, not "none").
#[tokio::test]
async fn a_deletion_confirmed_elsewhere_runs_where_the_room_is() {
    let Some(pg) = postgres() else { return };
    let storage = Storage::new(&pg).await;
    let ana = storage.token("ana@example.com").await;
    let root = storage.token("root@example.com").await;
    let (servers, _dirs) = cluster(&storage, 2).await;
    let (owner, other) = (&servers[0], &servers[1]);
    let room = create_room(owner, &ana).await;
    let mut c = Client::connect(owner, &room, &ana).await;
    c.synced().await;
    let (status, out) = exec(owner, &ana, &room, "echo running").await;
    assert_eq!(
        (status, out["stdout"].as_str()),
        (200, Some("running\n")),
        "{out}"
    );
    // A command that takes a while answers through the other server as it does at the owner.
    let (status, out) = exec(other, &ana, &room, "sleep 7; echo slow").await;
    assert_eq!(
        (status, out["stdout"].as_str()),
        (200, Some("slow\n")),
        "{out}"
    );
    let id = ask_deletion(other, &ana, &room).await;
    let confirm = other.url(&format!("/api/deletions/{id}/confirm"));
    let (status, body) = http(&confirm, "POST", Some(&root), None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(c.closed().await, Some(4004));
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let sandbox = v["receipt"]["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["artifact"] == "sandbox")
        .cloned()
        .unwrap();
    assert_eq!(sandbox["status"], "destroyed", "{v}");
    storage.drop_db().await;
}

/// A deletion whose server died part way is carried out by another running server once the
/// dead one's claim lapses (three leases), not at the next start of some server; and a server
/// that is alive keeps its deletions: nobody else runs them meanwhile.
#[tokio::test]
async fn a_deletion_left_part_way_by_a_dead_server_is_finished_by_a_running_one() {
    let Some(pg) = postgres() else { return };
    let storage = Storage::new(&pg).await;
    let ana = storage.token("ana@example.com").await;
    let root = storage.token("root@example.com").await;
    let args = [
        "--room-lease-ms",
        LEASE_MS,
        "--admin-emails",
        "root@example.com",
    ];
    let crashing = Server::start_with_env(
        &storage,
        &args,
        &[("CODEROOM_FAULT_PAUSE_AT", "deletion_after_steps_2")],
    )
    .await;
    let shared = storage.sharing();
    let other = Server::start(&shared, &args).await;
    let room = create_room(&crashing, &ana).await;
    let mut c = Client::connect(&crashing, &room, &ana).await;
    c.synced().await;
    c.insert("main.rs", 0, "to be deleted").await;
    eventually(&crashing, &room, &ana, "main.rs", "to be deleted").await;
    let id = ask_deletion(&crashing, &ana, &room).await;
    let confirm = crashing.url(&format!("/api/deletions/{id}/confirm"));
    let confirming = tokio::spawn(async move {
        let _ = request_within(
            &confirm,
            "POST",
            &[("Authorization", &format!("Bearer {root}"))],
            None,
            Duration::from_secs(120),
        )
        .await;
    });
    crashing.stopped_at("deletion_after_steps_2").await;
    let lease = Duration::from_millis(LEASE_MS.parse().unwrap());
    // Paused, not dead: the other server leaves its deletion alone. Its sweeper passes once
    // a lease; two passes after the pause, a claim nobody renewed would have lapsed and been
    // taken (the positive event the refusal is read after, not a fixed time).
    let sweeps = || other.metric("coderoom_deletion_sweeps_total");
    let from = sweeps().await;
    let waited = Instant::now();
    while sweeps().await < from + 2.0 {
        assert!(
            waited.elapsed() < lease * 2 + TIMEOUT,
            "the other server's deletion sweeper did not run"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let state = |d: &serde_json::Value| d["state"].as_str().unwrap_or_default().to_owned();
    let root = storage.token("root@example.com").await;
    let path = format!("/api/deletions/{id}");
    assert_eq!(state(&get_json(&other, &root, &path).await), "confirmed");
    crashing.kill9().await;
    confirming.abort();
    let died = Instant::now();
    let finished = loop {
        let d = get_json(&other, &root, &path).await;
        if state(&d) == "done" {
            break d;
        }
        assert!(
            died.elapsed() < lease * 3 + lease * 2 + TIMEOUT,
            "not picked up in time: {d}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let artifacts = finished["receipt"]["artifacts"].as_array().unwrap();
    assert!(
        artifacts.iter().all(|a| a["status"] != "pending"),
        "{finished}"
    );
    let (status, _) = http(
        &other.url(&format!("/api/rooms/{room}")),
        "GET",
        Some(&ana),
        None,
    )
    .await;
    assert_eq!(status, 404, "the room is gone");
    storage.drop_db().await;
}

/// A sandbox's idle stop is its own server's: another live server never records a stop for a
/// room it does not hold (it would leave the running sandbox with no timer); a room whose
/// server died is stopped on record by one that runs.
#[tokio::test]
async fn an_idle_stop_is_made_where_the_sandbox_runs_or_picked_up_when_its_server_died() {
    let Some(pg) = postgres() else { return };
    let storage = Storage::new(&pg).await;
    let ana = storage.token("ana@example.com").await;
    let args = ["--room-lease-ms", LEASE_MS, "--sandbox-idle-ms", "1500"];
    let runner = Server::start(&storage, &args).await;
    let shared = storage.sharing();
    let other = Server::start(&shared, &args).await;
    let stops = |records: &[serde_json::Value]| -> Vec<String> {
        records
            .iter()
            .filter(|r| r["action"] == "sandbox_stop")
            .map(|r| r["details"].to_string())
            .collect()
    };

    // Idle on its own server: stopped there (a snapshot taken), once.
    let room = create_room(&runner, &ana).await;
    let (status, out) = exec(&runner, &ana, &room, "echo kept > /workspace/kept.txt").await;
    assert_eq!(status, 200, "{out}");
    let started = Instant::now();
    let stopped = loop {
        let s = get_json(&runner, &ana, &format!("/api/rooms/{room}/sandbox")).await;
        if s["state"] == "stopped" {
            break s;
        }
        assert!(started.elapsed() < TIMEOUT * 2, "never stopped: {s}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        !stopped["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("timer fired"),
        "stopped by its own server: {stopped}"
    );
    assert!(stopped["snapshot_at"].is_number(), "{stopped}");
    let records = audit(&runner, &ana, &room).await;
    assert_eq!(stops(&records).len(), 1, "{:?}", stops(&records));

    // Its server dies with it running: another one records the stop when it comes due.
    let room = create_room(&runner, &ana).await;
    let (status, out) = exec(&runner, &ana, &room, "true").await;
    assert_eq!(status, 200, "{out}");
    runner.kill9().await;
    let died = Instant::now();
    let lease = Duration::from_millis(LEASE_MS.parse().unwrap());
    loop {
        // Answered 503 until the dead server's lease on the room lapses.
        let (status, body) = http(
            &other.url(&format!("/api/rooms/{room}/sandbox")),
            "GET",
            Some(&ana),
            None,
        )
        .await;
        let s: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        if status == 200 && s["state"] == "stopped" {
            assert!(
                s["reason"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("its server had stopped or gone"),
                "{s}"
            );
            break;
        }
        assert!(died.elapsed() < lease * 2 + TIMEOUT, "never picked up: {s}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    storage.drop_db().await;
}

/// A room that moves while its sandbox runs on its old server (paused past its lease): once
/// that server wakes, it ends the sandbox there instead of retrying to join a room it no longer
/// holds, says so in the room's audit log, and leaves the room's shared sandbox record to the
/// server that holds the room; the room's next command starts the sandbox there.
#[tokio::test]
async fn a_sandbox_whose_room_moved_ends_where_it_ran_and_starts_where_the_room_is() {
    let Some(pg) = postgres() else { return };
    let storage = Storage::new(&pg).await;
    let ana = storage.token("ana@example.com").await;
    let (servers, _dirs) = cluster(&storage, 2).await;
    let (old, new) = (&servers[0], &servers[1]);
    let room = create_room(old, &ana).await;
    let (status, out) = exec(
        old,
        &ana,
        &room,
        "echo made-on-the-old > /workspace/old.txt",
    )
    .await;
    assert_eq!(status, 200, "{out}");
    // In the room's document (what a sandbox's workspace is made from wherever it starts).
    let mut c = Client::connect(old, &room, &ana).await;
    c.synced().await;
    c.wait_for_file("old.txt", "made-on-the-old\n").await;
    drop(c);

    signal(old, "-STOP");
    let lease = Duration::from_millis(LEASE_MS.parse().unwrap());
    tokio::time::sleep(lease + Duration::from_millis(500)).await;
    let _client = connect_within(new, &room, &ana, lease * 4).await;
    signal(old, "-CONT");
    let woke = Instant::now();
    let abandoned = loop {
        let records = audit(new, &ana, &room).await;
        if let Some(r) = records.iter().find(|r| r["action"] == "sandbox_abandoned") {
            break r.clone();
        }
        assert!(
            woke.elapsed() < TIMEOUT * 2,
            "the old server never ended it"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        abandoned["details"]
            .to_string()
            .contains("the room moved to another server"),
        "{abandoned}"
    );
    // Started where the room is now, its workspace made from the room's files.
    let out = stdout_until(
        new,
        &ana,
        &room,
        "cat /workspace/old.txt",
        "made-on-the-old",
    )
    .await;
    assert_eq!(out, "made-on-the-old\n");
    storage.drop_db().await;
}
