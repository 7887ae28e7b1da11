//! The guest agent as a standalone binary (for VM images); the server binary also runs it as
//! `coderoom agent`.

fn main() {
    let mut args = std::env::args().skip(1);
    let mut fd = None;
    let mut exec_as = None;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--fd" => fd = args.next().and_then(|v| v.parse().ok()),
            "--exec-as" => exec_as = args.next().and_then(|v| v.parse().ok()),
            "--" => break,
            _ => {}
        }
    }
    if let Some(uid) = exec_as {
        let argv: Vec<String> = args.collect();
        std::process::exit(coderoom_sandbox::agent::exec_as(uid, &argv));
    }
    let Some(fd) = fd else {
        eprintln!("usage: coderoom-agent --fd N | --exec-as UID -- ARGV");
        std::process::exit(64);
    };
    std::process::exit(coderoom_sandbox::agent::main(fd));
}
