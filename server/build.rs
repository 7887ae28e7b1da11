//! Builds the browser client (`web/`, Vite) when its build output is missing or older than its
//! sources, and embeds that output in the binary, so a fresh clone serves the app after one
//! `cargo run`. `CODEROOM_SKIP_WEB_BUILD=1` builds the server without running npm: whatever
//! `web/dist` holds is embedded, and without it the server serves a page that says how to build
//! the client.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

/// What invalidates the build output.
const SOURCES: &[&str] = &[
    "src",
    "index.html",
    "package.json",
    "package-lock.json",
    "vite.config.ts",
    "tsconfig.json",
];

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let web = manifest.join("..").join("web");
    let dist = web.join("dist");
    for s in SOURCES {
        println!("cargo:rerun-if-changed={}", web.join(s).display());
    }
    println!("cargo:rerun-if-env-changed=CODEROOM_SKIP_WEB_BUILD");
    // sqlx::migrate! embeds the migrations: a new one must rebuild the server.
    println!("cargo:rerun-if-changed=../migrations");
    // A deleted or separately rebuilt client is embedded afresh.
    println!(
        "cargo:rerun-if-changed={}",
        dist.join("index.html").display()
    );
    let skip =
        std::env::var_os("CODEROOM_SKIP_WEB_BUILD").is_some_and(|v| v != "0" && !v.is_empty());
    if !skip && web.join("package.json").exists() && stale(&web, &dist) {
        let _lock = BuildLock::take(&web);
        // Another build may have done it while we waited.
        if stale(&web, &dist) {
            build(&web);
        }
    }
    let mut files = Vec::new();
    if dist.join("index.html").is_file() {
        walk(&dist, &dist, &mut files);
    } else {
        println!(
            "cargo:warning=web/dist is missing: the server will serve a page that says how to build the browser client"
        );
    }
    files.sort();
    let mut code = String::from("/// The browser client's build output: (path, bytes).\npub(crate) static ASSETS: &[(&str, &[u8])] = &[\n");
    for (rel, abs) in &files {
        let _ = writeln!(code, "    ({rel:?}, include_bytes!({abs:?})),");
    }
    code.push_str("];\n");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default()).join("web_assets.rs");
    if let Err(e) = std::fs::write(&out, code) {
        panic!("cannot write {}: {e}", out.display());
    }
}

/// True when `dist` is missing or older than any source file.
fn stale(web: &Path, dist: &Path) -> bool {
    let Some(built) = mtime(&dist.join("index.html")) else {
        return true;
    };
    SOURCES
        .iter()
        .filter_map(|s| newest(&web.join(s)))
        .any(|t| t > built)
}

fn mtime(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// The newest modification under `p`, directories included (a deleted file changes its
/// directory's time).
fn newest(p: &Path) -> Option<SystemTime> {
    let meta = std::fs::metadata(p).ok()?;
    let own = meta.modified().ok();
    if !meta.is_dir() {
        return own;
    }
    std::fs::read_dir(p)
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|e| newest(&e.path()))
        .chain(own)
        .max()
}

fn build(web: &Path) {
    let modules = web.join("node_modules");
    let lock = web.join("package-lock.json");
    if !modules.is_dir() || newest(&lock) > mtime(&modules) {
        npm(web, &["ci", "--no-audit", "--no-fund"]);
    }
    npm(web, &["run", "build"]);
}

fn npm(web: &Path, args: &[&str]) {
    let out = Command::new("npm").args(args).current_dir(web).output();
    match out {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!(
            "building the browser client failed: `npm {}` in {} exited with {}\n{}\n{}\n\
             Fix the error above, or set CODEROOM_SKIP_WEB_BUILD=1 to build the server without it.",
            args.join(" "),
            web.display(),
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => panic!(
            "building the browser client needs Node.js 20.19+ and npm ({e}). Install them, or set \
             CODEROOM_SKIP_WEB_BUILD=1 to build the server without the browser client."
        ),
    }
}

fn walk(root: &Path, dir: &Path, files: &mut Vec<(String, String)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.filter_map(Result::ok) {
        let path = e.path();
        if path.is_dir() {
            walk(root, &path, files);
        } else if let Ok(rel) = path.strip_prefix(root) {
            let rel = rel.to_string_lossy().replace('\\', "/");
            let abs = path.canonicalize().unwrap_or(path);
            files.push((rel, abs.to_string_lossy().into_owned()));
        }
    }
}

/// One npm build at a time (cargo may build several profiles at once): a directory made
/// atomically, holding the builder's pid; a lock whose builder is gone (a killed build) is
/// taken over.
struct BuildLock(PathBuf);

impl BuildLock {
    fn take(web: &Path) -> Self {
        let path = web.join(".build-lock");
        let pid_file = path.join("pid");
        let mut waited = Duration::ZERO;
        loop {
            match std::fs::create_dir(&path) {
                Ok(()) => {
                    let _ = std::fs::write(&pid_file, std::process::id().to_string());
                    return Self(path);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let holder = std::fs::read_to_string(&pid_file).ok();
                    let alive = if Path::new("/proc/self").exists() {
                        holder
                            .as_deref()
                            .map(str::trim)
                            .is_some_and(|pid| Path::new("/proc").join(pid).exists())
                    } else {
                        // No /proc to ask: a lock younger than any build is held.
                        mtime(&path)
                            .and_then(|t| t.elapsed().ok())
                            .is_some_and(|age| age < Duration::from_secs(600))
                    };
                    // No pid yet: the holder is between making the directory and writing it;
                    // give it a moment before calling it gone.
                    if !alive && (holder.is_some() || waited > Duration::from_secs(5)) {
                        let _ = std::fs::remove_dir_all(&path);
                        continue;
                    }
                    std::thread::sleep(Duration::from_millis(200));
                    waited += Duration::from_millis(200);
                }
                Err(e) => panic!(
                    "cannot lock {} to build the browser client: {e}. Set \
                     CODEROOM_SKIP_WEB_BUILD=1 to build the server without it.",
                    path.display()
                ),
            }
        }
    }
}

impl Drop for BuildLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
