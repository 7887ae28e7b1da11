//! Network namespaces of a test's own: a server that sees only the addresses a test gave it,
//! and an upstream host it reaches through a link of its own, with a name its system resolver
//! answers (from `/etc/hosts`, as DNS would), so the egress proxy's real path (resolve, check,
//! pin, connect) carries a connection with nothing in the server built for tests.
//!
//! ```text
//!   the test (host namespace)        server namespace                    upstream namespace
//!   10.213.N.1 ---- veth ---- 10.213.N.2 (the server listens)
//!                              5.5.5.5 on lo (an own, public address)
//!                              5.5.6.1 ---------- veth ---------- 5.5.6.2 (the upstream)
//! ```
//!
//! Needs root and iproute2; without them the test reports itself skipped (`Need::NetNamespace`).
//! Dropping the value removes both namespaces, and with them their links.

use super::{skip, Need};
use std::process::Command;

/// The server's public-looking address of its own (on its loopback interface).
pub const OWN_PUBLIC: &str = "5.5.5.5";
/// The upstream host's address, reached from the server's namespace.
pub const UPSTREAM: &str = "5.5.6.2";

pub struct Netns {
    /// The server's namespace (`/run/netns/<name>`).
    pub server: String,
    /// The upstream's namespace.
    pub upstream: String,
    /// The server's address on the link to the test.
    pub server_addr: String,
    /// `/etc/hosts` as the server's namespace reads it.
    pub hosts: tempfile::NamedTempFile,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Netns {
    /// The two namespaces, linked, with `names` (`NAME ADDR` lines) in the server's
    /// `/etc/hosts`; `None` after reporting the test skipped when this machine cannot make
    /// them.
    pub fn new(names: &[(&str, &str)]) -> Option<Netns> {
        if !rustix::process::geteuid().is_root() {
            skip(Need::NetNamespace, "network namespaces need root");
            return None;
        }
        let n = std::process::id() % 250;
        let ns = Netns {
            server: format!("crs{}", std::process::id()),
            upstream: format!("cru{}", std::process::id()),
            server_addr: format!("10.213.{n}.2"),
            hosts: tempfile::NamedTempFile::new().unwrap(),
        };
        let mut hosts = String::from("127.0.0.1 localhost\n");
        for (name, addr) in names {
            hosts.push_str(&format!("{addr} {name}\n"));
        }
        std::fs::write(ns.hosts.path(), hosts).unwrap();
        let (s, u) = (ns.server.as_str(), ns.upstream.as_str());
        let (to_test, to_server) = (format!("crh{n}"), format!("crs{n}"));
        let (up_s, up_u) = (format!("crsu{n}"), format!("cru{n}"));
        let host_side = format!("10.213.{n}.1/30");
        let server_side = format!("{}/30", ns.server_addr);
        let made = (|| {
            ip(&["netns", "add", s])?;
            ip(&["netns", "add", u])?;
            ip(&[
                "link", "add", &to_test, "type", "veth", "peer", "name", &to_server, "netns", s,
            ])?;
            ip(&["addr", "add", &host_side, "dev", &to_test])?;
            ip(&["link", "set", &to_test, "up"])?;
            ip(&["-n", s, "link", "set", "lo", "up"])?;
            ip(&[
                "-n",
                s,
                "addr",
                "add",
                &format!("{OWN_PUBLIC}/32"),
                "dev",
                "lo",
            ])?;
            ip(&["-n", s, "addr", "add", &server_side, "dev", &to_server])?;
            ip(&["-n", s, "link", "set", &to_server, "up"])?;
            ip(&[
                "-n", s, "link", "add", &up_s, "type", "veth", "peer", "name", &up_u, "netns", u,
            ])?;
            ip(&["-n", s, "addr", "add", "5.5.6.1/24", "dev", &up_s])?;
            ip(&["-n", s, "link", "set", &up_s, "up"])?;
            ip(&["-n", u, "link", "set", "lo", "up"])?;
            ip(&[
                "-n",
                u,
                "addr",
                "add",
                &format!("{UPSTREAM}/24"),
                "dev",
                &up_u,
            ])?;
            ip(&["-n", u, "link", "set", &up_u, "up"])
        })();
        match made {
            Ok(()) => Some(ns),
            Err(e) => {
                drop(ns);
                skip(
                    Need::NetNamespace,
                    &format!("this machine cannot make the test's network namespaces: {e}"),
                );
                None
            }
        }
    }

    /// `program` run in the server's namespace (its arguments are the caller's), seeing the
    /// test's `/etc/hosts` (a mount namespace of its own, slave to the host's: the cgroup and
    /// other mounts stay as they are).
    pub fn in_server(&self, program: &str) -> tokio::process::Command {
        let mut c = tokio::process::Command::new("nsenter");
        c.arg(format!("--net=/run/netns/{}", self.server))
            .args([
                "--",
                "unshare",
                "--mount",
                "--propagation",
                "slave",
                "sh",
                "-c",
            ])
            .arg(format!(
                "mount --bind {} /etc/hosts && exec \"$0\" \"$@\"",
                self.hosts.path().display()
            ))
            .arg(program);
        c
    }

    /// `program` run in the upstream's namespace.
    pub fn in_upstream(&self, program: &str) -> tokio::process::Command {
        let mut c = tokio::process::Command::new("nsenter");
        c.arg(format!("--net=/run/netns/{}", self.upstream))
            .arg("--")
            .arg(program);
        c
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting a namespace deletes its links, and their peers with them.
        let _ = ip(&["netns", "del", &self.server]);
        let _ = ip(&["netns", "del", &self.upstream]);
    }
}
