//! A VMM's output: read into one channel, the last of it kept, and turned into the words that
//! say why a VM ended.

use crate::process::describe;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncReadExt;

/// Longest line of a VM's output quoted in a reason.
const REASON_LINE: usize = 240;
/// Console output kept for failure reasons.
const CONSOLE_KEEP: usize = 16 << 10;

/// Reads a VMM's standard output and error (the guest console under QEMU, the VMM's log under
/// cloud-hypervisor) into one channel of chunks.
pub(crate) fn merge(
    out: Option<tokio::process::ChildStdout>,
    err: Option<tokio::process::ChildStderr>,
) -> tokio::sync::mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    fn pump<R: tokio::io::AsyncRead + Unpin + Send + 'static>(
        mut r: R,
        tx: tokio::sync::mpsc::Sender<Vec<u8>>,
    ) {
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            while let Ok(n) = r.read(&mut buf).await {
                if n == 0 || tx.send(buf[..n].to_vec()).await.is_err() {
                    break;
                }
            }
        });
    }
    if let Some(o) = out {
        pump(o, tx.clone());
    }
    if let Some(e) = err {
        pump(e, tx);
    }
    rx
}

/// The last of a VM's console, for saying why it ended.
#[derive(Clone)]
pub(super) struct Console {
    kept: Arc<Mutex<Vec<u8>>>,
    done: Arc<tokio::sync::Notify>,
    finished: Arc<std::sync::atomic::AtomicBool>,
}

impl Console {
    pub(super) fn watch(mut rx: tokio::sync::mpsc::Receiver<Vec<u8>>) -> Console {
        let c = Console {
            kept: Arc::default(),
            done: Arc::default(),
            finished: Arc::default(),
        };
        let w = c.clone();
        tokio::spawn(async move {
            while let Some(chunk) = rx.recv().await {
                let mut k = w.kept.lock().unwrap_or_else(|e| e.into_inner());
                k.extend_from_slice(&chunk);
                if k.len() > CONSOLE_KEEP {
                    let cut = k.len() - CONSOLE_KEEP;
                    k.drain(..cut);
                }
            }
            w.finished.store(true, Ordering::SeqCst);
            w.done.notify_waiters();
        });
        c
    }

    /// Waits (briefly) until the VMM's output has been read to its end.
    pub(super) async fn settled(&self) {
        let wait = self.done.notified();
        if self.finished.load(Ordering::SeqCst) {
            return;
        }
        let _ = tokio::time::timeout(Duration::from_secs(2), wait).await;
    }

    /// What was kept, one line per line, each without control characters and at most
    /// [`REASON_LINE`] characters (the text reaches the audit chain and the participants).
    fn text(&self) -> String {
        let k = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        String::from_utf8_lossy(&k)
            .lines()
            .map(|l| {
                l.chars()
                    .filter(|c| !c.is_control())
                    .take(REASON_LINE)
                    .collect::<String>()
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    pub(super) fn tail_line(&self) -> Option<String> {
        self.text()
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .map(|l| l.trim().to_owned())
    }

    /// Why the VM ended, in words: the guest's own account first (a kernel panic, the agent
    /// ending, the guest's out-of-memory killer), then how the VMM process ended.
    pub(super) fn reason(&self, status: Option<std::process::ExitStatus>) -> String {
        use std::os::unix::process::ExitStatusExt as _;
        let text = self.text();
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        let find = |needle: &str| lines.iter().rev().find(|l| l.contains(needle)).copied();
        let how = status.map_or_else(|| "unknown status".to_owned(), describe);
        if let Some(panic) = find("Kernel panic") {
            return format!("the guest kernel panicked ({panic}); the VMM exited: {how}");
        }
        if status.and_then(|s| s.signal()).is_some() {
            let mut r = format!("the VMM process was {how}");
            if let Some(l) = find("Out of memory") {
                r.push_str(&format!("; the guest had reported: {l}"));
            }
            return r;
        }
        let last = lines
            .iter()
            .rev()
            .find(|l| !l.is_empty())
            .copied()
            .unwrap_or("");
        // The VMM itself refused (a bad option, a device it could not open): its own words.
        if let Some(err) = lines.iter().rev().find(|l| {
            l.starts_with("qemu-system") || (l.contains("cloud-hypervisor") && l.contains("rror"))
        }) {
            return format!("the VMM failed ({how}): {err}");
        }
        let mut r = format!("the guest powered off ({how})");
        if let Some(l) = find("Out of memory") {
            r.push_str(&format!("; the guest reported: {l}"));
        }
        if !last.is_empty() {
            r.push_str(&format!("; its console's last line: {last}"));
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt as _;

    fn console(text: &str) -> Console {
        let c = Console {
            kept: Arc::default(),
            done: Arc::default(),
            finished: Arc::default(),
        };
        c.kept
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(text.as_bytes());
        c
    }

    #[test]
    fn the_reason_a_vm_ended_comes_from_what_it_said() {
        let exit = |code: i32| Some(std::process::ExitStatus::from_raw(code << 8));
        let signal = |sig: i32| Some(std::process::ExitStatus::from_raw(sig));
        let r = console("[ 1.0] Kernel panic - not syncing: Attempted to kill init!\r\n")
            .reason(exit(0));
        assert!(
            r.starts_with("the guest kernel panicked ([ 1.0] Kernel panic - not syncing"),
            "{r}"
        );
        let r = console("booting\n").reason(signal(9));
        assert_eq!(r, "the VMM process was killed by signal 9");
        let r = console("[ 9.1] Out of memory: Killed process 212 (awk)\n").reason(signal(9));
        assert!(
            r.ends_with("the guest had reported: [ 9.1] Out of memory: Killed process 212 (awk)"),
            "{r}"
        );
        let r = console("qemu-system-x86_64: -drive file=x: Could not open 'x'\n").reason(exit(1));
        assert_eq!(
            r,
            "the VMM failed (exit status 1): qemu-system-x86_64: -drive file=x: Could not open 'x'"
        );
        let r = console("coderoom-init: cannot mount the workspace disk\nreboot: Power down\n")
            .reason(exit(0));
        assert_eq!(
            r,
            "the guest powered off (exit status 0); its console's last line: reboot: Power down"
        );
        assert_eq!(
            console("").reason(None),
            "the guest powered off (unknown status)"
        );
    }
}
