//! TLS for the egress proxy: each room's own authority, which signs certificates for the hosts
//! the proxy adds secrets to (its certificate is in the sandbox's trust bundle), and the
//! client side that checks an upstream's certificate for the host before any secret goes to it.
//!
//! A room's authority lives in memory only, for as long as the server runs: every sandbox start
//! installs the current one, and a server restart (which stops every sandbox) makes new ones.
//! Its key never leaves the control plane.

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Leaf certificates a room's authority keeps made (one per host with a secret rule).
const MAX_LEAVES: usize = 256;

/// The crypto every TLS configuration here uses.
pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// An authority's parameters: named `common_name` (organisation Coderoom), signing leaves
/// only, valid from yesterday for ten years. The same each time for the same name.
pub(crate) fn authority(common_name: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(DnType::OrganizationName, "Coderoom");
    name.push(DnType::CommonName, common_name);
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::days(1);
    params.not_after = now + time::Duration::days(3650);
    params
}

/// One room's egress authority.
pub(crate) struct RoomCa {
    cert: rcgen::Certificate,
    key: KeyPair,
    /// Its certificate, PEM (what the sandbox trusts).
    pub pem: String,
    /// Server configurations by host, each with a leaf for that host.
    leaves: Mutex<HashMap<String, Arc<rustls::ServerConfig>>>,
}

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TlsError {
    #[error("cannot make a certificate: {0}")]
    Cert(#[from] rcgen::Error),
    #[error("cannot set up TLS: {0}")]
    Tls(#[from] rustls::Error),
}

impl RoomCa {
    /// A new authority for room `room_id`, valid from yesterday for ten years (it lives no
    /// longer than the server process anyway).
    pub(crate) fn new(room_id: &str) -> Result<RoomCa, TlsError> {
        let key = KeyPair::generate()?;
        let params = authority(&format!("Coderoom egress authority for room {room_id}"));
        let cert = params.self_signed(&key)?;
        Ok(RoomCa {
            pem: cert.pem(),
            cert,
            key,
            leaves: Mutex::default(),
        })
    }

    /// A server configuration presenting a certificate for `host`, signed by this authority
    /// (made once per host). Offers HTTP/1.1 only.
    pub(crate) fn server_config(&self, host: &str) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let mut leaves = self.leaves.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = leaves.get(host) {
            return Ok(c.clone());
        }
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(vec![host.to_owned()])?;
        params.is_ca = IsCa::NoCa;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, host);
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::days(1);
        params.not_after = now + time::Duration::days(365);
        let leaf = params.signed_by(&key, &self.cert, &self.key)?;
        let chain = vec![leaf.der().clone()];
        let private = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(chain, private)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        if leaves.len() >= MAX_LEAVES {
            leaves.clear();
        }
        leaves.insert(host.to_owned(), config.clone());
        Ok(config)
    }
}

/// The client configuration for upstreams: the Mozilla roots (`webpki-roots`), plus the
/// certificates of `--egress-extra-ca` (an operator's private authority, or a test's).
pub(crate) fn client_config(extra_pem: Option<&[u8]>) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(pem) = extra_pem {
        let mut added = 0;
        for cert in CertificateDer::pem_slice_iter(pem) {
            let cert: CertificateDer<'static> = cert?;
            roots.add(cert)?;
            added += 1;
        }
        if added == 0 {
            anyhow::bail!("--egress-extra-ca holds no PEM certificate");
        }
    }
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
