//! Room secrets at rest. Each value is sealed with XChaCha20-Poly1305 (the `chacha20poly1305`
//! crate, RustCrypto's audited AEAD: no hand-written cryptography here) under the server's
//! secret key, with a fresh random 24-byte nonce, and bound to its room and name (the associated
//! data), so a sealed value copied to another row does not open. The key lives in a file outside
//! the database (`--secret-key-file`, generated on first start, mode 0600); each sealed value
//! names the key that sealed it by a digest, so a rotation interrupted half-way is finished on
//! the next one. Values leave this module only to the code that uses them (the egress proxy),
//! never to a response, a log line, an audit record or the sandbox.

use crate::store::{SealedSecret, Store, StoreError};
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use rand::RngCore;
use sha2::{Digest as _, Sha256};
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

const KEY_BYTES: usize = 32;
const NONCE_BYTES: usize = 24;

#[derive(Debug, thiserror::Error)]
pub(crate) enum SecretError {
    #[error("the secret key file {0}: {1}")]
    KeyFile(PathBuf, std::io::Error),
    #[error("the secret key file {0} is not 64 hex digits")]
    BadKey(PathBuf),
    #[error("the secret key file {0} is missing, but {1} secret(s) are stored: give the key they were sealed with (--secret-key-file), or they cannot be opened")]
    Missing(PathBuf, usize),
    #[error("secret {room}/{name} was sealed with key {key_id}, which this server does not have")]
    UnknownKey {
        room: String,
        name: String,
        key_id: String,
    },
    #[error("secret {room}/{name} does not open with its key (altered, or moved to another row)")]
    Open { room: String, name: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A secret key and its id.
struct Key {
    id: String,
    cipher: XChaCha20Poly1305,
}

impl Key {
    fn new(bytes: &[u8; KEY_BYTES]) -> Key {
        let mut h = Sha256::new();
        h.update(b"coderoom secret key id\0");
        h.update(bytes);
        Key {
            id: hex::encode(&h.finalize()[..8]),
            cipher: XChaCha20Poly1305::new(bytes.into()),
        }
    }
}

/// The server's secret keys: the current one seals; any of them opens what it sealed.
pub(crate) struct Vault {
    /// Current first.
    keys: Vec<Key>,
}

impl std::fmt::Debug for Vault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<&str> = self.keys.iter().map(|k| k.id.as_str()).collect();
        f.debug_struct("Vault").field("key_ids", &ids).finish()
    }
}

/// The rotation's new key, kept beside the current one until every value is sealed with it.
fn next_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".next");
    PathBuf::from(p)
}

fn read_key(path: &Path) -> Result<Option<[u8; KEY_BYTES]>, SecretError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(SecretError::KeyFile(path.to_owned(), e)),
    };
    let mut key = [0u8; KEY_BYTES];
    hex::decode_to_slice(text.trim(), &mut key)
        .map_err(|_| SecretError::BadKey(path.to_owned()))?;
    Ok(Some(key))
}

/// The key at `path`, which must be there.
fn existing_key(path: &Path) -> Result<[u8; KEY_BYTES], SecretError> {
    read_key(path)?.ok_or_else(|| {
        SecretError::KeyFile(
            path.to_owned(),
            std::io::Error::from(std::io::ErrorKind::NotFound),
        )
    })
}

/// Writes a new random key to `path` (which must not exist), readable by its owner only, and
/// makes it durable.
fn write_new_key(path: &Path) -> Result<[u8; KEY_BYTES], SecretError> {
    let fail = |e| SecretError::KeyFile(path.to_owned(), e);
    let mut key = [0u8; KEY_BYTES];
    rand::rngs::OsRng.fill_bytes(&mut key);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(fail)?;
    }
    // Written whole under a temporary name, then renamed: a crash never leaves a short key.
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(fail)?;
    f.write_all(format!("{}\n", hex::encode(key)).as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(fail)?;
    drop(f);
    if path.exists() {
        let _ = std::fs::remove_file(&tmp);
        return Err(fail(std::io::Error::from(
            std::io::ErrorKind::AlreadyExists,
        )));
    }
    std::fs::rename(&tmp, path).map_err(fail)?;
    sync_parent(path);
    Ok(key)
}

fn sync_parent(path: &Path) {
    if let Some(dir) = path.parent() {
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
    }
}

impl Vault {
    /// The key at `path`, made (mode 0600) if there is none yet, unless secrets are stored
    /// (`sealed` of them): a new key would open none of them, so a missing key is an error
    /// then (a wrong `--secret-key-file`, a database moved without its key). Also the new key
    /// of a rotation that did not finish, if one is there.
    pub(crate) fn open_or_create(path: &Path, sealed: usize) -> Result<Vault, SecretError> {
        if read_key(path)?.is_none() {
            if sealed > 0 {
                return Err(SecretError::Missing(path.to_owned(), sealed));
            }
            write_new_key(path)?;
            tracing::warn!(path = %path.display(), "generated the secret key: back it up; without it, room secrets cannot be opened");
        }
        Self::load(path)
    }

    /// The keys at `path` (and `path.next`), without making any.
    pub(crate) fn load(path: &Path) -> Result<Vault, SecretError> {
        let current = existing_key(path)?;
        let mut keys = vec![Key::new(&current)];
        if let Some(next) = read_key(&next_path(path))? {
            keys.push(Key::new(&next));
        }
        Ok(Vault { keys })
    }

    fn associated(room: &str, name: &str) -> Vec<u8> {
        format!("coderoom secret\0{room}\0{name}").into_bytes()
    }

    /// Seals `value` for the secret `name` of `room` with the current key.
    pub(crate) fn seal(&self, room: &str, name: &str, value: &[u8]) -> SealedSecret {
        self.seal_with(&self.keys[0], room, name, value)
    }

    fn seal_with(&self, key: &Key, room: &str, name: &str, value: &[u8]) -> SealedSecret {
        let mut nonce = [0u8; NONCE_BYTES];
        rand::rngs::OsRng.fill_bytes(&mut nonce);
        let aad = Self::associated(room, name);
        let sealed = key
            .cipher
            .encrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: value,
                    aad: &aad,
                },
            )
            // Encryption fails only for messages past 256 GiB: a value is at most 8 KiB.
            .unwrap_or_default();
        SealedSecret {
            key_id: key.id.clone(),
            nonce: nonce.to_vec(),
            sealed,
        }
    }

    /// Opens the value sealed for the secret `name` of `room`.
    pub(crate) fn open(
        &self,
        room: &str,
        name: &str,
        s: &SealedSecret,
    ) -> Result<Vec<u8>, SecretError> {
        let key =
            self.keys
                .iter()
                .find(|k| k.id == s.key_id)
                .ok_or_else(|| SecretError::UnknownKey {
                    room: room.to_owned(),
                    name: name.to_owned(),
                    key_id: s.key_id.clone(),
                })?;
        let bad = || SecretError::Open {
            room: room.to_owned(),
            name: name.to_owned(),
        };
        if s.nonce.len() != NONCE_BYTES {
            return Err(bad());
        }
        let aad = Self::associated(room, name);
        key.cipher
            .decrypt(
                XNonce::from_slice(&s.nonce),
                Payload {
                    msg: &s.sealed,
                    aad: &aad,
                },
            )
            .map_err(|_| bad())
    }
}

/// `coderoom secrets verify`: opens every stored secret with the key at `path` (values are
/// never shown). Returns how many opened, and the first failure.
pub(crate) async fn verify(
    store: &Store,
    path: &Path,
) -> Result<(usize, Option<SecretError>), SecretError> {
    let vault = Vault::load(path)?;
    let mut opened = 0;
    for (room, name, sealed) in store.sealed_secrets().await? {
        match vault.open(&room, &name, &sealed) {
            Ok(_) => opened += 1,
            Err(e) => return Ok((opened, Some(e))),
        }
    }
    Ok((opened, None))
}

/// `coderoom secrets rotate-key` (with the server stopped): a new key is written beside the
/// current one (`PATH.next`), every secret is opened and sealed again with it in one
/// transaction, then the new key takes the current one's place. Interrupted, it is run again:
/// the new key is reused and what it already sealed still opens. Returns the count re-sealed
/// and the new key's id.
pub(crate) async fn rotate(store: &Store, path: &Path) -> Result<(usize, String), SecretError> {
    let next = next_path(path);
    let current = existing_key(path)?;
    let new = match read_key(&next)? {
        Some(k) => k,
        None => write_new_key(&next)?,
    };
    let vault = Vault {
        keys: vec![Key::new(&new), Key::new(&current)],
    };
    let mut resealed = Vec::new();
    for (room, name, sealed) in store.sealed_secrets().await? {
        let value = vault.open(&room, &name, &sealed)?;
        let again = vault.seal(&room, &name, &value);
        resealed.push((room, name, sealed, again));
    }
    let count = resealed.len();
    store.reseal_secrets(resealed).await?;
    std::fs::rename(&next, path).map_err(|e| SecretError::KeyFile(path.to_owned(), e))?;
    sync_parent(path);
    Ok((count, vault.keys[0].id.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_value_opens_only_for_its_room_and_name_and_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret.key");
        let vault = Vault::open_or_create(&path, 0).unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let s = vault.seal("r1", "API", b"sk-live-123");
        assert!(!s.sealed.windows(11).any(|w| w == b"sk-live-123"));
        assert_eq!(vault.open("r1", "API", &s).unwrap(), b"sk-live-123");
        assert!(matches!(
            vault.open("r2", "API", &s),
            Err(SecretError::Open { .. })
        ));
        assert!(matches!(
            vault.open("r1", "OTHER", &s),
            Err(SecretError::Open { .. })
        ));
        let mut altered = s.clone();
        altered.sealed[0] ^= 1;
        assert!(vault.open("r1", "API", &altered).is_err());
        // The same key again from its file; another key does not open it.
        assert_eq!(
            Vault::load(&path).unwrap().open("r1", "API", &s).unwrap(),
            b"sk-live-123"
        );
        let other = Vault::open_or_create(&dir.path().join("other.key"), 0).unwrap();
        assert!(matches!(
            other.open("r1", "API", &s),
            Err(SecretError::UnknownKey { .. })
        ));
        // A malformed key file is refused, not replaced.
        std::fs::write(dir.path().join("bad.key"), "not hex").unwrap();
        assert!(matches!(
            Vault::open_or_create(&dir.path().join("bad.key"), 0),
            Err(SecretError::BadKey(_))
        ));
        // No key is made over stored secrets.
        assert!(matches!(
            Vault::open_or_create(&dir.path().join("missing.key"), 3),
            Err(SecretError::Missing(_, 3))
        ));
        assert!(!dir.path().join("missing.key").exists());
        // Nonces differ: sealing twice gives two ciphertexts.
        assert_ne!(
            vault.seal("r1", "API", b"x").sealed,
            vault.seal("r1", "API", b"x").sealed
        );
    }
}
