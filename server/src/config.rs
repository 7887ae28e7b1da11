//! Command line and environment configuration. Every flag has a `CODEROOM_*` twin, except the
//! hidden ones that tests and the benchmarks' comparisons pass (a lever turned off is a
//! command line of its own, never an environment the server reads deep inside).

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(
    name = "coderoom",
    version,
    about = "Coderoom: a self-hostable multiplayer coding room"
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run the room server.
    Serve(Box<ServeArgs>),
    /// Apply database migrations and exit.
    Migrate(StorageArgs),
    /// The audit log.
    Audit {
        #[command(subcommand)]
        command: AuditCommand,
    },
    /// Room secrets at rest.
    Secrets {
        #[command(subcommand)]
        command: SecretsCommand,
    },
    /// Administrative tasks.
    Admin {
        #[command(subcommand)]
        command: AdminCommand,
    },
    /// Print what this host supports for sandboxes and the tier `auto` would pick, with
    /// reasons (boots a probe guest where a VMM and KVM are present).
    Doctor {
        #[command(flatten)]
        vm: VmArgs,
        /// Directory for local state (the guest image is looked for under it).
        #[arg(long, env = "CODEROOM_DATA_DIR", default_value = "./data")]
        data_dir: PathBuf,
    },
    /// The VM guest image.
    Image {
        #[command(subcommand)]
        command: ImageCommand,
    },
    /// Run a sandbox host: the sandbox backends of this machine, served to room servers
    /// (`serve --sandbox-hosts`) over mutual TLS.
    SandboxHost(Box<SandboxHostArgs>),
    /// Issue a certificate and key for a sandbox host or a room server, signed by the
    /// sandbox hosts' authority in DIR (made there, `ca.pem` and `ca.key`, when missing).
    Certs {
        /// Where the authority is kept and the certificate goes (`NAME.pem`, `NAME.key`).
        #[arg(long)]
        dir: PathBuf,
        /// The certificate's name (its file names and common name).
        #[arg(long)]
        name: String,
        /// What it is for: a sandbox host serves with it (and cannot connect to hosts with
        /// it), a room server connects with it (and cannot serve with it).
        #[arg(long, value_enum)]
        role: CertRole,
        /// Names a sandbox host is reached by (DNS names or IP addresses; repeat the flag).
        #[arg(long)]
        san: Vec<String>,
    },
    /// Benchmarks an operator runs on their own host.
    Bench {
        #[command(subcommand)]
        command: BenchCommand,
    },
}

/// `coderoom bench ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum BenchCommand {
    /// One fixture through every sandbox tier this host can run (namespace, the microVM under
    /// each VMM that works here, a sandbox host when named): start, resume, fork, rooms at
    /// once, steps against the host, memory at rest, the canaries as room code, deletion and
    /// a killed server. Prints a markdown table (or JSON); exits 1 when a canary or check
    /// fails in a tier that ran, or a tier named with --tiers cannot run.
    Tiers(Box<TiersArgs>),
}

/// `coderoom bench tiers`.
#[derive(Debug, Args)]
pub(crate) struct TiersArgs {
    /// Print the report as JSON instead of markdown.
    #[arg(long)]
    pub json: bool,
    /// The short fixture (as CI runs it): fewer repeats, 3 rooms at once instead of 20.
    #[arg(long)]
    pub short: bool,
    /// Only these tiers (comma-separated): namespace, microvm-qemu, microvm-cloud-hypervisor,
    /// sandbox-host. Default: every tier, each one this host cannot run reported with why.
    #[arg(long, value_delimiter = ',')]
    pub tiers: Vec<String>,
    /// Rooms created at once (default 20; 3 with --short).
    #[arg(long)]
    pub burst: Option<usize>,
    /// Work directory for the servers it starts (default: a new one under the system's
    /// temporary directory, removed at the end).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Keep the work directory (the servers' data and logs).
    #[arg(long)]
    pub keep: bool,
    /// The data directory of this host's server: when it exists, the report is recorded there
    /// (`tiers-last.json`) and every sandbox's receipt names the last run of its tier.
    #[arg(long, env = "CODEROOM_DATA_DIR", default_value = "./data")]
    pub data_dir: PathBuf,
    /// Where the guest image is (as `serve --image-dir`; default ./data/images).
    #[arg(long, env = "CODEROOM_IMAGE_DIR")]
    pub image_dir: Option<PathBuf>,
    /// The QEMU binary (default: `qemu-system-x86_64` on PATH).
    #[arg(long, env = "CODEROOM_QEMU_BIN")]
    pub qemu_bin: Option<PathBuf>,
    /// QEMU with software emulation, without probing KVM first.
    #[arg(long)]
    pub vm_accel_tcg: bool,
    /// The cloud-hypervisor binary (default: `cloud-hypervisor` on PATH).
    #[arg(long, env = "CODEROOM_CLOUD_HYPERVISOR_BIN")]
    pub cloud_hypervisor_bin: Option<PathBuf>,
    /// Sandbox hosts for the sandbox-host tier (as `serve --sandbox-hosts`).
    #[arg(long, value_delimiter = ',')]
    pub sandbox_hosts: Vec<String>,
    #[arg(long)]
    pub sandbox_host_ca: Option<PathBuf>,
    #[arg(long)]
    pub sandbox_host_cert: Option<PathBuf>,
    #[arg(long)]
    pub sandbox_host_key: Option<PathBuf>,
    /// One more argument for every server the fixture starts (repeat the flag).
    #[arg(long = "serve-arg", allow_hyphen_values = true)]
    pub serve_args: Vec<String>,
}

/// `coderoom certs --role`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum CertRole {
    /// Serves room servers (TLS server authentication only).
    SandboxHost,
    /// Connects to sandbox hosts (TLS client authentication only).
    RoomServer,
}

/// `coderoom sandbox-host`.
#[derive(Debug, Args)]
pub(crate) struct SandboxHostArgs {
    /// Address to serve room servers on (behind a NetworkPolicy or firewall that lets only
    /// room servers in).
    #[arg(
        long,
        env = "CODEROOM_SANDBOX_HOST_LISTEN",
        default_value = "127.0.0.1:7443"
    )]
    pub listen: String,
    /// This host's name in placements and receipts (default: the machine's hostname).
    #[arg(long, env = "CODEROOM_SANDBOX_HOST_ID")]
    pub id: Option<String>,
    /// Sandboxes this host runs at once at most; room servers place elsewhere when it is full.
    #[arg(long, env = "CODEROOM_SANDBOX_HOST_CAPACITY", default_value_t = 16)]
    pub capacity: usize,
    /// How long a sandbox whose room server's connection broke (the server died; a clean
    /// close stops it) keeps running for that server to attach again.
    #[arg(
        long,
        env = "CODEROOM_SANDBOX_HOST_ATTACH_GRACE_MS",
        default_value_t = 120_000
    )]
    pub attach_grace_ms: u64,
    /// This host's certificate (PEM), naming the address room servers reach it by.
    #[arg(long, env = "CODEROOM_SANDBOX_HOST_TLS_CERT")]
    pub tls_cert: PathBuf,
    /// Its private key (PEM).
    #[arg(long, env = "CODEROOM_SANDBOX_HOST_TLS_KEY")]
    pub tls_key: PathBuf,
    /// The authority room servers' client certificates must be signed by (PEM).
    #[arg(long, env = "CODEROOM_SANDBOX_HOST_TLS_CA")]
    pub tls_ca: PathBuf,
    /// Sandbox tier of this host (`auto` picks the best it supports and logs why).
    #[arg(long, env = "CODEROOM_SANDBOX_TIER", value_enum, default_value_t = SandboxTier::Auto)]
    pub sandbox_tier: SandboxTier,
    #[command(flatten)]
    pub vm: VmArgs,
    /// Directory for local state (VM disks and guest images).
    #[arg(long, env = "CODEROOM_DATA_DIR", default_value = "./data")]
    pub data_dir: PathBuf,
}

#[derive(Debug, Subcommand)]
pub(crate) enum ImageCommand {
    /// Build (or reuse) the VM guest image and print its content hash.
    Build {
        /// Directory for local state (the image goes to DATA_DIR/images unless --image-dir).
        #[arg(long, env = "CODEROOM_DATA_DIR", default_value = "./data")]
        data_dir: PathBuf,
        /// Where guest images are kept (default DATA_DIR/images).
        #[arg(long, env = "CODEROOM_IMAGE_DIR")]
        image_dir: Option<PathBuf>,
        /// A `linux-image-*-cloud-amd64` package file (default: the newest in
        /// IMAGE_DIR/cache, else downloaded there with `apt-get download`).
        #[arg(long, env = "CODEROOM_KERNEL_DEB")]
        kernel_deb: Option<PathBuf>,
        /// A statically linked busybox (default /bin/busybox, Debian's busybox-static).
        #[arg(long, env = "CODEROOM_BUSYBOX")]
        busybox: Option<PathBuf>,
        /// The statically linked guest agent (default: `coderoom-agent` beside this binary;
        /// built by deploy/guest/build-agent.sh).
        #[arg(long, env = "CODEROOM_GUEST_AGENT")]
        agent: Option<PathBuf>,
    },
}

/// The microVM tier's settings (`serve` and `doctor`).
#[derive(Debug, Clone, Args)]
pub(crate) struct VmArgs {
    /// VMM for the microvm tier.
    #[arg(long, env = "CODEROOM_VMM", value_enum, default_value_t = Vmm::Auto)]
    pub vmm: Vmm,
    /// The cloud-hypervisor binary (default: `cloud-hypervisor` on PATH).
    #[arg(long, env = "CODEROOM_CLOUD_HYPERVISOR_BIN")]
    pub cloud_hypervisor_bin: Option<PathBuf>,
    /// The QEMU binary (default: `qemu-system-x86_64` on PATH).
    #[arg(long, env = "CODEROOM_QEMU_BIN")]
    pub qemu_bin: Option<PathBuf>,
    /// QEMU's accelerator: `auto` uses KVM when a probe guest boots under it, else software
    /// emulation (only with `--vmm qemu`).
    #[arg(long, env = "CODEROOM_VM_ACCEL", value_enum, default_value_t = VmAccel::Auto)]
    pub vm_accel: VmAccel,
    /// Where guest images are kept (default DATA_DIR/images); `serve` builds one on first
    /// need when the microvm tier is asked for by name.
    #[arg(long, env = "CODEROOM_IMAGE_DIR")]
    pub image_dir: Option<PathBuf>,
    /// For an image built on first need: the static guest agent (default: `coderoom-agent`
    /// beside this binary; built by deploy/guest/build-agent.sh).
    #[arg(long, env = "CODEROOM_GUEST_AGENT")]
    pub guest_agent: Option<PathBuf>,
    /// For an image built on first need: a `linux-image-*-cloud-amd64` package file (default:
    /// fetched with `apt-get download`).
    #[arg(long, env = "CODEROOM_KERNEL_DEB")]
    pub kernel_deb: Option<PathBuf>,
}

impl VmArgs {
    /// The tier's settings for a server whose data directory is `data_dir`.
    pub(crate) fn config(&self, data_dir: &std::path::Path) -> coderoom_sandbox::vm::VmConfig {
        use coderoom_sandbox::vm::{Accel, VmmKind};
        coderoom_sandbox::vm::VmConfig {
            vmm: match self.vmm {
                Vmm::Auto => None,
                Vmm::CloudHypervisor => Some(VmmKind::CloudHypervisor),
                Vmm::Qemu => Some(VmmKind::Qemu),
            },
            accel: match self.vm_accel {
                VmAccel::Auto => None,
                VmAccel::Kvm => Some(Accel::Kvm),
                VmAccel::Tcg => Some(Accel::Tcg),
            },
            cloud_hypervisor_bin: self.cloud_hypervisor_bin.clone(),
            qemu_bin: self.qemu_bin.clone(),
            image_dir: self
                .image_dir
                .clone()
                .unwrap_or_else(|| data_dir.join("images")),
            state_dir: vm_state_dir(data_dir),
            inputs: coderoom_sandbox::vm::Inputs {
                kernel_deb: self.kernel_deb.clone(),
                busybox: None,
                agent: self.guest_agent.clone(),
            },
            build_on_need: true,
        }
    }
}

/// Where the microVM tier keeps its VMs' directories (`NAME-PID-N`, each with its workspace
/// disk).
pub(crate) fn vm_state_dir(data_dir: &std::path::Path) -> std::path::PathBuf {
    data_dir.join("vms")
}

/// `--vm-accel`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum VmAccel {
    Auto,
    Kvm,
    Tcg,
}

#[derive(Debug, Subcommand)]
pub(crate) enum AuditCommand {
    /// Verify every hash chain (or one room's) against the stored checkpoints; exits non-zero
    /// naming the first bad record.
    Verify {
        /// Only this room's chain.
        #[arg(long)]
        room: Option<String>,
        /// Check links and hashes only, for chains without a checkpoint (the checkpoint file
        /// is missing or lacks them). A chain whose last records were deleted then passes:
        /// without a checkpoint, truncation cannot be detected.
        #[arg(long)]
        no_checkpoint: bool,
        /// Also check every chain against the heads anchored in this file (written by
        /// `serve --audit-anchor-file`): catches a chain rewritten together with its checkpoint.
        #[arg(long)]
        anchor: Option<PathBuf>,
        #[command(flatten)]
        storage: StorageArgs,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum SecretsCommand {
    /// Seal every secret again under a new key (stop the server first). Run again if it was
    /// interrupted: it finishes the same rotation.
    RotateKey {
        #[command(flatten)]
        storage: StorageArgs,
        /// Defaults to `DATA_DIR/secret.key`.
        #[arg(long, env = "CODEROOM_SECRET_KEY_FILE")]
        secret_key_file: Option<PathBuf>,
    },
    /// Open every secret with the key (values are never shown); exits non-zero if one does not.
    Verify {
        #[command(flatten)]
        storage: StorageArgs,
        /// Defaults to `DATA_DIR/secret.key`.
        #[arg(long, env = "CODEROOM_SECRET_KEY_FILE")]
        secret_key_file: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum AdminCommand {
    /// Create (if needed) the user with this email and print a new bearer token for it.
    Token {
        #[arg(long)]
        email: String,
        /// Token lifetime in seconds.
        #[arg(long, default_value_t = 30 * 24 * 3600)]
        ttl_s: u64,
        #[command(flatten)]
        storage: StorageArgs,
    },
}

#[derive(Debug, Clone, Args)]
pub(crate) struct StorageArgs {
    /// Directory for the embedded database and other local state.
    #[arg(long, env = "CODEROOM_DATA_DIR", default_value = "./data")]
    pub data_dir: PathBuf,
    /// `sqlite://PATH` or `postgres://...`; defaults to SQLite inside the data directory.
    #[arg(long, env = "CODEROOM_DATABASE_URL")]
    pub database_url: Option<String>,
    /// What an acknowledged edit survives on SQLite: `full` (default), a power cut too;
    /// `normal`, the server process dying (kill -9) but not the machine losing power, for
    /// operators who accept losing the last moments on a power cut in exchange for fewer
    /// fsyncs (see docs/benchmarks.md).
    #[arg(long, env = "CODEROOM_SQLITE_SYNCHRONOUS", value_enum, default_value_t = SqliteSynchronous::Full)]
    pub sqlite_synchronous: SqliteSynchronous,
}

/// `--sqlite-synchronous`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum SqliteSynchronous {
    Full,
    Normal,
}

impl SqliteSynchronous {
    pub(crate) fn durability(self) -> crate::store::Durability {
        match self {
            SqliteSynchronous::Full => crate::store::Durability::PowerLoss,
            SqliteSynchronous::Normal => crate::store::Durability::Crash,
        }
    }
}

impl StorageArgs {
    /// `file`, or the secret key's place in the data directory.
    pub(crate) fn secret_key_path(&self, file: Option<&std::path::Path>) -> PathBuf {
        file.map_or_else(
            || self.data_dir.join("secret.key"),
            std::path::Path::to_path_buf,
        )
    }

    pub(crate) fn database_url(&self) -> String {
        match &self.database_url {
            Some(url) => url.clone(),
            None => format!("sqlite://{}", self.data_dir.join("coderoom.db").display()),
        }
    }
}

#[derive(Debug, Clone, Args)]
pub(crate) struct ServeArgs {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, env = "CODEROOM_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    #[command(flatten)]
    pub storage: StorageArgs,
    /// Origin used for links and the WebSocket Origin check.
    #[arg(long, env = "CODEROOM_PUBLIC_URL")]
    pub public_url: Option<String>,
    /// SMTP relay (lettre URL syntax); without it mail goes to DATA_DIR/outbox.
    #[arg(long, env = "CODEROOM_SMTP_URL")]
    pub smtp_url: Option<String>,
    /// PEM certificates of authorities the mailer trusts for the SMTP relay's certificate,
    /// besides the Mozilla roots (a relay with a private authority's certificate; for
    /// `smtps://` and `smtp://...?tls=required`).
    #[arg(long, env = "CODEROOM_SMTP_CA_FILE")]
    pub smtp_ca_file: Option<PathBuf>,
    /// Comma-separated system admin emails.
    #[arg(long, env = "CODEROOM_ADMIN_EMAILS", value_delimiter = ',')]
    pub admin_emails: Vec<String>,
    /// Sandbox tier (`auto` picks the best the host supports and logs why).
    #[arg(long, env = "CODEROOM_SANDBOX_TIER", value_enum, default_value_t = SandboxTier::Auto)]
    pub sandbox_tier: SandboxTier,
    #[command(flatten)]
    pub vm: VmArgs,
    #[arg(long, env = "CODEROOM_SANDBOX_ROOTFS")]
    pub sandbox_rootfs: Option<PathBuf>,
    /// Sandbox hosts (`coderoom sandbox-host`) to place rooms' sandboxes on, comma-separated
    /// `host:port`, instead of running them in this process; `--sandbox-tier` names the tier
    /// they must run.
    #[arg(long, env = "CODEROOM_SANDBOX_HOSTS", value_delimiter = ',')]
    pub sandbox_hosts: Vec<String>,
    /// The authority sandbox hosts' certificates are signed by (PEM).
    #[arg(long, env = "CODEROOM_SANDBOX_HOST_CA", requires = "sandbox_hosts")]
    pub sandbox_host_ca: Option<PathBuf>,
    /// This server's client certificate for sandbox hosts (PEM).
    #[arg(long, env = "CODEROOM_SANDBOX_HOST_CERT", requires = "sandbox_hosts")]
    pub sandbox_host_cert: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long, env = "CODEROOM_SANDBOX_HOST_KEY", requires = "sandbox_hosts")]
    pub sandbox_host_key: Option<PathBuf>,
    /// A file outside the data directory (append-only storage, another disk) where every
    /// chain's head is appended at each start and stop, for `coderoom audit verify --anchor`.
    #[arg(long, env = "CODEROOM_AUDIT_ANCHOR_FILE")]
    pub audit_anchor_file: Option<PathBuf>,
    /// Separate origin that previews are served from: `http://{id}.preview.localhost:8081`
    /// (the host must start with `{id}.`; in production a wildcard DNS name with a wildcard
    /// certificate, on another host than the app). Previews are off without it.
    #[arg(long, env = "CODEROOM_PREVIEW_URL")]
    pub preview_url: Option<String>,
    /// The E2B SDKs' own address shape (`docs/e2b.md`): with `e2b.example.com`, a harness sets
    /// only `E2B_API_KEY` and `E2B_DOMAIN=e2b.example.com`; `api.e2b.example.com` is the
    /// control plane, `49983-{room}.e2b.example.com` a room's envd, `{port}-{room}....` its
    /// ports (`get_host`). Wildcard DNS and a wildcard certificate for it point at this server
    /// (TLS ends at the proxy in front, as for previews). Without it, rooms' ports are
    /// `{port}-{room}.` names of the preview origin (`--preview-url`).
    #[arg(long, env = "CODEROOM_E2B_DOMAIN")]
    pub e2b_domain: Option<String>,
    /// Where the preview origin listens (default: 127.0.0.1 and the port of `--preview-url`).
    #[arg(long, env = "CODEROOM_PREVIEW_LISTEN")]
    pub preview_listen: Option<String>,
    /// Requests per second one public preview answers (a burst of ten times that); more get
    /// `429` with `Retry-After`. Room previews are for members and are not bounded.
    #[arg(long, env = "CODEROOM_PREVIEW_RATE", default_value_t = 20)]
    pub preview_rate: u32,
    /// Bytes per second one public preview sends, all its viewers together (a burst of one
    /// second's worth); faster readers are slowed, never cut.
    #[arg(long, env = "CODEROOM_PREVIEW_BANDWIDTH", default_value_t = 5_000_000)]
    pub preview_bandwidth: u64,
    /// Where the other servers sharing this database reach this one (`http://10.0.0.5:8080`):
    /// connections to a room this server owns are forwarded there (scale-out). Default: `http://`
    /// and the listen address, which must then not be a wildcard address.
    #[arg(long, env = "CODEROOM_INTERNAL_URL")]
    pub internal_url: Option<String>,
    /// This server's name in room leases (default: made once and kept in `DATA_DIR/server-id`).
    /// Each server sharing a database needs its own, the same across its restarts (so that it
    /// takes its rooms back at once): in Kubernetes, the pod's name. 1-128 letters, digits,
    /// `.`, `_`, `-`.
    #[arg(long, env = "CODEROOM_SERVER_ID")]
    pub server_id: Option<String>,
    /// How long a server's ownership of a loaded room lasts without renewal, in milliseconds
    /// (renewed every third of it): after a server dies, its rooms move to another server once
    /// this has passed.
    #[arg(long, env = "CODEROOM_ROOM_LEASE_MS", default_value_t = 10_000,
          value_parser = clap::value_parser!(i64).range(1000..=600_000))]
    pub room_lease_ms: i64,
    /// Comma-separated CIDRs whose X-Forwarded-For is trusted.
    #[arg(long, env = "CODEROOM_TRUSTED_PROXIES", value_delimiter = ',')]
    pub trusted_proxies: Vec<String>,
    /// The key room secrets are sealed with (generated, mode 0600, on first start); defaults
    /// to `DATA_DIR/secret.key`. Keep it apart from database backups.
    #[arg(long, env = "CODEROOM_SECRET_KEY_FILE")]
    pub secret_key_file: Option<PathBuf>,
    /// How often the egress proxy writes each room's aggregated record of its connections
    /// (allowed and refused) to the audit chain.
    #[arg(long, env = "CODEROOM_EGRESS_AUDIT_EVERY_MS", default_value_t = 60_000)]
    pub egress_audit_every_ms: u64,
    /// How often each room's metered use (sandbox seconds, commands, egress bytes, model
    /// tokens, tool calls) is written to its audit chain as one `metered` record (also before
    /// `GET /api/rooms/{id}/spend` answers, and at shutdown). Budgets are enforced at once,
    /// whatever this is.
    #[arg(long, env = "CODEROOM_SPEND_FLUSH_MS", default_value_t = 30_000)]
    pub spend_flush_ms: u64,
    /// PEM certificates of authorities the egress proxy trusts for upstreams, besides the
    /// Mozilla roots it ships with (a private registry's authority; tests use it too).
    #[arg(long, env = "CODEROOM_EGRESS_EXTRA_CA")]
    pub egress_extra_ca: Option<PathBuf>,
    /// For tests: `NAME=ADDR[+ADDR...]` makes the egress proxy resolve NAME to those addresses
    /// (checked like any DNS answer), `NAME=IP:PORT` to a stand-in server (not checked). Only
    /// in builds with the `egress-test-resolve` feature (the tests' own): a production build
    /// has no flag that skips an egress check.
    #[cfg(feature = "egress-test-resolve")]
    #[arg(long, value_delimiter = ',', hide = true)]
    pub egress_test_resolve: Vec<String>,
    /// Log format (logs go to stderr).
    #[arg(long, env = "CODEROOM_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// For the comparison in docs/benchmarks.md only: SQLite's own WAL checkpoints, inside
    /// whichever commit crosses 1,000 pages, instead of the checkpointer's beside the commits.
    #[arg(long, hide = true)]
    pub sqlite_inline_checkpoint: bool,
    /// For the comparison in docs/benchmarks.md only: most rooms' batches the update log's
    /// writer takes into one transaction (1: a transaction per room's batch, as before group
    /// commit). At most, and by default, the store's own bound.
    #[arg(long, hide = true, default_value_t = crate::store::MAX_COMMIT_GROUP)]
    pub max_commit_group: usize,
    /// For the comparison in docs/benchmarks.md only: an `INSERT` per update-log row inside a
    /// transaction, as before multi-row inserts.
    #[arg(long, hide = true)]
    pub log_row_each: bool,
    /// For the comparison in docs/benchmarks.md only: the SQLite update log written through
    /// a pool connection on the server's runtime (sqlx's worker thread), not by a thread of
    /// its own.
    #[arg(long, hide = true)]
    pub log_on_pool: bool,
    /// How many WAL frames (4 KiB pages) SQLite's WAL holds before the update log's writer
    /// copies the rest of a checkpoint between two of its groups, so the WAL starts over (0:
    /// never, for the comparison in docs/benchmarks.md: under steady writes the WAL then grows
    /// until the writes pause).
    #[arg(long, hide = true, default_value_t = crate::store::WAL_RESTART_FRAMES)]
    pub sqlite_wal_restart_frames: i64,
    #[command(flatten)]
    pub limits: Limits,
    #[command(flatten)]
    pub sandbox: SandboxArgs,
}

/// Room sandbox sizing and the shared terminal's bounds.
#[derive(Debug, Clone, Args)]
pub(crate) struct SandboxArgs {
    /// Memory of one sandbox (its processes, /tmp and the workspace), in MiB.
    #[arg(long, env = "CODEROOM_SANDBOX_MEMORY_MB", default_value_t = 1024)]
    pub sandbox_memory_mb: u64,
    /// Processes and threads one sandbox may run at once (stops fork bombs).
    #[arg(long, env = "CODEROOM_SANDBOX_PIDS", default_value_t = 512)]
    pub sandbox_pids: u64,
    /// CPU one sandbox may use, in thousandths of a core.
    #[arg(long, env = "CODEROOM_SANDBOX_CPU_MILLIS", default_value_t = 1000)]
    pub sandbox_cpu_millis: u64,
    /// Workspace quota, in MiB.
    #[arg(long, env = "CODEROOM_SANDBOX_WORKSPACE_MB", default_value_t = 512)]
    pub sandbox_workspace_mb: u64,
    /// A sandbox with no terminal open and no operation for this long is snapshotted and stopped.
    #[arg(long, env = "CODEROOM_SANDBOX_IDLE_MS", default_value_t = 15 * 60 * 1000)]
    pub sandbox_idle_ms: u64,
    /// A running sandbox's workspace is snapshotted this often, so a crash of the server loses
    /// at most this much of what is not in the document.
    #[arg(long, env = "CODEROOM_SANDBOX_SNAPSHOT_EVERY_MS", default_value_t = 10 * 60 * 1000)]
    pub sandbox_snapshot_every_ms: u64,
    /// Terminal output kept for viewers who join later (replayed on join).
    #[arg(long, env = "CODEROOM_TERMINAL_SCROLLBACK_BYTES", default_value_t = 1 << 20)]
    pub terminal_scrollback_bytes: usize,
    /// Terminal output passed on per second; a program writing faster is slowed down.
    #[arg(long, env = "CODEROOM_TERMINAL_OUTPUT_BYTES_PER_S", default_value_t = 8 << 20)]
    pub terminal_output_bytes_per_s: u64,
    /// Largest terminal recording (asciicast plus input attribution) kept per room.
    #[arg(long, env = "CODEROOM_RECORDING_MAX_BYTES", default_value_t = 64 << 20)]
    pub recording_max_bytes: u64,
    /// Sandboxes kept started and unassigned, so a room's first command runs about as soon as
    /// in a running room (each is used once, by one room; at most 16). `auto`: one where the
    /// host has memory available for four sandboxes (`--sandbox-memory-mb` plus
    /// `--sandbox-workspace-mb` each) when the server starts, else none.
    #[arg(long, env = "CODEROOM_SANDBOX_WARM_POOL", default_value = "auto", value_parser = WarmPool::parse)]
    pub sandbox_warm_pool: WarmPool,
    /// What a stopped microVM sandbox keeps for its next start, beside its snapshot: `disk`
    /// (the next start boots from it, nothing restored), `memory` (the disk and the guest's
    /// memory: the next start carries on with every process running; the disk alone where
    /// the VMM cannot save its guest), or `none` (the snapshot is restored into a new disk).
    #[arg(long, env = "CODEROOM_SANDBOX_KEEP", value_enum, default_value_t = SandboxKeep::Disk)]
    pub sandbox_keep: SandboxKeep,
}

/// `--sandbox-warm-pool`: `auto` or a number of sandboxes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WarmPool {
    Auto,
    Size(usize),
}

impl WarmPool {
    fn parse(s: &str) -> Result<WarmPool, NotWarmPool> {
        match s {
            "auto" => Ok(WarmPool::Auto),
            n => n
                .parse()
                .map(WarmPool::Size)
                .map_err(|_| NotWarmPool(n.to_owned())),
        }
    }
}

/// A `--sandbox-warm-pool` value that is neither `auto` nor a number.
#[derive(Debug, thiserror::Error)]
#[error("expected `auto` or a number of sandboxes, not {0:?}")]
pub(crate) struct NotWarmPool(String);

/// `--sandbox-keep`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum SandboxKeep {
    None,
    Disk,
    Memory,
}

impl SandboxKeep {
    /// What to ask a stopping sandbox to keep.
    pub(crate) fn keep(self) -> Option<coderoom_sandbox::Keep> {
        match self {
            SandboxKeep::None => None,
            SandboxKeep::Disk => Some(coderoom_sandbox::Keep::Disk),
            SandboxKeep::Memory => Some(coderoom_sandbox::Keep::Memory),
        }
    }
}

impl Default for SandboxArgs {
    fn default() -> Self {
        SandboxArgs {
            sandbox_memory_mb: 1024,
            sandbox_pids: 512,
            sandbox_cpu_millis: 1000,
            sandbox_workspace_mb: 512,
            sandbox_idle_ms: 15 * 60 * 1000,
            sandbox_snapshot_every_ms: 10 * 60 * 1000,
            terminal_scrollback_bytes: 1 << 20,
            terminal_output_bytes_per_s: 8 << 20,
            recording_max_bytes: 64 << 20,
            sandbox_warm_pool: WarmPool::Auto,
            sandbox_keep: SandboxKeep::Disk,
        }
    }
}

impl SandboxArgs {
    /// How many sandboxes the warm pool keeps, `available` being the host's available memory
    /// in bytes (`None`: unknown, then `auto` keeps none).
    pub(crate) fn warm_pool_size(&self, available: Option<u64>) -> usize {
        match self.sandbox_warm_pool {
            WarmPool::Size(n) => n,
            WarmPool::Auto => {
                let one = (self.sandbox_memory_mb + self.sandbox_workspace_mb) << 20;
                usize::from(available.is_some_and(|a| a >= one.saturating_mul(4)))
            }
        }
    }

    /// The limits every sandbox starts with.
    pub(crate) fn limits(&self) -> coderoom_sandbox::Limits {
        coderoom_sandbox::Limits {
            memory_bytes: self.sandbox_memory_mb << 20,
            pids: self.sandbox_pids,
            cpu_millis: self.sandbox_cpu_millis,
            workspace_bytes: self.sandbox_workspace_mb << 20,
        }
    }
}

/// Shortest schedule of checkpoints a room may set: each writes the document and the workspace
/// archive to disk and only the last 20 are kept, so a tighter one would churn the disk and
/// keep too short a span to go back to.
const CHECKPOINT_MIN_EVERY_MS: i64 = 5 * 60 * 1000;

/// Bounds on what one client or one room may use. Defaults suit a real deployment; tests lower
/// them to reach the edges quickly.
#[derive(Debug, Clone, Args)]
pub(crate) struct Limits {
    /// Largest WebSocket message accepted (bigger closes with 1009). Fits a large paste.
    #[arg(long, env = "CODEROOM_MAX_MESSAGE_BYTES", default_value_t = 2 << 20)]
    pub max_message_bytes: usize,
    /// Largest stored document (snapshot plus log); updates beyond it are refused with 1008.
    #[arg(long, env = "CODEROOM_MAX_DOC_BYTES", default_value_t = 64 << 20)]
    pub max_doc_bytes: usize,
    /// Largest awareness (presence) state of one client, in bytes of JSON.
    #[arg(long, env = "CODEROOM_MAX_AWARENESS_ENTRY_BYTES", default_value_t = 4 << 10)]
    pub max_awareness_entry_bytes: usize,
    /// Awareness client ids one connection may own (a tab normally has one).
    #[arg(
        long,
        env = "CODEROOM_MAX_AWARENESS_CLIENTS_PER_CONN",
        default_value_t = 4
    )]
    pub max_awareness_clients_per_conn: usize,
    /// Connections one room accepts at once.
    #[arg(long, env = "CODEROOM_MAX_CONNECTIONS_PER_ROOM", default_value_t = 256)]
    pub max_connections_per_room: usize,
    /// Bytes queued for one connection before it is considered stuck and dropped.
    #[arg(long, env = "CODEROOM_OUTBOUND_QUEUE_BYTES", default_value_t = 8 << 20)]
    pub outbound_queue_bytes: usize,
    /// A client that accepts no byte of a frame for this long is dropped.
    #[arg(long, env = "CODEROOM_WRITE_STALL_MS", default_value_t = 30_000)]
    pub write_stall_ms: u64,
    /// A room with no connections for this long is flushed and unloaded.
    #[arg(long, env = "CODEROOM_ROOM_IDLE_MS", default_value_t = 30_000)]
    pub room_idle_ms: u64,
    /// Requests to /api/auth/* one client address may make in a burst.
    #[arg(long, env = "CODEROOM_AUTH_BURST", default_value_t = 10)]
    pub auth_burst: u32,
    /// One more /api/auth/* request is allowed per client address every this many ms.
    #[arg(long, env = "CODEROOM_AUTH_REPLENISH_MS", default_value_t = 6_000)]
    pub auth_replenish_ms: u64,
    /// Fold the update log into the snapshot after this many logged updates.
    #[arg(long, env = "CODEROOM_COMPACT_EVERY", default_value_t = 1_000)]
    pub compact_every: u64,
    /// Workspace files mirrored into one room's document; past it files stay on disk only,
    /// and the room's sandbox panel says how many.
    #[arg(long, env = "CODEROOM_MAX_SYNCED_FILES", default_value_t = 5_000)]
    pub max_synced_files: usize,
    /// Tool calls one caller (an agent) may make on the MCP endpoint a second, in bursts of
    /// five times that; more are refused with a tool error saying when to try again.
    #[arg(long, env = "CODEROOM_AGENT_TOOL_CALLS_PER_S", default_value_t = 10)]
    pub agent_tool_calls_per_s: u32,
    /// Shortest schedule of checkpoints a room may set, in milliseconds; tests lower it to see
    /// scheduled checkpoints within seconds.
    #[arg(long, hide = true, default_value_t = CHECKPOINT_MIN_EVERY_MS)]
    pub checkpoint_min_every_ms: i64,
    /// For the comparison in docs/benchmarks.md only: a flush of a client's socket per frame,
    /// instead of queued frames written together.
    #[arg(long, hide = true)]
    pub write_each_frame: bool,
    /// For the comparison in docs/benchmarks.md only: a room's updates encoded after yrs merges
    /// the new blocks into their neighbours (`observe_update_v1`), instead of before.
    #[arg(long, hide = true)]
    pub encode_after_merge: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_message_bytes: 2 << 20,
            max_doc_bytes: 64 << 20,
            max_awareness_entry_bytes: 4 << 10,
            max_awareness_clients_per_conn: 4,
            max_connections_per_room: 256,
            outbound_queue_bytes: 8 << 20,
            room_idle_ms: 30_000,
            write_stall_ms: 30_000,
            compact_every: 1_000,
            max_synced_files: 5_000,
            auth_burst: 10,
            auth_replenish_ms: 6_000,
            agent_tool_calls_per_s: 10,
            checkpoint_min_every_ms: CHECKPOINT_MIN_EVERY_MS,
            write_each_frame: false,
            encode_after_merge: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_defaults_match_flag_defaults() {
        let cli = Cli::parse_from(["coderoom", "serve"]);
        let Command::Serve(args) = cli.command else {
            panic!("expected serve");
        };
        let d = Limits::default();
        assert_eq!(args.limits.max_message_bytes, d.max_message_bytes);
        assert_eq!(args.limits.max_doc_bytes, d.max_doc_bytes);
        assert_eq!(args.limits.outbound_queue_bytes, d.outbound_queue_bytes);
        assert_eq!(args.limits.room_idle_ms, d.room_idle_ms);
        assert_eq!(args.listen.to_string(), "127.0.0.1:8080");
        let s = SandboxArgs::default();
        assert_eq!(args.sandbox.limits(), s.limits());
        assert_eq!(args.sandbox.sandbox_idle_ms, s.sandbox_idle_ms);
        assert_eq!(
            args.sandbox.sandbox_snapshot_every_ms,
            s.sandbox_snapshot_every_ms
        );
        assert_eq!(
            args.sandbox.terminal_scrollback_bytes,
            s.terminal_scrollback_bytes
        );
        assert_eq!(args.sandbox.recording_max_bytes, s.recording_max_bytes);
        assert_eq!(args.sandbox.sandbox_warm_pool, s.sandbox_warm_pool);
        assert_eq!(args.storage.database_url(), "sqlite://./data/coderoom.db");
    }

    #[test]
    fn the_warm_pool_is_on_where_the_host_has_room_for_it() {
        let parse = |v: &str| {
            let cli = Cli::try_parse_from(["coderoom", "serve", "--sandbox-warm-pool", v])?;
            let Command::Serve(args) = cli.command else {
                panic!("expected serve");
            };
            Ok::<_, clap::Error>(args.sandbox)
        };
        let gib = 1u64 << 30;
        // Auto (the default): four sandboxes' worth (1 GiB + 512 MiB each by default).
        let auto = SandboxArgs::default();
        assert_eq!(auto.sandbox_warm_pool, WarmPool::Auto);
        assert_eq!(auto.warm_pool_size(Some(24 * gib)), 1);
        assert_eq!(auto.warm_pool_size(Some(6 * gib)), 1);
        assert_eq!(auto.warm_pool_size(Some(6 * gib - 1)), 0);
        assert_eq!(auto.warm_pool_size(None), 0);
        let small = SandboxArgs {
            sandbox_memory_mb: 256,
            sandbox_workspace_mb: 256,
            ..SandboxArgs::default()
        };
        assert_eq!(small.warm_pool_size(Some(2 * gib)), 1);
        // A number is kept whatever the host has.
        let two = parse("2").expect("a number");
        assert_eq!(two.warm_pool_size(None), 2);
        assert_eq!(parse("0").expect("zero").warm_pool_size(Some(24 * gib)), 0);
        assert_eq!(
            parse("auto").expect("auto").sandbox_warm_pool,
            WarmPool::Auto
        );
        let bad = match parse("lots") {
            Ok(_) => panic!("a word that is not `auto` was taken"),
            Err(e) => e.to_string(),
        };
        assert!(bad.contains("expected `auto` or a number"), "{bad}");
    }
}

/// `--sandbox-tier`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum SandboxTier {
    /// The best tier this host supports.
    Auto,
    /// Linux namespaces, seccomp and cgroups (bubblewrap).
    Namespace,
    /// A microVM per room (cloud-hypervisor, or QEMU).
    Microvm,
    /// No sandbox: terminal and exec answer 503.
    None,
}

impl SandboxTier {
    pub(crate) fn tier(self) -> coderoom_sandbox::Tier {
        match self {
            SandboxTier::Auto => coderoom_sandbox::Tier::Auto,
            SandboxTier::Namespace => coderoom_sandbox::Tier::Namespace,
            SandboxTier::Microvm => coderoom_sandbox::Tier::Microvm,
            SandboxTier::None => coderoom_sandbox::Tier::None,
        }
    }
}

/// `--vmm`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Vmm {
    Auto,
    CloudHypervisor,
    Qemu,
}

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

impl ServeArgs {
    /// How the store is opened: its durability, and the benchmarks' comparison levers.
    pub(crate) fn store_options(&self) -> crate::store::Options {
        crate::store::Options {
            durability: self.storage.sqlite_synchronous.durability(),
            inline_checkpoints: self.sqlite_inline_checkpoint,
            max_commit_group: self.max_commit_group,
            multi_row: !self.log_row_each,
            log_on_pool: self.log_on_pool,
            wal_restart_frames: self.sqlite_wal_restart_frames,
        }
    }

    /// Where the key that seals room secrets is.
    pub(crate) fn secret_key_path(&self) -> PathBuf {
        self.storage
            .secret_key_path(self.secret_key_file.as_deref())
    }
}
