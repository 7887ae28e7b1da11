//! Black-box harness: starts the real `coderoom` binary and talks to it as a client would.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use futures_util::{SinkExt, StreamExt};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use yrs::sync::protocol::{Message as YMessage, SyncMessage};
use yrs::updates::decoder::Decode;
use yrs::updates::encoder::Encode;
use yrs::{Doc, GetString, ReadTxn, StateVector, Text, Transact, Update};

pub const BIN: &str = env!("CARGO_BIN_EXE_coderoom");
pub const TIMEOUT: Duration = Duration::from_secs(15);

/// An external dependency some tests need. `tests/run` provides them where it can; `.ci/run`
/// provides all of them and says so with `CODEROOM_REQUIRE_<NAME>=1`.
#[derive(Clone, Copy, Debug)]
pub enum Need {
    /// A PostgreSQL server (`CODEROOM_TEST_POSTGRES_URL`).
    Postgres,
    /// A real SMTP server (Python's `aiosmtpd`).
    Smtp,
    /// The browser client's build (`web/dist`).
    WebDist,
    /// shadow's `newuidmap` and `newgidmap` (Debian's `uidmap`).
    Uidmap,
    /// The benchmark peers (`tests/bench/peers`: the reference server and Hocuspocus).
    BenchPeers,
    /// QEMU and a built VM guest image (`CODEROOM_TEST_IMAGE_DIR`, made by `tests/run`).
    Qemu,
    /// cloud-hypervisor's binary (built by `.ci/run` from `../shared/vendor`).
    CloudHypervisor,
    /// Network namespaces of the test's own (root and iproute2; see `netns.rs`).
    NetNamespace,
    /// A KVM that boots a stock guest kernel (hardware virtualisation; `CODEROOM_KVM_TESTS=1`
    /// forces the tests that need it).
    Kvm,
    /// The stock E2B Python SDK (`CODEROOM_E2B_PYTHON`, pinned by `.ci/run`).
    E2bSdk,
}

impl Need {
    fn name(self) -> &'static str {
        match self {
            Need::Postgres => "POSTGRES",
            Need::Smtp => "SMTP",
            Need::WebDist => "WEB_DIST",
            Need::Uidmap => "UIDMAP",
            Need::BenchPeers => "BENCH_PEERS",
            Need::Qemu => "QEMU",
            Need::CloudHypervisor => "CLOUD_HYPERVISOR",
            Need::Kvm => "KVM",
            Need::NetNamespace => "NETNS",
            Need::E2bSdk => "E2B_SDK",
        }
    }
}

pub mod netns;
mod skip_log;

/// Reports the running test as skipped for want of `need` (see `skip_log.rs`, shared with the
/// unit tests): counted in the run's summary, or a failure when the run promised it.
pub fn skip(need: Need, reason: &str) {
    skip_log::skip(need.name(), reason);
}

/// The PostgreSQL backend, or `None` after reporting the test skipped.
pub fn postgres() -> Option<Backend> {
    match std::env::var("CODEROOM_TEST_POSTGRES_URL") {
        Ok(url) if !url.is_empty() => Some(Backend::Postgres(url)),
        _ => {
            skip(Need::Postgres, "CODEROOM_TEST_POSTGRES_URL is not set");
            None
        }
    }
}

/// Declares a test per storage backend, `$name::sqlite` and `$name::postgres`, each running
/// `$run(&Backend)`: a missing PostgreSQL shows up as a skipped test of its own, never hidden
/// inside a passing one.
#[macro_export]
macro_rules! on_each_backend {
    ($name:ident, $run:ident) => {
        mod $name {
            #[tokio::test]
            async fn sqlite() {
                super::$run(&$crate::common::Backend::Sqlite).await;
            }

            #[tokio::test]
            async fn postgres() {
                if let Some(backend) = $crate::common::postgres() {
                    super::$run(&backend).await;
                }
            }
        }
    };
}

#[derive(Clone, Debug)]
pub enum Backend {
    Sqlite,
    Postgres(String),
}

/// A bind parameter of [`Storage::execute`] and [`Storage::query_i64`].
#[derive(Clone, Debug)]
pub enum Arg {
    Text(String),
    Int(i64),
}

impl From<&str> for Arg {
    fn from(s: &str) -> Arg {
        Arg::Text(s.to_owned())
    }
}

impl From<&String> for Arg {
    fn from(s: &String) -> Arg {
        Arg::Text(s.clone())
    }
}

impl From<i64> for Arg {
    fn from(i: i64) -> Arg {
        Arg::Int(i)
    }
}

/// A data directory and database that outlive server restarts.
pub struct Storage {
    pub dir: tempfile::TempDir,
    pub database_url: Option<String>,
    admin_url: Option<String>,
    db_name: Option<String>,
}

impl Storage {
    /// A direct connection to this storage's SQLite database, for tests that look under the
    /// server or tamper with what it stored.
    pub async fn sqlite(&self) -> sqlx::SqliteConnection {
        use sqlx::Connection;
        let db = format!("sqlite://{}", self.dir.path().join("coderoom.db").display());
        sqlx::SqliteConnection::connect(&db).await.unwrap()
    }

    /// Runs one statement on this storage's database, whichever backend it is, and returns the
    /// rows it changed: for tests that tamper with what the server stored.
    pub async fn execute(&self, sql: &str, args: &[Arg]) -> u64 {
        use sqlx::Connection;
        macro_rules! run {
            ($conn:expr) => {{
                let mut query = sqlx::query(sql);
                for arg in args {
                    query = match arg {
                        Arg::Text(s) => query.bind(s.clone()),
                        Arg::Int(i) => query.bind(*i),
                    };
                }
                query.execute(&mut $conn).await.unwrap().rows_affected()
            }};
        }
        match &self.database_url {
            Some(url) => run!(sqlx::PgConnection::connect(url).await.unwrap()),
            None => run!(self.sqlite().await),
        }
    }

    /// The single integer one query returns (a count, a sequence number), on either backend.
    pub async fn query_i64(&self, sql: &str, args: &[Arg]) -> i64 {
        use sqlx::Connection;
        macro_rules! run {
            ($conn:expr) => {{
                let mut query = sqlx::query_scalar::<_, i64>(sql);
                for arg in args {
                    query = match arg {
                        Arg::Text(s) => query.bind(s.clone()),
                        Arg::Int(i) => query.bind(*i),
                    };
                }
                query.fetch_one(&mut $conn).await.unwrap()
            }};
        }
        match &self.database_url {
            Some(url) => run!(sqlx::PgConnection::connect(url).await.unwrap()),
            None => run!(self.sqlite().await),
        }
    }

    pub async fn new(backend: &Backend) -> Storage {
        let dir = tempfile::tempdir().unwrap();
        match backend {
            Backend::Sqlite => Storage {
                dir,
                database_url: None,
                admin_url: None,
                db_name: None,
            },
            Backend::Postgres(admin) => {
                let name = format!("coderoom_t_{}", uuid::Uuid::new_v4().simple());
                psql(admin, &format!("CREATE DATABASE {name}")).await;
                let base = admin.rsplit_once('/').unwrap().0;
                Storage {
                    dir,
                    database_url: Some(format!("{base}/{name}")),
                    admin_url: Some(admin.clone()),
                    db_name: Some(name),
                }
            }
        }
    }

    /// Another server's storage on the same database (scale-out): a data directory of its
    /// own. Only the first one drops the database.
    pub fn sharing(&self) -> Storage {
        Storage {
            dir: tempfile::tempdir().unwrap(),
            database_url: self.database_url.clone(),
            admin_url: None,
            db_name: None,
        }
    }

    pub fn args(&self) -> Vec<String> {
        let mut a = vec!["--data-dir".into(), self.dir.path().display().to_string()];
        if let Some(url) = &self.database_url {
            a.push("--database-url".into());
            a.push(url.clone());
        }
        a
    }

    /// Runs `coderoom ARGS` against this storage; (success, stdout and stderr).
    pub async fn cli(&self, args: &[&str]) -> (bool, String) {
        let out = Command::new(BIN)
            .args(args)
            .args(self.args())
            .output()
            .await
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }

    pub async fn token(&self, email: &str) -> String {
        let out = Command::new(BIN)
            .args(["admin", "token", "--email", email])
            .args(self.args())
            .stderr(Stdio::null())
            .output()
            .await
            .unwrap();
        assert!(out.status.success(), "admin token failed");
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }

    pub async fn drop_db(&self) {
        if let (Some(admin), Some(name)) = (&self.admin_url, &self.db_name) {
            psql(
                admin,
                &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
            )
            .await;
        }
    }
}

async fn psql(url: &str, sql: &str) {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
    sqlx::Executor::execute(&mut conn, sql).await.unwrap();
}

/// This machine's clock in milliseconds since the epoch, as the server stamps its rows.
pub fn now_ms() -> i64 {
    i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

pub struct Server {
    pub child: Child,
    pub addr: String,
    /// Every line the server printed on stdout after its `listening on` line.
    stdout: tokio::sync::watch::Receiver<Vec<String>>,
}

impl Server {
    pub async fn start(storage: &Storage, extra: &[&str]) -> Server {
        Self::start_with_env(storage, extra, &[]).await
    }

    pub async fn start_with_env(storage: &Storage, extra: &[&str], env: &[(&str, &str)]) -> Server {
        Self::start_command(Command::new(BIN), storage, extra, env, None).await
    }

    /// Starts the server in the test's network namespace `ns` (listening on its address
    /// there, reading its `/etc/hosts`).
    pub async fn start_in(ns: &netns::Netns, storage: &Storage, extra: &[&str]) -> Server {
        let listen = format!("{}:0", ns.server_addr);
        let mut args = vec!["--listen", &listen];
        args.extend_from_slice(extra);
        Self::start_command(ns.in_server(BIN), storage, &args, &[], None).await
    }

    /// Starts a server that stops at the test hook `point` before it listens (work it does at
    /// startup, such as resuming a deletion, reaches the point). It has no address; kill it.
    pub async fn start_stopping_at(storage: &Storage, point: &str) -> Server {
        #[cfg(not(debug_assertions))]
        panic!("fault points exist in debug builds only (see server/src/fault.rs)");
        let env = [("CODEROOM_FAULT_PAUSE_AT", point)];
        Self::start_command(Command::new(BIN), storage, &[], &env, Some(point)).await
    }

    /// Starts the server through `sh` with extra redirections (`7>>FILE 8<FILE`): descriptors
    /// it inherits without close-on-exec, as a careless parent would leave them.
    pub async fn start_with_redirections(storage: &Storage, redirections: &str) -> Server {
        Self::start_via_shell(storage, "", redirections, &[]).await
    }

    /// Starts the server as `uid` (not root), moved first into `cgroups` (its own groups, one
    /// directory per cgroup v1 controller, as an operator delegates them). The storage's files
    /// must belong to `uid`.
    pub async fn start_unprivileged(
        storage: &Storage,
        uid: u32,
        cgroups: &[std::path::PathBuf],
    ) -> Server {
        let moves: String = cgroups
            .iter()
            .map(|d| format!("echo $$ > {}/cgroup.procs && ", d.display()))
            .collect();
        // The binary as `uid` can reach it: linked into the data directory (which the caller
        // opened to `uid`), since the checkout may sit below a directory only root may enter
        // (a `mktemp -d` clone), and the server binds its own binary into every sandbox.
        // Made once per storage (a restart finds it), and never copied onto itself: a copy
        // over a hard link to `BIN` would truncate `BIN`.
        let bin = storage.dir.path().join("coderoom");
        if !bin.exists() && std::fs::hard_link(BIN, &bin).is_err() {
            std::fs::copy(BIN, &bin).unwrap();
        }
        let mut sh = Command::new("sh");
        sh.arg("-c")
            .arg(format!(
                "{moves} exec setpriv --reuid={uid} --regid={uid} --clear-groups \"$0\" \"$@\""
            ))
            .arg(&bin);
        Self::start_command(sh, storage, &[], &[], None).await
    }

    /// Starts the server logging at debug level into `log` (its stderr).
    pub async fn start_logging_to(storage: &Storage, log: &std::path::Path) -> Server {
        Self::start_logging_with(storage, log, &[]).await
    }

    /// [`Server::start_logging_to`] with extra server flags.
    pub async fn start_logging_with(
        storage: &Storage,
        log: &std::path::Path,
        extra: &[&str],
    ) -> Server {
        let after = format!("2>>{}", log.display());
        Self::start_via_shell(storage, "CODEROOM_LOG=debug", &after, extra).await
    }

    /// Starts the server with an open-file limit of `soft` (and `hard`) descriptors.
    pub async fn start_with_open_file_limit(storage: &Storage, soft: u32, hard: u32) -> Server {
        let limits = format!("ulimit -S -n {soft} && ulimit -H -n {hard} &&");
        Self::start_via_shell(storage, &limits, "", &[]).await
    }

    /// Starts the server through `sh -c "{before} exec coderoom serve ... {after}"`.
    async fn start_via_shell(
        storage: &Storage,
        before: &str,
        after: &str,
        extra: &[&str],
    ) -> Server {
        let mut sh = Command::new("sh");
        sh.arg("-c")
            .arg(format!("{before} exec \"$0\" \"$@\" {after}"))
            .arg(BIN);
        Self::start_command(sh, storage, extra, &[], None).await
    }

    async fn start_command(
        mut cmd: Command,
        storage: &Storage,
        extra: &[&str],
        env: &[(&str, &str)],
        stop_at: Option<&str>,
    ) -> Server {
        if !extra.contains(&"--listen") {
            cmd.args(["serve", "--listen", "127.0.0.1:0"]);
        } else {
            cmd.arg("serve");
        }
        // No warm pool unless a test asks for one (`auto` would start a sandbox per server:
        // tests count sandboxes, and a 2-CPU machine runs many servers at once).
        if !extra.contains(&"--sandbox-warm-pool") {
            cmd.args(["--sandbox-warm-pool", "0"]);
        }
        let mut child = cmd
            .envs(env.iter().copied())
            .args(storage.args())
            .args(extra)
            // CODEROOM_TEST_LOG=debug shows the server's reasoning when a test fails.
            .env(
                "CODEROOM_LOG",
                std::env::var("CODEROOM_TEST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let stopped = stop_at.map(|p| format!("fault point reached: {p}"));
        let (addr, first) = tokio::time::timeout(TIMEOUT, async {
            while let Some(line) = lines.next_line().await.unwrap() {
                if let Some(a) = line.strip_prefix("listening on http://") {
                    return (a.to_owned(), Vec::new());
                }
                if stopped.as_deref() == Some(line.as_str()) {
                    return (String::new(), vec![line]);
                }
            }
            panic!("server exited before listening");
        })
        .await
        .expect("server did not start");
        // Keep draining stdout so the child never blocks on a full pipe; keep the lines.
        let (tx, stdout) = tokio::sync::watch::channel(first);
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                tx.send_modify(|all| all.push(line));
            }
        });
        Server {
            child,
            addr,
            stdout,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// Waits until the server has printed `line` on stdout.
    pub async fn printed(&self, line: &str) {
        let mut stdout = self.stdout.clone();
        tokio::time::timeout(
            TIMEOUT,
            stdout.wait_for(|all| all.iter().any(|l| l == line)),
        )
        .await
        .unwrap_or_else(|_| panic!("the server never printed {line:?}"))
        .unwrap();
    }

    /// Waits until the server stops at the test hook `point` (see `server/src/fault.rs`; the
    /// server must run with `CODEROOM_FAULT_PAUSE_AT` naming it).
    pub async fn stopped_at(&self, point: &str) {
        #[cfg(not(debug_assertions))]
        panic!("fault points exist in debug builds only (see server/src/fault.rs)");
        self.printed(&format!("fault point reached: {point}")).await;
    }

    pub async fn terminate(mut self) -> std::process::ExitStatus {
        let pid = self.child.id().unwrap();
        std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap();
        tokio::time::timeout(TIMEOUT, self.child.wait())
            .await
            .unwrap()
            .unwrap()
    }

    pub async fn kill9(mut self) {
        self.child.start_kill().unwrap();
        let _ = self.child.wait().await;
    }

    pub async fn metric(&self, name: &str) -> f64 {
        let body = http(&self.url("/metrics"), "GET", None, None).await.1;
        body.lines()
            .find_map(|l| {
                let (k, v) = l.split_once(' ')?;
                (k == name).then(|| v.parse().unwrap())
            })
            .unwrap_or_else(|| panic!("metric {name} missing"))
    }
}

pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
    /// The body's bytes as they came (`body` is them read as UTF-8).
    pub raw: Vec<u8>,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Minimal HTTP/1.1 client over a raw socket (keeps the dev-dependency list short).
pub async fn request(
    url: &str,
    method: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Resp {
    request_within(url, method, headers, body, TIMEOUT).await
}

/// Whether `buf` holds a whole HTTP/1.1 answer by its framing: a head, and a body as long as
/// its `Content-Length` or chunks up to the last one. (An answer framed by the connection's
/// end is whole when the connection ends.)
fn answer_complete(buf: &[u8]) -> bool {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
    let body = &buf[end + 4..];
    let header = |name: &str| {
        head.lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| k.trim() == name)
            .map(|(_, v)| v.trim().to_owned())
    };
    if let Some(len) = header("content-length").and_then(|v| v.parse::<usize>().ok()) {
        return body.len() >= len;
    }
    if header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        return body.ends_with(b"0\r\n\r\n");
    }
    // No body by its status (1xx, 204, 304).
    let status = head.get(9..12).unwrap_or("");
    status.starts_with('1') || status == "204" || status == "304"
}

/// [`request`], waiting up to `within` for the answer (a command run by the server may take
/// its own timeout).
pub async fn request_within(
    url: &str,
    method: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
    within: Duration,
) -> Resp {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_at(rest.find('/').unwrap());
    let mut s = TcpStream::connect(host).await.unwrap();
    let body = body.unwrap_or("");
    // A `Host` among `headers` replaces the URL's (a request to a name-based origin).
    let mut req = if headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        format!("{method} {path} HTTP/1.1\r\n")
    } else {
        format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\n")
    };
    if !headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("connection"))
    {
        req.push_str("Connection: close\r\n");
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if !body.is_empty() {
        req.push_str("Content-Type: application/json\r\n");
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    // An upgraded (101) connection stays open: stop once its head is in. Any other answer ends
    // with the connection or is complete by its framing; one that is neither within `within`
    // (a head and then nothing) fails the test, whatever its status.
    let ended = tokio::time::timeout(within, async {
        let mut chunk = [0u8; 8192];
        loop {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
            if buf.starts_with(b"HTTP/1.1 101") && buf.windows(4).any(|w| w == b"\r\n\r\n") {
                break;
            }
            if answer_complete(&buf) {
                break;
            }
        }
    })
    .await;
    assert!(
        ended.is_ok() || answer_complete(&buf),
        "{method} {path}: no whole answer within {within:?}: {:?}",
        String::from_utf8_lossy(&buf)
    );
    let raw = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or_else(Vec::new, |i| buf[i + 4..].to_vec());
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines.next().unwrap()[9..12].parse().unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    Resp {
        status,
        headers,
        body: body.to_owned(),
        raw,
    }
}

pub async fn http(
    url: &str,
    method: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> (u16, String) {
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("Authorization", a.as_str())).collect();
    let r = request(url, method, &headers, body).await;
    (r.status, r.body)
}

pub async fn create_room(server: &Server, token: &str) -> String {
    let (status, body) = http(
        &server.url("/api/rooms"),
        "POST",
        Some(token),
        Some(r#"{"name":"test"}"#),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["id"].as_str().unwrap().to_owned()
}

pub type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// A y-websocket client backed by a yrs document.
pub struct Client {
    pub ws: Ws,
    pub doc: Doc,
}

pub enum Event {
    Y(YMessage),
    Closed(Option<u16>),
}

impl Client {
    pub async fn connect(server: &Server, room: &str, token: &str) -> Client {
        let ws = raw_ws(server, room, token).await;
        let mut c = Client {
            ws,
            doc: Doc::new(),
        };
        let sv = c.doc.transact().state_vector();
        c.send(YMessage::Sync(SyncMessage::SyncStep1(sv))).await;
        c
    }

    /// Connects and syncs, or says why not (a refused upgrade, a close before the sync).
    pub async fn try_connect_synced(
        server: &Server,
        room: &str,
        token: &str,
    ) -> Result<Client, String> {
        let ws = try_raw_ws(server, room, token).await?;
        let mut c = Client {
            ws,
            doc: Doc::new(),
        };
        let sv = c.doc.transact().state_vector();
        c.send(YMessage::Sync(SyncMessage::SyncStep1(sv))).await;
        c.try_synced()
            .await
            .map_err(|code| format!("closed ({code:?}) before sync"))?;
        Ok(c)
    }

    /// Sends a message. A connection the server has closed (or that died with it) drops it:
    /// the close shows up in [`Client::next`], where tests look for it.
    pub async fn send(&mut self, m: YMessage) {
        let _ = self.ws.send(Message::Binary(m.encode_v1().into())).await;
    }

    pub async fn send_raw(&mut self, bytes: Vec<u8>) {
        let _ = self.ws.send(Message::Binary(bytes.into())).await;
    }

    /// Next protocol event; applies sync content to the local doc and answers sync step 1.
    pub async fn next(&mut self) -> Event {
        loop {
            let msg = match tokio::time::timeout(TIMEOUT, self.ws.next()).await {
                Err(_) => panic!("no message from server within {TIMEOUT:?}"),
                Ok(None) | Ok(Some(Err(_))) => return Event::Closed(None),
                Ok(Some(Ok(m))) => m,
            };
            match msg {
                Message::Binary(b) => {
                    let m = YMessage::decode_v1(&b).expect("server sent a malformed message");
                    match &m {
                        YMessage::Sync(SyncMessage::SyncStep1(sv)) => {
                            let u = self.doc.transact().encode_state_as_update_v1(sv);
                            self.send(YMessage::Sync(SyncMessage::SyncStep2(u))).await;
                        }
                        YMessage::Sync(SyncMessage::SyncStep2(u))
                        | YMessage::Sync(SyncMessage::Update(u)) => {
                            self.doc
                                .transact_mut()
                                .apply_update(Update::decode_v1(u).unwrap())
                                .unwrap();
                        }
                        _ => {}
                    }
                    return Event::Y(m);
                }
                Message::Close(f) => return Event::Closed(f.map(|f| u16::from(f.code))),
                _ => {}
            }
        }
    }

    /// Waits for the server's sync step 2 (the reply to our step 1).
    pub async fn synced(&mut self) {
        if let Err(c) = self.try_synced().await {
            panic!("closed ({c:?}) before sync");
        }
    }

    /// Like [`Client::synced`], but reports a close instead of panicking.
    pub async fn try_synced(&mut self) -> Result<(), Option<u16>> {
        loop {
            match self.next().await {
                Event::Y(YMessage::Sync(SyncMessage::SyncStep2(_))) => return Ok(()),
                Event::Y(_) => {}
                Event::Closed(c) => return Err(c),
            }
        }
    }

    /// Waits until the server closes the connection; returns the close code.
    pub async fn closed(&mut self) -> Option<u16> {
        loop {
            if let Event::Closed(c) = self.next().await {
                return c;
            }
        }
    }

    /// Inserts text locally and sends the update.
    pub async fn insert(&mut self, file: &str, at: u32, s: &str) {
        let update = {
            let text = self.text(file);
            let mut txn = self.doc.transact_mut();
            text.insert(&mut txn, at, s);
            txn.encode_update_v1()
        };
        self.send(YMessage::Sync(SyncMessage::Update(update))).await;
    }

    /// Deletes `len` characters of `file` at `at`, and sends the update.
    pub async fn remove(&mut self, file: &str, at: u32, len: u32) {
        let update = {
            let text = self.text(file);
            let mut txn = self.doc.transact_mut();
            text.remove_range(&mut txn, at, len);
            txn.encode_update_v1()
        };
        self.send(YMessage::Sync(SyncMessage::Update(update))).await;
    }

    /// Reads until the server tells this client something with y-protocols' permission-denied
    /// message (a full room, changes not kept), and returns the reason; panics on a close.
    pub async fn told(&mut self) -> String {
        loop {
            match self.next().await {
                Event::Y(YMessage::Auth(reason)) => return reason.unwrap_or_default(),
                Event::Y(_) => {}
                Event::Closed(code) => panic!("closed ({code:?}) instead of being told"),
            }
        }
    }

    pub fn text(&self, file: &str) -> yrs::TextRef {
        self.doc.get_or_insert_text(file)
    }

    pub fn content(&self, file: &str) -> String {
        let t = self.text(file);
        let txn = self.doc.transact();
        t.get_string(&txn)
    }

    /// Receives until `file` has exactly `expected`.
    pub async fn wait_for(&mut self, file: &str, expected: &str) {
        while self.content(file) != expected {
            if let Event::Closed(c) = self.next().await {
                panic!(
                    "closed ({c:?}) waiting for {expected:?}, have {:?}",
                    self.content(file)
                );
            }
        }
    }

    pub fn state_vector(&self) -> StateVector {
        self.doc.transact().state_vector()
    }

    /// The `Y.Text` of a workspace file (`files` map), if the document has it.
    pub fn file(&self, path: &str) -> Option<yrs::TextRef> {
        use yrs::Map;
        let files = self.doc.get_or_insert_map("files");
        let txn = self.doc.transact();
        match files.get(&txn, path) {
            Some(yrs::Out::YText(t)) => Some(t),
            _ => None,
        }
    }

    pub fn file_content(&self, path: &str) -> Option<String> {
        let t = self.file(path)?;
        let txn = self.doc.transact();
        Some(t.get_string(&txn))
    }

    /// Creates (or replaces) a workspace file in the document and sends the update.
    pub async fn put_file(&mut self, path: &str, content: &str) {
        use yrs::Map;
        let update = {
            let files = self.doc.get_or_insert_map("files");
            let mut txn = self.doc.transact_mut();
            files.insert(&mut txn, path, yrs::TextPrelim::new(content));
            txn.encode_update_v1()
        };
        self.send(YMessage::Sync(SyncMessage::Update(update))).await;
    }

    /// Deletes workspace file `path` from the document and sends the update.
    pub async fn remove_file(&mut self, path: &str) {
        use yrs::Map;
        let update = {
            let files = self.doc.get_or_insert_map("files");
            let mut txn = self.doc.transact_mut();
            files.remove(&mut txn, path);
            txn.encode_update_v1()
        };
        self.send(YMessage::Sync(SyncMessage::Update(update))).await;
    }

    /// Inserts into a workspace file of the document and sends the update.
    pub async fn edit_file(&mut self, path: &str, at: u32, s: &str) {
        let text = self.file(path).expect("the file exists");
        let update = {
            let mut txn = self.doc.transact_mut();
            text.insert(&mut txn, at, s);
            txn.encode_update_v1()
        };
        self.send(YMessage::Sync(SyncMessage::Update(update))).await;
    }

    /// Receives until the document holds no file `path`.
    pub async fn wait_for_no_file(&mut self, path: &str) {
        let r = tokio::time::timeout(Duration::from_secs(20), async {
            while self.file_content(path).is_some() {
                if let Event::Closed(c) = self.next().await {
                    panic!("closed ({c:?}) waiting for {path} to leave");
                }
            }
        })
        .await;
        assert!(
            r.is_ok(),
            "{path} never left the document; it reads {:?}",
            self.file_content(path)
        );
    }

    /// Receives until the workspace file `path` reads `expected`.
    pub async fn wait_for_file(&mut self, path: &str, expected: &str) {
        let r = tokio::time::timeout(Duration::from_secs(20), async {
            while self.file_content(path).as_deref() != Some(expected) {
                if let Event::Closed(c) = self.next().await {
                    panic!("closed ({c:?}) waiting for {path}");
                }
            }
        })
        .await;
        assert!(
            r.is_ok(),
            "{path} never became {expected:?}; it is {:?}",
            self.file_content(path)
        );
    }
}

/// Waits until the warm pool holds `n` started sandboxes (`/metrics`).
pub async fn pool_holds(server: &Server, n: u32) {
    let want = format!("coderoom_sandbox_pool_ready {n}");
    let mut last = String::new();
    for _ in 0..200 {
        last = http(&server.url("/metrics"), "GET", None, None).await.1;
        if last.lines().any(|l| l == want) {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!(
        "the pool never held {n}: {}",
        last.lines()
            .filter(|l| l.contains("pool"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

pub async fn raw_ws(server: &Server, room: &str, token: &str) -> Ws {
    try_raw_ws(server, room, token)
        .await
        .unwrap_or_else(|e| panic!("cannot open the document socket: {e}"))
}

/// [`raw_ws`], reporting a refused upgrade (a server that cannot serve the room now) instead
/// of panicking.
pub async fn try_raw_ws(server: &Server, room: &str, token: &str) -> Result<Ws, String> {
    let mut req = format!("ws://{}/api/rooms/{room}/doc", server.addr)
        .into_client_request()
        .unwrap();
    req.headers_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    let cfg = WebSocketConfig::default()
        .max_message_size(Some(64 << 20))
        .max_frame_size(Some(64 << 20));
    tokio_tungstenite::connect_async_with_config(req, Some(cfg), false)
        .await
        .map(|(ws, _)| ws)
        .map_err(|e| e.to_string())
}

/// A WebSocket joined to the room's shared terminal (100x30).
pub async fn terminal_ws(server: &Server, room: &str, token: &str) -> Ws {
    let mut req = format!(
        "ws://{}/api/rooms/{room}/terminal?cols=100&rows=30",
        server.addr
    )
    .into_client_request()
    .unwrap();
    req.headers_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    tokio_tungstenite::connect_async(req).await.unwrap().0
}

/// The document as a fresh client sees it after syncing.
pub async fn snapshot(
    server: &Server,
    room: &str,
    token: &str,
    file: &str,
) -> (String, StateVector) {
    let mut c = Client::connect(server, room, token).await;
    c.synced().await;
    let s = c.content(file);
    let sv = c.state_vector();
    let _ = c.ws.close(None).await;
    (s, sv)
}

/// Polls fresh clients until `file` reads `expected` (y-websocket has no acknowledgements, so a
/// second connection may sync before the first one's update arrived).
pub async fn eventually(server: &Server, room: &str, token: &str, file: &str, expected: &str) {
    let mut last = String::new();
    for _ in 0..200 {
        let mut c = Client::connect(server, room, token).await;
        // A room busy with a backlog may drop a fresh reader that falls behind; try again.
        if c.try_synced().await.is_ok() {
            last = c.content(file);
            if last == expected {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{file} never became {expected:?}; last {last:?}");
}

// Room participants and their rights, shared by the authorization and sandbox tests.

pub async fn me(server: &Server, token: &str) -> String {
    let (status, body) = http(&server.url("/api/me"), "GET", Some(token), None).await;
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["id"].as_str().unwrap().to_owned()
}

pub async fn invite(
    server: &Server,
    token: &str,
    room: &str,
    role: &str,
    uses: i64,
) -> (u16, String) {
    let body = format!(r#"{{"role":"{role}","ttl_s":3600,"max_uses":{uses}}}"#);
    let (status, body) = http(
        &server.url(&format!("/api/rooms/{room}/invites")),
        "POST",
        Some(token),
        Some(&body),
    )
    .await;
    let token = serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["token"].as_str().map(str::to_owned))
        .unwrap_or_default();
    (status, token)
}

pub async fn accept(server: &Server, token: &str, invite: &str) -> u16 {
    http(
        &server.url(&format!("/api/invites/{invite}/accept")),
        "POST",
        Some(token),
        None,
    )
    .await
    .0
}

pub async fn set_role(server: &Server, token: &str, room: &str, user: &str, body: &str) -> u16 {
    let url = server.url(&format!("/api/rooms/{room}/participants/{user}"));
    http(&url, "PATCH", Some(token), Some(body)).await.0
}

pub async fn audit(server: &Server, token: &str, room: &str) -> Vec<serde_json::Value> {
    let (status, body) = http(
        &server.url(&format!("/api/rooms/{room}/audit")),
        "GET",
        Some(token),
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_str::<serde_json::Value>(&body)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

pub struct Room {
    pub server: Server,
    pub room: String,
    pub ana: String,
    pub ben: String,
    pub ben_id: String,
    pub cy: String,
}

/// Ana owns a room; Ben joined as editor and Cy as viewer, through invites.
/// A [`team_with`] whose server serves previews on a port of its own (returned).
pub async fn preview_team(storage: &Storage, extra: &[&str]) -> (Room, u16) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://{{id}}.preview.localhost:{port}");
    let listen = format!("127.0.0.1:{port}");
    let mut args = vec!["--preview-url", &url, "--preview-listen", &listen];
    args.extend_from_slice(extra);
    (team_with(storage, &args).await, port)
}

pub async fn team(storage: &Storage) -> Room {
    team_with(storage, &[]).await
}

/// [`team`] with extra server flags.
pub async fn team_with(storage: &Storage, extra: &[&str]) -> Room {
    let ana = storage.token("ana@example.com").await;
    let ben = storage.token("ben@example.com").await;
    let cy = storage.token("cy@example.com").await;
    let server = Server::start(storage, extra).await;
    team_at(server, ana, ben, cy).await
}

/// [`team`] on a server the caller started, for the three people's tokens.
pub async fn team_at(server: Server, ana: String, ben: String, cy: String) -> Room {
    let room = create_room(&server, &ana).await;
    let (status, inv) = invite(&server, &ana, &room, "editor", 1).await;
    assert_eq!(status, 201);
    assert_eq!(accept(&server, &ben, &inv).await, 200);
    assert_eq!(
        accept(&server, &cy, &inv).await,
        410,
        "a one-use invite works once"
    );
    let (_, inv) = invite(&server, &ana, &room, "viewer", 5).await;
    assert_eq!(accept(&server, &cy, &inv).await, 200);
    let ben_id = me(&server, &ben).await;
    Room {
        server,
        room,
        ana,
        ben,
        ben_id,
        cy,
    }
}

/// `POST /api/rooms/{room}/sandbox/{action}` (`start`, `stop`) as `token`.
pub async fn lifecycle(server: &Server, token: &str, room: &str, action: &str) -> (u16, String) {
    http(
        &server.url(&format!("/api/rooms/{room}/sandbox/{action}")),
        "POST",
        Some(token),
        None,
    )
    .await
}

/// `GET path` as `token`: asserts 200 and returns the body as JSON.
pub async fn get_json(server: &Server, token: &str, path: &str) -> serde_json::Value {
    let (status, body) = http(&server.url(path), "GET", Some(token), None).await;
    assert_eq!(status, 200, "GET {path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
}

/// Runs `sh -c script` in the room's sandbox (`POST /exec`): the status and the answer.
pub async fn exec(
    server: &Server,
    token: &str,
    room: &str,
    script: &str,
) -> (u16, serde_json::Value) {
    let body = serde_json::json!({ "argv": ["sh", "-c", script], "timeout_ms": 30000 }).to_string();
    let auth = format!("Bearer {token}");
    // The command may take its 30 s, after a sandbox start: the answer is waited for longer.
    let r = request_within(
        &server.url(&format!("/api/rooms/{room}/exec")),
        "POST",
        &[("Authorization", auth.as_str())],
        Some(&body),
        Duration::from_secs(90),
    )
    .await;
    let (status, body) = (r.status, r.body);
    (
        status,
        serde_json::from_str(&body)
            .unwrap_or(serde_json::Value::String(format!("{status}: {body}"))),
    )
}

/// Runs `sh -c script` in the room's sandbox, asserting it ran; its stdout. The whole answer is
/// kept in `seen` (tests search everything they were shown for a secret).
pub async fn inside(
    server: &Server,
    token: &str,
    room: &str,
    script: &str,
    seen: &mut String,
) -> String {
    let (status, out) = exec(server, token, room, script).await;
    assert_eq!(status, 200, "{out}");
    seen.push_str(&out.to_string());
    out["stdout"].as_str().unwrap().to_owned()
}

/// Runs `script` until its stdout holds `needle` (5 s at most); its last stdout.
pub async fn stdout_until(
    server: &Server,
    token: &str,
    room: &str,
    script: &str,
    needle: &str,
) -> serde_json::Value {
    let mut out = serde_json::Value::Null;
    for _ in 0..100 {
        out = exec(server, token, room, script).await.1["stdout"].clone();
        if out.as_str().is_some_and(|s| s.contains(needle)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    out
}

/// Deletes a room: its owner asks, a system admin confirms. Returns the confirmation (with the
/// receipt).
pub async fn delete_room(
    server: &Server,
    owner: &str,
    admin: &str,
    room: &str,
) -> serde_json::Value {
    let url = server.url(&format!("/api/rooms/{room}"));
    let (status, body) = http(&url, "DELETE", Some(owner), None).await;
    assert_eq!(status, 202, "{body}");
    let asked: serde_json::Value = serde_json::from_str(&body).unwrap();
    let id = asked["deletion_id"].as_str().unwrap();
    let url = server.url(&format!("/api/deletions/{id}/confirm"));
    let (status, body) = http(&url, "POST", Some(admin), None).await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// `METHOD path` as `token` with a JSON `body`: the status and the answer as JSON (the text,
/// as a JSON string, when it is not JSON).
pub async fn send_json(
    server: &Server,
    token: &str,
    method: &str,
    path: &str,
    body: &str,
) -> (u16, serde_json::Value) {
    let (status, body) = http(&server.url(path), method, Some(token), Some(body)).await;
    (
        status,
        serde_json::from_str(&body).unwrap_or(serde_json::Value::String(body)),
    )
}

/// [`send_json`] with `POST`.
pub async fn post(
    server: &Server,
    token: &str,
    path: &str,
    body: &str,
) -> (u16, serde_json::Value) {
    send_json(server, token, "POST", path, body).await
}

/// [`send_json`] with `PUT`.
pub async fn put(server: &Server, token: &str, path: &str, body: &str) -> (u16, serde_json::Value) {
    send_json(server, token, "PUT", path, body).await
}

/// Every file under `dir`, recursively.
pub fn files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            files(&p, out);
        } else {
            out.push(p);
        }
    }
}

/// Asserts that no file under `dir` holds `needle`; returns the files searched.
pub fn no_file_holds(dir: &std::path::Path, needle: &str) -> Vec<std::path::PathBuf> {
    let mut all = Vec::new();
    files(dir, &mut all);
    for f in &all {
        let bytes = std::fs::read(f).unwrap();
        assert!(
            !holds(&bytes, needle.as_bytes()),
            "{} holds the value",
            f.display()
        );
    }
    all
}

/// Whether `haystack` holds `needle` anywhere.
pub fn holds(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// A benchmark's figures as markdown: printed, and written to `$BENCH_OUT/NAME.md` when
/// `BENCH_OUT` is set (`tests/bench/regenerate` splices those files into
/// `docs/benchmarks.md`).
pub fn report(name: &str, markdown: &str) {
    println!("{markdown}");
    if let Ok(dir) = std::env::var("BENCH_OUT") {
        std::fs::create_dir_all(&dir).expect("BENCH_OUT is a directory");
        let path = std::path::Path::new(&dir).join(format!("{name}.md"));
        std::fs::write(&path, markdown)
            .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    }
}

/// A benchmark's knob: the environment variable `name` as a number, else `default`.
pub fn knob(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Types into `typer`'s shell: `X` set to `value`, and a `sleep` left running in the
/// background; the sleep's pid, once the shell has echoed `shell-VALUE`.
pub async fn leave_a_shell_running(typer: &mut Term, value: &str) -> u32 {
    typer
        .send(format!("X={value}; sleep 100000 & echo started-pid=$!; echo shell-$X\n").as_bytes())
        .await;
    typer.output_contains(&format!("shell-{value}")).await;
    // The first `started-pid=` followed by digits is the output (the echo of the typed line
    // reads `started-pid=$!`).
    typer
        .output
        .split("started-pid=")
        .filter_map(|r| r.split_whitespace().next()?.parse().ok())
        .next()
        .expect("the background process's pid")
}

/// A terminal socket and what it has shown.
pub struct Term {
    pub ws: Ws,
    pub output: String,
    pub events: Vec<serde_json::Value>,
    pub closed: Option<u16>,
}

/// Opens the room's terminal as `token`.
pub async fn term(server: &Server, room: &str, token: &str) -> Term {
    let ws = terminal_ws(server, room, token).await;
    Term {
        ws,
        output: String::new(),
        events: Vec::new(),
        closed: None,
    }
}

impl Term {
    pub async fn send(&mut self, bytes: &[u8]) {
        self.ws
            .send(Message::Binary(bytes.to_vec().into()))
            .await
            .unwrap();
    }

    /// Reads until `pred` holds (or fails after the timeout).
    pub async fn until(&mut self, what: &str, pred: impl Fn(&Term) -> bool) {
        let r = tokio::time::timeout(std::time::Duration::from_secs(30), async {
            while !pred(self) {
                if !self.read_one().await {
                    return;
                }
            }
        })
        .await;
        assert!(
            r.is_ok() && pred(self),
            "waiting for {what}: output ends {:?}, events {:?}, closed {:?}",
            tail(&self.output),
            self.events,
            self.closed
        );
    }

    /// Reads one message; false once the socket is closed.
    pub async fn read_one(&mut self) -> bool {
        match self.ws.next().await {
            Some(Ok(Message::Binary(b))) => self.output.push_str(&String::from_utf8_lossy(&b)),
            Some(Ok(Message::Text(t))) => self.events.push(serde_json::from_str(&t).unwrap()),
            Some(Ok(Message::Close(f))) => {
                self.closed = Some(f.map_or(1005, |f| f.code.into()));
                return false;
            }
            Some(Ok(_)) => {}
            None | Some(Err(_)) => {
                self.closed.get_or_insert(1006);
                return false;
            }
        }
        true
    }

    /// Reads until the output contains `needle`, searching only what is new each time (the
    /// output may be tens of megabytes).
    pub async fn output_contains(&mut self, needle: &str) {
        let mut from = 0;
        let r = tokio::time::timeout(std::time::Duration::from_secs(30), async {
            loop {
                let start = from.min(self.output.len());
                let start = (0..=start)
                    .rev()
                    .find(|i| self.output.is_char_boundary(*i))
                    .unwrap_or(0);
                if self.output[start..].contains(needle) {
                    return true;
                }
                from = self.output.len().saturating_sub(needle.len());
                if !self.read_one().await {
                    return false;
                }
            }
        })
        .await;
        assert!(
            r == Ok(true),
            "waiting for {needle:?}: output ends {:?}, events {:?}, closed {:?}",
            tail(&self.output),
            self.events,
            self.closed
        );
    }

    pub fn has_event(&self, kind: &str) -> bool {
        self.events.iter().any(|e| e["type"] == kind)
    }
}

/// The last characters of a long output, for failure messages.
pub fn tail(s: &str) -> &str {
    let mut at = s.len().saturating_sub(300);
    while !s.is_char_boundary(at) {
        at += 1;
    }
    &s[at..]
}

/// A plain HTTP server on loopback standing in for an allowed host: answers every request
/// with its request line, and keeps each request head it saw.
pub async fn stand_in() -> (u16, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let heads = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            let heads = heads.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&buf).into_owned();
                let line = head.lines().next().unwrap_or_default().to_owned();
                heads.lock().unwrap().push(head);
                let body = format!("stand-in saw: {line}\n");
                let reply = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(reply.as_bytes()).await;
            });
        }
    });
    (port, seen)
}

/// The mails in the dev outbox addressed to `to` (whole files only: the server writes
/// `NAME.eml.tmp` and renames it).
pub fn mail_to(storage: &Storage, to: &str) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(storage.dir.path().join("outbox")) else {
        return Vec::new();
    };
    dir.filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "eml"))
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        // Quoted-printable's soft line breaks joined again.
        .map(|m| m.replace("=\r\n", "").replace("=\n", ""))
        .filter(|m| m.contains(&format!("To: {to}")))
        .collect()
}

/// Logs `email` in as a browser does (a code mailed to the dev outbox, then verified): the
/// session cookie, as `name=value`.
pub async fn login_cookie(server: &Server, storage: &Storage, email: &str) -> String {
    let body = serde_json::json!({ "email": email }).to_string();
    let asked = request(&server.url("/api/auth/code"), "POST", &[], Some(&body)).await;
    assert_eq!(asked.status, 202, "{}", asked.body);
    let mail = wait_for_mail(storage, email, "code is ").await;
    let at = mail.find("code is ").unwrap() + "code is ".len();
    let code = &mail[at..at + 6];
    let body = serde_json::json!({ "email": email, "code": code }).to_string();
    let ok = request(&server.url("/api/auth/verify"), "POST", &[], Some(&body)).await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    let cookie = ok.header("set-cookie").expect("a session cookie");
    cookie.split(';').next().unwrap().to_owned()
}

/// The first mail to `to` that holds `needle`, once it is in the outbox.
pub async fn wait_for_mail(storage: &Storage, to: &str, needle: &str) -> String {
    for _ in 0..200 {
        if let Some(m) = mail_to(storage, to)
            .into_iter()
            .find(|m| m.contains(needle))
        {
            return m;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("no mail to {to} with {needle:?}");
}
