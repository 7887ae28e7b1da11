//! The `coderoom` command line: `serve`, `agent`, `audit verify`, `migrate`, `admin token`,
//! `bench tiers`.

use crate::accounts::sessions as auth;
use crate::config::{
    AdminCommand, AuditCommand, BenchCommand, Cli, Command, ImageCommand, SecretsCommand,
};
use crate::store::Store;
use clap::Parser;
use tracing_subscriber::EnvFilter;

fn init_logging(json: bool) {
    let filter = EnvFilter::try_from_env("CODEROOM_LOG")
        .unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn,tower_http=info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// Parses the command line and runs the command.
pub fn main() -> anyhow::Result<()> {
    // The agent (`coderoom agent`: a sandbox's machinery, and the start of every command room
    // code runs; not for use by hand) parses its own few arguments: the full parser below is
    // built for the server's every command, which a sandbox's start and each command paid for.
    // It forks into a reaper and a server before any thread exists, so it runs before (and
    // without) the server's runtime.
    let mut args = std::env::args_os();
    if args.nth(1).is_some_and(|a| a == "agent") {
        std::process::exit(coderoom_sandbox::agent::run_command_line(args));
    }
    let cli = Cli::parse();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        // Nested document values are handled recursively (see `MAX_VALUE_DEPTH`).
        .thread_stack_size(crate::room::protocol::THREAD_STACK_BYTES)
        .build()?
        .block_on(run(cli))
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(args) => {
            init_logging(args.log_format == crate::config::LogFormat::Json);
            crate::serve::serve(*args).await
        }
        Command::Audit {
            command:
                AuditCommand::Verify {
                    room,
                    no_checkpoint,
                    anchor,
                    storage,
                },
        } => {
            init_logging(false);
            let store = Store::connect(&storage.database_url()).await?;
            store.migrate().await?;
            if no_checkpoint {
                eprintln!(
                    "warning: chains without a checkpoint are checked for links and hashes \
                     only; a chain whose last records were deleted passes"
                );
            }
            let need = if no_checkpoint {
                crate::audit::Checkpoint::Optional
            } else {
                crate::audit::Checkpoint::Required
            };
            let result = crate::audit::verify_all(
                &store,
                &storage.data_dir,
                room.as_deref(),
                need,
                anchor.as_deref(),
            )
            .await?;
            store.close().await;
            match result {
                Ok(n) => {
                    println!("ok: {n} audit chain(s) verified");
                    Ok(())
                }
                Err(e) => {
                    eprintln!("FAILED: {e}");
                    std::process::exit(1);
                }
            }
        }
        Command::Secrets { command } => {
            init_logging(false);
            let (storage, file, rotate) = match command {
                SecretsCommand::RotateKey {
                    storage,
                    secret_key_file,
                } => (storage, secret_key_file, true),
                SecretsCommand::Verify {
                    storage,
                    secret_key_file,
                } => (storage, secret_key_file, false),
            };
            let path = storage.secret_key_path(file.as_deref());
            let store = Store::connect(&storage.database_url()).await?;
            store.migrate().await?;
            let outcome = if rotate {
                crate::secrets::rotate(&store, &path)
                    .await
                    .map(|(n, id)| println!("ok: {n} secret(s) sealed again under key {id}"))
            } else {
                match crate::secrets::verify(&store, &path).await {
                    Ok((n, None)) => {
                        println!("ok: {n} secret(s) open with {}", path.display());
                        Ok(())
                    }
                    Ok((n, Some(e))) => {
                        eprintln!("FAILED after {n} secret(s): {e}");
                        store.close().await;
                        std::process::exit(1);
                    }
                    Err(e) => Err(e),
                }
            };
            store.close().await;
            if let Err(e) = outcome {
                eprintln!("FAILED: {e}");
                std::process::exit(1);
            }
            Ok(())
        }
        Command::Image {
            command:
                ImageCommand::Build {
                    data_dir,
                    image_dir,
                    kernel_deb,
                    busybox,
                    agent,
                },
        } => {
            let dir = image_dir.unwrap_or_else(|| data_dir.join("images"));
            let inputs = coderoom_sandbox::vm::Inputs {
                kernel_deb,
                busybox,
                agent,
            };
            let image = tokio::task::spawn_blocking(move || {
                coderoom_sandbox::vm::image::build(&dir, &inputs, &mut |line| {
                    eprintln!("image: {line}");
                })
            })
            .await??;
            println!("{}", image.manifest.hash);
            Ok(())
        }
        Command::SandboxHost(args) => {
            init_logging(false);
            crate::sandbox::hosts::run(*args).await
        }
        Command::Certs {
            dir,
            name,
            role,
            san,
        } => {
            let (cert, key) = crate::sandbox::hosts::issue(&dir, &name, role, &san)?;
            println!("{}\n{}", cert.display(), key.display());
            Ok(())
        }
        Command::Doctor { vm, data_dir } => {
            init_logging(false);
            doctor(&vm, &data_dir).await;
            Ok(())
        }
        Command::Bench {
            command: BenchCommand::Tiers(args),
        } => {
            init_logging(false);
            if !crate::tiers::run(*args).await? {
                std::process::exit(1);
            }
            Ok(())
        }
        Command::Migrate(storage) => {
            init_logging(false);
            let store = Store::connect(&storage.database_url()).await?;
            store.migrate().await?;
            tracing::info!(backend = ?store.backend(), "migrations applied");
            Ok(())
        }
        Command::Admin {
            command:
                AdminCommand::Token {
                    email,
                    ttl_s,
                    storage,
                },
        } => {
            init_logging(false);
            let email = crate::accounts::email::canonicalize(&email)
                .map_err(|_| anyhow::anyhow!("not a plain email address: {email:?}"))?;
            let store = Store::connect(&storage.database_url()).await?;
            store.migrate().await?;
            let user = auth::ensure_user(&store, &email).await?;
            let now = crate::clock::Clock::system().now_ms();
            let token = auth::issue_token(&store, &user.id, ttl_s, now).await?;
            println!("{token}");
            store.close().await;
            Ok(())
        }
    }
}

/// `coderoom doctor`: what this host supports for sandboxes, and the tier `auto` picks.
async fn doctor(vm: &crate::config::VmArgs, data_dir: &std::path::Path) {
    use coderoom_sandbox::vm::{ch, find_program, kvm_usable, GuestImage};
    use coderoom_sandbox::{AgentCommand, Backend, Namespace, Tier};
    let agent = || AgentCommand {
        exe: std::env::current_exe().unwrap_or_else(|_| "coderoom".into()),
        args: vec!["agent".into()],
    };
    let yes_no = |r: anyhow::Result<String>| match r {
        Ok(s) => format!("yes: {s}"),
        Err(e) => format!("no: {e}"),
    };
    println!("coderoom doctor");
    println!(
        "  namespace tier (namespaces, seccomp, bubblewrap): {}",
        yes_no(
            Namespace::new(agent(), None)
                .map(|ns| match ns.cgroups() {
                    Ok(l) => format!("cgroup limits through {}", l.name()),
                    Err(why) => format!("no cgroup limits ({})", coderoom_sandbox::Chain(why)),
                })
                .map_err(anyhow::Error::new)
        )
    );
    if let Ok(exe) = std::env::current_exe() {
        println!("  its agent: {}", AgentCommand::beside(&exe).1);
    }
    println!(
        "  KVM: {}",
        yes_no(
            kvm_usable()
                .map(|()| "/dev/kvm opens".to_owned())
                .map_err(|e| anyhow::anyhow!("{}", coderoom_sandbox::Chain(&e)))
        )
    );
    let cfg = vm.config(data_dir);
    println!(
        "  cloud-hypervisor: {}",
        yes_no(
            find_program(cfg.cloud_hypervisor_bin.as_deref(), "cloud-hypervisor")
                .ok_or_else(|| anyhow::anyhow!("not found (--cloud-hypervisor-bin)"))
                .and_then(|b| {
                    ch::version(&b)
                        .map(|v| format!("{v} at {}", b.display()))
                        .map_err(|e| anyhow::anyhow!("{}", coderoom_sandbox::Chain(&e)))
                })
        )
    );
    println!(
        "  QEMU: {}",
        yes_no(
            find_program(cfg.qemu_bin.as_deref(), "qemu-system-x86_64")
                .ok_or_else(|| anyhow::anyhow!("not found (--qemu-bin)"))
                .and_then(|b| {
                    std::process::Command::new(&b)
                        .arg("--version")
                        .output()
                        .map_err(anyhow::Error::new)
                        .map(|o| {
                            let v = String::from_utf8_lossy(&o.stdout);
                            format!(
                                "{} at {}",
                                v.lines().next().unwrap_or("").trim(),
                                b.display()
                            )
                        })
                })
        )
    );
    println!(
        "  guest image: {}",
        yes_no(
            GuestImage::current(&cfg.image_dir)
                .map(|i| {
                    format!(
                        "{} (kernel {}) in {}",
                        i.manifest.hash,
                        i.manifest.kernel_release,
                        cfg.image_dir.display()
                    )
                })
                .ok_or_else(|| {
                    anyhow::anyhow!(
                        "none in {} (`coderoom image build`)",
                        cfg.image_dir.display()
                    )
                })
        )
    );
    let (backend, why) = Backend::select(Tier::Auto, agent(), None, &cfg).await;
    println!("  auto picks: {}", backend.tier().name());
    println!("  because: {why}");
}
