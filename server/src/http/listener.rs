//! The server's TCP listener: `TCP_NODELAY` on every connection, the open-file limit raised at
//! start, and a clear answer when the process runs out of descriptors.
//!
//! Keystrokes are tiny frames: without `TCP_NODELAY`, Nagle's algorithm holds a broadcast back
//! until the previous one is acknowledged, which with delayed ACKs adds ~40 ms at the tail.
//!
//! Out of descriptors, `accept` fails with `EMFILE` while the connection waits in the backlog;
//! axum's own listener logs and sleeps, and the client hangs. This one keeps a spare descriptor
//! (`/dev/null`): it lets the spare go, takes the waiting connection, answers it `503` with a
//! reason, closes it, and takes the spare back.

use crate::metrics::Metrics;
use std::io::Write;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};

/// The body a connection accepted without a descriptor to serve it gets, with a 503.
const OUT_OF_DESCRIPTORS: &str = r#"{"error":"the server is out of file descriptors; try again"}"#;

fn out_of_descriptors_response() -> String {
    format!(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n\
         Connection: close\r\nContent-Length: {}\r\n\r\n{OUT_OF_DESCRIPTORS}",
        OUT_OF_DESCRIPTORS.len()
    )
}

pub(crate) struct Listener {
    inner: TcpListener,
    spare: Option<std::fs::File>,
    metrics: Metrics,
    last_logged: Option<Instant>,
}

impl Listener {
    pub(crate) fn new(inner: TcpListener, metrics: Metrics) -> Listener {
        Listener {
            inner,
            spare: std::fs::File::open("/dev/null").ok(),
            metrics,
            last_logged: None,
        }
    }

    /// Answers one waiting connection `503` using the spare descriptor.
    async fn refuse_one(&mut self, e: &std::io::Error) {
        if self
            .last_logged
            .is_none_or(|at| at.elapsed() > Duration::from_secs(1))
        {
            tracing::error!(
                error = %e,
                "out of file descriptors: new connections get 503 until some are free \
                 (raise the open-file limit, e.g. LimitNOFILE in the systemd unit)"
            );
            self.last_logged = Some(Instant::now());
        }
        self.spare = None;
        let waiting = tokio::time::timeout(Duration::from_millis(100), self.inner.accept()).await;
        if let Ok(Ok((tcp, _))) = waiting {
            // A plain non-blocking write: the reply is far smaller than a fresh socket's buffer.
            // Then the write side is shut and what the client already sent is read, so closing
            // does not reset the connection before the reply is read.
            if let Ok(mut tcp) = tcp.into_std() {
                if tcp
                    .write_all(out_of_descriptors_response().as_bytes())
                    .is_ok()
                {
                    self.metrics.descriptors_exhausted.inc();
                }
                let _ = tcp.shutdown(std::net::Shutdown::Write);
                let mut sink = [0u8; 4096];
                while let Ok(n) = std::io::Read::read(&mut tcp, &mut sink) {
                    if n == 0 {
                        break;
                    }
                }
            }
        }
        self.spare = std::fs::File::open("/dev/null").ok();
        if self.spare.is_none() {
            // Still none free: do not spin.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl axum::serve::Listener for Listener {
    type Io = TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (TcpStream, SocketAddr) {
        loop {
            match self.inner.accept().await {
                Ok(accepted) => return accepted,
                Err(e) if out_of_descriptors(&e) => self.refuse_one(&e).await,
                Err(e) if connection_error(&e) => {}
                Err(e) => {
                    tracing::error!(error = %e, "accept failed; retrying in a second");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// Sets `TCP_NODELAY` on an accepted connection.
pub(crate) fn no_delay(tcp: &mut TcpStream) {
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!(error = %e, "cannot set TCP_NODELAY");
    }
}

fn out_of_descriptors(e: &std::io::Error) -> bool {
    // EMFILE (the process's limit) and ENFILE (the system's).
    matches!(e.raw_os_error(), Some(24) | Some(23))
}

fn connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    )
}

/// Raises the soft open-file limit to the hard one (every connection and sandbox holds
/// descriptors), and says what it found and did.
pub(crate) fn raise_open_file_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let before = getrlimit(Resource::Nofile);
    let (soft, hard) = (before.current, before.maximum);
    if soft == hard {
        tracing::info!(soft = ?soft, hard = ?hard, "open-file limit already at its hard limit");
        return;
    }
    let raised = Rlimit {
        current: hard,
        maximum: hard,
    };
    match setrlimit(Resource::Nofile, raised) {
        Ok(()) => {
            tracing::info!(from = ?soft, to = ?hard, "raised the open-file limit to the hard limit")
        }
        Err(e) => {
            tracing::warn!(soft = ?soft, hard = ?hard, error = %e, "cannot raise the open-file limit")
        }
    }
}
