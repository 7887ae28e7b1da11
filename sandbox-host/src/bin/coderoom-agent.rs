//! The guest agent as a standalone binary (for VM images); the server binary also runs it as
//! `coderoom agent`.

fn main() {
    let mut args = std::env::args().skip(1);
    let mut fd = None;
    while let Some(a) = args.next() {
        if a == "--fd" {
            fd = args.next().and_then(|v| v.parse().ok());
        }
    }
    let Some(fd) = fd else {
        eprintln!("usage: coderoom-agent --fd N");
        std::process::exit(64);
    };
    std::process::exit(coderoom_sandbox::agent::main(fd));
}
