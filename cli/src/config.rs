//! Where `lap` finds its server and key: `LAP_URL` and `MASTER_KEY` from the environment win,
//! else the file `lap login` wrote (`$LAP_CONFIG`, else `$XDG_CONFIG_HOME/lap/config.toml`,
//! else `~/.config/lap/config.toml`; mode 0600 in a 0700 directory).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The saved login.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Saved {
    pub(crate) url: Option<String>,
    pub(crate) key: Option<String>,
}

/// A server to talk to.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Creds {
    /// Base URL without a trailing slash (`http://127.0.0.1:4000`).
    pub(crate) url: String,
    pub(crate) key: String,
}

impl std::fmt::Debug for Creds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Creds").field("url", &self.url).finish_non_exhaustive()
    }
}

/// A configuration problem.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConfigError {
    #[error("no LAP server configured: run `lap login`, or set LAP_URL and MASTER_KEY")]
    NotLoggedIn,
    #[error("{path}: {reason}")]
    File { path: String, reason: String },
    #[error("no config directory: set HOME, XDG_CONFIG_HOME or LAP_CONFIG")]
    NoHome,
}

/// The config file's path for an environment (pure: `get` reads a variable).
pub(crate) fn path_from(get: impl Fn(&str) -> Option<String>) -> Result<PathBuf, ConfigError> {
    let nonempty = |k: &str| get(k).filter(|v| !v.is_empty());
    if let Some(p) = nonempty("LAP_CONFIG") {
        return Ok(PathBuf::from(p));
    }
    if let Some(x) = nonempty("XDG_CONFIG_HOME") {
        return Ok(Path::new(&x).join("lap").join("config.toml"));
    }
    nonempty("HOME")
        .map(|h| Path::new(&h).join(".config").join("lap").join("config.toml"))
        .ok_or(ConfigError::NoHome)
}

/// The config file's path here.
pub(crate) fn path() -> Result<PathBuf, ConfigError> {
    path_from(|k| std::env::var(k).ok())
}

/// Normalise a server URL: scheme required (http or https), no trailing slash.
pub(crate) fn normalise_url(url: &str) -> Result<String, String> {
    let url = url.trim().trim_end_matches('/');
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(format!("`{url}` is not an http:// or https:// URL"));
    }
    Ok(url.to_owned())
}

/// Environment over file, per field (pure).
pub(crate) fn resolve(env_url: Option<String>, env_key: Option<String>, saved: &Saved) -> Result<Creds, ConfigError> {
    let url = env_url
        .filter(|v| !v.is_empty())
        .or_else(|| saved.url.clone())
        .ok_or(ConfigError::NotLoggedIn)?;
    let key = env_key
        .filter(|v| !v.is_empty())
        .or_else(|| saved.key.clone())
        .ok_or(ConfigError::NotLoggedIn)?;
    let url = normalise_url(&url).map_err(|reason| ConfigError::File {
        path: "LAP_URL".into(),
        reason,
    })?;
    Ok(Creds { url, key })
}

/// Read the saved login (a missing file is an empty one).
pub(crate) fn load(path: &Path) -> Result<Saved, ConfigError> {
    let err = |reason: String| ConfigError::File {
        path: path.display().to_string(),
        reason,
    };
    match std::fs::read_to_string(path) {
        Ok(text) => toml::from_str(&text).map_err(|e| err(e.to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Saved::default()),
        Err(e) => Err(err(e.to_string())),
    }
}

/// Write the login, 0600 (directory 0700), replacing the file atomically.
pub(crate) fn save(path: &Path, saved: &Saved) -> Result<(), ConfigError> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let err = |reason: String| ConfigError::File {
        path: path.display().to_string(),
        reason,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| err(e.to_string()))?;
    }
    let text = toml::to_string(saved).map_err(|e| err(e.to_string()))?;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| err(e.to_string()))?;
    f.write_all(text.as_bytes()).map_err(|e| err(e.to_string()))?;
    f.sync_all().map_err(|e| err(e.to_string()))?;
    std::fs::rename(&tmp, path).map_err(|e| err(e.to_string()))
}

/// The server and key to use now.
pub(crate) fn creds() -> Result<Creds, ConfigError> {
    let saved = load(&path()?)?;
    resolve(std::env::var("LAP_URL").ok(), std::env::var("MASTER_KEY").ok(), &saved)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn environment_wins_per_field() {
        let saved = Saved {
            url: Some("http://file:1".into()),
            key: Some("file-key".into()),
        };
        let c = resolve(Some("http://env:2/".into()), None, &saved).unwrap();
        assert_eq!((c.url.as_str(), c.key.as_str()), ("http://env:2", "file-key"));
        let c = resolve(None, Some("env-key".into()), &saved).unwrap();
        assert_eq!((c.url.as_str(), c.key.as_str()), ("http://file:1", "env-key"));
        let c = resolve(Some(String::new()), Some(String::new()), &saved).unwrap();
        assert_eq!(c.key, "file-key");
        assert!(matches!(
            resolve(None, None, &Saved::default()),
            Err(ConfigError::NotLoggedIn)
        ));
        assert!(resolve(Some("ftp://x".into()), Some("k".into()), &saved).is_err());
        assert!(!format!("{c:?}").contains("file-key"), "Debug shows the key");
    }

    #[test]
    fn config_paths() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| (*v).to_owned())
        };
        assert_eq!(
            path_from(env(&[("LAP_CONFIG", "/c.toml"), ("HOME", "/h")])).unwrap(),
            PathBuf::from("/c.toml")
        );
        assert_eq!(
            path_from(env(&[("XDG_CONFIG_HOME", "/x"), ("HOME", "/h")])).unwrap(),
            PathBuf::from("/x/lap/config.toml")
        );
        assert_eq!(
            path_from(env(&[("HOME", "/h")])).unwrap(),
            PathBuf::from("/h/.config/lap/config.toml")
        );
        assert!(path_from(env(&[])).is_err());
    }

    #[test]
    fn saved_with_mode_0600() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("lap").join("config.toml");
        let s = Saved {
            url: Some("http://h:4000".into()),
            key: Some("k".into()),
        };
        save(&p, &s).unwrap();
        assert_eq!(load(&p).unwrap(), s);
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&p), 0o600);
        assert_eq!(mode(p.parent().unwrap()), 0o700);
        assert_eq!(load(&dir.path().join("none.toml")).unwrap(), Saved::default());
    }
}
