//! The guest agent as a standalone binary (for VM images, built static: see
//! `deploy/guest/build-agent.sh`); the server binary also runs it as `coderoom agent`.

use coderoom_sandbox::agent::{self, Channel};

fn main() {
    let mut args = std::env::args().skip(1);
    let mut channel = None;
    let mut exec_as = None;
    let mut status_fd = None;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--fd" => channel = args.next().and_then(|v| v.parse().ok()).map(Channel::Fd),
            "--port" => channel = args.next().map(Channel::Port),
            "--vsock" => channel = args.next().and_then(|v| v.parse().ok()).map(Channel::Vsock),
            "--exec-as" => exec_as = args.next().and_then(|v| v.parse().ok()),
            "--status-fd" => status_fd = args.next().and_then(|v| v.parse().ok()),
            "--" => break,
            _ => {}
        }
    }
    if let Some(uid) = exec_as {
        let argv: Vec<String> = args.collect();
        std::process::exit(agent::exec_as(uid, &argv, status_fd));
    }
    let Some(channel) = channel else {
        eprintln!(
            "usage: coderoom-agent --fd N | --port NAME | --vsock PORT | --exec-as UID [--status-fd N] -- ARGV"
        );
        std::process::exit(64);
    };
    std::process::exit(agent::main(channel));
}
