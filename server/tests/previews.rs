//! Previews (issue 15, first part): an app in the room's sandbox (HTTP and a WebSocket echo,
//! started from the terminal) served on the preview origin. Room previews only for members, by a
//! one-time link traded for the preview origin's own cookie; public previews only after someone
//! else's approval; revocation and removal from the room end open WebSockets within seconds; a
//! preview cannot set cookies for another host; room deletion removes previews.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use futures_util::{SinkExt, StreamExt};
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

/// The app: `/` answers with the cookies it received, `/cookies` tries to set one for another
/// host and one of its own, `/ws` echoes WebSocket text frames.
const APP: &str = r#"
import base64, hashlib, http.server, socketserver
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_GET(self):
        if self.path == "/ws":
            key = self.headers["Sec-WebSocket-Key"]
            accept = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
            self.send_response(101)
            self.send_header("Upgrade", "websocket")
            self.send_header("Connection", "Upgrade")
            self.send_header("Sec-WebSocket-Accept", accept)
            self.end_headers()
            self.wfile.flush()
            while True:
                head = self.rfile.read(2)
                if len(head) < 2 or head[0] & 0x0f == 8:
                    return
                n = head[1] & 0x7f
                if n == 126:
                    n = int.from_bytes(self.rfile.read(2), "big")
                mask = self.rfile.read(4)
                data = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(n)))
                self.wfile.write(bytes([0x81, len(data)]) + data)
                self.wfile.flush()
        body = ("app saw cookies: " + str(self.headers.get("Cookie"))).encode()
        self.send_response(200)
        if self.path == "/cookies":
            self.send_header("Set-Cookie", "stolen=1; Domain=localhost; Path=/")
            self.send_header("Set-Cookie", "own=1; Path=/")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
S(("127.0.0.1", 8000), H).serve_forever()
"#;

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
    let cookie = r
        .header("set-cookie")
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    assert!(cookie.starts_with("coderoom_preview="), "{cookie}");
    assert_eq!(get(port, link, None).await.status, 404, "a link works once");
    cookie
}

#[tokio::test]
async fn previews_are_for_members_or_approved_and_end_when_revoked() {
    let storage = Storage::new(&Backend::Sqlite).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://{{id}}.preview.localhost:{port}");
    let listen = format!("127.0.0.1:{port}");
    let t = team_with(
        &storage,
        &[
            "--preview-url",
            &url,
            "--preview-listen",
            &listen,
            "--admin-emails",
            "root@example.com",
        ],
    )
    .await;
    let (server, room) = (&t.server, &t.room);
    let dee = storage.token("dee@example.com").await;
    let (status, inv) = invite(server, &t.ana, room, "owner", 1).await;
    assert_eq!(status, 201);
    assert_eq!(accept(server, &dee, &inv).await, 200);
    let eve = storage.token("eve@example.com").await;
    let previews = format!("/api/rooms/{room}/previews");

    // The app runs from the terminal.
    inside(
        server,
        &t.ana,
        room,
        &format!("cat > app.py <<'EOF'\n{APP}\nEOF"),
        &mut String::new(),
    )
    .await;
    let mut term = term(server, room, &t.ana).await;
    term.send(b"python3 app.py\r").await;

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
    // The app gets its own cookies, never the preview origin's.
    let both = format!("{cy_cookie}; theme=dark");
    let r = get(port, &preview_url, Some(&both)).await;
    assert_eq!(r.body, "app saw cookies: theme=dark");
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

    // WebSockets pass; removing the viewer from the room ends theirs within seconds.
    let mut cy_ws = ws(port, &preview_url, Some(&cy_cookie)).await;
    echoes(&mut cy_ws, "hello").await;
    let (status, body) = send_json(
        server,
        &t.ana,
        "DELETE",
        &format!("/api/rooms/{room}/participants/{}", me(server, &t.cy).await),
        "",
    )
    .await;
    assert!(status == 200 || status == 204, "{status} {body}");
    assert!(ends(&mut cy_ws).await < Duration::from_secs(5));
    assert_eq!(get(port, &preview_url, Some(&cy_cookie)).await.status, 404);

    // Revoking ends the preview's open sockets and requests within seconds.
    let (_, opened) = post(server, &t.ana, &format!("{previews}/{id}/open"), "{}").await;
    let ana_cookie = trade(port, opened["url"].as_str().unwrap()).await;
    let mut ana_ws = ws(port, &preview_url, Some(&ana_cookie)).await;
    echoes(&mut ana_ws, "still here").await;
    let (status, _) = send_json(server, &t.ana, "DELETE", &format!("{previews}/{id}"), "").await;
    assert_eq!(status, 204);
    assert!(ends(&mut ana_ws).await < Duration::from_secs(5));
    assert_eq!(get(port, &preview_url, Some(&ana_cookie)).await.status, 410);

    // A public preview waits for someone else's approval, then anyone gets the app.
    let body = r#"{"port":8000,"visibility":"public","ttl_s":600}"#;
    let (status, p) = post(server, &t.ana, &previews, body).await;
    assert_eq!(status, 201, "{p}");
    assert_eq!(p["state"], "pending_approval");
    let public = p["url"].as_str().unwrap().to_owned();
    let pid = p["id"].as_str().unwrap().to_owned();
    let r = get(port, &public, None).await;
    assert_eq!(r.status, 403);
    assert!(r.body.contains("waits for an owner's approval") && !r.body.contains("app saw"));
    let approval = p["approval_id"].as_str().unwrap().to_owned();
    let decide = format!("/api/rooms/{room}/approvals/{approval}/decision");
    assert_eq!(
        post(server, &t.ana, &decide, r#"{"approve":true}"#).await.0,
        403,
        "not one's own"
    );
    assert_eq!(
        post(server, &dee, &decide, r#"{"approve":true}"#).await.0,
        200
    );
    let r = get(port, &public, None).await;
    assert_eq!((r.status, r.body.as_str()), (200, "app saw cookies: None"));
    let mut anon = ws(port, &public, None).await;
    echoes(&mut anon, "anyone").await;
    let listed = get_json(server, &t.ana, &previews).await;
    let states: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, vec!["active", "revoked"]);
    let (status, _) = send_json(server, &t.ana, "DELETE", &format!("{previews}/{pid}"), "").await;
    assert_eq!(status, 204);
    assert!(ends(&mut anon).await < Duration::from_secs(5));
    assert_eq!(get(port, &public, None).await.status, 410);
    let chain = audit(server, &t.ana, room).await;
    for action in ["create_preview", "activate_preview", "revoke_preview"] {
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
