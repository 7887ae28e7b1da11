//! Previews (issue 15): an app in the room's sandbox (HTTP and a WebSocket echo, started from
//! the terminal) served on the preview origin. Room previews only for members, by a one-time
//! link traded for the preview origin's own cookie; public previews only after someone else's
//! approval (owners are mailed), bounded in requests and bytes a second; revocation, expiry and
//! removal from the room end open WebSockets within seconds; a preview cannot set cookies for
//! another host; the room sees which ports listen; room deletion removes previews. A 200 MB
//! download read slowly neither fails nor stalls another preview of the room.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use futures_util::{SinkExt, StreamExt};
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

/// The app (`tests/fixtures/preview_app.py`): `/` names the cookies it received, `/cookies`
/// tries to set one for another host and one of its own, `/big?n=N` sends N bytes, `/ws`
/// echoes WebSocket text frames.
const APP: &str = include_str!("../../tests/fixtures/preview_app.py");

/// A request to the preview origin at `port` for `url`'s host and path, with `cookie`.
async fn get(port: u16, url: &str, cookie: Option<&str>) -> Resp {
    let rest = url.split_once("://").unwrap().1;
    let (host, path) = rest.split_at(rest.find('/').unwrap());
    let mut headers = vec![("Host", host)];
    if let Some(c) = cookie {
        headers.push(("Cookie", c));
    }
    request(
        &format!("http://127.0.0.1:{port}{path}"),
        "GET",
        &headers,
        None,
    )
    .await
}

/// Opens the preview's WebSocket echo as the holder of `cookie` (none for a public preview).
async fn ws(port: u16, url: &str, cookie: Option<&str>) -> Ws {
    let host = url.split_once("://").unwrap().1.split('/').next().unwrap();
    let mut req = format!("ws://127.0.0.1:{port}/ws")
        .into_client_request()
        .unwrap();
    req.headers_mut().insert("host", host.parse().unwrap());
    if let Some(c) = cookie {
        req.headers_mut().insert("cookie", c.parse().unwrap());
    }
    tokio_tungstenite::connect_async(req).await.unwrap().0
}

async fn echoes(ws: &mut Ws, text: &str) {
    ws.send(Message::Text(text.into())).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), ws.next())
        .await
        .unwrap();
    assert_eq!(got.unwrap().unwrap(), Message::Text(text.into()));
}

/// Waits until the socket ends; how long that took.
async fn ends(ws: &mut Ws) -> Duration {
    let start = Instant::now();
    let r = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(Ok(m)) = ws.next().await {
            if m.is_close() {
                break;
            }
        }
    })
    .await;
    assert!(r.is_ok(), "the socket stayed open");
    start.elapsed()
}

/// The preview cookie a one-time link is traded for, checking the trade: a redirect to the
/// same URL without the token, and the link works once.
async fn trade(port: u16, link: &str) -> String {
    let r = get(port, link, None).await;
    assert_eq!(r.status, 303, "{}", r.body);
    assert_eq!(r.header("location"), Some("/"));
    assert_eq!(r.header("referrer-policy"), Some("no-referrer"));
    let set = r.header("set-cookie").unwrap();
    // Host-only (no Domain), script cannot read it, and on `*.localhost` (as on https) it is
    // partitioned: the preview pane's frame holds it under the app's site and no other's. No
    // lifetime of its own: the browser drops it with its session; the server ends it sooner.
    let attrs = set.split_once(';').map_or("", |(_, a)| a);
    assert_eq!(
        attrs, " Path=/; HttpOnly; SameSite=None; Secure; Partitioned",
        "{set}"
    );
    let cookie = set.split(';').next().unwrap().to_owned();
    assert!(cookie.starts_with("coderoom_preview="), "{cookie}");
    assert_eq!(get(port, link, None).await.status, 404, "a link works once");
    cookie
}

/// Puts the app in the room's workspace as `app.py`.
async fn write_app(t: &Room) {
    let script = format!("cat > app.py <<'EOF'\n{APP}\nEOF");
    inside(&t.server, &t.ana, &t.room, &script, &mut String::new()).await;
}

on_each_backend!(
    previews_are_for_members_or_approved_and_end_when_revoked,
    previews_are_for_members_or_approved_and_end_when_revoked_on
);

async fn previews_are_for_members_or_approved_and_end_when_revoked_on(backend: &Backend) {
    let storage = Storage::new(backend).await;
    let extra = [
        "--admin-emails",
        "root@example.com",
        "--preview-rate",
        "2",
        "--preview-bandwidth",
        "250000",
    ];
    let (t, port) = preview_team(&storage, &extra).await;
    let (server, room) = (&t.server, &t.room);
    // Looking at the ports neither starts the sandbox nor finds any.
    let ports = format!("/api/rooms/{room}/sandbox/ports");
    let v = get_json(server, &t.cy, &ports).await;
    assert_eq!(
        v,
        serde_json::json!({"running": false, "listening": [], "previews": true})
    );
    let v = get_json(server, &t.ana, &format!("/api/rooms/{room}/sandbox")).await;
    assert_ne!(v["state"], "running", "{v}");
    let dee = storage.token("dee@example.com").await;
    let (status, inv) = invite(server, &t.ana, room, "owner", 1).await;
    assert_eq!(status, 201);
    assert_eq!(accept(server, &dee, &inv).await, 200);
    let eve = storage.token("eve@example.com").await;
    let previews = format!("/api/rooms/{room}/previews");

    // The app runs from the terminal.
    write_app(&t).await;
    let mut term = term(server, room, &t.ana).await;
    term.send(b"python3 app.py\r").await;
    // The room sees the port open (and never the agent's own forwarder).
    let mut listening = serde_json::Value::Null;
    for _ in 0..200 {
        listening = get_json(server, &t.cy, &ports).await;
        if listening["listening"] == serde_json::json!([8000]) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        listening,
        serde_json::json!({"running": true, "listening": [8000], "previews": true})
    );

    // A room preview: needs publish; only members who may observe open it.
    let body = r#"{"port":8000,"visibility":"room","ttl_s":600}"#;
    assert_eq!(post(server, &t.ben, &previews, body).await.0, 403);
    let (status, p) = post(server, &t.ana, &previews, body).await;
    assert_eq!(status, 201, "{p}");
    assert_eq!(p["state"], "active");
    let id = p["id"].as_str().unwrap().to_owned();
    assert_eq!(id.len(), 32, "128 random bits");
    let preview_url = p["url"].as_str().unwrap().to_owned();
    assert_eq!(
        preview_url,
        format!("http://{id}.preview.localhost:{port}/")
    );
    // Logged out (no link, no cookie): sent to the room, which asks to log in.
    let r = get(port, &preview_url, None).await;
    assert_eq!(r.status, 303);
    assert!(r
        .header("location")
        .unwrap()
        .ends_with(&format!("/rooms/{room}")));
    assert_eq!(
        post(server, &eve, &format!("{previews}/{id}/open"), "{}")
            .await
            .0,
        404
    );
    let (status, opened) = post(server, &t.cy, &format!("{previews}/{id}/open"), "{}").await;
    assert_eq!(status, 200, "{opened}");
    let link = opened["url"].as_str().unwrap().to_owned();
    assert!(link.contains("coderoom_preview_token="));
    let cy_cookie = trade(port, &link).await;
    // The app may not be listening yet: the preview says so and tries again.
    let mut r = get(port, &preview_url, Some(&cy_cookie)).await;
    for _ in 0..100 {
        if r.status == 200 {
            break;
        }
        assert!(
            r.body.contains("tries again") || r.status == 200,
            "{}",
            r.body
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        r = get(port, &preview_url, Some(&cy_cookie)).await;
    }
    assert_eq!(r.status, 200, "{}", r.body);
    // Only the room (its preview pane, on the app's origin) may frame a room preview.
    assert_eq!(
        r.header("content-security-policy"),
        Some(format!("frame-ancestors 'self' http://{}", server.addr).as_str()),
        "a room preview's answers say who may frame them"
    );
    // The app gets its own cookies, never the preview origin's, nor the app's session cookie
    // (a deployment that gives it a Domain has the browser send it to preview hosts too).
    let both = format!(
        "{cy_cookie}; coderoom_session=app-session-token; theme=dark; \
         __Host-coderoom_session=app-session-token"
    );
    let r = get(port, &preview_url, Some(&both)).await;
    assert!(
        r.body.contains("app saw cookies: theme=dark<"),
        "{}",
        r.body
    );
    // A cookie for another host does not pass; the app's own does.
    let r = get(port, &format!("{preview_url}cookies"), Some(&cy_cookie)).await;
    let set: Vec<&str> = r
        .headers
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case("set-cookie"))
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(set, vec!["own=1; Path=/"]);
    // A cookie is for its preview only.
    assert_eq!(
        get(
            port,
            &preview_url.replace(&id, &"0".repeat(32)),
            Some(&cy_cookie)
        )
        .await
        .status,
        404
    );

    // Requests answered are counted.
    let listed = get_json(server, &t.ana, &previews).await;
    assert!(listed[0]["hits"].as_i64().unwrap() >= 3, "{listed}");
    assert_eq!(listed[0]["created_by"], me(server, &t.ana).await);

    // WebSockets pass; removing the viewer from the room ends theirs at once, as it does their
    // room's sockets (not at the next one-second recheck): within half a second of the removal
    // being asked, seen from their end.
    let mut cy_ws = ws(port, &preview_url, Some(&cy_cookie)).await;
    echoes(&mut cy_ws, "hello").await;
    let cy_id = me(server, &t.cy).await;
    let asked = Instant::now();
    let (status, body) = send_json(
        server,
        &t.ana,
        "DELETE",
        &format!("/api/rooms/{room}/participants/{cy_id}"),
        "",
    )
    .await;
    assert!(status == 200 || status == 204, "{status} {body}");
    ends(&mut cy_ws).await;
    assert!(
        asked.elapsed() < Duration::from_millis(500),
        "the preview socket closed {:?} after the removal was asked",
        asked.elapsed()
    );
    assert_eq!(get(port, &preview_url, Some(&cy_cookie)).await.status, 404);

    // Revoking ends the preview's open sockets and requests at once: within a second of the
    // revoke being asked, seen from the client.
    let (_, opened) = post(server, &t.ana, &format!("{previews}/{id}/open"), "{}").await;
    let ana_cookie = trade(port, opened["url"].as_str().unwrap()).await;
    let mut ana_ws = ws(port, &preview_url, Some(&ana_cookie)).await;
    echoes(&mut ana_ws, "still here").await;
    let asked = Instant::now();
    let (status, _) = send_json(server, &t.ana, "DELETE", &format!("{previews}/{id}"), "").await;
    assert_eq!(status, 204);
    ends(&mut ana_ws).await;
    assert!(
        asked.elapsed() < Duration::from_secs(1),
        "{:?}",
        asked.elapsed()
    );
    assert_eq!(get(port, &preview_url, Some(&ana_cookie)).await.status, 410);

    // A public preview, asked by an editor granted publish, waits for someone else's
    // approval, then anyone gets the app.
    let body = r#"{"port":8000,"visibility":"public","ttl_s":600}"#;
    let grant = r#"{"grant":["publish"]}"#;
    assert_eq!(set_role(server, &t.ana, room, &t.ben_id, grant).await, 200);
    let (status, p) = post(server, &t.ben, &previews, body).await;
    assert_eq!(status, 201, "{p}");
    assert_eq!(p["state"], "pending_approval");
    let public = p["url"].as_str().unwrap().to_owned();
    let pid = p["id"].as_str().unwrap().to_owned();
    let r = get(port, &public, None).await;
    assert_eq!(r.status, 403);
    assert!(r.body.contains("waits for an owner's approval") && !r.body.contains("app saw"));
    // The owners are told by mail (the requester is not).
    for owner in ["ana@example.com", "dee@example.com"] {
        let mail = wait_for_mail(&storage, owner, "preview").await;
        assert!(
            mail.contains("ben@example.com asks to make port 8000")
                && mail.contains(&format!("/rooms/{room}")),
            "{mail}"
        );
    }
    assert!(mail_to(&storage, "ben@example.com").is_empty());
    let approval = p["approval_id"].as_str().unwrap().to_owned();
    let decide = format!("/api/rooms/{room}/approvals/{approval}/decision");
    assert_eq!(
        post(server, &t.ben, &decide, r#"{"approve":true}"#).await.0,
        403,
        "not one's own"
    );
    assert_eq!(
        post(server, &dee, &decide, r#"{"approve":true}"#).await.0,
        200
    );
    let r = get(port, &public, None).await;
    assert_eq!(r.status, 200);
    assert!(r.body.contains("app saw cookies: None<"), "{}", r.body);
    // A public preview is for anyone, framed or not: the app's own answer decides.
    assert_eq!(r.header("content-security-policy"), None);
    let mut anon = ws(port, &public, None).await;
    echoes(&mut anon, "anyone").await;
    // Bounded: a burst of requests meets 429 with Retry-After (2 a second, a burst of ten times
    // that): 20 answered (the page and the socket above took two of them), then at most the 2
    // a second that came back meanwhile.
    let mut limited = None;
    let burst = Instant::now();
    let mut answered = 0u32;
    for _ in 0..60 {
        let r = get(port, &public, None).await;
        if r.status == 429 {
            limited = Some(r);
            break;
        }
        assert_eq!(r.status, 200, "{}", r.body);
        answered += 1;
    }
    let limited = limited.expect("60 requests at once were all answered");
    assert!(limited.header("retry-after").is_some());
    let refilled = 2 * u32::try_from(burst.elapsed().as_secs()).unwrap() + 2;
    assert!(
        (18..=18 + refilled).contains(&answered),
        "{answered} answered before the first 429, in {:?}",
        burst.elapsed()
    );
    // ...and bytes (250 kB a second, a burst of a second's): 1 MB takes at least 3 s more. The
    // slowest machine only makes it slower.
    let (big, took) = loop {
        let started = Instant::now();
        let big = get(port, &format!("{public}big?n=1000000"), None).await;
        if big.status != 429 {
            break (big, started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!((big.status, big.raw.len()), (200, 1_000_000));
    assert!(took >= Duration::from_millis(2500), "1 MB in {took:?}");
    let listed = get_json(server, &t.ana, &previews).await;
    let states: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, vec!["active", "revoked"]);
    let asked = Instant::now();
    let (status, _) = send_json(server, &t.ana, "DELETE", &format!("{previews}/{pid}"), "").await;
    assert_eq!(status, 204);
    ends(&mut anon).await;
    assert!(
        asked.elapsed() < Duration::from_secs(1),
        "{:?}",
        asked.elapsed()
    );
    assert_eq!(get(port, &public, None).await.status, 410);
    // An expiring preview ends by itself at its expiry, open WebSockets included: not before
    // its ten seconds, and within a second after.
    let body = r#"{"port":8000,"visibility":"room","ttl_s":10}"#;
    let started = Instant::now();
    let (status, p) = post(server, &t.ana, &previews, body).await;
    assert_eq!(status, 201, "{p}");
    let short = p["url"].as_str().unwrap().to_owned();
    let sid = p["id"].as_str().unwrap().to_owned();
    let (_, opened) = post(server, &t.ana, &format!("{previews}/{sid}/open"), "{}").await;
    let cookie = trade(port, opened["url"].as_str().unwrap()).await;
    let mut expiring = ws(port, &short, Some(&cookie)).await;
    echoes(&mut expiring, "for now").await;
    let r = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(Ok(m)) = expiring.next().await {
            if m.is_close() {
                break;
            }
        }
    })
    .await;
    assert!(r.is_ok(), "the socket outlived its preview");
    let lived = started.elapsed();
    assert!(
        lived >= Duration::from_secs(10) && lived < Duration::from_secs(11),
        "{lived:?}"
    );
    let r = get(port, &short, Some(&cookie)).await;
    assert_eq!(r.status, 410);
    assert!(r.body.contains("expired"), "{}", r.body);

    let chain = audit(server, &t.ana, room).await;
    for action in ["public_preview", "activate_preview", "revoke_preview"] {
        assert!(
            chain.iter().any(|r| r["action"] == action),
            "no {action} in the audit"
        );
    }

    // Deleting the room removes its previews.
    let admin = storage.token("root@example.com").await;
    let v = delete_room(server, &t.ana, &admin, room).await;
    let entry = v["receipt"]["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["artifact"] == "previews")
        .cloned()
        .unwrap();
    assert_eq!(entry["status"], "destroyed", "{v}");
    assert_eq!(get(port, &public, None).await.status, 404);
    drop(term);
}

/// Reads an HTTP/1.1 answer's head from `tcp`: (status, content length).
async fn head_of(tcp: &mut tokio::io::BufReader<tokio::net::TcpStream>) -> (u16, usize) {
    use tokio::io::AsyncBufReadExt;
    let mut status = 0;
    let mut length = 0;
    loop {
        let mut line = String::new();
        tcp.read_line(&mut line).await.unwrap();
        let line = line.trim_end();
        if line.is_empty() {
            return (status, length);
        }
        if let Some(rest) = line.strip_prefix("HTTP/1.1 ") {
            status = rest[..3].parse().unwrap();
        } else if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse().unwrap();
            }
        }
    }
}

#[tokio::test]
async fn a_slow_reader_of_a_big_download_stalls_no_other_preview() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const SIZE: usize = 200_000_000;
    let storage = Storage::new(&Backend::Sqlite).await;
    let (t, port) = preview_team(&storage, &[]).await;
    let (server, room) = (&t.server, &t.room);
    write_app(&t).await;
    let mut term = term(server, room, &t.ana).await;
    term.send(b"python3 app.py 8000 & python3 app.py 8001 &\r")
        .await;
    let previews = format!("/api/rooms/{room}/previews");
    let mut open = Vec::new();
    for app_port in [8000, 8001] {
        let body = format!(r#"{{"port":{app_port},"visibility":"room","ttl_s":3600}}"#);
        let (status, p) = post(server, &t.ana, &previews, &body).await;
        assert_eq!(status, 201, "{p}");
        let id = p["id"].as_str().unwrap();
        let (_, opened) = post(server, &t.ana, &format!("{previews}/{id}/open"), "{}").await;
        let cookie = trade(port, opened["url"].as_str().unwrap()).await;
        let mut r = get(port, p["url"].as_str().unwrap(), Some(&cookie)).await;
        for _ in 0..200 {
            if r.status == 200 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            r = get(port, p["url"].as_str().unwrap(), Some(&cookie)).await;
        }
        assert_eq!(r.status, 200, "{}", r.body);
        open.push((p["url"].as_str().unwrap().to_owned(), cookie));
    }
    let (big, big_cookie) = open[0].clone();
    let (other, other_cookie) = open[1].clone();

    // The slow reader: 200 MB, with long pauses in which it reads nothing at all.
    let host = big
        .split_once("://")
        .unwrap()
        .1
        .trim_end_matches('/')
        .to_owned();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let mut tcp = tokio::io::BufReader::new(tcp);
    tcp.get_mut()
        .write_all(
            format!("GET /big?n={SIZE} HTTP/1.1\r\nHost: {host}\r\nCookie: {big_cookie}\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
    assert_eq!(head_of(&mut tcp).await, (200, SIZE));
    let mut got = 0usize;
    let mut buf = vec![0u8; 64 * 1024];
    let mut pauses = 0;
    let mut next_pause = 1 << 20;
    while got < SIZE {
        let n = tokio::time::timeout(Duration::from_secs(60), tcp.read(&mut buf))
            .await
            .expect("the download stalled")
            .unwrap();
        assert!(n > 0, "the download was cut at {got} bytes");
        // Every byte is the app's: the pattern continues where it left off.
        for (i, b) in buf[..n].iter().enumerate() {
            assert_eq!(usize::from(*b), (got + i) % 256, "byte {}", got + i);
        }
        got += n;
        if got >= next_pause {
            // Paused: the preview's window fills. Meanwhile the other preview answers, page
            // and all, every time.
            next_pause += 50 << 20;
            pauses += 1;
            for _ in 0..3 {
                let r = tokio::time::timeout(
                    Duration::from_secs(20),
                    get(port, &other, Some(&other_cookie)),
                )
                .await
                .expect("the other preview stalled behind the slow reader");
                assert_eq!(r.status, 200, "{}", r.body);
                assert!(r.body.contains("app saw cookies"), "{}", r.body);
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
    assert_eq!(got, SIZE);
    assert!(pauses >= 4);
    drop(term);
}
