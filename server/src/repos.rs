//! Repositories connected to a room: cloned, fetched and pushed by the control plane with the
//! room's credential, so the token never enters the sandbox. The room sees the files: the
//! server writes the branch's tree into the workspace (under the repository's directory) and
//! reads the workspace back to make a commit, authored by whoever pushes.
//!
//! The `git` binary does the work (see `docs/design.md`, Repositories): a bare clone per
//! repository under `DATA_DIR/rooms/<room>/repos/<id>.git`, whose config names the remote by
//! its URL only. Every git run gets a clean environment: no system or global config, no
//! prompts, only the http(s) protocols, no redirects, the credential as an extra header through
//! `GIT_CONFIG_*` variables (never an argument, a URL or a file), and the server's address
//! pinned with `http.curloptResolve` after the egress proxy's address checks.

use std::path::PathBuf;
use std::time::Duration;
use tokio::io::AsyncWriteExt as _;

/// Longest a clone, fetch or push may take.
const NETWORK_WITHIN: Duration = Duration::from_secs(180);
/// Longest a local git step may take.
const LOCAL_WITHIN: Duration = Duration::from_secs(60);
/// Most output kept from one git run.
const MAX_OUTPUT: usize = 64 << 20;
/// Most files a repository's tree may hold to be placed in the workspace.
pub(crate) const MAX_FILES: usize = 5_000;
/// Largest file placed in the workspace (bigger ones are left out and listed).
pub(crate) const MAX_FILE_BYTES: u64 = 16 << 20;

/// Why a repository operation failed; the text is for the person who asked (never a
/// credential: git's own messages are scrubbed of it).
#[derive(Debug, thiserror::Error)]
pub(crate) enum RepoError {
    #[error("{0}")]
    BadUrl(String),
    #[error("the repository's server is refused: {0}")]
    Refused(String),
    #[error("the repository's server refused the credential (or there is no such repository)")]
    Auth,
    #[error("no branch {0:?} in the repository")]
    NoBranch(String),
    #[error(
        "the branch moved on the server: pull first (or push with force, which needs an approval)"
    )]
    Rejected,
    #[error("git failed: {0}")]
    Failed(String),
    #[error("git did not finish in time")]
    Timeout,
    #[error("{0}")]
    TooLarge(String),
}

/// A remote and how to reach it: its URL (no credentials in it), the header that carries the
/// credential (if any), and the pinned address.
pub(crate) struct Remote {
    pub url: String,
    /// `Header: value` (from the room's secret rule). Never logged, never written to disk.
    header: Option<String>,
    /// `host:port:address` for `http.curloptResolve`.
    resolve: String,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote")
            .field("url", &self.url)
            .field("header", &self.header.as_ref().map(|_| "(set)"))
            .finish()
    }
}

/// `http(s)://host[:port]/path` without credentials, query or fragment: the scheme, host,
/// port (default by scheme) and the name of the repository (its last path segment, without
/// `.git`).
pub(crate) fn parse_url(url: &str) -> Result<(String, u16, String), RepoError> {
    let bad = |why: &str| RepoError::BadUrl(format!("repository URL {url:?}: {why}"));
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| bad("must start with https:// or http://"))?;
    let default_port = match scheme {
        "https" => 443,
        "http" => 80,
        _ => return Err(bad("must start with https:// or http://")),
    };
    if url.len() > 2048 || url.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(bad("too long, or holds spaces or control characters"));
    }
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    if authority.contains('@') {
        return Err(bad(
            "credentials go in a room secret, not in the URL (it is shown to the room)",
        ));
    }
    if path.contains(['?', '#']) {
        return Err(bad("no query or fragment"));
    }
    let (host, port) = crate::egress::addr::split_port(authority);
    let port = match port {
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| bad("bad port"))?,
        None => default_port,
    };
    if host.is_empty() {
        return Err(bad("no host"));
    }
    let name = path
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .trim_end_matches(".git")
        .to_owned();
    if name.is_empty() || name.starts_with('.') {
        return Err(bad("no repository name in the path"));
    }
    Ok((host.to_owned(), port, name))
}

impl Remote {
    /// A remote for `url`, reached at the address the egress checks allow, with `header`
    /// (`Name: value`) sent on every request when given.
    pub(crate) async fn checked(
        egress: &crate::egress::Egress,
        url: &str,
        header: Option<String>,
    ) -> Result<Remote, RepoError> {
        let (host, port, _) = parse_url(url)?;
        let (host, to) = egress
            .checked_address(&host, port)
            .await
            .map_err(|e| RepoError::Refused(e.0))?;
        // curl is told where the host is; a stand-in of the tests must listen on the URL's port.
        let resolve = format!(
            "{}:{port}:{}",
            host.to_string().trim_matches(['[', ']']),
            to.ip()
        );
        Ok(Remote {
            url: url.to_owned(),
            header,
            resolve,
        })
    }

    /// The configuration every network git run gets, as `GIT_CONFIG_*` variables.
    fn config(&self) -> Vec<(String, String)> {
        let mut pairs: Vec<(&str, String)> = vec![
            ("protocol.allow", "never".into()),
            ("protocol.https.allow", "always".into()),
            ("protocol.http.allow", "always".into()),
            ("http.followRedirects", "false".into()),
            ("http.curloptResolve", self.resolve.clone()),
            ("credential.helper", String::new()),
        ];
        if let Some(h) = &self.header {
            pairs.push(("http.extraHeader", h.clone()));
        }
        let mut env = vec![("GIT_CONFIG_COUNT".to_owned(), pairs.len().to_string())];
        for (i, (k, v)) in pairs.into_iter().enumerate() {
            env.push((format!("GIT_CONFIG_KEY_{i}"), k.to_owned()));
            env.push((format!("GIT_CONFIG_VALUE_{i}"), v));
        }
        env
    }

    /// Removes the credential from text git printed, should it ever appear there.
    fn scrub(&self, text: &str) -> String {
        match self.header.as_deref().and_then(|h| h.split_once(':')) {
            Some((_, value)) if !value.trim().is_empty() => text.replace(value.trim(), "[secret]"),
            _ => text.to_owned(),
        }
    }
}

/// The output of one git run.
struct Ran {
    ok: bool,
    stdout: Vec<u8>,
    stderr: String,
}

/// A person as git names them.
#[derive(Debug, Clone)]
pub(crate) struct Person {
    pub name: String,
    pub email: String,
}

/// A bare repository on the server.
pub(crate) struct Bare {
    dir: PathBuf,
}

impl Bare {
    pub(crate) fn at(dir: PathBuf) -> Bare {
        Bare { dir }
    }

    /// Runs git with a clean environment; `remote` adds the network configuration.
    async fn git(
        &self,
        args: &[&str],
        remote: Option<&Remote>,
        extra_env: &[(&str, &str)],
        stdin: Option<&[u8]>,
    ) -> Result<Ran, RepoError> {
        let home = self.dir.with_extension("home");
        let _ = tokio::fs::create_dir_all(&home).await;
        let mut cmd = tokio::process::Command::new("git");
        cmd.env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", &home)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_TERMINAL_PROMPT", "0")
            .env("GIT_ASKPASS", "/bin/false")
            .env("LC_ALL", "C")
            .args(args)
            .stdin(if stdin.is_some() {
                std::process::Stdio::piped()
            } else {
                std::process::Stdio::null()
            })
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        if self.dir.exists() {
            cmd.env("GIT_DIR", &self.dir);
        }
        if let Some(r) = remote {
            cmd.envs(r.config());
        }
        cmd.envs(extra_env.iter().copied());
        // Paths given to git are relative to its work tree, when it has one.
        if let Some((_, work)) = extra_env.iter().find(|(k, _)| *k == "GIT_WORK_TREE") {
            cmd.current_dir(work);
        }
        let within = if remote.is_some() {
            NETWORK_WITHIN
        } else {
            LOCAL_WITHIN
        };
        let run = async {
            let mut child = cmd
                .spawn()
                .map_err(|e| RepoError::Failed(format!("cannot run git: {e}")))?;
            if let (Some(data), Some(mut input)) = (stdin, child.stdin.take()) {
                let _ = input.write_all(data).await;
            }
            child
                .wait_with_output()
                .await
                .map_err(|e| RepoError::Failed(format!("git: {e}")))
        };
        let out = tokio::time::timeout(within, run)
            .await
            .map_err(|_| RepoError::Timeout)??;
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stderr = remote.map_or_else(|| stderr.to_string(), |r| r.scrub(&stderr));
        if out.stdout.len() > MAX_OUTPUT {
            return Err(RepoError::Failed("git printed too much".into()));
        }
        Ok(Ran {
            ok: out.status.success(),
            stdout: out.stdout,
            stderr,
        })
    }

    /// `git ...` that must succeed; its stdout.
    async fn must(&self, args: &[&str], extra_env: &[(&str, &str)]) -> Result<Vec<u8>, RepoError> {
        let ran = self.git(args, None, extra_env, None).await?;
        if !ran.ok {
            return Err(RepoError::Failed(last_line(&ran.stderr)));
        }
        Ok(ran.stdout)
    }

    /// Clones `branch` of `remote` into this (new) bare repository; its head commit.
    pub(crate) async fn clone_from(
        &self,
        remote: &Remote,
        branch: &str,
    ) -> Result<String, RepoError> {
        if let Some(parent) = self.dir.parent() {
            tokio::fs::create_dir_all(parent)
                .await
                .map_err(|e| RepoError::Failed(e.to_string()))?;
        }
        let dir = self.dir.to_string_lossy().into_owned();
        let ran = self
            .git(
                &[
                    "clone",
                    "--bare",
                    "--single-branch",
                    "--no-tags",
                    "--branch",
                    branch,
                    "--",
                    &remote.url,
                    &dir,
                ],
                Some(remote),
                &[],
                None,
            )
            .await?;
        if !ran.ok {
            let _ = tokio::fs::remove_dir_all(&self.dir).await;
            return Err(network_error(&ran.stderr, branch));
        }
        self.rev(&format!("refs/heads/{branch}")).await
    }

    /// Fetches `branch` into `refs/remotes/origin/<branch>`; its commit.
    pub(crate) async fn fetch(&self, remote: &Remote, branch: &str) -> Result<String, RepoError> {
        let spec = format!("+refs/heads/{branch}:refs/remotes/origin/{branch}");
        let ran = self
            .git(
                &["fetch", "--no-tags", "--", &remote.url, &spec],
                Some(remote),
                &[],
                None,
            )
            .await?;
        if !ran.ok {
            return Err(network_error(&ran.stderr, branch));
        }
        self.rev(&format!("refs/remotes/origin/{branch}")).await
    }

    /// Pushes `commit` to `branch` (replacing it when `force`).
    pub(crate) async fn push(
        &self,
        remote: &Remote,
        commit: &str,
        branch: &str,
        force: bool,
    ) -> Result<(), RepoError> {
        let spec = format!(
            "{}{commit}:refs/heads/{branch}",
            if force { "+" } else { "" }
        );
        let ran = self
            .git(
                &["push", "--porcelain", "--", &remote.url, &spec],
                Some(remote),
                &[],
                None,
            )
            .await?;
        if ran.ok {
            return Ok(());
        }
        let out = String::from_utf8_lossy(&ran.stdout);
        if out.contains("[rejected]")
            || ran.stderr.contains("non-fast-forward")
            || ran.stderr.contains("fetch first")
        {
            return Err(RepoError::Rejected);
        }
        Err(network_error(&ran.stderr, branch))
    }

    /// The commit a ref names.
    pub(crate) async fn rev(&self, name: &str) -> Result<String, RepoError> {
        let out = self
            .must(
                &[
                    "rev-parse",
                    "--verify",
                    "--quiet",
                    &format!("{name}^{{commit}}"),
                ],
                &[],
            )
            .await?;
        Ok(String::from_utf8_lossy(&out).trim().to_owned())
    }

    /// The empty tree's id.
    pub(crate) async fn empty_tree(&self) -> Result<String, RepoError> {
        let ran = self.git(&["mktree"], None, &[], Some(b"")).await?;
        Ok(String::from_utf8_lossy(&ran.stdout).trim().to_owned())
    }

    /// The tree of `commit` (or a tree itself).
    pub(crate) async fn tree_of(&self, rev: &str) -> Result<String, RepoError> {
        let out = self
            .must(&["rev-parse", "--verify", &format!("{rev}^{{tree}}")], &[])
            .await?;
        Ok(String::from_utf8_lossy(&out).trim().to_owned())
    }

    /// What changes between two trees: `(path, Some(blob))` to write, `(path, None)` to remove.
    /// Symlinks and submodules are left out.
    pub(crate) async fn changes(
        &self,
        from: &str,
        to: &str,
    ) -> Result<Vec<(String, Option<String>)>, RepoError> {
        let out = self
            .must(&["diff-tree", "-r", "-z", "--no-renames", from, to], &[])
            .await?;
        let mut fields = out.split(|b| *b == 0).filter(|f| !f.is_empty());
        let mut changes = Vec::new();
        while let (Some(meta), Some(path)) = (fields.next(), fields.next()) {
            let meta = String::from_utf8_lossy(meta);
            let parts: Vec<&str> = meta.trim_start_matches(':').split(' ').collect();
            let [_, new_mode, _, new_sha, status] = parts.as_slice() else {
                return Err(RepoError::Failed("unexpected diff-tree output".into()));
            };
            let path = String::from_utf8_lossy(path).into_owned();
            if status.starts_with('D') {
                changes.push((path, None));
            } else if new_mode.starts_with("100") {
                changes.push((path, Some((*new_sha).to_owned())));
            }
        }
        Ok(changes)
    }

    /// A blob's bytes.
    pub(crate) async fn blob(&self, sha: &str) -> Result<Vec<u8>, RepoError> {
        self.must(&["cat-file", "blob", sha], &[]).await
    }

    /// Makes a tree of `files` (path -> content) as a change of `base`'s tree (files absent
    /// from `files` are removed, `.gitignore` rules apply); the tree's id.
    pub(crate) async fn tree_from(
        &self,
        base: &str,
        files: &[(String, Vec<u8>)],
    ) -> Result<String, RepoError> {
        let scratch = self
            .dir
            .with_extension(format!("work-{}", uuid::Uuid::new_v4().simple()));
        let result = async {
            for (path, data) in files {
                let p = scratch.join(path);
                if let Some(parent) = p.parent() {
                    tokio::fs::create_dir_all(parent)
                        .await
                        .map_err(|e| RepoError::Failed(e.to_string()))?;
                }
                tokio::fs::write(&p, data)
                    .await
                    .map_err(|e| RepoError::Failed(e.to_string()))?;
            }
            tokio::fs::create_dir_all(&scratch)
                .await
                .map_err(|e| RepoError::Failed(e.to_string()))?;
            let index = scratch.with_extension("index");
            let index = index.to_string_lossy().into_owned();
            let work = scratch.to_string_lossy().into_owned();
            let env = [
                ("GIT_INDEX_FILE", index.as_str()),
                ("GIT_WORK_TREE", work.as_str()),
            ];
            self.must(&["read-tree", base], &env).await?;
            // What the workspace listing leaves out (tool state, build output) is left as the
            // base has it, not taken as deleted.
            let excluded: Vec<String> = coderoom_sandbox::agent::SKIP_DIRS
                .iter()
                .map(|d| format!(":(exclude,glob)**/{d}/**"))
                .collect();
            let mut args = vec!["add", "-A", "--", "."];
            args.extend(excluded.iter().map(String::as_str));
            self.must(&args, &env).await?;
            let out = self.must(&["write-tree"], &env).await;
            let _ = tokio::fs::remove_file(&index).await;
            out
        }
        .await;
        let _ = tokio::fs::remove_dir_all(&scratch).await;
        Ok(String::from_utf8_lossy(&result?).trim().to_owned())
    }

    /// A commit of `tree` on `parents`, by `author`, committed by the room.
    pub(crate) async fn commit(
        &self,
        tree: &str,
        parents: &[&str],
        message: &str,
        author: &Person,
        committer: &Person,
    ) -> Result<String, RepoError> {
        let mut args = vec!["commit-tree", tree];
        for p in parents {
            args.push("-p");
            args.push(p);
        }
        args.extend(["-m", message]);
        let env = [
            ("GIT_AUTHOR_NAME", author.name.as_str()),
            ("GIT_AUTHOR_EMAIL", author.email.as_str()),
            ("GIT_COMMITTER_NAME", committer.name.as_str()),
            ("GIT_COMMITTER_EMAIL", committer.email.as_str()),
        ];
        let out = self.must(&args, &env).await?;
        Ok(String::from_utf8_lossy(&out).trim().to_owned())
    }

    /// Merges two commits without a work tree: the merged tree, or the conflicting paths.
    pub(crate) async fn merge(
        &self,
        ours: &str,
        theirs: &str,
    ) -> Result<Result<String, Vec<String>>, RepoError> {
        let ran = self
            .git(
                &[
                    "merge-tree",
                    "--write-tree",
                    "--name-only",
                    "-z",
                    ours,
                    theirs,
                ],
                None,
                &[],
                None,
            )
            .await?;
        let mut fields = ran
            .stdout
            .split(|b| *b == 0)
            .map(|f| String::from_utf8_lossy(f).into_owned());
        let tree = fields.next().unwrap_or_default().trim().to_owned();
        if ran.ok {
            return Ok(Ok(tree));
        }
        let conflicts: Vec<String> = fields.take_while(|f| !f.is_empty()).collect();
        if conflicts.is_empty() {
            return Err(RepoError::Failed(last_line(&ran.stderr)));
        }
        Ok(Err(conflicts))
    }

    /// The commits `from..to` as a git bundle holding the branch `room-changes` (whoever has
    /// `from` fetches it: `git fetch room.bundle room-changes`). The caller holds the room's
    /// lock: the name is used by one export at a time.
    pub(crate) async fn bundle(&self, from: &str, to: &str) -> Result<Vec<u8>, RepoError> {
        let name = "refs/heads/room-changes";
        let file = self
            .dir
            .with_extension(format!("export-{}.bundle", uuid::Uuid::new_v4().simple()));
        let path = file.to_string_lossy().into_owned();
        self.must(&["update-ref", name, to], &[]).await?;
        let made = self
            .must(
                &["bundle", "create", &path, &format!("{from}..{name}")],
                &[],
            )
            .await;
        let _ = self.must(&["update-ref", "-d", name], &[]).await;
        let out = match made {
            Ok(_) => tokio::fs::read(&file)
                .await
                .map_err(|e| RepoError::Failed(e.to_string())),
            Err(e) => Err(e),
        };
        let _ = tokio::fs::remove_file(&file).await;
        out
    }

    /// The commits `from..to` as an email-style patch series (`git am` applies it).
    pub(crate) async fn patch(&self, from: &str, to: &str) -> Result<Vec<u8>, RepoError> {
        self.must(
            &[
                "format-patch",
                "--stdout",
                "--no-signature",
                &format!("{from}..{to}"),
            ],
            &[],
        )
        .await
    }

    /// Sets `refs/heads/<branch>` here (what the room has).
    pub(crate) async fn set_branch(&self, branch: &str, commit: &str) -> Result<(), RepoError> {
        self.must(
            &["update-ref", &format!("refs/heads/{branch}"), commit],
            &[],
        )
        .await
        .map(|_| ())
    }

    /// Removes the repository from the server.
    pub(crate) async fn remove(&self) {
        let _ = tokio::fs::remove_dir_all(&self.dir).await;
        let _ = tokio::fs::remove_dir_all(self.dir.with_extension("home")).await;
    }
}

fn last_line(stderr: &str) -> String {
    stderr
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("(no message)")
        .chars()
        .take(300)
        .collect()
}

/// What a failed network run means.
fn network_error(stderr: &str, branch: &str) -> RepoError {
    if stderr.contains("401")
        || stderr.contains("403")
        || stderr.contains("Authentication failed")
        || stderr.contains("could not read Username")
        || stderr.contains("not found") && stderr.contains("repository")
    {
        RepoError::Auth
    } else if stderr.contains("Remote branch") && stderr.contains("not found") {
        RepoError::NoBranch(branch.to_owned())
    } else {
        RepoError::Failed(last_line(stderr))
    }
}

/// A branch name git accepts and nothing odd (no option, no ref trickery).
pub(crate) fn valid_branch(b: &str) -> bool {
    !b.is_empty()
        && b.len() <= 200
        && !b.starts_with(['-', '/', '.'])
        && !b.ends_with(['/', '.'])
        && !b.contains("..")
        && !b.contains("@{")
        && !b.ends_with(".lock")
        && b.bytes()
            .all(|c| c.is_ascii_alphanumeric() || b"-_./".contains(&c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked() {
        assert_eq!(
            parse_url("https://git.example.com/team/app.git").unwrap(),
            ("git.example.com".into(), 443, "app".into())
        );
        assert_eq!(
            parse_url("http://git.test:8080/app").unwrap(),
            ("git.test".into(), 8080, "app".into())
        );
        for bad in [
            "git@github.com:team/app.git",
            "ssh://git.example.com/app",
            "file:///etc/passwd",
            "https://user:token@git.example.com/app.git",
            "https://git.example.com/app.git?x=1",
            "https://git.example.com/",
            "https://git.example.com/app git",
            "ext::sh -c touch% /tmp/x",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn branches_are_checked() {
        for ok in ["main", "feature/x-1", "release-2.0"] {
            assert!(valid_branch(ok), "{ok}");
        }
        for bad in [
            "",
            "-x",
            "--upload-pack=x",
            "a..b",
            "a@{1}",
            "x.lock",
            "a b",
            "/x",
            "x/",
        ] {
            assert!(!valid_branch(bad), "{bad}");
        }
    }
}
