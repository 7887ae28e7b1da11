//! Repositories (issue 16): connected with a room secret as the credential, cloned, pulled and
//! pushed by the control plane, against a real git server on loopback (`git http-backend`
//! behind a server that checks the token). The token never reaches the workspace, the
//! sandbox's environment, the server's clone, the log or any answer; a push lands with the
//! person who pushed as its author; a push without `push` access is refused and audited.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use http_body_util::BodyExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Runs git (a clean environment: no user config) in `dir`; its stdout.
fn git(dir: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "Seed")
        .env("GIT_AUTHOR_EMAIL", "seed@example.com")
        .env("GIT_COMMITTER_NAME", "Seed")
        .env("GIT_COMMITTER_EMAIL", "seed@example.com")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The team's repository: `root/team.git` (bare, pushes allowed) and a working clone `seed`
/// to make commits on the server side.
fn origin(root: &Path) -> PathBuf {
    let bare = root.join("team.git");
    std::fs::create_dir_all(&bare).unwrap();
    git(&bare, &["init", "--bare", "-q", "-b", "main"]);
    git(&bare, &["config", "http.receivepack", "true"]);
    let seed = root.join("seed");
    std::fs::create_dir_all(seed.join("src")).unwrap();
    git(&seed, &["init", "-q", "-b", "main"]);
    std::fs::write(seed.join("README.md"), "# Team\n").unwrap();
    std::fs::write(seed.join("src/app.txt"), "one\ntwo\nthree\n").unwrap();
    git(&seed, &["add", "-A"]);
    git(&seed, &["commit", "-q", "-m", "seed"]);
    git(
        &seed,
        &["remote", "add", "origin", &bare.display().to_string()],
    );
    git(&seed, &["push", "-q", "origin", "main"]);
    seed
}

/// A commit on the server side (through `seed`): `file` gets `text`.
fn commit_upstream(seed: &Path, file: &str, text: &str) {
    git(seed, &["pull", "-q", "--rebase", "origin", "main"]);
    std::fs::write(seed.join(file), text).unwrap();
    git(seed, &["add", "-A"]);
    git(seed, &["commit", "-q", "-m", &format!("upstream {file}")]);
    git(seed, &["push", "-q", "origin", "main"]);
}

/// A git server over HTTP: `git http-backend` behind a check of `Authorization: Bearer
/// <token>`. Counts the requests it refused.
async fn git_server(root: PathBuf, token: String) -> (u16, Arc<Mutex<usize>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let refused = Arc::new(Mutex::new(0usize));
    let count = refused.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (root, token, count) = (root.clone(), token.clone(), count.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let (root, token, count) = (root.clone(), token.clone(), count.clone());
                        async move {
                            Ok::<_, std::convert::Infallible>(cgi(req, &root, &token, &count).await)
                        }
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
    (port, refused)
}

async fn cgi(
    req: hyper::Request<hyper::body::Incoming>,
    root: &Path,
    token: &str,
    refused: &Mutex<usize>,
) -> hyper::Response<http_body_util::Full<bytes::Bytes>> {
    let reply = |status: u16, body: Vec<u8>| {
        let mut r = hyper::Response::new(http_body_util::Full::new(bytes::Bytes::from(body)));
        *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
        r
    };
    let authorized = req
        .headers()
        .get("authorization")
        .is_some_and(|v| v.as_bytes() == format!("Bearer {token}").as_bytes());
    if !authorized {
        *refused.lock().unwrap() += 1;
        let mut r = reply(401, b"token required\n".to_vec());
        r.headers_mut()
            .insert("www-authenticate", "Basic realm=\"git\"".parse().unwrap());
        return r;
    }
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let (method, path, query) = (
        req.method().to_string(),
        req.uri().path().to_owned(),
        req.uri().query().unwrap_or_default().to_owned(),
    );
    let (content_type, encoding) = (header("content-type"), header("content-encoding"));
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let mut child = tokio::process::Command::new("git")
        .arg("http-backend")
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("GIT_PROJECT_ROOT", root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("REQUEST_METHOD", method)
        .env("PATH_INFO", path)
        .env("QUERY_STRING", query)
        .env("CONTENT_TYPE", content_type)
        .env("HTTP_CONTENT_ENCODING", encoding)
        .env("REMOTE_USER", "room")
        .env("REMOTE_ADDR", "127.0.0.1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    tokio::spawn(async move {
        use tokio::io::AsyncWriteExt as _;
        let _ = stdin.write_all(&body).await;
    });
    let out = child.wait_with_output().await.unwrap().stdout;
    let split = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, 4))
        .or_else(|| out.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2)))
        .unwrap();
    let head = String::from_utf8_lossy(&out[..split.0]).into_owned();
    let mut r = reply(200, out[split.0 + split.1..].to_vec());
    for line in head.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        if k.eq_ignore_ascii_case("status") {
            let code = v.trim().split(' ').next().unwrap().parse().unwrap();
            *r.status_mut() = hyper::StatusCode::from_u16(code).unwrap();
        } else {
            r.headers_mut().append(
                hyper::header::HeaderName::from_bytes(k.trim().as_bytes()).unwrap(),
                v.trim().parse().unwrap(),
            );
        }
    }
    r
}

on_each_backend!(
    repositories_are_cloned_pulled_and_pushed_without_the_token_entering_the_room,
    repositories_are_cloned_pulled_and_pushed_without_the_token_entering_the_room_on
);

async fn repositories_are_cloned_pulled_and_pushed_without_the_token_entering_the_room_on(
    backend: &Backend,
) {
    let storage = Storage::new(backend).await;
    let log = storage.dir.path().join("server.log");
    let upstream = tempfile::tempdir().unwrap();
    let seed = origin(upstream.path());
    let token = format!("ghp_{}", uuid::Uuid::new_v4().simple());
    let (port, refused) = git_server(upstream.path().to_owned(), token.clone()).await;
    let ana = storage.token("ana@example.com").await;
    let ben = storage.token("ben@example.com").await;
    let admin = storage.token("root@example.com").await;
    let resolve = format!("git.test=127.0.0.1:{port}");
    let server = Server::start_logging_with(
        &storage,
        &log,
        &[
            "--egress-test-resolve",
            &resolve,
            "--admin-emails",
            "root@example.com",
        ],
    )
    .await;
    let room = create_room(&server, &ana).await;
    let (status, inv) = invite(&server, &ana, &room, "editor", 1).await;
    assert_eq!(status, 201);
    assert_eq!(accept(&server, &ben, &inv).await, 200);
    let mut seen = String::new();
    let repos = format!("/api/rooms/{room}/repos");
    let url = format!("http://git.test:{port}/team.git");
    for (name, value) in [("GIT_TOKEN", token.as_str()), ("WRONG_TOKEN", "nope")] {
        let (status, body) = post(
            &server,
            &ana,
            &format!("/api/rooms/{room}/secrets"),
            &format!(r#"{{"name":"{name}","value":"{value}","hosts":["git.test"]}}"#),
        )
        .await;
        assert_eq!(status, 201, "{body}");
    }
    let connect = |secret: &str, access: &str, path: &str, url: &str| {
        format!(
            r#"{{"url":"{url}","branch":"main","secret":"{secret}","access":"{access}","path":"{path}"}}"#
        )
    };

    // Refused: without connect_repo; with a credential the server refuses; an address inside;
    // credentials in the URL; a branch that is an option.
    let (status, _) = post(
        &server,
        &ben,
        &repos,
        &connect("GIT_TOKEN", "push", "team", &url),
    )
    .await;
    assert_eq!(status, 403);
    let (status, body) = post(
        &server,
        &ana,
        &repos,
        &connect("WRONG_TOKEN", "push", "team", &url),
    )
    .await;
    assert_eq!(status, 502, "{body}");
    assert!(
        body.to_string().contains("refused the credential"),
        "{body}"
    );
    assert!(*refused.lock().unwrap() > 0);
    let inside_url = format!(
        "http://127.0.0.1:{}/team.git",
        server.addr.rsplit(':').next().unwrap()
    );
    let (status, body) = post(
        &server,
        &ana,
        &repos,
        &connect("GIT_TOKEN", "push", "team", &inside_url),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert!(body.to_string().contains("loopback"), "{body}");
    let with_creds = format!("http://x:{token}@git.test:{port}/team.git");
    let (status, body) = post(
        &server,
        &ana,
        &repos,
        &connect("GIT_TOKEN", "push", "team", &with_creds),
    )
    .await;
    assert_eq!(status, 400);
    seen.push_str(
        &body
            .to_string()
            .replace(&token, "(the token the test sent)"),
    );
    let (status, _) = post(
        &server,
        &ana,
        &repos,
        &format!(r#"{{"url":"{url}","branch":"--upload-pack=touch /tmp/x","secret":null,"access":"read"}}"#),
    )
    .await;
    assert_eq!(status, 400);
    assert!(get_json(&server, &ana, &repos)
        .await
        .as_array()
        .unwrap()
        .is_empty());

    // Connected: the branch's files are in the workspace.
    let (status, body) = post(
        &server,
        &ana,
        &repos,
        &connect("GIT_TOKEN", "push", "team", &url),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    seen.push_str(&body.to_string());
    let rid = body["id"].as_str().unwrap().to_owned();
    let out = inside(
        &server,
        &ana,
        &room,
        "cat team/README.md team/src/app.txt",
        &mut seen,
    )
    .await;
    assert_eq!(out, "# Team\none\ntwo\nthree\n");

    // Ben changes a file and pushes: the commit is his, committed by the room.
    inside(
        &server,
        &ana,
        &room,
        "echo 'four' >> team/src/app.txt",
        &mut seen,
    )
    .await;
    let (status, body) = post(
        &server,
        &ben,
        &format!("{repos}/{rid}/push"),
        r#"{"message":"Count to four"}"#,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["state"], "pushed");
    let bare = upstream.path().join("team.git");
    let last = git(
        &bare,
        &["log", "-1", "--format=%an <%ae>|%cn <%ce>|%s", "main"],
    );
    assert_eq!(
        last.trim(),
        format!("ben <ben@example.com>|Coderoom room <room-{room}@coderoom.invalid>|Count to four")
    );
    assert_eq!(
        git(&bare, &["show", "main:src/app.txt"]),
        "one\ntwo\nthree\nfour\n"
    );
    let (status, body) = post(
        &server,
        &ben,
        &format!("{repos}/{rid}/push"),
        r#"{"message":"again"}"#,
    )
    .await;
    assert_eq!(
        (status, body["state"].as_str()),
        (200, Some("nothing_to_push"))
    );

    // Read-only: the push is refused, and the refusal is in the audit chain.
    let (status, body) = post(
        &server,
        &ana,
        &repos,
        &connect("GIT_TOKEN", "read", "team-ro", &url),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let ro = body["id"].as_str().unwrap().to_owned();
    inside(
        &server,
        &ana,
        &room,
        "echo change > team-ro/README.md",
        &mut seen,
    )
    .await;
    let (status, _) = post(
        &server,
        &ana,
        &format!("{repos}/{ro}/push"),
        r#"{"message":"no"}"#,
    )
    .await;
    assert_eq!(status, 403);
    let chain = audit(&server, &ana, &room).await;
    assert!(chain.iter().any(|r| r["action"] == "push_repo"
        && r["decision"] == "deny"
        && r["reason"] == "the repository is connected read-only"));
    assert!(chain
        .iter()
        .any(|r| r["action"] == "connect_repo" && r["decision"] == "allow"));

    // A change upstream and one in the room, to different files: a pull merges them.
    commit_upstream(&seed, "NEWS.md", "news\n");
    inside(
        &server,
        &ana,
        &room,
        "echo mine > team/notes.txt",
        &mut seen,
    )
    .await;
    let (status, body) = post(&server, &ana, &format!("{repos}/{rid}/pull"), "{}").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (body["state"].as_str(), body["merged"].as_bool()),
        (Some("pulled"), Some(true))
    );
    let out = inside(
        &server,
        &ana,
        &room,
        "cat team/NEWS.md team/notes.txt team/src/app.txt",
        &mut seen,
    )
    .await;
    assert_eq!(out, "news\nmine\none\ntwo\nthree\nfour\n");
    // The same line changed on both sides: the pull is refused and nothing changes.
    commit_upstream(&seed, "src/app.txt", "one\ntwo\nTHREE\nfour\n");
    inside(
        &server,
        &ana,
        &room,
        "sed -i 's/three/3/' team/src/app.txt",
        &mut seen,
    )
    .await;
    let (status, body) = post(&server, &ana, &format!("{repos}/{rid}/pull"), "{}").await;
    assert_eq!(status, 409, "{body}");
    assert!(body.to_string().contains("src/app.txt"), "{body}");
    // Pushing over it is refused too: the branch moved.
    let (status, body) = post(
        &server,
        &ana,
        &format!("{repos}/{rid}/push"),
        r#"{"message":"mine"}"#,
    )
    .await;
    assert_eq!(status, 409, "{body}");
    assert!(body.to_string().contains("pull first"), "{body}");
    assert_eq!(
        git(&bare, &["show", "main:src/app.txt"]),
        "one\ntwo\nTHREE\nfour\n"
    );
    // Forced, it needs someone else's approval of exactly that push; then it replaces the
    // branch with the room's version, once.
    let force = r#"{"message":"ours wins","force":true}"#;
    let (status, body) = post(&server, &ben, &format!("{repos}/{rid}/push"), force).await;
    assert_eq!(status, 202, "{body}");
    let approval = body["approval_id"].as_str().unwrap().to_owned();
    let (status, body) = post(
        &server,
        &ana,
        &format!("/api/rooms/{room}/approvals/{approval}/decision"),
        r#"{"approve":true}"#,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let approved = format!(r#"{{"message":"ours wins","force":true,"approval_id":"{approval}"}}"#);
    let (status, body) = post(&server, &ben, &format!("{repos}/{rid}/push"), &approved).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["forced"], true);
    assert_eq!(
        git(&bare, &["show", "main:src/app.txt"]),
        "one\ntwo\n3\nfour\n"
    );
    let (status, _) = post(&server, &ben, &format!("{repos}/{rid}/push"), &approved).await;
    assert_eq!(status, 403, "an approval is spent once");

    // Exports of the room's changes, as a bundle and as a patch: each waits for someone
    // else's approval (Dee's, a second owner), and carries one commit authored by whoever
    // asked.
    let dee = storage.token("dee@example.com").await;
    let (status, inv) = invite(&server, &ana, &room, "owner", 1).await;
    assert_eq!(status, 201);
    assert_eq!(accept(&server, &dee, &inv).await, 200);
    inside(
        &server,
        &ana,
        &room,
        "echo exported > team/EXPORT.md",
        &mut seen,
    )
    .await;
    let export = format!("{repos}/{rid}/export");
    let mut outputs = Vec::new();
    for format in ["bundle", "patch"] {
        let (status, body) = post(
            &server,
            &ana,
            &export,
            &format!(r#"{{"format":"{format}"}}"#),
        )
        .await;
        assert_eq!(status, 202, "{body}");
        let approval = body["approval_id"].as_str().unwrap().to_owned();
        let (status, _) = post(
            &server,
            &dee,
            &format!("/api/rooms/{room}/approvals/{approval}/decision"),
            r#"{"approve":true}"#,
        )
        .await;
        assert_eq!(status, 200);
        let url = server.url(&export);
        let body = format!(r#"{{"format":"{format}","approval_id":"{approval}"}}"#);
        let auth = format!("Bearer {ana}");
        let resp = request(&url, "POST", &[("Authorization", &auth)], Some(&body)).await;
        assert_eq!(resp.status, 200, "{}", resp.body);
        assert!(resp
            .header("content-disposition")
            .unwrap()
            .contains(&format!("team.{format}")));
        outputs.push(resp.raw);
    }
    let file = upstream.path().join("room.bundle");
    std::fs::write(&file, &outputs[0]).unwrap();
    git(&seed, &["fetch", "-q", "origin", "main"]);
    git(&seed, &["reset", "-q", "--hard", "origin/main"]);
    git(
        &seed,
        &["bundle", "verify", "-q", &file.display().to_string()],
    );
    let fetched = format!("{}", file.display());
    git(
        &seed,
        &["fetch", "-q", &fetched, "room-changes:refs/heads/from-room"],
    );
    assert_eq!(
        git(&seed, &["log", "-1", "--format=%an <%ae>|%s", "from-room"]).trim(),
        "ana <ana@example.com>|Changes from the room"
    );
    assert_eq!(git(&seed, &["show", "from-room:EXPORT.md"]), "exported\n");
    let patch = String::from_utf8(outputs[1].clone()).unwrap();
    assert!(
        patch.contains("From: ana <ana@example.com>") && patch.contains("+exported"),
        "{patch}"
    );

    // Nor in what the shared terminal shows (its recording is searched below).
    let mut t = term(&server, &room, &ana).await;
    t.send(b"cat team/README.md; env | sort; echo terminal-done\r")
        .await;
    t.output_contains("terminal-done\r\n").await;
    seen.push_str(&t.output);
    drop(t);

    // The token is nowhere in the room: not the environment, not a file (git's own config
    // included), not the terminal's processes.
    let out = inside(
        &server,
        &ana,
        &room,
        "env; cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'; grep -rs . /workspace /tmp /run 2>/dev/null | head -c 2000000; echo done",
        &mut seen,
    )
    .await;
    assert!(out.ends_with("done\n"));
    let listed = get_json(&server, &ana, &repos).await;
    seen.push_str(&listed.to_string());
    assert_eq!(listed.as_array().unwrap().len(), 2);
    let chain = audit(&server, &ana, &room).await;
    seen.push_str(&serde_json::to_string(&chain).unwrap());
    assert!(
        !seen.contains(&token),
        "an answer or an output carried the token"
    );
    // The server's clone names its remote by URL only.
    assert!(
        no_file_holds(storage.dir.path(), &token)
            .iter()
            .any(|f| f.to_string_lossy().contains("recordings")),
        "no terminal recording was searched"
    );
    let clone = storage
        .dir
        .path()
        .join("rooms")
        .join(&room)
        .join("repos")
        .join(format!("{rid}.git"));
    let config = std::fs::read_to_string(clone.join("config")).unwrap();
    assert!(
        config.contains(&url) && !config.contains(&token),
        "{config}"
    );
    no_file_holds(storage.dir.path(), &token);

    // Deleting the room destroys the clones and the credentials with it.
    let v = delete_room(&server, &ana, &admin, &room).await;
    let artifacts = v["receipt"]["artifacts"].as_array().unwrap();
    let status_of = |name: &str| {
        artifacts
            .iter()
            .find(|a| a["artifact"] == name)
            .map(|a| a["status"].clone())
    };
    assert_eq!(
        status_of("repositories"),
        Some(serde_json::json!("destroyed")),
        "{v}"
    );
    assert_eq!(
        status_of("secrets"),
        Some(serde_json::json!("destroyed")),
        "{v}"
    );
    assert!(!clone.exists());
    assert!(server.terminate().await.success());
    assert!(
        std::fs::metadata(&log).unwrap().len() > 1000,
        "the debug log is missing"
    );
    no_file_holds(storage.dir.path(), &token);
}
