//! A `coderoom serve` of the fixture's own, started from this binary, and a small HTTP client
//! that talks to it from outside as any client would.

use anyhow::{anyhow, bail, Context as _};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, Command};

/// The fixture's one user: owner of its rooms, and the system admin who confirms their
/// deletion.
pub(super) const EMAIL: &str = "tiers-bench@example.com";

/// A command's time limit in the sandbox.
const EXEC_TIMEOUT_MS: u64 = 60_000;

/// How long one request may take (a VM under software emulation boots in seconds; the
/// canaries' script may run for minutes there).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(360);

/// A running server of the fixture.
pub(super) struct Server {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub(super) addr: String,
    /// Its data directory.
    pub(super) data_dir: PathBuf,
    /// The arguments it was started with (a restart uses them again).
    args: Vec<String>,
    /// A bearer token of [`EMAIL`].
    pub(super) token: String,
}

/// An answer: status and body.
pub(super) struct Answer {
    pub(super) status: u16,
    pub(super) body: Bytes,
}

impl Answer {
    /// The body as JSON (`null` when it is not JSON).
    pub(super) fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    /// The body as text.
    pub(super) fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

impl Server {
    /// Starts `coderoom serve` on `data_dir` with `args` and makes a token for [`EMAIL`].
    pub(super) async fn start(data_dir: &Path, args: Vec<String>) -> anyhow::Result<Server> {
        std::fs::create_dir_all(data_dir)
            .with_context(|| format!("cannot make {}", data_dir.display()))?;
        let (child, addr) = spawn(data_dir, &args).await?;
        let mut server = Server {
            child,
            addr,
            data_dir: data_dir.to_owned(),
            args,
            token: String::new(),
        };
        server.token = server.make_token().await?;
        Ok(server)
    }

    async fn make_token(&self) -> anyhow::Result<String> {
        let out = Command::new(std::env::current_exe()?)
            .args(["admin", "token", "--email", EMAIL, "--data-dir"])
            .arg(&self.data_dir)
            .env_remove("CODEROOM_DATABASE_URL")
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .await?;
        let token = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        if !out.status.success() || token.is_empty() {
            bail!("`coderoom admin token` failed ({})", out.status);
        }
        Ok(token)
    }

    /// The server's process id.
    pub(super) fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// SIGKILL, then a new server on the same data directory and arguments.
    pub(super) async fn kill9_and_restart(&mut self) -> anyhow::Result<()> {
        self.child.start_kill()?;
        self.child.wait().await?;
        let (child, addr) = spawn(&self.data_dir, &self.args).await?;
        self.child = child;
        self.addr = addr;
        Ok(())
    }

    /// SIGTERM (a clean stop: sandboxes stopped, rooms flushed), waiting for the exit.
    pub(super) async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            let _ = Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status()
                .await;
        }
        if tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.start_kill();
            let _ = self.child.wait().await;
        }
    }

    /// One request with the fixture's token.
    pub(super) async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> anyhow::Result<Answer> {
        request(&self.addr, method, path, Some(&self.token), body).await
    }

    /// [`Server::call`] with a JSON body, expecting `want`; the answer's JSON.
    pub(super) async fn json(
        &self,
        method: &str,
        path: &str,
        body: Value,
        want: u16,
    ) -> anyhow::Result<Value> {
        let a = self
            .call(method, path, Some(body.to_string().into_bytes()))
            .await?;
        if a.status != want {
            bail!("{method} {path}: {} {}", a.status, a.text());
        }
        Ok(a.json())
    }

    /// A new room; its id.
    pub(super) async fn room(&self, name: &str) -> anyhow::Result<String> {
        let v = self
            .json(
                "POST",
                "/api/rooms",
                serde_json::json!({ "name": name }),
                201,
            )
            .await?;
        v["id"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| anyhow!("POST /api/rooms: no id in {v}"))
    }

    /// Runs `script` with `sh -c` in `room`'s sandbox: its answer and how long it took.
    pub(super) async fn exec(&self, room: &str, script: &str) -> anyhow::Result<(Exec, Duration)> {
        self.exec_argv(room, &["sh", "-c", script]).await
    }

    /// Runs `argv` in `room`'s sandbox.
    pub(super) async fn exec_argv(
        &self,
        room: &str,
        argv: &[&str],
    ) -> anyhow::Result<(Exec, Duration)> {
        self.exec_within(room, argv, EXEC_TIMEOUT_MS).await
    }

    /// Runs `argv` in `room`'s sandbox with a time limit of `timeout_ms`.
    pub(super) async fn exec_within(
        &self,
        room: &str,
        argv: &[&str],
        timeout_ms: u64,
    ) -> anyhow::Result<(Exec, Duration)> {
        let started = Instant::now();
        let v = self
            .json(
                "POST",
                &format!("/api/rooms/{room}/exec"),
                serde_json::json!({ "argv": argv, "timeout_ms": timeout_ms }),
                200,
            )
            .await?;
        let took = started.elapsed();
        Ok((
            Exec {
                code: v["exit_code"].as_i64().unwrap_or(-1),
                stdout: v["stdout"].as_str().unwrap_or_default().to_owned(),
                stderr: v["stderr"].as_str().unwrap_or_default().to_owned(),
            },
            took,
        ))
    }

    /// Writes a file of `room`'s workspace.
    pub(super) async fn put_file(
        &self,
        room: &str,
        path: &str,
        content: &str,
    ) -> anyhow::Result<()> {
        let a = self
            .call(
                "PUT",
                &format!("/api/rooms/{room}/files/{path}"),
                Some(content.as_bytes().to_vec()),
            )
            .await?;
        if !(200..300).contains(&a.status) {
            bail!("PUT {path}: {} {}", a.status, a.text());
        }
        Ok(())
    }

    /// The Prometheus text of `/metrics`.
    pub(super) async fn metrics(&self) -> anyhow::Result<String> {
        let a = request(&self.addr, "GET", "/metrics", None, None).await?;
        Ok(a.text())
    }
}

/// What a command answered.
pub(super) struct Exec {
    pub(super) code: i64,
    pub(super) stdout: String,
    pub(super) stderr: String,
}

impl Exec {
    /// Ok when it exited 0.
    pub(super) fn ok(self) -> anyhow::Result<Exec> {
        if self.code != 0 {
            bail!(
                "exit {}: {}",
                self.code,
                self.stderr.lines().last().unwrap_or("")
            );
        }
        Ok(self)
    }
}

async fn spawn(data_dir: &Path, args: &[String]) -> anyhow::Result<(Child, String)> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(data_dir.join("server.log"))?;
    let mut child = Command::new(std::env::current_exe()?)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin-emails",
            EMAIL,
            "--data-dir",
        ])
        .arg(data_dir)
        .args(args)
        // The fixture's own SQLite, whatever the caller's environment names.
        .env_remove("CODEROOM_DATABASE_URL")
        .env("CODEROOM_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .context("cannot start `coderoom serve`")?;
    let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
    let mut lines = BufReader::new(stdout).lines();
    let addr = tokio::time::timeout(Duration::from_secs(600), async {
        while let Some(line) = lines.next_line().await? {
            if let Some(a) = line.strip_prefix("listening on http://") {
                return Ok(a.to_owned());
            }
        }
        Err(anyhow!(
            "the server exited before listening (its log: {})",
            data_dir.join("server.log").display()
        ))
    })
    .await
    .map_err(|_| anyhow!("the server did not listen within 600 s"))??;
    // Drained, so that the server never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok((child, addr))
}

/// One HTTP/1.1 request on a connection of its own.
pub(super) async fn request(
    addr: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<Vec<u8>>,
) -> anyhow::Result<Answer> {
    let go = async {
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
        tokio::spawn(conn);
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", addr);
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        if body.is_some() {
            req = req.header("content-type", "application/json");
        }
        let req = req.body(Full::new(Bytes::from(body.unwrap_or_default())))?;
        let res = send.send_request(req).await?;
        let status = res.status().as_u16();
        let body = res.into_body().collect().await?.to_bytes();
        Ok::<_, anyhow::Error>(Answer { status, body })
    };
    tokio::time::timeout(REQUEST_TIMEOUT, go)
        .await
        .map_err(|_| anyhow!("{method} {path}: no answer within {REQUEST_TIMEOUT:?}"))?
}
