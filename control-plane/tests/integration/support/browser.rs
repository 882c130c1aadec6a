//! A real headless Chromium, driven over WebDriver (`chromedriver`, through the `fantoccini`
//! client), for the console's browser tests. Chromium runs with a fresh profile and everything
//! that would reach the network switched off. Missing `chromium`/`chromedriver` fails the test
//! (`bash .ci/run` installs both from Debian).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use lap_test_support::eventually_ok;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};

fn find_on_path(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|d| names.iter().map(move |n| d.join(n)))
        .find(|p| p.is_file())
}

/// Where screenshots go: `target/console-screenshots/` (kept as test artifacts).
pub fn screenshot_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .join("console-screenshots")
}

pub struct Browser {
    pub client: Client,
    driver: tokio::process::Child,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Start `chromedriver` on a port of its choosing and a headless Chromium session.
    pub async fn start() -> Browser {
        let driver_bin = find_on_path(&["chromedriver"]).unwrap_or_else(|| {
            panic!("chromedriver is not on PATH: apt-get install chromium chromium-driver (bash .ci/run does)")
        });
        let chromium = find_on_path(&["chromium", "chromium-browser", "google-chrome"]).unwrap_or_else(|| {
            panic!("chromium is not on PATH: apt-get install chromium chromium-driver (bash .ci/run does)")
        });
        let mut driver = tokio::process::Command::new(driver_bin)
            .arg("--port=0")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        // "ChromeDriver was started successfully on port 44661."
        let mut out = BufReader::new(driver.stdout.take().unwrap()).lines();
        let port = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(line) = out.next_line().await.unwrap() {
                if let Some(rest) = line.split("started successfully on port ").nth(1) {
                    return rest.trim_end_matches('.').parse::<u16>().unwrap();
                }
            }
            panic!("chromedriver exited before it was listening");
        })
        .await
        .expect("chromedriver did not start within 30 s");
        // Keep draining its stdout so it never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = out.next_line().await {} });

        let profile = tempfile::tempdir().unwrap();
        let args = [
            "--headless=new".to_owned(),
            "--no-sandbox".to_owned(),
            "--disable-gpu".to_owned(),
            "--disable-quic".to_owned(),
            "--no-first-run".to_owned(),
            "--no-default-browser-check".to_owned(),
            "--disable-background-networking".to_owned(),
            "--disable-component-update".to_owned(),
            "--disable-sync".to_owned(),
            "--disable-dev-shm-usage".to_owned(),
            "--window-size=1280,1100".to_owned(),
            format!("--user-data-dir={}", profile.path().display()),
        ];
        let caps = json!({
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": chromium, "args": args},
        });
        let Value::Object(caps) = caps else { unreachable!() };
        let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
            .expect("a Chromium session through chromedriver");
        Browser {
            client,
            driver,
            _profile: profile,
        }
    }

    /// Save a PNG of the page as `target/console-screenshots/NAME.png`.
    pub async fn screenshot(&self, name: &str) -> PathBuf {
        let png = self.client.screenshot().await.unwrap();
        let dir = screenshot_dir();
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, png).unwrap();
        eprintln!("screenshot: {}", path.display());
        path
    }

    /// Run `script` (a function body; `arguments` are `args`) in the page.
    pub async fn js(&self, script: &str, args: Vec<Value>) -> Value {
        self.client.execute(script, args).await.unwrap()
    }

    /// The text a CSS selector's first element shows ("" when there is none).
    pub async fn text(&self, css: &str) -> String {
        self.js(
            "const e = document.querySelector(arguments[0]); return e ? e.innerText : '';",
            vec![json!(css)],
        )
        .await
        .as_str()
        .unwrap_or_default()
        .to_owned()
    }

    /// Poll until `css`'s text satisfies `done`, or panic after `timeout` saying what was awaited.
    pub async fn wait_text(&self, css: &str, what: &str, timeout: Duration, done: impl Fn(&str) -> bool) -> String {
        let what = format!("{what} in {css}");
        eventually_ok(timeout, &what, || async {
            let t = self.text(css).await;
            if done(&t) {
                return Ok(t);
            }
            let page = self.text("body").await;
            Err(format!("it shows:\n{t}\n---- the page:\n{page}"))
        })
        .await
    }

    /// Type into the element `css` (after clearing it).
    pub async fn fill(&self, css: &str, text: &str) {
        self.on_element(css, |e| async move {
            e.clear().await?;
            e.send_keys(text).await
        })
        .await;
    }

    pub async fn click(&self, css: &str) {
        self.on_element(css, |e| async move { e.click().await }).await;
    }

    /// Find `css` and act on it. The console re-renders as session state arrives, so an element
    /// found may be replaced before the action reaches it (WebDriver's "stale element
    /// reference", W3C WebDriver §12.1): then it is found again, up to five times.
    async fn on_element<F, Fut>(&self, css: &str, act: F)
    where
        F: Fn(fantoccini::elements::Element) -> Fut,
        Fut: std::future::Future<Output = Result<(), fantoccini::error::CmdError>>,
    {
        for attempt in 1..=5 {
            let e = self.client.find(Locator::Css(css)).await.unwrap();
            match act(e).await {
                Ok(()) => return,
                Err(err) if err.is_stale_element_reference() && attempt < 5 => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(err) => panic!("{css}: {err}"),
            }
        }
    }

    pub async fn goto(&self, url: &str) {
        self.client.goto(url).await.unwrap();
    }

    pub async fn close(mut self) {
        let _ = self.client.clone().close().await;
        let _ = self.driver.kill().await;
    }
}
