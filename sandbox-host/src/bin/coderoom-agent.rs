//! The guest agent as a standalone binary (for VM images, built static: see
//! `deploy/guest/build-agent.sh`); the server binary also runs it as `coderoom agent`.

fn main() {
    std::process::exit(coderoom_sandbox::agent::run_command_line(
        std::env::args_os().skip(1),
    ));
}
