//! First-start keys (SPEC §3.1): the API master key and the at-rest encryption key, taken from
//! the settings or kept in `<data dir>/master_key` and `<data dir>/encryption_key` (0600).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use rand::Rng;

use crate::crypto::Cipher;

/// The keys the server runs with.
#[derive(Clone)]
pub struct Keys {
    pub master_key: String,
    pub encryption_key: String,
    /// The master key was generated just now (print it once).
    pub created_master_key: bool,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keys")
            .field("created_master_key", &self.created_master_key)
            .finish_non_exhaustive()
    }
}

/// A key file could not be read or written.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {source}")]
pub struct KeyFileError {
    path: String,
    #[source]
    source: std::io::Error,
}

fn read_or_create(path: &Path, make: impl FnOnce() -> String) -> Result<(String, bool), KeyFileError> {
    let err = |source| KeyFileError {
        path: path.display().to_string(),
        source,
    };
    match std::fs::read_to_string(path) {
        Ok(s) if !s.trim().is_empty() => return Ok((s.trim().to_owned(), false)),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    let key = make();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(err)?;
    f.write_all(format!("{key}\n").as_bytes()).map_err(err)?;
    Ok((key, true))
}

/// A fresh master key: `lap_` and 40 random base-62 characters.
pub fn generate_master_key() -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::thread_rng();
    let body: String = (0..40)
        .map(|_| char::from(ALPHABET[rng.gen_range(0..ALPHABET.len())]))
        .collect();
    format!("lap_{body}")
}

/// Use the given keys, else the data dir's files, creating them (0600) on first start.
pub fn load_or_create(
    data_dir: &Path,
    master_key: Option<&str>,
    encryption_key: Option<&str>,
) -> Result<Keys, KeyFileError> {
    let (master_key, created_master_key) = match master_key.filter(|k| !k.is_empty()) {
        Some(k) => (k.to_owned(), false),
        None => read_or_create(&data_dir.join("master_key"), generate_master_key)?,
    };
    let encryption_key = match encryption_key.filter(|k| !k.is_empty()) {
        Some(k) => k.to_owned(),
        None => read_or_create(&data_dir.join("encryption_key"), Cipher::generate_setting)?.0,
    };
    Ok(Keys {
        master_key,
        encryption_key,
        created_master_key,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn created_once_with_0600() {
        let dir = tempfile::tempdir().unwrap();
        let k1 = load_or_create(dir.path(), None, None).unwrap();
        assert!(k1.created_master_key);
        assert!(k1.master_key.starts_with("lap_"));
        for f in ["master_key", "encryption_key"] {
            let mode = std::fs::metadata(dir.path().join(f)).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{f}");
        }
        let k2 = load_or_create(dir.path(), None, None).unwrap();
        assert!(!k2.created_master_key);
        assert_eq!(k1.master_key, k2.master_key);
        assert_eq!(k1.encryption_key, k2.encryption_key);
        let k3 = load_or_create(dir.path(), Some("given"), Some("enc")).unwrap();
        assert_eq!((k3.master_key.as_str(), k3.encryption_key.as_str()), ("given", "enc"));
    }
}
