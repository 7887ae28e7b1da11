//! The identity of the sources the guest agent is built from (`AGENT_BUILD`): a server uses a
//! standalone `coderoom-agent` found beside it only when that binary says the same
//! (`AgentCommand::beside`), so an agent left from another build is never started.

use std::hash::Hasher as _;
use std::path::{Path, PathBuf};

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            files(&p, out);
        } else {
            out.push(p);
        }
    }
}

fn main() {
    let here = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let mut all = Vec::new();
    files(&here.join("src"), &mut all);
    all.push(here.join("Cargo.toml"));
    // The versions of everything it links.
    all.push(here.join("../Cargo.lock"));
    all.sort();
    let mut h = std::hash::DefaultHasher::new();
    for f in &all {
        h.write(
            f.strip_prefix(&here)
                .unwrap_or(f)
                .as_os_str()
                .as_encoded_bytes(),
        );
        h.write(&std::fs::read(f).unwrap_or_default());
    }
    println!("cargo:rustc-env=CODEROOM_AGENT_BUILD={:016x}", h.finish());
    for watched in ["src", "Cargo.toml", "../Cargo.lock"] {
        println!("cargo:rerun-if-changed={watched}");
    }
}
