#![forbid(unsafe_code)]

fn main() -> anyhow::Result<()> {
    coderoom_server::cli::main()
}
