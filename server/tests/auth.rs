//! Email login against a real SMTP server (Python `aiosmtpd`, started per test), sessions,
//! rate limits and the Origin checks.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;
use tokio::process::{Child, Command};

/// The first Python that has aiosmtpd: Debian's own (`python3-aiosmtpd`, what `.ci/run`
/// installs), then whatever `python3` the PATH names; `None` after reporting the test skipped.
async fn aiosmtpd_python() -> Option<&'static str> {
    for candidate in ["/usr/bin/python3", "python3"] {
        let have = Command::new(candidate)
            .args(["-c", "import aiosmtpd"])
            .stderr(Stdio::null())
            .status()
            .await
            .is_ok_and(|s| s.success());
        if have {
            return Some(candidate);
        }
    }
    skip(
        Need::Smtp,
        "no Python with aiosmtpd (apt-get install python3-aiosmtpd)",
    );
    None
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A real SMTP server that stores every message it accepts in a maildir.
struct Smtp {
    _child: Child,
    port: u16,
    maildir: PathBuf,
    _dir: tempfile::TempDir,
}

impl Smtp {
    /// Starts `aiosmtpd` with the first Python that has it: Debian's own (`python3-aiosmtpd`,
    /// what `.ci/run` installs), then whatever `python3` the PATH names.
    async fn start() -> Option<Smtp> {
        let python = aiosmtpd_python().await?;
        let port = free_port();
        let dir = tempfile::tempdir().unwrap();
        let maildir = dir.path().join("maildir");
        let child = Command::new(python)
            .args(["-m", "aiosmtpd", "-n", "-l", &format!("127.0.0.1:{port}")])
            .args(["-c", "aiosmtpd.handlers.Mailbox", maildir.to_str().unwrap()])
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        for _ in 0..100 {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                return Some(Smtp {
                    _child: child,
                    port,
                    maildir,
                    _dir: dir,
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("aiosmtpd did not start");
    }

    fn url(&self) -> String {
        format!("smtp://127.0.0.1:{}", self.port)
    }

    fn messages(&self) -> Vec<String> {
        let Ok(dir) = std::fs::read_dir(self.maildir.join("new")) else {
            return Vec::new();
        };
        let mut v: Vec<(std::time::SystemTime, String)> = dir
            .filter_map(|e| e.ok())
            .map(|e| {
                (
                    e.metadata().unwrap().modified().unwrap(),
                    std::fs::read_to_string(e.path()).unwrap(),
                )
            })
            .collect();
        v.sort();
        v.into_iter().map(|(_, m)| m).collect()
    }

    /// Waits for the `n`-th message (1-based) and returns it.
    async fn nth(&self, n: usize) -> String {
        for _ in 0..200 {
            let m = self.messages();
            if m.len() >= n {
                return m[n - 1].clone();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("message {n} never arrived");
    }
}

fn code_in(message: &str) -> String {
    let at = message.find("code is ").unwrap() + "code is ".len();
    message[at..at + 6].to_owned()
}

fn headers_of(message: &str) -> Vec<(String, String)> {
    let head = message.split("\n\n").next().unwrap();
    head.lines()
        .filter(|l| !l.starts_with(' ') && !l.starts_with('\t'))
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect()
}

async fn ask_code(server: &Server, email: &str) -> Resp {
    let body = serde_json::json!({ "email": email }).to_string();
    request(&server.url("/api/auth/code"), "POST", &[], Some(&body)).await
}

async fn verify(server: &Server, email: &str, code: &str) -> Resp {
    let body = serde_json::json!({ "email": email, "code": code }).to_string();
    request(&server.url("/api/auth/verify"), "POST", &[], Some(&body)).await
}

fn cookie_of(r: &Resp) -> String {
    r.header("set-cookie")
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned()
}

async fn auth_events(storage: &Storage, kind: &str) -> i64 {
    storage
        .query_i64(
            "SELECT COUNT(*) FROM auth_events WHERE kind = $1",
            &[kind.into()],
        )
        .await
}

on_each_backend!(login_through_real_smtp_once, login_once);

async fn login_once(backend: &Backend) {
    let Some(smtp) = Smtp::start().await else {
        return;
    };
    let storage = Storage::new(backend).await;
    let url = smtp.url();
    let server = Server::start(
        &storage,
        &["--smtp-url", &url, "--admin-emails", "boss@example.com"],
    )
    .await;

    let r = ask_code(&server, "Ana@Example.com").await;
    assert_eq!(r.status, 202);
    let mail = smtp.nth(1).await;
    let headers = headers_of(&mail);
    let to: Vec<_> = headers.iter().filter(|(k, _)| k == "to").collect();
    assert_eq!(to.len(), 1, "exactly one To header");
    assert_eq!(to[0].1, "ana@example.com");
    // aiosmtpd records the envelope: exactly the stored address.
    let rcpt: Vec<_> = headers.iter().filter(|(k, _)| k == "x-rcptto").collect();
    assert_eq!(rcpt.len(), 1);
    assert_eq!(rcpt[0].1, "ana@example.com");
    assert!(!headers.iter().any(|(k, _)| k == "bcc" || k == "cc"));
    let code = code_in(&mail);
    // A code lives ten minutes.
    let lives = storage
        .query_i64(
            "SELECT expires_at - created_at FROM login_codes WHERE email = $1",
            &[Arg::Text("ana@example.com".into())],
        )
        .await;
    assert_eq!(lives, 10 * 60 * 1000);

    let ok = verify(&server, "ana@example.com", &code).await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    let v: serde_json::Value = serde_json::from_str(&ok.body).unwrap();
    assert_eq!(v["user"]["email"], "ana@example.com");
    let set_cookie = ok.header("set-cookie").unwrap();
    assert!(
        set_cookie.contains("HttpOnly") && set_cookie.contains("SameSite=Lax"),
        "{set_cookie}"
    );
    // A session lives thirty days at most, in the browser and in the database.
    assert!(set_cookie.contains("Max-Age=2592000"), "{set_cookie}");
    let lives = storage
        .query_i64("SELECT MAX(expires_at - created_at) FROM sessions", &[])
        .await;
    // (expiry set at login, the row stamped as it is written, a moment later)
    let month = 30 * 24 * 3600 * 1000;
    assert!((month - 1000..=month).contains(&lives), "{lives}");
    let cookie = cookie_of(&ok);
    let me = request(&server.url("/api/me"), "GET", &[("Cookie", &cookie)], None).await;
    assert_eq!(me.status, 200);
    let me: serde_json::Value = serde_json::from_str(&me.body).unwrap();
    assert_eq!(me["is_admin"], false);

    // Single use.
    assert_eq!(verify(&server, "ana@example.com", &code).await.status, 401);

    // Admins come from --admin-emails.
    assert_eq!(ask_code(&server, "boss@example.com").await.status, 202);
    let code = code_in(&smtp.nth(2).await);
    let boss = cookie_of(&verify(&server, "boss@example.com", &code).await);
    let me = request(&server.url("/api/me"), "GET", &[("Cookie", &boss)], None).await;
    assert!(me.body.contains("\"is_admin\":true"), "{}", me.body);

    // Logout kills the session server-side.
    let origin = format!("http://{}", server.addr);
    let out = request(
        &server.url("/api/auth/logout"),
        "POST",
        &[("Cookie", &cookie), ("Origin", &origin)],
        None,
    )
    .await;
    assert_eq!(out.status, 204);
    assert_eq!(
        request(&server.url("/api/me"), "GET", &[("Cookie", &cookie)], None)
            .await
            .status,
        401
    );
    assert_eq!(auth_events(&storage, "login_ok").await, 2);
    assert_eq!(auth_events(&storage, "logout").await, 1);
    server.terminate().await;
    storage.drop_db().await;
}

on_each_backend!(
    brute_force_replay_and_foreign_codes_fail_alike,
    brute_force_on
);

async fn brute_force_on(backend: &Backend) {
    let Some(smtp) = Smtp::start().await else {
        return;
    };
    let storage = Storage::new(backend).await;
    let url = smtp.url();
    let server = Server::start(&storage, &["--smtp-url", &url, "--auth-burst", "200"]).await;

    assert_eq!(ask_code(&server, "ben@example.com").await.status, 202);
    let ben_code = code_in(&smtp.nth(1).await);
    assert_eq!(ask_code(&server, "cleo@example.com").await.status, 202);
    let cleo_code = code_in(&smtp.nth(2).await);
    let wrong_for = |code: &str| if code == "000000" { "111111" } else { "000000" }.to_owned();

    // Four wrong tries (another login's code among them) answer 401, all alike, and the right
    // code still opens the account after them.
    let foreign = if cleo_code != ben_code {
        cleo_code.clone()
    } else {
        wrong_for(&ben_code)
    };
    let first = verify(&server, "ben@example.com", &foreign).await;
    assert_eq!(first.status, 401, "{}", first.body);
    for _ in 1..4 {
        let r = verify(&server, "ben@example.com", &wrong_for(&ben_code)).await;
        assert_eq!((r.status, &r.body), (first.status, &first.body));
    }
    let ok = verify(&server, "ben@example.com", &ben_code).await;
    assert_eq!(
        ok.status, 200,
        "the right code after 4 wrong ones: {}",
        ok.body
    );
    // Replayed, it is refused like any wrong code.
    let replay = verify(&server, "ben@example.com", &ben_code).await;
    assert_eq!((replay.status, &replay.body), (first.status, &first.body));

    // The fifth wrong try voids the code: the right one is refused after it, the same way.
    for _ in 0..5 {
        let r = verify(&server, "cleo@example.com", &wrong_for(&cleo_code)).await;
        assert_eq!((r.status, &r.body), (first.status, &first.body));
    }
    let late = verify(&server, "cleo@example.com", &cleo_code).await;
    assert_eq!(
        (late.status, &late.body),
        (first.status, &first.body),
        "the right code after 5 wrong ones"
    );
    assert_eq!(auth_events(&storage, "code_locked").await, 1);

    // Guessing from many connections at once counts every try: once five concurrent wrong
    // guesses have been checked (401; the rest may find the hashing pool full, 503), the code
    // is void (a lost update of the try count would leave it open).
    assert_eq!(ask_code(&server, "dan@example.com").await.status, 202);
    let dan_code = code_in(&smtp.nth(3).await);
    let mut checked = 0;
    let mut next_guess = dan_code.parse::<u32>().unwrap();
    while checked < 5 {
        let guesses: Vec<_> = (0..30)
            .map(|_| {
                next_guess = (next_guess + 1) % 1_000_000;
                let body = serde_json::json!({ "email": "dan@example.com", "code": format!("{next_guess:06}") });
                let url = server.url("/api/auth/verify");
                tokio::spawn(async move { request(&url, "POST", &[], Some(&body.to_string())).await })
            })
            .collect();
        for g in guesses {
            let r = g.await.unwrap();
            match r.status {
                401 => {
                    assert_eq!(r.body, first.body);
                    checked += 1;
                }
                503 => {}
                other => panic!("a concurrent guess answered {other}: {}", r.body),
            }
        }
    }
    let after = verify(&server, "dan@example.com", &dan_code).await;
    assert_eq!(
        (after.status, &after.body),
        (first.status, &first.body),
        "the right code after 30 concurrent wrong guesses"
    );
    assert_eq!(auth_events(&storage, "code_locked").await, 2);

    // A new code is refused within the per-email minute, with 429 and when to ask again.
    let again = ask_code(&server, "cleo@example.com").await;
    assert_eq!(again.status, 429);
    let retry: u64 = again
        .headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("retry-after"))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or_else(|| panic!("no Retry-After: {:?}", again.headers));
    assert!((1..=60).contains(&retry), "{retry}");
    // Malformed codes are refused the same way as wrong ones.
    assert_eq!(
        verify(&server, "ben@example.com", "12ab56").await.body,
        first.body
    );
    server.terminate().await;
    storage.drop_db().await;
}

#[tokio::test]
async fn known_and_unknown_emails_get_identical_answers() {
    let Some(smtp) = Smtp::start().await else {
        return;
    };
    let storage = Storage::new(&Backend::Sqlite).await;
    storage.token("known@example.com").await;
    let url = smtp.url();
    let server = Server::start(&storage, &["--smtp-url", &url]).await;
    let hashes_before = server.metric("coderoom_argon2_operations_total").await;
    let known = ask_code(&server, "known@example.com").await;
    let unknown = ask_code(&server, "nobody@example.com").await;
    assert_eq!(known.status, unknown.status);
    assert_eq!(known.body, unknown.body);
    let names = |r: &Resp| {
        let mut v: Vec<(String, String)> = r
            .headers
            .iter()
            .filter(|(k, _)| !k.eq_ignore_ascii_case("date"))
            .map(|(k, v)| (k.to_ascii_lowercase(), v.clone()))
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(&known), names(&unknown));
    // The same work ran for both (one argon2 hash each).
    assert_eq!(
        server.metric("coderoom_argon2_operations_total").await - hashes_before,
        2.0
    );
    smtp.nth(2).await;
    server.terminate().await;
}

#[tokio::test]
async fn hostile_addresses_never_reach_smtp() {
    let Some(smtp) = Smtp::start().await else {
        return;
    };
    let storage = Storage::new(&Backend::Sqlite).await;
    let url = smtp.url();
    let server = Server::start(&storage, &["--smtp-url", &url, "--auth-burst", "100"]).await;
    for bad in [
        "\"a@evil.com\"@victim.com",
        "a@x.com,b@y.com",
        "a@x.com\r\nBcc: c@evil.com",
        "victim@example.com\nCc: spy@evil.com",
        "a\u{FF20}example.com",
        "Victim <victim@example.com>, spy@evil.com",
    ] {
        let r = ask_code(&server, bad).await;
        assert_eq!(r.status, 400, "{bad:?}");
    }
    // A legitimate request after them. The server sends mail one at a time, in the order it
    // was queued, so once the sentinel has arrived anything queued before it has been sent too:
    // nothing else being there means nothing else was queued.
    assert_eq!(ask_code(&server, "sentinel@example.com").await.status, 202);
    let mail = smtp.nth(1).await;
    assert_eq!(smtp.messages().len(), 1);
    assert!(headers_of(&mail)
        .iter()
        .any(|(k, v)| k == "x-rcptto" && v == "sentinel@example.com"));
    server.terminate().await;
}

#[tokio::test]
async fn one_ip_is_limited_before_any_hashing() {
    let storage = Storage::new(&Backend::Sqlite).await;
    let server = Server::start(&storage, &[]).await;
    let before = server.metric("coderoom_argon2_operations_total").await;
    let mut limited = 0;
    for i in 0..1000 {
        let r = verify(&server, "x@example.com", &format!("{:06}", i)).await;
        if r.status == 429 {
            limited += 1;
        } else {
            assert_eq!(r.status, 401);
        }
    }
    let hashed = server.metric("coderoom_argon2_operations_total").await - before;
    assert!(limited >= 985, "only {limited} of 1000 were limited");
    assert!(
        hashed <= 15.0,
        "argon2 ran {hashed} times for 1000 limited requests"
    );

    // A spoofed X-Forwarded-For from an untrusted peer changes nothing.
    for i in 0..50 {
        let body = r#"{"email":"x@example.com","code":"123456"}"#;
        let xff = format!("10.9.{}.{}", i / 250, i % 250);
        let r = request(
            &server.url("/api/auth/verify"),
            "POST",
            &[("X-Forwarded-For", &xff)],
            Some(body),
        )
        .await;
        assert_eq!(r.status, 429, "spoofed X-Forwarded-For escaped the limiter");
    }
    server.terminate().await;

    // The burst is exact: ten answered, the eleventh refused (nothing comes back within ten
    // minutes here).
    let server = Server::start(&storage, &["--auth-replenish-ms", "600000"]).await;
    for i in 0..10 {
        let r = verify(&server, "x@example.com", "000000").await;
        assert_eq!(r.status, 401, "request {i} of the burst of 10");
    }
    let r = verify(&server, "x@example.com", "000000").await;
    assert_eq!(r.status, 429, "the eleventh");
    assert!(r.header("retry-after").is_some(), "{:?}", r.headers);
    server.terminate().await;
    // And one more comes back every --auth-replenish-ms: not sooner, and not much later. The
    // interval is long beside one answered request (a debug build's argon2 on a busy machine
    // took over a second, and the second request then found the token back).
    let server = Server::start(
        &storage,
        &["--auth-burst", "1", "--auth-replenish-ms", "3000"],
    )
    .await;
    let asked = std::time::Instant::now();
    assert_eq!(verify(&server, "x@example.com", "000000").await.status, 401);
    let second = asked.elapsed();
    let status = verify(&server, "x@example.com", "000000").await.status;
    assert_eq!(status, 429, "the second, sent {second:?} after the first");
    loop {
        let status = verify(&server, "x@example.com", "000000").await.status;
        if status == 401 {
            break;
        }
        assert_eq!(status, 429);
        assert!(
            asked.elapsed() < Duration::from_secs(8),
            "no request came back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        asked.elapsed() >= Duration::from_millis(3000),
        "one came back after {:?}",
        asked.elapsed()
    );
    server.terminate().await;

    // Behind a trusted proxy the forwarded address is the key: distinct clients are distinct.
    let server = Server::start(
        &storage,
        &["--trusted-proxies", "127.0.0.1/32", "--auth-burst", "2"],
    )
    .await;
    for i in 0..20 {
        let body = r#"{"email":"x@example.com","code":"123456"}"#;
        let xff = format!("198.51.100.{i}");
        let r = request(
            &server.url("/api/auth/verify"),
            "POST",
            &[("X-Forwarded-For", &xff)],
            Some(body),
        )
        .await;
        assert_eq!(
            r.status, 401,
            "client {xff} behind the proxy was limited by others' requests"
        );
    }
    server.terminate().await;
}

#[tokio::test]
async fn cookies_need_the_right_origin() {
    let storage = Storage::new(&Backend::Sqlite).await;
    let server = Server::start(&storage, &[]).await;
    // Log in through the dev outbox this time.
    assert_eq!(ask_code(&server, "ana@example.com").await.status, 202);
    let outbox = storage.dir.path().join("outbox");
    // Only a whole `.eml`: the server writes `NAME.eml.tmp` first and renames it, and a reader
    // that took the first entry could read the half-written temporary file.
    let mut mail = String::new();
    for _ in 0..400 {
        let whole = std::fs::read_dir(&outbox).ok().and_then(|d| {
            d.flatten()
                .map(|e| e.path())
                .find(|p| p.extension().is_some_and(|x| x == "eml"))
        });
        if let Some(path) = whole {
            mail = std::fs::read_to_string(path).unwrap();
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        mail.contains("code is "),
        "no login mail in {outbox:?}: {mail:?}"
    );
    let cookie = cookie_of(&verify(&server, "ana@example.com", &code_in(&mail)).await);
    let origin = format!("http://{}", server.addr);
    let rooms = server.url("/api/rooms");
    let body = Some(r#"{"name":"r"}"#);

    let no_origin = request(&rooms, "POST", &[("Cookie", &cookie)], body).await;
    assert_eq!(no_origin.status, 403);
    let evil = request(
        &rooms,
        "POST",
        &[("Cookie", &cookie), ("Origin", "http://evil.example")],
        body,
    )
    .await;
    assert_eq!(evil.status, 403);
    let ok = request(
        &rooms,
        "POST",
        &[("Cookie", &cookie), ("Origin", &origin)],
        body,
    )
    .await;
    assert_eq!(ok.status, 201);
    let room: serde_json::Value = serde_json::from_str(&ok.body).unwrap();
    let room = room["id"].as_str().unwrap();

    // Cross-site WebSocket hijacking: the browser sends the cookie, the Origin gives it away.
    let doc = server.url(&format!("/api/rooms/{room}/doc"));
    let upgrade = |o: &'static str| {
        let cookie = cookie.clone();
        let doc = doc.clone();
        async move {
            let o = if o == "self" {
                format!("http://{}", doc.split('/').nth(2).unwrap())
            } else {
                o.to_owned()
            };
            request(
                &doc,
                "GET",
                &[
                    ("Cookie", &cookie),
                    ("Origin", &o),
                    ("Upgrade", "websocket"),
                    ("Connection", "Upgrade"),
                    ("Sec-WebSocket-Version", "13"),
                    ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
                ],
                None,
            )
            .await
            .status
        }
    };
    assert_eq!(upgrade("http://evil.example").await, 403);
    assert_eq!(upgrade("self").await, 101);
    server.terminate().await;
}

/// The answer never waits for SMTP. The relay here accepts the server's connection and never
/// says a word, so no mail can be sent until the server gives up on it; the answer arrives
/// while that first connection is still open and unanswered.
#[tokio::test]
async fn a_dead_relay_never_delays_the_request() {
    let storage = Storage::new(&Backend::Sqlite).await;
    let relay = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("smtp://{}", relay.local_addr().unwrap());
    let server = Server::start(&storage, &["--smtp-url", &url]).await;
    assert_eq!(ask_code(&server, "ana@example.com").await.status, 202);
    let (first, _) = tokio::time::timeout(TIMEOUT, relay.accept())
        .await
        .expect("the server never tried the relay")
        .unwrap();
    // Still open and silent: the server is waiting for the relay's greeting, not done with it.
    // (A plain non-blocking read: 0 bytes means closed, WouldBlock means open and silent.)
    let mut first = first.into_std().unwrap();
    let mut byte = [0u8; 1];
    match std::io::Read::read(&mut first, &mut byte) {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("the first SMTP connection already ended ({other:?}): the answer waited"),
    }
    server.kill9().await;
}

#[tokio::test]
async fn idle_sessions_die() {
    let storage = Storage::new(&Backend::Sqlite).await;
    let token = storage.token("ana@example.com").await;
    let server = Server::start(&storage, &[]).await;
    assert_eq!(
        http(&server.url("/api/me"), "GET", Some(&token), None)
            .await
            .0,
        200
    );
    let mut conn = storage.sqlite().await;
    let (minute, week) = (60 * 1000, 7 * 24 * 3600 * 1000);
    let me = || async {
        http(&server.url("/api/me"), "GET", Some(&token), None)
            .await
            .0
    };
    // Last used a minute short of the seven-day idle limit: alive (and used again now).
    sqlx::query("UPDATE sessions SET last_seen_at = $1")
        .bind(now_ms() - week + minute)
        .execute(&mut conn)
        .await
        .unwrap();
    assert_eq!(me().await, 200);
    // Last used a minute past it: gone.
    sqlx::query("UPDATE sessions SET last_seen_at = $1")
        .bind(now_ms() - week - minute)
        .execute(&mut conn)
        .await
        .unwrap();
    assert_eq!(me().await, 401);
    // However recently used, a session ends at its absolute expiry.
    let token = storage.token("ben@example.com").await;
    let me = || async {
        http(&server.url("/api/me"), "GET", Some(&token), None)
            .await
            .0
    };
    assert_eq!(me().await, 200);
    sqlx::query("UPDATE sessions SET expires_at = $1")
        .bind(now_ms() - 1000)
        .execute(&mut conn)
        .await
        .unwrap();
    assert_eq!(me().await, 401);
    server.terminate().await;
}

/// Logging out and `GET /api/me` are never rate limited: an address that spent its
/// `/api/auth/*` burst can still end its sessions (it used to get 429 for the logout).
#[tokio::test]
async fn logout_and_me_are_never_rate_limited() {
    let storage = Storage::new(&Backend::Sqlite).await;
    let server = Server::start(
        &storage,
        &["--auth-burst", "2", "--auth-replenish-ms", "600000"],
    )
    .await;
    let token = storage.token("ana@example.com").await;
    let mut limited = false;
    for i in 0..10 {
        if verify(&server, "x@example.com", &format!("{i:06}"))
            .await
            .status
            == 429
        {
            limited = true;
            break;
        }
    }
    assert!(limited, "the burst was never spent");
    for _ in 0..5 {
        assert_eq!(
            http(&server.url("/api/me"), "GET", Some(&token), None)
                .await
                .0,
            200
        );
    }
    assert_eq!(
        http(&server.url("/api/auth/logout"), "POST", Some(&token), None)
            .await
            .0,
        204
    );
    // The session is over.
    assert_eq!(
        http(&server.url("/api/me"), "GET", Some(&token), None)
            .await
            .0,
        401
    );
    server.terminate().await;
}

/// From where a revoked user stands (issue 38): revoked everywhere, they ask for a login code
/// as anyone would; the answer is the one any address gets, and no code is mailed to them (a
/// mail asked for after theirs arrives alone). Once an admin restores the account, they log in
/// again, into no room; both acts are in the system chain.
#[tokio::test]
async fn a_revoked_account_stays_revoked_until_an_admin_restores_it() {
    let Some(smtp) = Smtp::start().await else {
        return;
    };
    let storage = Storage::new(&Backend::Sqlite).await;
    let root = storage.token("root@example.com").await;
    let url = smtp.url();
    let server = Server::start(
        &storage,
        &["--smtp-url", &url, "--admin-emails", "root@example.com"],
    )
    .await;
    // Each ask below stands for one a minute or more after the last: the per-address cap on
    // codes is not what this test is about.
    let a_minute_later = || {
        let storage = &storage;
        async move {
            storage.execute("DELETE FROM code_issuance", &[]).await;
        }
    };
    let login = |n: usize| {
        let (server, smtp, later) = (&server, &smtp, &a_minute_later);
        async move {
            later().await;
            assert_eq!(ask_code(server, "ben@example.com").await.status, 202);
            let code = code_in(&smtp.nth(n).await);
            verify(server, "ben@example.com", &code).await
        }
    };
    let first = login(1).await;
    assert_eq!(first.status, 200, "{}", first.body);
    let ben_cookie = cookie_of(&first);
    let ben_id = serde_json::from_str::<serde_json::Value>(&first.body).unwrap()["user"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let revoke = format!("/api/admin/users/{ben_id}/revoke");
    let (status, v) = post(&server, &root, &revoke, "").await;
    assert_eq!(status, 200, "{v}");
    let me = |cookie: String| {
        let server = &server;
        async move {
            request(
                &server.url("/api/me"),
                "GET",
                &[("Cookie", cookie.as_str())],
                None,
            )
            .await
            .status
        }
    };
    assert_eq!(me(ben_cookie).await, 401);

    // Asking again: the answer any address gets, and no mail.
    a_minute_later().await;
    let theirs = ask_code(&server, "ben@example.com").await;
    let anyone = ask_code(&server, "nobody@example.com").await;
    assert_eq!((theirs.status, &theirs.body), (anyone.status, &anyone.body));
    let fence = smtp.nth(2).await;
    assert!(fence.contains("nobody@example.com"), "{fence}");
    assert_eq!(
        smtp.messages().len(),
        2,
        "a code was mailed to a revoked account"
    );
    assert_eq!(
        verify(&server, "ben@example.com", "000000").await.status,
        401
    );
    let users = get_json(&server, &root, "/api/admin/users?q=ben").await;
    assert!(users[0]["revoked_at"].is_i64(), "{users}");

    // Restored by an admin (only an admin), they log in again.
    let restore = format!("/api/admin/users/{ben_id}/restore");
    let ana = storage.token("ana@example.com").await;
    assert_eq!(post(&server, &ana, &restore, "").await.0, 403);
    let (status, v) = post(&server, &root, &restore, "").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        post(&server, &root, &restore, "").await.0,
        400,
        "not revoked now"
    );
    let users = get_json(&server, &root, "/api/admin/users?q=ben").await;
    assert!(users[0]["revoked_at"].is_null(), "{users}");
    let again = login(3).await;
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(me(cookie_of(&again)).await, 200);
    let chain = get_json(&server, &root, "/api/admin/audit").await;
    let acts: Vec<&str> = chain
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["action"].as_str())
        .collect();
    assert!(
        acts.contains(&"revoke_user") && acts.contains(&"restore_user"),
        "{acts:?}"
    );
    server.terminate().await;
}

/// An SMTP relay that takes mail only over TLS (`starttls`: STARTTLS is required before
/// anything else; `smtps`: TLS from the first byte) and only from the user
/// `mailer@example.com` with the password `p@ss:w/rd`; says what it saw as JSON lines.
const TLS_RELAY: &str = r#"
import json, logging, signal, ssl, sys
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword
mode, cert, key, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
# A client refusing this relay's certificate is what some tests want: no traceback for it.
logging.getLogger("mail.log").setLevel(logging.CRITICAL)
ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
ctx.load_cert_chain(cert, key)
def say(**kw):
    print(json.dumps(kw), flush=True)
def authenticator(server, session, envelope, mechanism, data):
    ok = isinstance(data, LoginPassword) and data.login == b"mailer@example.com" and data.password == b"p@ss:w/rd"
    say(event="auth", mechanism=mechanism, ok=ok)
    return AuthResult(success=ok)
class Handler:
    async def handle_DATA(self, server, session, envelope):
        say(event="mail", authenticated=bool(session.authenticated), to=envelope.rcpt_tos,
            body=envelope.content.decode(errors="replace"))
        return "250 OK"
common = dict(hostname="127.0.0.1", port=port, authenticator=authenticator, auth_required=True)
if mode == "starttls":
    relay = Controller(Handler(), tls_context=ctx, require_starttls=True, auth_require_tls=True, **common)
else:
    # Implicit TLS: the connection is TLS before AUTH is offered.
    relay = Controller(Handler(), ssl_context=ctx, auth_require_tls=False, **common)
relay.start()
say(event="ready")
signal.pause()
"#;

/// The TLS relay of [`TLS_RELAY`], its port and what it says.
async fn tls_relay(
    python: &str,
    mode: &str,
    dir: &std::path::Path,
) -> (
    Child,
    u16,
    tokio::sync::mpsc::UnboundedReceiver<serde_json::Value>,
) {
    use tokio::io::AsyncBufReadExt as _;
    let port = free_port();
    let mut child = Command::new(python)
        .args(["-c", TLS_RELAY, mode])
        .arg(dir.join("relay.pem"))
        .arg(dir.join("relay.key"))
        .arg(port.to_string())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok(Some(l)) = lines.next_line().await {
            let _ = tx.send(serde_json::from_str::<serde_json::Value>(&l).unwrap());
        }
    });
    let ready = tokio::time::timeout(TIMEOUT, rx.recv()).await;
    assert!(
        matches!(&ready, Ok(Some(v)) if v["event"] == "ready"),
        "the {mode} relay did not start: {ready:?}"
    );
    (child, port, rx)
}

/// The next thing the relay says.
async fn heard(
    said: &mut tokio::sync::mpsc::UnboundedReceiver<serde_json::Value>,
) -> serde_json::Value {
    let next = tokio::time::timeout(TIMEOUT, said.recv()).await;
    next.expect("the relay said nothing")
        .expect("the relay exited")
}

/// Mail goes out through a relay that needs TLS and credentials, both ways lettre speaks it:
/// STARTTLS (`smtp://...?tls=required`) and TLS from the start (`smtps://`), with the user and
/// password from the URL (percent-decoded) and the relay's certificate from a private authority
/// (`--smtp-ca-file`). Without that authority the relay's certificate is not trusted: the mail
/// is not sent, and the credentials never reach the relay.
#[tokio::test]
async fn mail_goes_out_over_starttls_and_tls_with_credentials() {
    let Some(python) = aiosmtpd_python().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_coderoom"))
        .args(["certs", "--dir"])
        .arg(dir.path())
        .args([
            "--name",
            "relay",
            "--role",
            "sandbox-host",
            "--san",
            "127.0.0.1",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ca = dir.path().join("ca.pem");
    let ca = ca.to_str().unwrap();
    let credentials = "mailer%40example.com:p%40ss%3Aw%2Frd";
    for (mode, scheme, query) in [
        ("starttls", "smtp", "?tls=required"),
        ("smtps", "smtps", ""),
    ] {
        let (_relay, port, mut said) = tls_relay(python, mode, dir.path()).await;
        let url = format!("{scheme}://{credentials}@127.0.0.1:{port}{query}");
        let storage = Storage::new(&Backend::Sqlite).await;
        let server = Server::start(&storage, &["--smtp-url", &url, "--smtp-ca-file", ca]).await;
        assert_eq!(ask_code(&server, "ana@example.com").await.status, 202);
        let auth = heard(&mut said).await;
        assert_eq!(auth["event"], "auth", "{mode}: {auth}");
        assert_eq!(auth["ok"], true, "{mode}: the URL's credentials: {auth}");
        let mail = heard(&mut said).await;
        assert_eq!(mail["event"], "mail", "{mode}: {mail}");
        assert_eq!(mail["authenticated"], true, "{mode}: {mail}");
        assert_eq!(mail["to"], serde_json::json!(["ana@example.com"]), "{mode}");
        assert!(
            mail["body"].as_str().unwrap().contains("code is "),
            "{mode}: {mail}"
        );
        drop(server);

        // The same relay, its authority not given: nothing is sent, and the log says why.
        let storage = Storage::new(&Backend::Sqlite).await;
        let log = dir.path().join(format!("{mode}.log"));
        let server = Server::start_logging_with(&storage, &log, &["--smtp-url", &url]).await;
        assert_eq!(ask_code(&server, "ana@example.com").await.status, 202);
        let waited = std::time::Instant::now();
        let logged = loop {
            let logged = std::fs::read_to_string(&log).unwrap_or_default();
            if logged.contains("mail could not be sent") {
                break logged;
            }
            assert!(
                waited.elapsed() < TIMEOUT * 2,
                "no failure logged: {logged}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(
            logged.to_lowercase().contains("certificate"),
            "{mode}: the failure names the certificate: {logged}"
        );
        assert!(
            !logged.contains("p@ss") && !logged.contains("p%40ss"),
            "{logged}"
        );
        // Every attempt has ended (logged above) before the relay's account is read.
        assert!(
            said.try_recv().is_err(),
            "{mode}: the relay heard from an untrusted client"
        );
    }
    // A CA file for a relay reached without TLS is a mistake said at once.
    let storage = Storage::new(&Backend::Sqlite).await;
    let (ok, text) = storage
        .cli(&[
            "serve",
            "--smtp-url",
            "smtp://127.0.0.1:25",
            "--smtp-ca-file",
            ca,
        ])
        .await;
    assert!(
        !ok && text.contains("--smtp-ca-file is for a relay reached over TLS"),
        "{text}"
    );
}
