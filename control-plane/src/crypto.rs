//! At-rest encryption of secret values: AES-256-GCM, a random 96-bit nonce per value, stored
//! as base64 of `nonce || ciphertext || tag`.

use aes_gcm::aead::{Aead, KeyInit};
use aes_gcm::{Aes256Gcm, Key, Nonce};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
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

/// An AES-256-GCM key.
#[derive(Clone)]
pub struct Cipher(Aes256Gcm);

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
        Self(Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(&bytes)))
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
            .0
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
        self.0
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
}
