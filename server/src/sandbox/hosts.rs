//! Sandbox hosts (`coderoom sandbox-host`) and the mutual TLS between them and room servers.
//!
//! Both sides present a certificate signed by one authority the operator keeps (`coderoom
//! certs` makes it and issues from it; cert-manager or any other CA works as well), and each
//! checks the other's against it: a sandbox host serves only room servers, a room server
//! trusts only sandbox hosts. Why mutual TLS rather than a shared token over TLS is argued in
//! docs/design.md ("Sandbox hosts").

use crate::config::{CertRole, SandboxHostArgs};
use anyhow::Context as _;
use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The authority's common name.
const CA_NAME: &str = "Coderoom sandbox hosts authority";

/// The authority's parameters (the same each time: a certificate issued from it is checked
/// against `ca.pem` by its name and key).
fn ca_params() -> CertificateParams {
    crate::egress::tls::authority(CA_NAME)
}

/// Writes `data` to `path`, readable by its owner only.
fn write_private(path: &Path, data: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    f.write_all(data.as_bytes())?;
    f.sync_all()?;
    Ok(())
}

/// `coderoom certs`: a certificate and key for `name` (a sandbox host, named also by `sans`,
/// or a room server), signed by the authority in `dir`, which is made when missing. Returns the
/// certificate's and the key's paths.
pub(crate) fn issue(
    dir: &Path,
    name: &str,
    role: CertRole,
    sans: &[String],
) -> anyhow::Result<(PathBuf, PathBuf)> {
    if name.is_empty()
        || name == "ca"
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        || name.starts_with('.')
    {
        anyhow::bail!("--name must be letters, digits, '-', '_' or '.' (and not \"ca\")");
    }
    if role == CertRole::SandboxHost && sans.is_empty() {
        anyhow::bail!(
            "a sandbox host's certificate needs --san: the names room servers reach it by"
        );
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot make {}", dir.display()))?;
    let (ca_pem, ca_key) = (dir.join("ca.pem"), dir.join("ca.key"));
    let ca_keypair = match std::fs::read_to_string(&ca_key) {
        Ok(pem) => KeyPair::from_pem(&pem).context("ca.key is not a PEM private key")?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let key = KeyPair::generate()?;
            let cert = ca_params().self_signed(&key)?;
            write_private(&ca_key, &key.serialize_pem())?;
            std::fs::write(&ca_pem, cert.pem())?;
            key
        }
        Err(e) => return Err(e).context("cannot read ca.key"),
    };
    let ca = ca_params().self_signed(&ca_keypair)?;
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(sans.to_vec())?;
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::NoCa;
    // One use each: a host's key (on a machine that runs hostile code) cannot connect to
    // other hosts as a room server, and a room server's cannot serve as a host.
    params.extended_key_usages = vec![match role {
        CertRole::SandboxHost => ExtendedKeyUsagePurpose::ServerAuth,
        CertRole::RoomServer => ExtendedKeyUsagePurpose::ClientAuth,
    }];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::days(1);
    params.not_after = now + time::Duration::days(825);
    let cert = params.signed_by(&key, &ca, &ca_keypair)?;
    let (cert_path, key_path) = (
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}.key")),
    );
    write_private(&key_path, &key.serialize_pem())?;
    std::fs::write(&cert_path, cert.pem())?;
    Ok((cert_path, key_path))
}

/// The authority's certificates in `ca` (PEM).
fn roots(ca: &Path) -> anyhow::Result<rustls::RootCertStore> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca)
        .with_context(|| format!("cannot read {}", ca.display()))?
    {
        roots.add(cert.with_context(|| format!("{} is not PEM", ca.display()))?)?;
    }
    if roots.is_empty() {
        anyhow::bail!("{} holds no certificate", ca.display());
    }
    Ok(roots)
}

/// A certificate chain and its key.
fn identity(
    cert: &Path,
    key: &Path,
) -> anyhow::Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
    let chain = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("cannot read {}", cert.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("{} is not PEM", cert.display()))?;
    if chain.is_empty() {
        anyhow::bail!("{} holds no certificate", cert.display());
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("cannot read a private key from {}", key.display()))?;
    Ok((chain, key))
}

/// A room server's side: trusts sandbox hosts signed by `ca`, presents `cert`.
pub(crate) fn client_config(
    ca: &Path,
    cert: &Path,
    key: &Path,
) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let (chain, key) = identity(cert, key)?;
    let config = rustls::ClientConfig::builder_with_provider(crate::egress::tls::provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots(ca)?)
        .with_client_auth_cert(chain, key)?;
    Ok(Arc::new(config))
}

/// A sandbox host's side: presents `cert`, requires a client certificate signed by `ca`.
pub(crate) fn server_config(
    ca: &Path,
    cert: &Path,
    key: &Path,
) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let (chain, key) = identity(cert, key)?;
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots(ca)?),
        crate::egress::tls::provider(),
    )
    .build()?;
    let config = rustls::ServerConfig::builder_with_provider(crate::egress::tls::provider())
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)?;
    Ok(Arc::new(config))
}

/// `coderoom sandbox-host`: chooses this machine's backend, then serves it until SIGTERM or
/// SIGINT (its sandboxes end with it).
pub(crate) async fn run(args: SandboxHostArgs) -> anyhow::Result<()> {
    use coderoom_sandbox::{AgentCommand, Backend, Tier};
    let tls = server_config(&args.tls_ca, &args.tls_cert, &args.tls_key)?;
    let (agent, agent_why) = AgentCommand::beside(&std::env::current_exe()?);
    tracing::info!(agent = %agent_why, "the namespace tier's agent");
    let tier = args.sandbox_tier.tier();
    let vms = args.vm.config(&args.data_dir);
    let (backend, why) = Backend::select(tier, agent, None, &vms).await;
    if matches!(backend, Backend::None(_)) || (tier != Tier::Auto && backend.tier() != tier) {
        anyhow::bail!("this host cannot run sandboxes: {why}");
    }
    if args.capacity == 0 {
        anyhow::bail!("--capacity must be at least 1");
    }
    let id = match args.id.clone() {
        Some(id) => id,
        None => std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "sandbox-host".into()),
    };
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let bound = listener.local_addr()?;
    tracing::info!(%id, %bound, capacity = args.capacity, "{why}");
    println!("sandbox host {id} listening on {bound}");
    let host = Arc::new(
        coderoom_sandbox::remote::Host::new(backend, why, id, args.capacity, tls)
            .with_grace(std::time::Duration::from_millis(args.attach_grace_ms)),
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        () = host.serve(listener) => {}
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issued certificates verify against the authority that issued them, across separate
    /// runs of `coderoom certs` (the authority is made once and kept); a bad name is refused.
    #[test]
    fn certificates_issued_from_one_authority_make_both_ends_of_a_connection() {
        let dir = tempfile::tempdir().expect("dir");
        let (host_cert, host_key) = issue(
            dir.path(),
            "host1",
            CertRole::SandboxHost,
            &["127.0.0.1".into(), "sandbox-1".into()],
        )
        .expect("host");
        let ca = std::fs::read(dir.path().join("ca.pem")).expect("ca");
        let (server_cert, server_key) =
            issue(dir.path(), "server", CertRole::RoomServer, &[]).expect("server");
        assert_eq!(
            std::fs::read(dir.path().join("ca.pem")).expect("ca"),
            ca,
            "made once"
        );
        server_config(&dir.path().join("ca.pem"), &host_cert, &host_key).expect("host side");
        client_config(&dir.path().join("ca.pem"), &server_cert, &server_key).expect("server side");
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&host_key)
            .expect("key")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(issue(dir.path(), "ca", CertRole::RoomServer, &[]).is_err());
        assert!(issue(dir.path(), "../x", CertRole::RoomServer, &[]).is_err());
        assert!(
            issue(dir.path(), "host2", CertRole::SandboxHost, &[]).is_err(),
            "a host's certificate names the host"
        );
    }
}
