//! tmux as the user's terminal: start a command in a detached session, type, read the screen.

use std::process::Command;
use std::time::Duration;

use lap_test_support::eventually_ok;

pub struct Tmux {
    pub socket: String,
}

impl Tmux {
    pub fn cmd(&self) -> Command {
        let mut c = Command::new("tmux");
        c.args(["-L", &self.socket]);
        c
    }

    /// A new session named `name` running `command` (with `env` added to the environment).
    pub fn start(&self, name: &str, command: &str, env: &[(&str, String)]) {
        let mut c = self.cmd();
        c.args(["new-session", "-d", "-s", name, "-x", "120", "-y", "40"]);
        for (k, v) in env {
            c.arg("-e").arg(format!("{k}={v}"));
        }
        let out = c.arg(command).output().unwrap();
        assert!(out.status.success(), "tmux: {}", String::from_utf8_lossy(&out.stderr));
    }

    pub fn capture(&self, name: &str) -> String {
        let out = self.cmd().args(["capture-pane", "-p", "-t", name]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn keys(&self, name: &str, keys: &[&str]) {
        let out = self.cmd().args(["send-keys", "-t", name]).args(keys).output().unwrap();
        assert!(out.status.success());
    }

    /// Poll the pane until `done(screen)`; panics with the screen after `timeout`.
    pub async fn wait(&self, name: &str, what: &str, timeout: Duration, done: impl Fn(&str) -> bool) -> String {
        eventually_ok(timeout, what, || async {
            let screen = self.capture(name);
            if done(&screen) {
                Ok(screen)
            } else {
                Err(format!("the screen:\n{screen}"))
            }
        })
        .await
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd().arg("kill-server").output();
    }
}
