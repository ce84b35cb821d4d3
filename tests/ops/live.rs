//! A real Prometheus server on loopback scrapes the storm example while its `unguarded`
//! policy (the naive loop on stormguard's layers, protections off) and then its
//! `stormguard` policy run. The rules are `ops/prometheus/stormguard.rules.yml` on a clock
//! 60 times faster (a minute of the rules is a second of the run: the storm's trigger lasts
//! 4 s). Through Prometheus's HTTP API: the metastable-loop alert is pending or firing
//! for `unguarded` after the trigger and never fires for `stormguard`; the budget alert fires for
//! `stormguard` during the trigger and clears after it; every query of the Grafana
//! dashboard is accepted and returns series.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::examples_support::build_examples;
use crate::prometheus::{ops_dir, scale_durations, tool};

/// A minute of the rules is this many milliseconds of the run.
const SPEED: u64 = 60;
/// Scrape and rule evaluation interval.
const INTERVAL: &str = "250ms";

/// A child process killed when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A folder of this test's own, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("stormguard-ops-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A port nothing listens on now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GET path` from Prometheus at `addr` (HTTP/1.0: the body ends with the connection).
fn get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    Ok((status, body))
}

fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// An API call's `data`; fails with Prometheus's error when it refuses the query.
fn api(addr: SocketAddr, path: &str) -> Value {
    let (status, body) = get(addr, path).unwrap();
    let value: Value = serde_json::from_str(&body)
        .unwrap_or_else(|e| panic!("{path}: HTTP {status}, not JSON ({e}): {body:.300}"));
    assert_eq!(value["status"], "success", "{path}: {body:.500}");
    value["data"].clone()
}

/// Prometheus on `port`, scraping `target`, with the rules sped up; ready when returned.
fn start_prometheus(dir: &Path, port: u16, target: &str) -> (Running, SocketAddr) {
    let rules = std::fs::read_to_string(ops_dir().join("prometheus/stormguard.rules.yml")).unwrap();
    std::fs::write(dir.join("rules.yml"), scale_durations(&rules, SPEED)).unwrap();
    let config = format!(
        "global:\n  scrape_interval: {INTERVAL}\n  scrape_timeout: {INTERVAL}\n  \
         evaluation_interval: {INTERVAL}\nrule_files: [rules.yml]\nscrape_configs:\n  \
         - job_name: storm\n    static_configs: [{{targets: ['{target}']}}]\n"
    );
    std::fs::write(dir.join("prometheus.yml"), config).unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut child = Running(
        Command::new(tool("prometheus"))
            .current_dir(dir)
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // Poll the readiness endpoint until it answers 200, or the server has exited.
    loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            panic!("prometheus exited before it was ready: {status}");
        }
        if matches!(get(addr, "/-/ready"), Ok((200, _))) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    (child, addr)
}

/// The storm's stderr lines, read on a thread as it runs; the first `metrics on` line's
/// address once it is written.
fn read_stderr(child: &mut Child) -> (std::sync::mpsc::Receiver<String>, String) {
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    loop {
        let line = rx
            .recv_timeout(Duration::from_secs(120))
            .expect("the storm wrote no `metrics on` line");
        if let Some(url) = line.strip_prefix("metrics on http://") {
            let target = url.trim_end_matches("/metrics").to_owned();
            return (rx, target);
        }
    }
}

/// When `policy`'s run started, in Unix seconds, from the storm's stderr.
fn started(lines: &[String], policy: &str) -> f64 {
    let prefix = format!("storm: {policy} started at unix ms ");
    let ms: u64 = lines
        .iter()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no start of {policy} in {lines:#?}"))
        .parse()
        .unwrap();
    ms as f64 / 1000.0
}

/// The instants (Unix s) at which `alert` of `layer` was in `state` between `from` and `to`.
fn alert_times(
    addr: SocketAddr,
    alert: &str,
    layer: &str,
    state: &str,
    (from, to): (f64, f64),
) -> Vec<f64> {
    let query = format!(
        "ALERTS{{alertname=\"{alert}\",stormguard_layer=\"{layer}\",alertstate=\"{state}\"}}"
    );
    let data = api(
        addr,
        &format!(
            "/api/v1/query_range?query={}&start={from:.3}&end={to:.3}&step=0.25",
            encode(&query)
        ),
    );
    data["result"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|series| series["values"].as_array().unwrap().clone())
        .map(|point| point[0].as_f64().unwrap())
        .collect()
}

/// `query`'s values from `from` to `to`, every 0.5 s, as `t:value` (t from `from`), for
/// a failure's message.
fn series(addr: SocketAddr, query: &str, (from, to): (f64, f64)) -> String {
    let data = api(
        addr,
        &format!(
            "/api/v1/query_range?query={}&start={from:.3}&end={to:.3}&step=0.5",
            encode(query)
        ),
    );
    let mut text = String::new();
    for series in data["result"].as_array().unwrap() {
        for point in series["values"].as_array().unwrap() {
            let t = point[0].as_f64().unwrap() - from;
            text.push_str(&format!("{t:.1}:{} ", point[1].as_str().unwrap_or("?")));
        }
    }
    text
}

/// Waits until Prometheus has evaluated its rules past `instant` (Unix s).
fn evaluated_past(addr: SocketAddr, instant: f64) {
    loop {
        let data = api(addr, "/api/v1/query?query=time()");
        if data["result"][0].as_f64().unwrap_or(0.0) > instant + 1.0 {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One run: the storm (`unguarded`, then `stormguard`) under a real Prometheus.
#[test]
fn alerts_and_dashboard_on_a_real_prometheus() {
    let storm = build_examples(&["storm"]).join(format!("storm{}", std::env::consts::EXE_SUFFIX));
    let dir = TempDir::new();
    let mut child = Command::new(&storm)
        .args(["--policies", "unguarded,stormguard"])
        .args(["--metrics-addr", "127.0.0.1:0"])
        .arg("--json")
        .arg(dir.0.join("storm.json"))
        .arg("--svg")
        .arg(dir.0.join("storm.svg"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (lines, target) = read_stderr(&mut child);
    let storm_run = Running(child);
    let (_prometheus, addr) = start_prometheus(&dir.0, free_port(), &target);

    let mut storm_run = storm_run;
    let status = storm_run.0.wait().unwrap();
    let mut out = String::new();
    storm_run
        .0
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let lines: Vec<String> = lines.try_iter().collect();
    assert!(status.success(), "storm failed: {lines:#?}\n{out}");
    eprintln!("{out}");
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.0.join("storm.json")).unwrap()).unwrap();
    let trigger = |start: f64| {
        (
            start + report["trigger"]["start_s"].as_f64().unwrap(),
            start + report["trigger"]["end_s"].as_f64().unwrap(),
        )
    };
    // The alerts are checked against what the storm did: a machine too busy to serve the
    // stormguard policy before its trigger cannot show a trigger and a recovery.
    let policy = report["policies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "stormguard")
        .unwrap();
    let before = policy["goodput_before"].as_f64().unwrap();
    assert!(
        before >= 0.9,
        "the machine is too busy for a live run: the storm's stormguard policy served \
         {:.0} % of its calls before the trigger (run it on a quieter machine)\n{out}",
        before * 100.0
    );
    // Seconds the stormguard policy took to serve its callers again after the trigger: its
    // retries were refused for as long (a busy machine stretches it), and the budget alert
    // clears after.
    let recovery = policy["recovery_s"].as_f64().unwrap_or_else(|| {
        panic!("the storm's stormguard policy never recovered in this run\n{out}")
    });
    let (unguarded, stormguard) = (started(&lines, "unguarded"), started(&lines, "stormguard"));
    let end = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    evaluated_past(addr, end);
    // The picture of docs/operating.md is this run's (the storm's own SVG of goodput and
    // attempts per second): `STORMGUARD_OPS_SVG=docs/operating-storm.svg` keeps it.
    if let Some(path) = std::env::var_os("STORMGUARD_OPS_SVG") {
        std::fs::copy(dir.0.join("storm.svg"), path).unwrap();
    }

    check_metastable_loop(
        addr,
        trigger(unguarded),
        (unguarded, stormguard),
        (stormguard, end),
    );
    check_budget(addr, trigger(stormguard), recovery, (stormguard, end));
    check_dashboard(addr, trigger(stormguard).0 + 2.0);
}

/// The metastable-loop alert: pending or firing for `unguarded` after its trigger, never
/// firing for `stormguard`. (On the sped-up clock a burst of retries the budget's floor
/// pays for lasts a whole rate window, and may match the expression for an instant:
/// pending, which notifies no one; firing takes 5 s of it, as 5 minutes do at the rules'
/// own scale.)
fn check_metastable_loop(
    addr: SocketAddr,
    (_, trigger_end): (f64, f64),
    unguarded: (f64, f64),
    stormguard: (f64, f64),
) {
    let alert = "StormguardMetastableLoop";
    let after: Vec<f64> = ["pending", "firing"]
        .iter()
        .flat_map(|state| alert_times(addr, alert, "unguarded", state, unguarded))
        .filter(|t| *t >= trigger_end)
        .collect();
    assert!(
        !after.is_empty(),
        "{alert} was neither pending nor firing for unguarded after its trigger \
         (ended {trigger_end})"
    );
    let seen = alert_times(addr, alert, "stormguard", "firing", stormguard);
    assert!(seen.is_empty(), "{alert} firing for stormguard at {seen:?}");
}

/// The budget alert for `stormguard`: firing during the trigger (give or take one rate
/// window of the sped-up rules), and clear from 4 s after the policy recovered (`recovery`
/// seconds after the trigger) to the end of the run.
fn check_budget(addr: SocketAddr, (start, end): (f64, f64), recovery: f64, run: (f64, f64)) {
    let alert = "StormguardBudgetRefusingRetries";
    let firing = alert_times(addr, alert, "stormguard", "firing", run);
    let window = 1.0;
    assert!(
        firing.iter().any(|t| *t >= start && *t <= end + window),
        "{alert} did not fire during the trigger ({start}..{end}): firing at {firing:?}; \
         budget refusals per second: {}",
        series(
            addr,
            "stormguard:client_refusals:rate1m{stormguard_layer=\"stormguard\",\
             stormguard_refusal_cause=\"budget\"}",
            run
        )
    );
    let late: Vec<&f64> = firing
        .iter()
        .filter(|t| **t > end + recovery + 4.0)
        .collect();
    assert!(
        late.is_empty(),
        "{alert} still firing 4 s after the policy recovered, {recovery} s after the trigger \
         ended at {end}: {late:?}"
    );
}

/// The panels whose series the storm does not make: it has no `Replicas` channel, no
/// breaker and no hedging policy. Their queries must still be accepted.
const NOT_IN_THE_STORM: [&str; 4] = [
    "Circuit breaker state",
    "Replicas by state",
    "Replica ejections",
    "Hedges sent and won",
];

/// Every query of the dashboard is accepted by the live Prometheus, and returns series at
/// `at` (during the `stormguard` policy's trigger) unless the storm makes none.
fn check_dashboard(addr: SocketAddr, at: f64) {
    let path = ops_dir().join("grafana/stormguard.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(panels.len() >= 12, "{} panels", panels.len());
    let mut queried = 0;
    for panel in panels {
        let title = panel["title"].as_str().unwrap();
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            let live =
                scale_durations(&expr.replace("$layer", ".+").replace("$chain", ".+"), SPEED);
            let data = api(
                addr,
                &format!("/api/v1/query?query={}&time={at:.3}", encode(&live)),
            );
            let series = data["result"].as_array().map_or(0, Vec::len);
            if !NOT_IN_THE_STORM.iter().any(|t| title.starts_with(t)) {
                assert!(series > 0, "{title}: `{live}` returned no series");
            }
            queried += 1;
        }
    }
    assert!(queried >= 16, "{queried} queries");
}
