//! The canaries: what room code tries, run as room code (a plain `sh` script through the exec
//! operation, POSIX and busybox alike, so that every tier runs the same one), and the verdicts.
//!
//! Its inputs reach it as a file in its workspace, never on its command line: a process's
//! command line is readable by every process of the sandbox, and the server's data directory
//! must not be found by looking for the canary's own arguments.

use serde::Serialize;

/// The script's time limit (under software emulation `find /` and Python's starts are slow).
pub(super) const TIMEOUT_MS: u64 = 300_000;

/// Where the inputs are written, relative to the workspace.
pub(super) const INPUT: &str = ".tiers-canary-input";

/// One line per input, in this order: the server's data directory, its port, the file name
/// only another room's workspace holds, the memory limit in bytes, the pids limit, then the
/// host's addresses (IPv4 dotted, IPv6 as the 32 hex digits of `/proc/net/if_inet6`).
pub(super) fn input(
    data_dir: &str,
    port: u16,
    other_room_file: &str,
    memory_bytes: u64,
    pids: u64,
    addresses: &[String],
) -> String {
    let mut s = format!("{data_dir}\n{port}\n{other_room_file}\n{memory_bytes}\n{pids}\n");
    for a in addresses {
        match a.parse::<std::net::Ipv6Addr>() {
            Ok(v6) => {
                for seg in v6.segments() {
                    s.push_str(&format!("{seg:04x}"));
                }
                s.push('\n');
            }
            Err(_) => {
                s.push_str(a);
                s.push('\n');
            }
        }
    }
    s
}

/// The canaries. Each prints `PASS name: detail` or `FAIL name: detail`; [`NAMES`] lists
/// them, and one that prints nothing has failed.
pub(super) const SCRIPT: &str = r#"
in=/workspace/.tiers-canary-input
{ read -r data_dir; read -r port; read -r other; read -r mem; read -r pids; } < "$in"
addrs=$(tail -n +6 "$in")
pass() { echo "PASS $1: $2"; }
fail() { echo "FAIL $1: $2"; }
# Without its inputs no canary proves anything: none gets a verdict.
if [ -z "$data_dir" ] || [ -z "$port" ] || [ -z "$other" ] || [ -z "$mem" ] || [ -z "$pids" ]; then
  echo "no inputs in $in"; exit 1
fi

# Descriptors: everything open in every process room code can see is a pipe, a socket, a
# terminal, a standard device or a file of the sandbox's own.
bad=""
for f in /proc/[0-9]*/fd/*; do
  t=$(readlink "$f" 2>/dev/null) || continue
  case "$t" in
    pipe:*|socket:*|anon_inode:*|/dev/null|/dev/zero|/dev/full|/dev/random|/dev/urandom) ;;
    /dev/pts/*|/dev/ptmx|/dev/tty|/workspace|/workspace/*|/tmp|/tmp/*|/proc/*) ;;
    *) bad="$bad $f=$t" ;;
  esac
done
if [ -z "$bad" ]; then pass descriptors "only pipes, sockets, terminals and the sandbox's own files are open"
else fail descriptors "host descriptors open:$bad"; fi

# The first process of the sandbox: not readable, not traceable.
if [ ! -e /proc/1/mem ]; then fail proc-1-mem "no /proc/1/mem to try"
elif (exec 3</proc/1/mem) 2>/dev/null; then fail proc-1-mem "opened /proc/1/mem"
else pass proc-1-mem "cannot open /proc/1/mem"; fi
if [ ! -L /proc/1/root ]; then fail proc-1-root "no /proc/1/root to try"
elif ls /proc/1/root/ >/dev/null 2>&1; then fail proc-1-root "listed /proc/1/root"
else pass proc-1-root "cannot list /proc/1/root"; fi

# The server: its data directory is not there, its process is not visible.
if [ -e "$data_dir" ]; then fail data-dir "$data_dir is visible"
else pass data-dir "the server's data directory is not there"; fi
seen=""
for c in /proc/[0-9]*/cmdline; do
  [ "$c" = "/proc/$$/cmdline" ] && continue
  v=$(tr '\0' ' ' < "$c" 2>/dev/null) || continue
  case "$v" in *"$data_dir"*) seen="$seen ${c%/cmdline}" ;; esac
done
if [ -z "$seen" ]; then pass server-process "no process of the control plane is visible"
else fail server-process "control-plane processes visible:$seen"; fi

# Another room's workspace; the same search must find this room's own input file.
found=$(find / -path /proc -prune -o -path /sys -prune -o -name '*tiers-*' -print 2>/dev/null)
hit=$(echo "$found" | grep -F "/$other" | head -n 1)
if ! echo "$found" | grep -q '/.tiers-canary-input$'; then fail other-room "find cannot search here (it missed this room's own file)"
elif [ -z "$hit" ]; then pass other-room "another room's file is nowhere to be found"
else fail other-room "another room's file is at $hit"; fi

# The network: the server's port on loopback, directly and through the egress proxy, and the
# metadata address through the proxy.
# curl where the sandbox has it, else Python (busybox's wget crashes behind a proxy).
# direct URL: 0 reached, 1 not reached (refused, unreachable, no answer to connect), 2 cannot
# tell (no client, another error): a canary that cannot tell fails.
direct() {
  if command -v curl >/dev/null 2>&1; then
    curl --noproxy '*' -s --connect-timeout 5 -m 20 -o /dev/null "$1" 2>/dev/null
    case $? in 0|22|52|56) return 0 ;; 6|7) return 1 ;; 28) return 1 ;; *) return 2 ;; esac
  fi
  command -v python3 >/dev/null 2>&1 || return 2
  python3 -c '
import socket, sys, urllib.parse
u = urllib.parse.urlsplit(sys.argv[1])
try:
    socket.create_connection((u.hostname, u.port or 80), 5).close()
except (ConnectionRefusedError, TimeoutError, socket.timeout):
    sys.exit(1)
except OSError as e:
    sys.exit(1 if e.errno in (101, 113) else 2)
' "$1"
}
# via_proxy URL: the proxy's status for it, "none" without a proxy, or "error: ...".
via_proxy() {
  p=${HTTP_PROXY:-$http_proxy}
  [ -z "$p" ] && { echo none; return; }
  if command -v curl >/dev/null 2>&1; then
    curl -s -m 20 -o /dev/null -w '%{http_code}' --noproxy '' -x "$p" "$1" 2>/dev/null; return
  fi
  command -v python3 >/dev/null 2>&1 || { echo "error: no curl or python3"; return; }
  no_proxy= NO_PROXY= python3 -c '
import sys, urllib.error, urllib.request
o = urllib.request.build_opener(urllib.request.ProxyHandler({"http": sys.argv[1]}))
try:
    print(o.open(sys.argv[2], timeout=20).status)
except urllib.error.HTTPError as e:
    print(e.code)
except Exception as e:
    print("error:", e)
' "$p" "$1" 2>&1
}
direct "http://127.0.0.1:$port/healthz"; r=$?
proxy=${HTTP_PROXY:-$http_proxy}
forwarder=${proxy#http://}; forwarder=${forwarder%/}
# The control: what does answer inside (the agent's forwarder to the proxy) reads as reached.
if [ -n "$forwarder" ]; then direct "http://$forwarder/"; control=$?; else control=0; fi
if [ $r -eq 0 ]; then fail server-port "reached the server on 127.0.0.1:$port"
elif [ $r -eq 2 ] || [ $control -ne 0 ]; then fail server-port "cannot tell (probe $r, control $control)"
else pass server-port "127.0.0.1:$port does not answer from inside"; fi
# The room's allowlist lets everything out (the fixture set it so): the proxy's own refusal
# of loopback, link-local and this machine's addresses is what holds. The control: a name
# the allowlist lets through is not refused (it does not resolve: not a 403).
control=$(via_proxy "http://tiers-canary.invalid/")
bad=""
urls="http://127.0.0.1:$port/healthz http://localhost:$port/healthz http://169.254.169.254/latest/meta-data/"
for a in $addrs; do case "$a" in *.*) urls="$urls http://$a:$port/healthz" ;; esac; done
for u in $urls; do
  code=$(via_proxy "$u")
  case "$code" in 403) ;; *) bad="$bad $u=$code" ;; esac
done
case "$control" in 403|000|none|error*) open=no ;; [1-5][0-9][0-9]) open=yes ;; *) open=no ;; esac
if [ $open = no ]; then
  fail egress-proxy "no open allowlist to test the proxy's refusals with (control: $control)"
elif [ -z "$bad" ]; then pass egress-proxy "with everything allowed, the proxy refuses loopback, the metadata address and the host's own"
else fail egress-proxy "the proxy let through:$bad"; fi

# The network namespace: none of the host's addresses is here.
bad=""
for a in $addrs; do
  if grep -q -i -w -F "$a" /proc/net/fib_trie /proc/net/if_inet6 2>/dev/null; then bad="$bad $a"; fi
done
ifs=$(tail -n +3 /proc/net/dev 2>/dev/null | cut -d: -f1 | tr -d ' ' | tr '\n' ' ')
if [ -z "$bad" ]; then pass network-namespace "none of the host's addresses (interfaces: $ifs)"
else fail network-namespace "host addresses visible:$bad"; fi

# The read-only base.
bad=""
for d in / /usr /usr/bin /usr/lib /bin /etc /.coderoom; do
  [ -d "$d" ] || continue
  if ( : > "$d/.tiers-canary" ) 2>/dev/null; then rm -f "$d/.tiers-canary"; bad="$bad $d"; fi
done
if [ -z "$bad" ]; then pass read-only-base "nothing written outside the workspace and /tmp"
else fail read-only-base "wrote into:$bad"; fi

# A fork bomb within the pids limit: it stops, and its processes go.
rm -f /tmp/.tiers-pids
( i=0; while [ $i -lt $((pids + 64)) ]; do sleep 60 & echo $! >> /tmp/.tiers-pids; i=$((i+1)); done ) 2>/dev/null
n=0; while read -r p; do kill "$p" 2>/dev/null; n=$((n+1)); done < /tmp/.tiers-pids
# Until each is reaped (builtins only: no fork may fail on the way).
while read -r p; do i=0; while [ -e "/proc/$p" ] && [ $i -lt 200000 ]; do i=$((i+1)); done; done < /tmp/.tiers-pids
rm -f /tmp/.tiers-pids
if [ "$n" -gt "$pids" ]; then fail fork-bomb "$n processes started at once, over the limit of $pids"
elif [ "$n" -lt $((pids / 2)) ]; then fail fork-bomb "only $n processes started (limit $pids): the bomb did not run"
else pass fork-bomb "stopped after $n processes (limit $pids)"; fi

# Memory beyond the limit: the process is stopped before it holds more than the limit.
out=$(awk -v max="$((mem * 2))" 'BEGIN { s = "0123456789abcdef"; while (length(s) < max) { s = s s; print length(s); fflush() } }' 2>&1)
r=$?
last=$(echo "$out" | grep -E '^[0-9]+$' | tail -n 1)
if [ "${last:-0}" -gt "$mem" ]; then fail memory "one string of $last bytes, over the limit of $mem (exit $r)"
elif [ "${last:-0}" -lt $((mem / 8)) ] || [ $r -eq 0 ]; then fail memory "the hog did not run (exit $r, ${last:-0} bytes): $(echo "$out" | tail -n 1)"
else pass memory "stopped at a string of ${last:-0} bytes (exit $r; limit $mem)"; fi
"#;

/// The second script: what room code can read of its sandbox's environments, command lines
/// and small files, for the fixture to look for the room's secret in (its value is never
/// given to the sandbox, so the sandbox cannot look for it itself).
pub(super) const DUMP: &str = r#"
for p in /proc/[0-9]*; do
  cat "$p/environ" "$p/cmdline" 2>/dev/null | tr '\0' '\n'
done
find /workspace /tmp /run /etc /home /root -type f -size -64k 2>/dev/null | while read -r f; do
  cat "$f" 2>/dev/null
done
"#;

/// Every canary [`SCRIPT`] runs, by name.
pub(super) const NAMES: &[&str] = &[
    "descriptors",
    "proc-1-mem",
    "proc-1-root",
    "data-dir",
    "server-process",
    "other-room",
    "server-port",
    "egress-proxy",
    "network-namespace",
    "read-only-base",
    "fork-bomb",
    "memory",
];

/// One canary's verdict (or a check's beside them).
#[derive(Clone, Debug, Serialize)]
pub(super) struct Verdict {
    pub(super) name: String,
    pub(super) held: bool,
    pub(super) detail: String,
}

impl Verdict {
    pub(super) fn new(name: &str, held: bool, detail: impl Into<String>) -> Verdict {
        Verdict {
            name: name.to_owned(),
            held,
            detail: detail.into(),
        }
    }
}

/// The verdicts in `out` (the script's stdout), one per name in [`NAMES`]: a canary that
/// printed nothing, or printed twice, has not held.
pub(super) fn verdicts(out: &str) -> Vec<Verdict> {
    NAMES
        .iter()
        .map(|&name| {
            let lines: Vec<(bool, &str)> = out
                .lines()
                .filter_map(|l| {
                    let (held, rest) = if let Some(r) = l.strip_prefix("PASS ") {
                        (true, r)
                    } else {
                        (false, l.strip_prefix("FAIL ")?)
                    };
                    let detail = rest.strip_prefix(name)?.strip_prefix(": ")?;
                    Some((held, detail))
                })
                .collect();
            match lines.as_slice() {
                [(held, detail)] => Verdict::new(name, *held, *detail),
                [] => Verdict::new(name, false, "no verdict (the script stopped before it)"),
                _ => Verdict::new(name, false, "more than one verdict"),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_doubled_verdict_does_not_hold() {
        let out = "PASS descriptors: fine\nFAIL data-dir: /x is visible\nPASS memory: a\nPASS memory: b\n";
        let v = verdicts(out);
        let by = |n: &str| v.iter().find(|v| v.name == n).unwrap();
        assert!(by("descriptors").held);
        assert!(!by("data-dir").held);
        assert_eq!(by("data-dir").detail, "/x is visible");
        assert!(!by("memory").held, "two verdicts");
        assert!(!by("fork-bomb").held, "none");
        assert_eq!(v.len(), NAMES.len());
    }

    #[test]
    fn every_canary_the_script_runs_is_named() {
        for name in NAMES {
            assert!(
                SCRIPT.contains(&format!("pass {name} ")),
                "{name} has no verdict in the script"
            );
        }
    }

    #[test]
    fn inputs_are_one_per_line_with_ipv6_as_proc_spells_it() {
        let s = input(
            "/d",
            8080,
            "f.txt",
            1 << 20,
            64,
            &["10.0.0.2".into(), "2001:db8::1".into()],
        );
        assert_eq!(
            s,
            "/d\n8080\nf.txt\n1048576\n64\n10.0.0.2\n20010db8000000000000000000000001\n"
        );
    }
}
