//! The dashboard in a real headless Chromium, against a simulated 133-target campaign:
//! 401 without the token, a session page that follows its session live over SSE while the
//! daemon runs it (watched in real time over the DevTools protocol), then (from `fk-agentd dashboard` after the run) the overview, the sessions
//! table with 133 rows, the lease timeline and the scores.
//!
//! Where Chromium is missing the test says so and skips, so `cargo test` on a fresh machine
//! stays green; `.ci/run` installs Debian's `chromium` and sets `FK_AGENTD_REQUIRE_BROWSER=1`,
//! under which a missing browser fails the test instead. `FK_AGENTD_DASHBOARD_SHOTS=DIR` also writes a PNG of
//! each page there (how `docs/dashboard/` was made).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use assert_cmd::cargo::CommandCargoExt;
use fk_agentd::store::Store;

fn find_chromium() -> Option<PathBuf> {
    let from_env = std::env::var_os("CHROMIUM").map(PathBuf::from);
    let on_path = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .flat_map(|d| [d.join("chromium"), d.join("chromium-browser")])
            .find(|c| c.is_file())
    });
    from_env.or(on_path)
}

const NO_BROWSER: &str = "this test needs headless Chromium and none was found (not on PATH, \
                          CHROMIUM unset): install Debian's `chromium` \
                          (`apt-get install -y chromium`, as .ci/run does)";

/// Headless, and quiet on a machine without a network (no background connections).
const HEADLESS: &[&str] = &[
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
];

fn chromium() -> PathBuf {
    find_chromium().expect(NO_BROWSER)
}

/// Runs Chromium headless on `url` with `extra` flags; returns its stdout.
fn browse(url: &str, extra: &[&str]) -> String {
    let profile = tempfile::tempdir().unwrap();
    let mut child = Command::new(chromium())
        .args(HEADLESS)
        .arg("--window-size=1280,1000")
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(extra)
        .arg(url)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromium starts");
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert!(child.wait().unwrap().success(), "chromium failed on {url}");
    out
}

fn dump(url: &str) -> String {
    browse(url, &["--dump-dom"])
}

/// A plain HTTP/1.1 GET; returns the whole response (status line, headers, body).
fn http_get(base: &str, path: &str) -> String {
    let addr = base.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < limit, "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The dashboard URL split into its base and token.
fn read_url(home: &Path) -> (String, String) {
    let url = wait_for("dashboard.url", Duration::from_secs(60), || {
        std::fs::read_to_string(home.join("dashboard.url"))
            .ok()
            .filter(|s| s.ends_with('\n'))
    });
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(home.join("dashboard.url"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "dashboard.url must be private");
    let (base, token) = url.trim().split_once("/?token=").expect("URL with a token");
    (base.to_string(), token.to_string())
}

fn fk(home: &Path, args: &[&str], log: &Path) -> Child {
    let log = std::fs::File::create(log).unwrap();
    Command::cargo_bin("fk-agentd")
        .unwrap()
        .args(args)
        .arg("--home")
        .arg(home)
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap()
}

/// A headless Chromium driven over the DevTools protocol (a WebSocket), for what
/// `--dump-dom` cannot show: a page that changes in real time.
struct Cdp {
    child: Child,
    ws: tungstenite::WebSocket<tungstenite::stream::MaybeTlsStream<std::net::TcpStream>>,
    session: String,
    next_id: u64,
    _profile: tempfile::TempDir,
}

impl Cdp {
    fn open(url: &str) -> Self {
        use std::io::BufRead;
        let profile = tempfile::tempdir().unwrap();
        let mut child = Command::new(chromium())
            .args(HEADLESS)
            .arg("--remote-debugging-port=0")
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("chromium starts");
        let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
        let ws_url = stderr
            .lines()
            .map_while(Result::ok)
            .find_map(|l| {
                l.split_once("DevTools listening on ")
                    .map(|(_, u)| u.trim().to_string())
            })
            .expect("chromium prints its DevTools address");
        let (ws, _) = tungstenite::connect(ws_url.as_str()).expect("DevTools connection");
        let mut cdp = Self {
            child,
            ws,
            session: String::new(),
            next_id: 0,
            _profile: profile,
        };
        let target = cdp.call(None, "Target.createTarget", serde_json::json!({"url": url}));
        let target = target["targetId"].as_str().unwrap().to_string();
        let attached = cdp.call(
            None,
            "Target.attachToTarget",
            serde_json::json!({"targetId": target, "flatten": true}),
        );
        cdp.session = attached["sessionId"].as_str().unwrap().to_string();
        cdp
    }

    fn call(
        &mut self,
        session: Option<&str>,
        method: &str,
        params: serde_json::Value,
    ) -> serde_json::Value {
        self.next_id += 1;
        let mut msg = serde_json::json!({"id": self.next_id, "method": method, "params": params});
        if let Some(s) = session {
            msg["sessionId"] = s.into();
        }
        self.ws
            .send(tungstenite::Message::text(msg.to_string()))
            .unwrap();
        loop {
            let reply = self.ws.read().unwrap();
            let Ok(text) = reply.to_text() else { continue };
            let v: serde_json::Value = serde_json::from_str(text).unwrap();
            if v["id"] == self.next_id {
                assert!(v["error"].is_null(), "{method}: {v}");
                return v["result"].clone();
            }
        }
    }

    /// Evaluates `expr` in the page; its value (a string, or null while the page loads).
    fn eval(&mut self, expr: &str) -> serde_json::Value {
        let session = self.session.clone();
        let r = self.call(
            Some(&session),
            "Runtime.evaluate",
            serde_json::json!({"expression": expr, "returnByValue": true}),
        );
        r["result"]["value"].clone()
    }
}

impl Drop for Cdp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The session page follows, in real time, a session that was still queued when it opened.
fn live_session_page(home: &Path, base: &str, token: &str) {
    let store = Store::open_read_only(&home.join("fk-agentd.db")).unwrap();
    let run = store.run(None).unwrap();
    let queued = wait_for("a queued session", Duration::from_secs(30), || {
        let sessions = store.sessions(&run.id).ok()?;
        (sessions.len() == 133).then_some(())?;
        sessions
            .into_iter()
            .rev()
            .find(|s| s.state == fk_agentd::event::SessionState::Queued)
            .map(|s| s.target)
    });
    let mut page = Cdp::open(&format!("{base}/session?token={token}&target={queued}"));
    let probe = "(() => { const l = document.querySelector('#session-live'); \
                 const s = document.querySelector('#session-state'); \
                 return l && s ? [l.dataset.done, l.dataset.updates || '0', s.textContent].join('|') : null })()";
    let mut seen: Vec<String> = Vec::new();
    let start = Instant::now();
    let last = loop {
        let v = page.eval(probe).as_str().unwrap_or("").to_string();
        let state = v.rsplit('|').next().unwrap().to_string();
        if !state.is_empty() && seen.last() != Some(&state) {
            seen.push(state);
        }
        if v.starts_with("true|") {
            break v;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the page did not see its session end: last {v:?}, states seen {seen:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let updates: u32 = last.split('|').nth(1).unwrap().parse().unwrap();
    assert!(updates >= 1, "no live update reached the page: {last}");
    assert_eq!(
        seen.first().map(String::as_str),
        Some("queued"),
        "states seen: {seen:?}"
    );
    assert_eq!(
        seen.last().map(String::as_str),
        Some("finished"),
        "states seen: {seen:?}"
    );
    let text = page.eval("document.querySelector('#session-view').textContent");
    let text = text.as_str().unwrap();
    assert!(
        text.contains("SIMULATED") && text.contains("turn 1"),
        "{text}"
    );
}

fn after_the_run(base: &str, token: &str, shots: Option<&Path>) {
    let overview = dump(&format!("{base}/?token={token}"));
    assert!(overview.contains("133 / 133"), "{overview}");
    assert!(overview.contains("133 sessions finished"), "{overview}");
    assert!(overview.contains("SIMULATED RUN"));
    let sessions = dump(&format!("{base}/sessions?token={token}"));
    assert_eq!(sessions.matches("<tr data-state=").count(), 133);
    assert!(sessions.contains("SIMULATED RUN"));
    // The run is scored: every session winner says whether scoring kept it, none is left
    // "not scored yet".
    let rows: Vec<&str> = sessions.split("<tr data-state=").skip(1).collect();
    let winners: Vec<&&str> = rows
        .iter()
        .filter(|r| r.contains("data-verdict=\"winner\""))
        .collect();
    assert!(!winners.is_empty(), "no session winner");
    for row in &winners {
        assert!(
            row.contains("data-scoring=\"kept\"") || row.contains("data-scoring=\"not-kept\""),
            "a winner without its scoring verdict: {row}"
        );
    }
    let leases = dump(&format!("{base}/leases?token={token}"));
    assert!(
        leases.contains("class=\"lease c-validate"),
        "no lease bar drawn"
    );
    assert!(leases.contains(">GPU 0 "), "no GPU lane");
    let scores = dump(&format!("{base}/scores?token={token}"));
    assert!(
        scores.contains("Standalone") && scores.contains("Composed"),
        "{scores}"
    );
    // Each stage's speedups drawn about the 1.0× line, the noise floor said.
    assert!(
        scores.matches("aria-label=\"speedup per target").count() >= 2,
        "no speedup chart: {scores}"
    );
    assert!(scores.contains("class=\"axis one\""), "{scores}");
    assert!(scores.contains("noise floor"), "{scores}");
    let pages = [
        ("overview", "/".to_string()),
        ("sessions", "/sessions".into()),
        ("session", "/session?target=L1/gelu".into()),
        ("leases", "/leases".into()),
        ("scores", "/scores".into()),
    ];
    let tmp = tempfile::tempdir().unwrap();
    for (name, path) in pages {
        let file = shots.unwrap_or(tmp.path()).join(format!("{name}.png"));
        let sep = if path.contains('?') { '&' } else { '?' };
        browse(
            &format!("{base}{path}{sep}token={token}"),
            &[&format!("--screenshot={}", file.display())],
        );
        let png = std::fs::read(&file).unwrap();
        assert_eq!(&png[..4], b"\x89PNG", "{name}: not a PNG");
    }
}

#[test]
fn a_simulated_campaign_in_headless_chromium() {
    if find_chromium().is_none() {
        assert!(
            std::env::var_os("FK_AGENTD_REQUIRE_BROWSER").is_none(),
            "{NO_BROWSER}"
        );
        eprintln!("SKIPPED a_simulated_campaign_in_headless_chromium: {NO_BROWSER}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let mut daemon = fk(
        &home,
        &["start", "--sim", "--targets", "L1-L3"],
        &dir.path().join("start.log"),
    );
    let (base, token) = read_url(&home);
    let denied = http_get(&base, "/");
    assert!(denied.starts_with("HTTP/1.1 401"), "{denied}");
    assert!(dump(&format!("{base}/sessions")).contains("401 unauthorized"));
    let mut overview = Cdp::open(&format!("{base}/?token={token}"));
    let sessions = "(() => { const c = document.querySelector('#card-sessions .value'); \
                    return c ? c.textContent : null })()";
    let first = wait_for("the overview", Duration::from_secs(30), || {
        overview.eval(sessions).as_str().map(str::to_string)
    });
    live_session_page(&home, &base, &token);
    // The overview opened at the start has refreshed itself as the run moved on.
    let later = overview.eval(sessions);
    let later = later.as_str().unwrap_or_default();
    assert!(
        later.ends_with(" / 133") && later != first,
        "overview went from {first:?} to {later:?}"
    );
    drop(overview);
    let status = daemon.wait().unwrap();
    let log = std::fs::read_to_string(dir.path().join("start.log")).unwrap();
    assert!(status.success(), "start failed:\n{log}");
    assert!(
        log.contains("dashboard: http://127.0.0.1:"),
        "the URL was not shown:\n{log}"
    );
    assert!(
        !home.join("dashboard.url").exists(),
        "the daemon left its URL file behind"
    );

    // Exit 1 is a score that ran and found losers; the results are written all the same.
    let score = fk(&home, &["score"], &dir.path().join("score.log"))
        .wait()
        .unwrap();
    let score_log = std::fs::read_to_string(dir.path().join("score.log")).unwrap();
    assert!(matches!(score.code(), Some(0 | 1)), "{score_log}");

    let mut served = fk(&home, &["dashboard"], &dir.path().join("dashboard.log"));
    let (base, token) = read_url(&home);
    let shots = std::env::var_os("FK_AGENTD_DASHBOARD_SHOTS").map(PathBuf::from);
    after_the_run(&base, &token, shots.as_deref());
    // Ctrl-C, to the child this test started (by its pid).
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&served),
        rustix::process::Signal::INT,
    )
    .unwrap();
    assert!(served.wait().unwrap().success());
    assert!(!home.join("dashboard.url").exists());
}
