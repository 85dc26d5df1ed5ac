//! A real headless Chromium through chromedriver, for the dashboard as people meet it: the
//! browser tests of a single `serve` and of a cluster share this set-up and its skip rule.

use std::os::unix::process::CommandExt;
use std::time::Duration;

use serde_json::json;

/// chromedriver on a free loopback port, stopped on drop.
pub(crate) struct Driver {
    child: std::process::Child,
    url: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        // chromedriver and the Chromium it started share its process group: a test that
        // fails before closing its session leaves no browser behind.
        if let Ok(group) = i32::try_from(self.child.id())
            && group > 1
        {
            // SAFETY: kill(2) with a negative pid signals that process group only: the
            // group chromedriver leads (`process_group(0)`), never this process's.
            unsafe {
                libc::kill(-group, libc::SIGKILL);
            }
        }
        let _ = self.child.wait();
    }
}

/// chromedriver and a headless Chromium session, or `None` (a skip) when they are not
/// installed and `SHADOWBRAIN_REQUIRE_BROWSER` is unset.
pub(crate) async fn browser() -> Option<(Driver, fantoccini::Client)> {
    let (chromium, driver) = ("/usr/bin/chromium", "/usr/bin/chromedriver");
    if !std::path::Path::new(chromium).exists() || !std::path::Path::new(driver).exists() {
        assert!(
            std::env::var_os("SHADOWBRAIN_REQUIRE_BROWSER").is_none(),
            "Chromium and chromedriver are needed: run scripts/setup (it installs Debian's \
             chromium and chromium-driver)"
        );
        eprintln!("skipped: no {chromium} or {driver}; scripts/setup installs them");
        return None;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = std::process::Command::new(driver)
        .arg(format!("--port={port}"))
        .process_group(0)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let driver = Driver {
        child,
        url: format!("http://127.0.0.1:{port}"),
    };
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": chromium,
            // As root in a sandbox-less container, on a machine with no outside network.
            "args": ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                     "--no-first-run", "--disable-background-networking",
                     "--disable-component-update", "--disable-sync",
                     "--disable-dev-shm-usage", "--window-size=1280,800"],
        }),
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        match fantoccini::ClientBuilder::new(connector)
            .capabilities(caps.clone())
            .connect(&driver.url)
            .await
        {
            Ok(client) => return Some((driver, client)),
            Err(e) if std::time::Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("chromedriver did not start a session: {e}"),
        }
    }
}

/// Saves the browser's view as `target/dashboard-screenshots/{name}.png`.
pub(crate) async fn screenshot(client: &fantoccini::Client, name: &str) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/dashboard-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    let png = client.screenshot().await.unwrap();
    assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
    std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
}

/// Waits (20 s at most) for the element `css` selects.
pub(crate) async fn wait_for(
    client: &fantoccini::Client,
    css: &str,
) -> fantoccini::elements::Element {
    client
        .wait()
        .at_most(Duration::from_secs(20))
        .for_element(fantoccini::Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("no `{css}`: {e}"))
}

/// Clicks the element `css` selects.
pub(crate) async fn click(client: &fantoccini::Client, css: &str) {
    client
        .find(fantoccini::Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("no `{css}`: {e}"))
        .click()
        .await
        .unwrap();
}

/// Loads `path` and waits for its heading.
pub(crate) async fn open(client: &fantoccini::Client, base: &str, path: &str) -> String {
    client.goto(&format!("{base}{path}")).await.unwrap();
    wait_for(client, "main h1").await.text().await.unwrap()
}
