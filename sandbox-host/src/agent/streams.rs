//! Connections carried over the control stream: to ports inside, and out through the egress
//! forwarder, each attributed to whom the process that opened it runs for.

use super::{send, streams_of, units, Carried, Out, State, Streams};
use crate::proto::{self, AgentError, Message, Reply};
use std::time::Duration;
use tokio::sync::mpsc;

/// Port connections open at once.
const MAX_STREAMS: usize = 256;
/// Of those, connections out through the egress forwarder (port connections keep the rest).
const MAX_OUTBOUND: usize = 64;

/// Who opened the connection from local port `peer_port` to the forwarder: whom the unit of
/// the process holding it runs for ([`units::owner_of`]), that process found through the kernel's socket table and each process's descriptors
/// (read with room code's file identity, which is allowed for room code's processes). Empty
/// when it cannot be told.
fn actor_of_peer(peer_port: u16) -> String {
    let inode = std::fs::read_to_string("/proc/net/tcp")
        .ok()
        .and_then(|table| {
            table.lines().skip(1).find_map(|line| {
                let f: Vec<&str> = line.split_whitespace().collect();
                let port = |field: &str| {
                    field
                        .rsplit_once(':')
                        .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
                };
                let ours = port(f.get(1)?)? == peer_port && port(f.get(2)?)? == proto::EGRESS_PORT;
                ours.then(|| f.get(9).map(|s| (*s).to_owned())).flatten()
            })
        });
    let Some(inode) = inode else {
        return String::new();
    };
    let wanted = format!("socket:[{inode}]");
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return String::new();
    };
    for p in procs.flatten() {
        let name = p.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        let holds = fds.flatten().any(|fd| {
            std::fs::read_link(fd.path()).is_ok_and(|t| t.as_os_str() == wanted.as_str())
        });
        if !holds {
            continue;
        }
        return units::owner_of(pid);
    }
    String::new()
}

/// Time a connection to a port inside may take.
const CONNECT_WITHIN: Duration = Duration::from_secs(5);

/// The TCP ports listened on inside (this network namespace's `/proc/net/tcp` and `tcp6`),
/// the forwarder's aside.
pub(super) fn listening() -> Vec<u16> {
    let mut ports = std::collections::BTreeSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        if let Ok(text) = std::fs::read_to_string(table) {
            ports.extend(listening_in(&text));
        }
    }
    ports.remove(&proto::EGRESS_PORT);
    ports.into_iter().take(proto::MAX_LISTENING).collect()
}

/// Local ports of the sockets in state `0A` (LISTEN) of a `/proc/net/tcp`-style table.
pub(super) fn listening_in(table: &str) -> impl Iterator<Item = u16> + '_ {
    table.lines().skip(1).filter_map(|line| {
        let mut fields = line.split_whitespace();
        let local = fields.nth(1)?;
        let state = fields.nth(1)?;
        if state != "0A" {
            return None;
        }
        u16::from_str_radix(local.rsplit_once(':')?.1, 16).ok()
    })
}

/// Opens a TCP connection inside the sandbox and wires it to stream `stream`.
pub(super) async fn connect(
    state: &mut State,
    stream: u32,
    port: u16,
) -> Result<Reply, AgentError> {
    if stream & proto::OUTBOUND_STREAM != 0 {
        return Err(AgentError::Invalid("stream id out of range".into()));
    }
    {
        let streams = streams_of(&state.streams);
        if streams.len() >= MAX_STREAMS {
            return Err(AgentError::Invalid("too many open connections".into()));
        }
        if streams.contains_key(&stream) {
            return Err(AgentError::Invalid("stream id in use".into()));
        }
    }
    let tcp = tokio::time::timeout(
        CONNECT_WITHIN,
        tokio::net::TcpStream::connect((std::net::Ipv4Addr::LOCALHOST, port)),
    )
    .await
    .map_err(|_| AgentError::Failed("connection timed out".into()))?
    .map_err(|e| AgentError::Failed(format!("cannot connect to port {port}: {e}")))?;
    let rx = open_stream(&state.streams, stream);
    carry(tcp, stream, rx, state.streams.clone(), state.out.clone());
    Ok(Reply::Done)
}

/// Registers stream `stream`: its queue toward the socket (returned) and its credit.
fn open_stream(streams: &Streams, stream: u32) -> mpsc::Receiver<Vec<u8>> {
    let (end, rx) = Carried::new();
    streams_of(streams).insert(stream, end);
    rx
}

/// Carries a connection's bytes as stream `stream`: what arrives on `rx` is written to it (each
/// chunk acknowledged), and what it sends goes out as [`Message::StreamData`] as the control
/// plane's acknowledgements allow, then [`Message::StreamClosed`]; the stream is forgotten once
/// the socket has nothing more to send.
fn carry(
    tcp: tokio::net::TcpStream,
    stream: u32,
    rx: mpsc::Receiver<Vec<u8>>,
    streams: Streams,
    out: Out,
) {
    let Some(credit) = streams_of(&streams).get(&stream).map(|c| c.credit.clone()) else {
        return;
    };
    let (rd, wr) = tcp.into_split();
    let ack = move |bytes| proto::encode(&Message::StreamAck { stream, bytes }).ok();
    tokio::spawn(crate::bridge::drain_into(rx, wr, out.clone(), ack));
    let closed = proto::encode(&Message::StreamClosed { stream }).ok();
    let frame = move |data| proto::encode(&Message::StreamData { stream, data }).ok();
    tokio::spawn(async move {
        crate::bridge::frames_from(rd, out, credit, frame, closed).await;
        crate::bridge::sent_all(&mut streams_of(&streams), stream);
    });
}

/// The egress forwarder: every connection code inside makes to [`proto::EGRESS_PORT`] becomes
/// an outbound stream to the control plane, which alone decides where it goes. Nothing here
/// reads or judges the bytes.
pub(super) async fn forward_outbound(
    listener: tokio::net::TcpListener,
    streams: Streams,
    out: Out,
) {
    let mut next: u32 = 0;
    loop {
        let tcp = match listener.accept().await {
            Ok((tcp, _)) => tcp,
            Err(_) => {
                // Out of descriptors, most likely: wait rather than spin.
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let stream = proto::OUTBOUND_STREAM | (next & !proto::OUTBOUND_STREAM);
        next = next.wrapping_add(1);
        {
            let open = streams_of(&streams);
            let outbound = open
                .keys()
                .filter(|s| *s & proto::OUTBOUND_STREAM != 0)
                .count();
            if open.len() >= MAX_STREAMS || outbound >= MAX_OUTBOUND || open.contains_key(&stream) {
                // Dropping the connection tells the program inside; nothing is queued.
                continue;
            }
        }
        let rx = open_stream(&streams, stream);
        let port = tcp.peer_addr().map(|a| a.port()).unwrap_or(0);
        let actor = tokio::task::spawn_blocking(move || actor_of_peer(port))
            .await
            .unwrap_or_default();
        // The control plane hears of the stream before any of its data.
        send(&out, &Message::Outbound { stream, actor }).await;
        carry(tcp, stream, rx, streams.clone(), out.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only LISTEN sockets count, on any address, IPv4 or IPv6; junk lines are skipped.
    #[test]
    fn listening_ports_are_read_from_the_tables() {
        let v4 = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 1 1
   1: 00000000:1435 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 2 1
   2: 0100007F:1F40 0100007F:A2C4 01 00000000:00000000 00:00000000 00000000  1000        0 3 1
   3: garbage
";
        let v6 = "  sl  local_address remote_address st
   0: 00000000000000000000000000000000:0BB8 00000000000000000000000000000000:0000 0A 0
";
        assert_eq!(listening_in(v4).collect::<Vec<_>>(), vec![8000, 5173]);
        assert_eq!(listening_in(v6).collect::<Vec<_>>(), vec![3000]);
    }
}
