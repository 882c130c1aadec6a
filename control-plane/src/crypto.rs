//! At-rest encryption of secret values: AES-256-GCM, a random 96-bit nonce per value, stored
//! as base64 of `nonce || ciphertext || tag`. And the sessions' terminal tokens, which are never
//! stored: each is derived from the session id with a key of its own (HMAC-SHA256, RFC 2104,
//! under a key derived from the at-rest key), and only its SHA-256 hash is kept in the database.

use aes_gcm::aead::{Aead, KeyInit};
use aes_gcm::{Aes256Gcm, Key, Nonce};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::{Digest, Sha256};

/// Encryption failed or a stored value could not be decrypted (wrong key or tampering).
#[derive(Debug, thiserror::Error)]
pub enum CryptoError {
    #[error("stored value is not valid base64 or too short")]
    Malformed,
    #[error("stored value cannot be decrypted: wrong LAP_ENCRYPTION_KEY or tampered data")]
    Decrypt,
    #[error("encryption failed")]
    Encrypt,
}

/// An AES-256-GCM key, and the key terminal tokens are derived with.
#[derive(Clone)]
pub struct Cipher {
    aead: Aes256Gcm,
    token_key: [u8; 32],
}

/// The prefix of a stored token hash (`sha256:<hex>`).
pub const TOKEN_HASH_PREFIX: &str = "sha256:";

/// What the database keeps of a token: `sha256:` and the hex SHA-256 of it.
pub fn token_hash(token: &str) -> String {
    let digest = Sha256::digest(token.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("{TOKEN_HASH_PREFIX}{hex}")
}

/// Whether `presented` hashes to `stored`, in constant time (over the hashes' bytes).
pub fn token_matches(presented: &str, stored: &str) -> bool {
    use subtle::ConstantTimeEq;
    let a = token_hash(presented);
    a.len() == stored.len() && bool::from(a.as_bytes().ct_eq(stored.as_bytes()))
}

impl std::fmt::Debug for Cipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Cipher(<redacted>)")
    }
}

impl Cipher {
    /// From `LAP_ENCRYPTION_KEY`: base64 of exactly 32 bytes is used as is; any other string
    /// is hashed with SHA-256 into a key.
    pub fn from_setting(key: &str) -> Self {
        let key = key.trim();
        let bytes: [u8; 32] = match B64.decode(key) {
            Ok(raw) if raw.len() == 32 => {
                let mut k = [0u8; 32];
                k.copy_from_slice(&raw);
                k
            }
            _ => Sha256::digest(key.as_bytes()).into(),
        };
        let mut h = Sha256::new();
        h.update(b"lap tty-token key v1\0");
        h.update(bytes);
        Self {
            aead: Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(&bytes)),
            token_key: h.finalize().into(),
        }
    }

    /// The terminal token of session `session_id` (hex, 256 bits): the same on every replica
    /// that shares the at-rest key, never stored.
    pub fn tty_token(&self, session_id: &str) -> String {
        // HMAC takes a key of any length: `new_from_slice` cannot fail for it.
        let Ok(mut mac) = <Hmac<Sha256> as Mac>::new_from_slice(&self.token_key) else {
            return String::new();
        };
        mac.update(b"tty:");
        mac.update(session_id.as_bytes());
        mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// A new random key, as the base64 text stored in the key file.
    pub fn generate_setting() -> String {
        let mut k = [0u8; 32];
        rand::thread_rng().fill_bytes(&mut k);
        B64.encode(k)
    }

    /// Encrypt `plain` into stored text.
    pub fn seal(&self, plain: &[u8]) -> Result<String, CryptoError> {
        let mut nonce = [0u8; 12];
        rand::thread_rng().fill_bytes(&mut nonce);
        let ct = self
            .aead
            .encrypt(Nonce::from_slice(&nonce), plain)
            .map_err(|_| CryptoError::Encrypt)?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(&ct);
        Ok(B64.encode(out))
    }

    /// Decrypt stored text.
    pub fn open(&self, stored: &str) -> Result<Vec<u8>, CryptoError> {
        let raw = B64.decode(stored).map_err(|_| CryptoError::Malformed)?;
        if raw.len() < 12 + 16 {
            return Err(CryptoError::Malformed);
        }
        let (nonce, ct) = raw.split_at(12);
        self.aead
            .decrypt(Nonce::from_slice(nonce), ct)
            .map_err(|_| CryptoError::Decrypt)
    }

    /// Encrypt a JSON-serialisable value.
    pub fn seal_json<T: serde::Serialize>(&self, v: &T) -> Result<String, CryptoError> {
        let bytes = serde_json::to_vec(v).map_err(|_| CryptoError::Encrypt)?;
        self.seal(&bytes)
    }

    /// Decrypt a JSON value.
    pub fn open_json<T: serde::de::DeserializeOwned>(&self, stored: &str) -> Result<T, CryptoError> {
        serde_json::from_slice(&self.open(stored)?).map_err(|_| CryptoError::Malformed)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn round_trip_and_tamper() {
        let c = Cipher::from_setting(&Cipher::generate_setting());
        let s = c.seal(b"secret value").unwrap();
        assert!(!s.contains("secret"));
        assert_eq!(c.open(&s).unwrap(), b"secret value");
        assert_ne!(c.seal(b"secret value").unwrap(), s, "nonces are fresh");
        let other = Cipher::from_setting("a passphrase");
        assert!(matches!(other.open(&s), Err(CryptoError::Decrypt)));
        let mut raw = B64.decode(&s).unwrap();
        raw[20] ^= 1;
        assert!(matches!(c.open(&B64.encode(raw)), Err(CryptoError::Decrypt)));
        assert!(matches!(c.open("!!"), Err(CryptoError::Malformed)));
    }

    #[test]
    fn tty_tokens_are_derived_per_session_and_only_their_hash_is_kept() {
        let key = Cipher::generate_setting();
        let (a, b) = (Cipher::from_setting(&key), Cipher::from_setting(&key));
        let t = a.tty_token("ses_1");
        assert_eq!(t.len(), 64);
        assert_eq!(t, b.tty_token("ses_1"), "every replica derives the same token");
        assert_ne!(t, a.tty_token("ses_2"));
        assert_ne!(t, Cipher::from_setting("other key").tty_token("ses_1"));
        let stored = token_hash(&t);
        assert!(stored.starts_with(TOKEN_HASH_PREFIX));
        assert!(!stored.contains(&t));
        assert!(token_matches(&t, &stored));
        assert!(!token_matches(&a.tty_token("ses_2"), &stored));
        assert!(!token_matches("", &stored));
    }
}
