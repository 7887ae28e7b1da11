//! Room code's environment: the proxy variables that send it through the egress forwarder, the
//! room's own variables, and the trust bundle.

use super::{failed, room_uid, WORKSPACE};
use crate::proto::{self, AgentError, Reply};
use std::path::Path;
use std::sync::Mutex;

/// The room's proxy: the agent's forwarder (see [`proto::EGRESS_PORT`]).
pub(super) const PROXY_URL: &str = "http://127.0.0.1:3128";
/// Connections to the sandbox's own loopback stay inside.
const NO_PROXY: &str = "localhost,127.0.0.1,::1";
/// The system's roots, which the trust bundle starts from.
const SYSTEM_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
/// Largest authority certificate accepted.
const MAX_CA_PEM: usize = 64 << 10;
/// Most variables [`crate::proto::Op::Egress`] may set.
const MAX_ROOM_ENV: usize = 128;

/// Variables the control plane gave room code ([`crate::proto::Op::Egress`]), after [`base_env`].
static ROOM_ENV: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());

/// Everything room code's environment holds: [`base_env`] and the room's own variables.
pub(super) fn room_env() -> Vec<(String, String)> {
    let extra = ROOM_ENV.lock().unwrap_or_else(|e| e.into_inner()).clone();
    base_env()
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .chain(extra)
        .collect()
}

/// Checks and keeps [`crate::proto::Op::Egress`]: the variables for later execs, and the trust bundle
/// (the system's roots and the room's authority), written as root so room code cannot
/// replace it.
pub(super) fn set_egress(ca_pem: String, env: Vec<(String, String)>) -> Result<Reply, AgentError> {
    let pem_ok = ca_pem.len() <= MAX_CA_PEM
        && (ca_pem.is_empty()
            || ca_pem
                .trim_start()
                .starts_with("-----BEGIN CERTIFICATE-----"));
    if !pem_ok {
        return Err(AgentError::Invalid("not one PEM certificate".into()));
    }
    let env_ok = env.len() <= MAX_ROOM_ENV
        && env.iter().all(|(k, v)| {
            k.strip_prefix("CODEROOM_SECRET_").is_some_and(|n| {
                !n.is_empty()
                    && n.bytes()
                        .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
            }) && !v.is_empty()
                && v.len() <= 256
                && v.bytes().all(|b| b.is_ascii_graphic())
        });
    if !env_ok {
        return Err(AgentError::Invalid("bad room variables".into()));
    }
    write_trust(&ca_pem)?;
    *ROOM_ENV.lock().unwrap_or_else(|e| e.into_inner()) = env;
    Ok(Reply::Done)
}

/// The trust bundle until the control plane names the room's authority ([`set_egress`]): the
/// system's roots by a symlink to them, or an empty bundle where the system has none. This runs
/// at every start, before room code can, so it copies nothing (a copy of the roots was ~0.4
/// ms of each start); called while the agent still acts on files as itself (the directory is
/// the machinery's). Without the directory (a test harness), nothing.
pub(super) fn link_system_trust() {
    let path = Path::new(proto::TRUST_FILE);
    if !path.parent().is_some_and(Path::is_dir) {
        return;
    }
    let _ = if Path::new(SYSTEM_BUNDLE).is_file() {
        std::os::unix::fs::symlink(SYSTEM_BUNDLE, path)
    } else {
        std::fs::write(path, b"")
    };
}

/// Writes [`proto::TRUST_FILE`]: the system's roots, then `extra`. On a thread of its own that
/// acts on files as root (every other agent thread acts as room code).
pub(super) fn write_trust(extra: &str) -> Result<(), AgentError> {
    let extra = extra.to_owned();
    let writer = std::thread::Builder::new()
        .name("trust".into())
        .spawn(move || -> std::io::Result<()> {
            if room_uid().is_some() {
                // SAFETY: plain credential calls with constant arguments, on this thread only.
                unsafe {
                    libc::setfsgid(0);
                    libc::setfsuid(0);
                }
            }
            let mut bundle = std::fs::read(SYSTEM_BUNDLE).unwrap_or_default();
            if !bundle.is_empty() && !bundle.ends_with(b"\n") {
                bundle.push(b'\n');
            }
            bundle.extend_from_slice(extra.as_bytes());
            let path = Path::new(proto::TRUST_FILE);
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, &bundle)?;
            std::fs::rename(&tmp, path)
        })
        .map_err(failed)?;
    match writer.join() {
        Ok(r) => r.map_err(|e| AgentError::Failed(format!("cannot write the trust bundle: {e}"))),
        Err(_) => Err(AgentError::Failed("the trust writer panicked".into())),
    }
}

pub(super) fn base_env() -> Vec<(&'static str, &'static str)> {
    vec![
        ("PATH", "/usr/local/bin:/usr/bin:/bin"),
        ("HOME", WORKSPACE),
        ("USER", "coder"),
        ("LANG", "C.UTF-8"),
        ("TERM", "xterm-256color"),
        // Every way out is the agent's forwarder, which hands the connection to the control
        // plane's egress proxy (default deny). Both spellings: tools read one or the other.
        ("HTTP_PROXY", PROXY_URL),
        ("HTTPS_PROXY", PROXY_URL),
        ("ALL_PROXY", PROXY_URL),
        ("http_proxy", PROXY_URL),
        ("https_proxy", PROXY_URL),
        ("all_proxy", PROXY_URL),
        ("NO_PROXY", NO_PROXY),
        ("no_proxy", NO_PROXY),
        // TLS clients trust the system's roots and the room's egress authority (which signs
        // for hosts the proxy adds secrets to).
        ("SSL_CERT_FILE", proto::TRUST_FILE),
        ("CURL_CA_BUNDLE", proto::TRUST_FILE),
        ("REQUESTS_CA_BUNDLE", proto::TRUST_FILE),
        ("NODE_EXTRA_CA_CERTS", proto::TRUST_FILE),
        ("GIT_SSL_CAINFO", proto::TRUST_FILE),
        ("CARGO_HTTP_CAINFO", proto::TRUST_FILE),
        ("PIP_CERT", proto::TRUST_FILE),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_proxy_variables_name_the_forwarder() {
        assert_eq!(
            PROXY_URL,
            format!("http://127.0.0.1:{}", proto::EGRESS_PORT)
        );
        for name in ["HTTP_PROXY", "https_proxy", "ALL_PROXY"] {
            assert!(base_env().contains(&(name, PROXY_URL)), "{name}");
        }
    }
}
