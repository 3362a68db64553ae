//! The status page in a real browser: headless Chromium opens `/` of a
//! daemon that ran a few jobs with mixed outcomes; the rendered DOM has a
//! section per job and one cell per slot with its state, and a screenshot
//! is saved as `target/status-page.png` to look at.
//!
//! Chromium is Debian's `chromium` package; `.ci/run` installs it when it
//! is missing. Without it the test fails and says how to get it.

#![allow(clippy::unwrap_used)]

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{Fleet, run_in, sqlite_crontab_head, wait_for};
use nix::sys::signal::Signal;

fn chromium() -> PathBuf {
    for candidate in ["/usr/bin/chromium", "/usr/bin/chromium-browser"] {
        if Path::new(candidate).exists() {
            return PathBuf::from(candidate);
        }
    }
    panic!(
        "no Chromium: the status page is checked in a real browser. Install it with \
         `apt-get install chromium` (Debian), or run `bash .ci/run`, which does"
    );
}

/// Chromium, headless, on `url` with `args`; its stdout.
fn headless(args: &[&str], url: &str) -> String {
    let out = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-dev-shm-usage",
        ])
        .args(args)
        .arg(url)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_status_page_shows_each_job_and_slot_in_a_browser() {
    // Fail first, and say how to get one, when there is no browser.
    chromium();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let addr: SocketAddr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let config = d.join("anarchon.toml");
    std::fs::write(
        &config,
        format!(
            "{head}\n[http]\nlisten = \"{addr}\"\n\n\
             [[job]]\nname = \"nightly-report\"\nschedule = \"0 3 * * *\"\ncommand = \"true\"\n\n\
             [[job]]\nname = \"flaky-sync\"\nschedule = \"*/5 * * * *\"\ncommand = \"echo 'upstream <timeout>' >&2; exit 2\"\n",
            head = sqlite_crontab_head(&d.join("page.db"), ["3s", "1s", "1s", "500ms"]),
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let mut fleet = Fleet::default();
    fleet.start(Path::new(config), d);
    let url = format!("http://{addr}/");
    wait_for(
        Duration::from_secs(20),
        "the daemon's page",
        || std::net::TcpStream::connect(addr).ok(),
        || fleet.logs(),
    );
    for (job, code) in [
        ("nightly-report", 0),
        ("nightly-report", 0),
        ("flaky-sync", 1),
        ("nightly-report", 0),
        ("flaky-sync", 1),
    ] {
        let (got, out, err) = run_in(d, &["trigger", job, "--wait", "--config", config]);
        assert_eq!(got, code, "{out}{err}");
    }

    let dom = headless(&["--dump-dom"], &url);
    assert!(
        dom.contains("data-job=\"nightly-report\"") && dom.contains("data-job=\"flaky-sync\""),
        "a section per job: {dom}"
    );
    assert!(dom.contains("<h2>nightly-report</h2>"), "{dom}");
    assert_eq!(
        dom.matches("class=\"cell succeeded\" data-state=\"succeeded\"")
            .count(),
        3,
        "one cell per run of nightly-report, succeeded: {dom}"
    );
    assert_eq!(
        dom.matches("class=\"cell failed\" data-state=\"failed\"")
            .count(),
        2,
        "one cell per run of flaky-sync, failed: {dom}"
    );
    assert!(
        dom.contains("upstream &lt;timeout&gt;"),
        "the error is on hover, escaped: {dom}"
    );
    assert!(
        !dom.contains("<timeout>"),
        "stored text never becomes markup"
    );
    assert!(!dom.contains("sqlite://"), "no store URL on the page");

    let shot = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/status-page.png");
    let shot = shot.to_str().unwrap().to_owned();
    let _ = std::fs::remove_file(&shot);
    headless(
        &[&format!("--screenshot={shot}"), "--window-size=1000,560"],
        &url,
    );
    let png = std::fs::read(&shot).expect("the screenshot");
    assert!(png.starts_with(b"\x89PNG"), "a PNG at {shot}");
    assert!(
        png.len() > 5_000,
        "a page, not a blank: {} bytes",
        png.len()
    );

    fleet.daemons[0].signal(Signal::SIGTERM);
    assert_eq!(fleet.daemons[0].wait(Duration::from_secs(15)), Some(0));
}
