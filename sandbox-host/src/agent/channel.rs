//! The agent's control stream: where it comes from in each tier (an inherited socket, a virtio
//! port, a vsock listener), and how its two halves are read and written.

use std::io::{Read as _, Write as _};
use std::os::fd::{FromRawFd as _, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where the agent's control stream comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Channel {
    /// A socket descriptor the spawner passed (the namespace tier's socket pair).
    Fd(RawFd),
    /// The virtio-serial port of this name (a QEMU guest), opened once it appears.
    Port(String),
    /// The first connection to this vsock port (a cloud-hypervisor guest's hybrid vsock).
    Vsock(u32),
}

/// The control stream once open: a socket (either tier's), or a virtio port's character
/// device, which is read and written with `read`/`write` rather than `recv`/`send`; and, for
/// a vsock channel, the listener a stream comes from again after the VM is restored.
pub(super) enum Opened {
    Socket(OwnedFd),
    Device(OwnedFd),
    Vsock { stream: OwnedFd, listener: OwnedFd },
}

/// The peer every control stream over vsock comes from: the host (a connection from inside
/// the guest, over vsock's loopback, has the local or the guest's own context id).
const VSOCK_HOST: u32 = 2;

/// Where a new control stream comes from after a save (a cloud-hypervisor guest restored from
/// its memory: the host's end of the old vsock connection did not survive it). A virtio port
/// is the same device after a restore, so it needs none.
pub(super) enum Relisten {
    /// The channel's vsock listener, non-blocking; only the host's connections are taken.
    Vsock(tokio::io::unix::AsyncFd<OwnedFd>),
    /// A unix listener, for the agent's own tests.
    #[cfg(test)]
    Unix(tokio::net::UnixListener),
}

impl Relisten {
    /// The next control stream: the next connection from the host.
    pub(super) async fn accept(&self) -> std::io::Result<OwnedFd> {
        match self {
            Relisten::Vsock(listener) => loop {
                let mut ready = listener.readable().await?;
                match ready.try_io(|l| accept_from_host(l.get_ref())) {
                    Ok(Ok(Some(fd))) => return Ok(fd),
                    // Someone other than the host: refused, and the next one waited for.
                    Ok(Ok(None)) => continue,
                    Ok(Err(e)) => return Err(e),
                    Err(_would_block) => continue,
                }
            },
            #[cfg(test)]
            Relisten::Unix(listener) => {
                let (stream, _) = listener.accept().await?;
                Ok(stream.into_std()?.into())
            }
        }
    }
}

/// Accepts one connection on vsock `listener` and keeps it only when it comes from the host;
/// `None` for any other peer (closed at once).
fn accept_from_host(listener: &OwnedFd) -> std::io::Result<Option<OwnedFd>> {
    use std::os::fd::AsRawFd as _;
    // SAFETY: an all-zero sockaddr_vm is a valid value for accept to fill in.
    let mut peer: libc::sockaddr_vm = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_vm>() as libc::socklen_t;
    // SAFETY: accepting on our own listening socket into a sockaddr_vm of `len` bytes.
    let fd = unsafe {
        libc::accept4(
            listener.as_raw_fd(),
            std::ptr::addr_of_mut!(peer).cast(),
            &mut len,
            libc::SOCK_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just accepted and is owned by nothing else.
    let stream = unsafe { OwnedFd::from_raw_fd(fd) };
    Ok((peer.svm_cid == VSOCK_HOST).then_some(stream))
}

/// How long a quiesced agent with a vsock channel waits for its host's next request or stream.
pub(super) const QUIESCED_WITHIN: Duration = Duration::from_secs(120);
/// How long a VM guest waits for its channel's device to appear (modules load first).
const DEVICE_WITHIN: Duration = Duration::from_secs(30);

impl Channel {
    /// Opens the channel (in the serving agent, so the reaper never holds it).
    pub(super) fn open(&self) -> std::io::Result<Opened> {
        match self {
            // SAFETY: the spawner passed this descriptor to us and nothing else in this process
            // owns it.
            Channel::Fd(fd) => Ok(Opened::Socket(unsafe { OwnedFd::from_raw_fd(*fd) })),
            Channel::Port(name) => {
                let deadline = std::time::Instant::now() + DEVICE_WITHIN;
                loop {
                    if let Some(dev) = find_port(name) {
                        use std::os::unix::fs::OpenOptionsExt as _;
                        let file = std::fs::OpenOptions::new()
                            .read(true)
                            .write(true)
                            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
                            .open(dev)?;
                        return Ok(Opened::Device(file.into()));
                    }
                    if std::time::Instant::now() > deadline {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::NotFound,
                            format!("no virtio port named {name}"),
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            Channel::Vsock(port) => {
                accept_vsock(*port).map(|(listener, stream)| Opened::Vsock { stream, listener })
            }
        }
    }
}

/// `/dev/vportNpM` of the virtio-serial port named `name`, if it is there yet.
fn find_port(name: &str) -> Option<PathBuf> {
    std::fs::read_dir("/sys/class/virtio-ports")
        .ok()?
        .flatten()
        .find(|e| std::fs::read_to_string(e.path().join("name")).is_ok_and(|n| n.trim() == name))
        .map(|e| Path::new("/dev").join(e.file_name()))
        .filter(|dev| dev.exists())
}

/// Listens on vsock `port` (any CID: only the host reaches a guest's vsock) and accepts the
/// control plane's connection, from the host only. Stream sockets read and write the same
/// whatever their family, so the accepted socket is served like the namespace tier's. The
/// listener stays open for the stream a restored VM gets next.
fn accept_vsock(port: u32) -> std::io::Result<(OwnedFd, OwnedFd)> {
    let listener = listen_vsock(port)?;
    loop {
        if let Some(stream) = accept_from_host(&listener)? {
            return Ok((listener, stream));
        }
    }
}

/// A vsock listener on `port`, any CID, once the transport is there.
fn listen_vsock(port: u32) -> std::io::Result<OwnedFd> {
    let deadline = std::time::Instant::now() + DEVICE_WITHIN;
    // The transport's module may still be loading: socket() fails until it has.
    let listener = loop {
        // SAFETY: plain socket call; the result is checked and owned at once.
        let fd = unsafe { libc::socket(libc::AF_VSOCK, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
        if fd >= 0 {
            // SAFETY: `fd` was just created and is owned by nothing else.
            break unsafe { OwnedFd::from_raw_fd(fd) };
        }
        if std::time::Instant::now() > deadline {
            return Err(std::io::Error::last_os_error());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // SAFETY: an all-zero sockaddr_vm is a valid value, then filled in.
    let mut addr: libc::sockaddr_vm = unsafe { std::mem::zeroed() };
    addr.svm_family = libc::AF_VSOCK as libc::sa_family_t;
    addr.svm_port = port;
    addr.svm_cid = libc::VMADDR_CID_ANY;
    let len = std::mem::size_of::<libc::sockaddr_vm>() as libc::socklen_t;
    use std::os::fd::AsRawFd as _;
    // SAFETY: `addr` is a valid sockaddr_vm of `len` bytes; the descriptor is ours.
    if unsafe { libc::bind(listener.as_raw_fd(), std::ptr::addr_of!(addr).cast(), len) } != 0
        // SAFETY: listening on our own socket.
        || unsafe { libc::listen(listener.as_raw_fd(), 1) } != 0
    {
        return Err(std::io::Error::last_os_error());
    }
    Ok(listener)
}

/// The two halves of the control stream.
type Halves = (
    Box<dyn tokio::io::AsyncRead + Unpin + Send>,
    Box<dyn tokio::io::AsyncWrite + Unpin + Send>,
);

pub(super) fn halves(opened: Opened) -> std::io::Result<Halves> {
    match opened {
        Opened::Socket(fd) | Opened::Vsock { stream: fd, .. } => {
            let std_stream = std::os::unix::net::UnixStream::from(fd);
            std_stream.set_nonblocking(true)?;
            let (rd, wr) = tokio::net::UnixStream::from_std(std_stream)?.into_split();
            Ok((Box::new(rd), Box::new(wr)))
        }
        Opened::Device(fd) => {
            // SAFETY: the `File` owns its descriptor for as long as the `AsyncFd` holds it, and
            // its `as_raw_fd` is always that descriptor.
            let registered = unsafe { tokio::io::unix::AsyncFd::register(std::fs::File::from(fd)) }
                .map_err(std::io::Error::from)?;
            let (rd, wr) = tokio::io::split(Device(registered));
            Ok((Box::new(rd), Box::new(wr)))
        }
    }
}

/// A virtio port's character device (opened non-blocking), read and written until the kernel
/// says it would block. tokio's own pipe and socket types take a short read as "drained" and
/// wait for the next wake-up, but a port hands over one buffer per read while more wait, and no
/// wake-up comes for data already there: a multi-chunk restore stalled that way.
pub(super) struct Device(tokio::io::unix::AsyncFd<std::fs::File>);

impl tokio::io::AsyncRead for Device {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        loop {
            let mut guard = std::task::ready!(self.0.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            match guard.try_io(|f| f.get_ref().read(unfilled)) {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return std::task::Poll::Ready(Ok(()));
                }
                Ok(Err(e)) => return std::task::Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl tokio::io::AsyncWrite for Device {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        loop {
            let mut guard = std::task::ready!(self.0.poll_write_ready(cx))?;
            match guard.try_io(|f| f.get_ref().write(data)) {
                Ok(r) => return std::task::Poll::Ready(r),
                Err(_would_block) => continue,
            }
        }
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd as _;

    /// Connects to vsock `cid`:`port`, or says why not.
    fn connect_vsock(cid: u32, port: u32) -> std::io::Result<OwnedFd> {
        // SAFETY: plain socket call; the result is checked and owned at once.
        let fd = unsafe { libc::socket(libc::AF_VSOCK, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and is owned by nothing else.
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: an all-zero sockaddr_vm is a valid value, then filled in.
        let mut addr: libc::sockaddr_vm = unsafe { std::mem::zeroed() };
        addr.svm_family = libc::AF_VSOCK as libc::sa_family_t;
        addr.svm_port = port;
        addr.svm_cid = cid;
        let len = std::mem::size_of::<libc::sockaddr_vm>() as libc::socklen_t;
        // SAFETY: `addr` is a valid sockaddr_vm of `len` bytes; the descriptor is ours.
        if unsafe { libc::connect(sock.as_raw_fd(), std::ptr::addr_of!(addr).cast(), len) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(sock)
    }

    /// Code inside a guest reaching the agent's own vsock listener over vsock's loopback (the
    /// local context id, 1) is refused: its connection is closed unanswered, and the listener
    /// waits on for the host. Needs a kernel with vsock's loopback transport (a guest's, or a
    /// host with `vsock_loopback` loaded); elsewhere the test reports itself skipped.
    #[test]
    fn a_vsock_peer_other_than_the_host_is_refused() {
        let port = 0x4000_0000 + std::process::id() % 0x1000_0000;
        // SAFETY: plain socket call, closed at once.
        let probe =
            unsafe { libc::socket(libc::AF_VSOCK, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
        if probe < 0 {
            crate::test_skip::skip("VSOCK", "this kernel has no vsock sockets");
            return;
        }
        // SAFETY: `probe` is ours and closed once.
        unsafe { libc::close(probe) };
        let listener = listen_vsock(port).unwrap();
        let connecting = std::thread::spawn(move || connect_vsock(libc::VMADDR_CID_LOCAL, port));
        let client = match connecting.join().unwrap() {
            Ok(c) => c,
            Err(e) => {
                crate::test_skip::skip(
                    "VSOCK",
                    &format!("no vsock loopback here (connecting to context id 1: {e})"),
                );
                return;
            }
        };
        assert!(
            accept_from_host(&listener).unwrap().is_none(),
            "a connection from context id 1 was taken as the host's"
        );
        // Closed unanswered: the peer reads the end, not a greeting.
        let mut buf = [0u8; 16];
        // SAFETY: reading into our own buffer from our own socket.
        let n = unsafe { libc::read(client.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        assert!(n <= 0, "the refused peer read {n} bytes");
    }
}
