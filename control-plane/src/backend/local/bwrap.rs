//! The bubblewrap command line of a local sandbox (pure: paths in, argv out), and the reasons
//! bubblewrap gives when it cannot build one, in words a user can act on.
//!
//! What the harness sees (`bwrap(1)`):
//!
//! ```text
//! /usr /etc /opt, /bin /sbin /lib*     the host's, read-only (agent CLIs included)
//! extra read-only paths                LAP_LOCAL_RO_PATHS, at the same path
//! /proc /dev /dev/shm                  its own (pid namespace, minimal devices, tmpfs)
//! /home/agent                          the session's home (rw), /home/agent/workspace its cwd
//! /tmp, /var/tmp                       the session's tmp (rw)
//! /run/lap/ca                          ca.pem and ca-bundle.pem (read-only)
//! /run/lap/harness                     where lap-harness serves its Unix socket (rw)
//! /run/lap/bin/lap-harness             the harness binary (read-only)
//! ```
//!
//! Namespaces: user (mapped to [`SANDBOX_UID`] inside, nested user namespaces disabled), mount,
//! pid, network (loopback only), ipc, uts, cgroup where the kernel has it; a new session (no
//! `TIOCSTI` into the caller's terminal). Nothing else of the host: not the data dir, not other
//! sessions, not the sidecar's files, not `/root`, `/home` or `/tmp`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The uid and gid the harness has inside its sandbox (as in the harness images).
pub const SANDBOX_UID: u32 = 10001;
/// The harness's home inside.
pub const HOME: &str = "/home/agent";
/// Its working directory inside.
pub const WORKSPACE: &str = "/home/agent/workspace";
/// Where the CA files are inside.
pub const CA_DIR: &str = "/run/lap/ca";
/// Where the harness's socket directory is inside.
pub const RUN_DIR: &str = "/run/lap/harness";
/// The harness binary inside.
pub const HARNESS_BIN: &str = "/run/lap/bin/lap-harness";
/// The vault's proxy address inside the sandbox's own network namespace.
pub const VAULT_LISTEN: &str = "127.0.0.1:14322";
/// The fd bubblewrap writes `{"child-pid": N}` to (`--info-fd`): the host pid of the sandbox's
/// init (pid 1 inside). Killing it ends every process of the sandbox's pid namespace.
pub const INFO_FD: i32 = 3;

/// The `child-pid` of bubblewrap's `--info-fd` JSON.
pub fn info_child_pid(info: &[u8]) -> Option<i32> {
    let v: serde_json::Value = serde_json::from_slice(info).ok()?;
    i32::try_from(v.get("child-pid")?.as_i64()?).ok()
}

/// The session's own directories (host paths), bound read-write or read-only as above.
#[derive(Debug, Clone)]
pub struct Binds {
    pub home: PathBuf,
    pub tmp: PathBuf,
    pub ca: PathBuf,
    pub run: PathBuf,
    pub harness_bin: PathBuf,
    /// `LAP_LOCAL_RO_PATHS`: more host paths, read-only at the same path.
    pub ro_paths: Vec<PathBuf>,
}

/// How a top-level system path exists on this host: a directory to bind, or a symlink to
/// recreate (merged-/usr systems have `/bin -> usr/bin`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SystemPath {
    Dir(PathBuf),
    Symlink { path: PathBuf, target: PathBuf },
}

/// The top-level system paths bound read-only, as found on this host.
pub const SYSTEM_PATHS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt",
];

/// Look at [`SYSTEM_PATHS`] on this host (missing ones are left out).
pub fn system_paths() -> Vec<SystemPath> {
    SYSTEM_PATHS
        .iter()
        .map(PathBuf::from)
        .filter_map(|p| match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => std::fs::read_link(&p)
                .ok()
                .map(|target| SystemPath::Symlink { path: p, target }),
            Ok(m) if m.is_dir() => Some(SystemPath::Dir(p)),
            _ => None,
        })
        .collect()
}

fn push(args: &mut Vec<OsString>, items: &[&str]) {
    args.extend(items.iter().map(OsString::from));
}

fn push_paths(args: &mut Vec<OsString>, flag: &str, a: &Path, b: &Path) {
    args.push(flag.into());
    args.push(a.into());
    args.push(b.into());
}

/// The arguments after `bwrap` (the command is the harness binary inside).
pub fn args(system: &[SystemPath], binds: &Binds, hostname: &str) -> Vec<OsString> {
    let mut a = Vec::new();
    push(
        &mut a,
        &[
            "--unshare-all",
            "--unshare-user",
            "--disable-userns",
            "--new-session",
            "--info-fd",
            &INFO_FD.to_string(),
            "--uid",
            &SANDBOX_UID.to_string(),
            "--gid",
            &SANDBOX_UID.to_string(),
            "--hostname",
            hostname,
        ],
    );
    for p in system {
        match p {
            SystemPath::Dir(d) => push_paths(&mut a, "--ro-bind", d, d),
            SystemPath::Symlink { path, target } => push_paths(&mut a, "--symlink", target, path),
        }
    }
    push(&mut a, &["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/dev/shm"]);
    push_paths(&mut a, "--bind", &binds.home, Path::new(HOME));
    push_paths(&mut a, "--bind", &binds.tmp, Path::new("/tmp"));
    push(&mut a, &["--symlink", "/tmp", "/var/tmp"]);
    // After /tmp and the home: an extra path below either stays visible.
    for p in &binds.ro_paths {
        push_paths(&mut a, "--ro-bind", p, p);
    }
    push_paths(&mut a, "--ro-bind", &binds.ca, Path::new(CA_DIR));
    push_paths(&mut a, "--bind", &binds.run, Path::new(RUN_DIR));
    push_paths(&mut a, "--ro-bind", &binds.harness_bin, Path::new(HARNESS_BIN));
    push(&mut a, &["--chdir", WORKSPACE, "--", HARNESS_BIN]);
    a
}

/// What to tell a user when bubblewrap could not build the sandbox, from its stderr.
pub fn failure_reason(stderr: &str) -> String {
    let line = stderr
        .lines()
        .rev()
        .find(|l| l.starts_with("bwrap:"))
        .unwrap_or_else(|| stderr.lines().last().unwrap_or("bwrap exited"))
        .trim();
    let hint = if line.contains("namespace") || line.contains("uid map") || line.contains("Operation not permitted") {
        "; the kernel refuses unprivileged user namespaces here: enable them \
         (`sysctl -w kernel.unprivileged_userns_clone=1` on Debian, `sysctl -w user.max_user_namespaces=15000`, \
         or the AppArmor rule for bwrap on Ubuntu 24.04), or set LAP_LOCAL_ISOLATION=none (development only)"
    } else {
        ""
    };
    format!("the sandbox could not be created: {line}{hint}")
}

/// The reason when no `bwrap` can be found.
pub fn missing_reason() -> String {
    "bubblewrap (`bwrap`) is not installed, and local sessions run only inside it: install it \
     (`apt-get install bubblewrap`, `dnf install bubblewrap`), or set LAP_LOCAL_ISOLATION=none \
     (development only: the agent then runs unisolated as the server's user)"
        .to_owned()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn binds() -> Binds {
        Binds {
            home: "/s/home".into(),
            tmp: "/s/tmp".into(),
            ca: "/s/ca".into(),
            run: "/s/run".into(),
            harness_bin: "/opt/lap/lap-harness".into(),
            ro_paths: vec!["/nix/store".into()],
        }
    }

    fn strings(a: &[OsString]) -> Vec<String> {
        a.iter().map(|s| s.to_string_lossy().into_owned()).collect()
    }

    /// The argv as `flag src dest` triples, for position-independent checks.
    fn has(a: &[String], triple: [&str; 3]) -> bool {
        a.windows(3)
            .any(|w| w[0] == triple[0] && w[1] == triple[1] && w[2] == triple[2])
    }

    #[test]
    fn every_namespace_is_new_and_nested_user_namespaces_are_off() {
        let a = strings(&args(&[], &binds(), "lap-x"));
        for flag in ["--unshare-all", "--unshare-user", "--disable-userns", "--new-session"] {
            assert!(a.iter().any(|x| x == flag), "{flag}");
        }
        assert!(!a.iter().any(|x| x == "--share-net"), "no host network");
        assert!(
            !a.iter().any(|x| x == "--die-with-parent"),
            "sessions outlive a server restart"
        );
        assert!(has(&a, ["--uid", "10001", "--gid"]));
        assert!(a.windows(2).any(|w| w[0] == "--hostname" && w[1] == "lap-x"));
    }

    #[test]
    fn the_system_is_read_only_and_the_session_dirs_are_its_own() {
        let system = vec![
            SystemPath::Dir("/usr".into()),
            SystemPath::Symlink {
                path: "/bin".into(),
                target: "usr/bin".into(),
            },
            SystemPath::Dir("/etc".into()),
        ];
        let a = strings(&args(&system, &binds(), "h"));
        assert!(has(&a, ["--ro-bind", "/usr", "/usr"]));
        assert!(has(&a, ["--symlink", "usr/bin", "/bin"]));
        assert!(has(&a, ["--ro-bind", "/etc", "/etc"]));
        assert!(has(&a, ["--ro-bind", "/nix/store", "/nix/store"]));
        assert!(has(&a, ["--bind", "/s/home", HOME]));
        assert!(has(&a, ["--bind", "/s/tmp", "/tmp"]));
        assert!(has(&a, ["--ro-bind", "/s/ca", CA_DIR]));
        assert!(has(&a, ["--bind", "/s/run", RUN_DIR]));
        assert!(has(&a, ["--ro-bind", "/opt/lap/lap-harness", HARNESS_BIN]));
        // Read-write binds are only the session's own directories.
        let rw: Vec<&String> = a.windows(2).filter(|w| w[0] == "--bind").map(|w| &w[1]).collect();
        assert_eq!(rw, ["/s/home", "/s/tmp", "/s/run"]);
        assert_eq!(&a[a.len() - 4..], ["--chdir", WORKSPACE, "--", HARNESS_BIN]);
        // An extra read-only path below /tmp is bound after /tmp, so it is not hidden by it.
        let pos = |t: &str| a.iter().position(|x| x == t).unwrap();
        assert!(pos("/nix/store") > pos("/s/tmp"));
    }

    #[test]
    fn the_sandbox_init_is_reported() {
        let a = strings(&args(&[], &binds(), "h"));
        assert!(a.windows(2).any(|w| w[0] == "--info-fd" && w[1] == "3"));
        assert_eq!(
            info_child_pid(b"{\n    \"child-pid\": 4242,\n    \"cgroup-namespace\": 1\n}\n"),
            Some(4242)
        );
        assert_eq!(info_child_pid(b""), None);
    }

    #[test]
    fn failures_say_what_to_do() {
        let r = failure_reason(
            "bwrap: No permissions to creating new namespace, likely because the kernel does not allow non-privileged user namespaces.\n",
        );
        assert!(r.contains("user namespaces"), "{r}");
        assert!(r.contains("LAP_LOCAL_ISOLATION=none"), "{r}");
        let r = failure_reason("bwrap: Can't find source path /nope: No such file or directory\n");
        assert_eq!(
            r,
            "the sandbox could not be created: bwrap: Can't find source path /nope: No such file or directory"
        );
        assert!(missing_reason().contains("apt-get install bubblewrap"));
    }
}
