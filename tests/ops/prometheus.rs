//! Finding Prometheus's binaries, and the rules' durations scaled for a short run.

use std::path::{Path, PathBuf};

/// The repository's `ops/` folder.
pub(crate) fn ops_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("ops")
}

/// `name` (`promtool`, `prometheus`) on PATH; fails, saying how to get it, when it is not.
pub(crate) fn tool(name: &str) -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|path| path.is_file())
    });
    found.unwrap_or_else(|| {
        panic!(
            "{name} is not on PATH: install Debian's prometheus package \
             (`bash ops/prometheus/setup.sh`, or `apt-get install -y prometheus`), \
             or put Prometheus 2.42 or later's binaries on PATH"
        )
    })
}

/// `text` with every duration of a range selector (`[5m]`) and of a `for:` divided by
/// `factor`, in milliseconds: the same rules, on a clock `factor` times faster.
pub(crate) fn scale_durations(text: &str, factor: u64) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(['[', ':']) {
        let (head, tail) = rest.split_at(i + 1);
        out.push_str(head);
        rest = tail;
        let is_for = head.ends_with("for:");
        if !(head.ends_with('[') || is_for) {
            continue;
        }
        let spaces = rest.len() - rest.trim_start().len();
        let body = &rest[spaces..];
        let digits = body.chars().take_while(char::is_ascii_digit).count();
        let unit = body[digits..].chars().next();
        let ms_per = match unit {
            Some('m') if !body[digits..].starts_with("ms") => 60_000,
            Some('s') => 1_000,
            Some('h') => 3_600_000,
            _ => continue,
        };
        let Ok(n) = body[..digits].parse::<u64>() else {
            continue;
        };
        out.push_str(&rest[..spaces]);
        out.push_str(&format!("{}ms", n * ms_per / factor));
        rest = &body[digits + 1..];
    }
    out.push_str(rest);
    out
}

#[test]
fn durations_scale_in_selectors_and_for_only() {
    let rules =
        "expr: rate(x[1m]) > 0.5 and y[15m:30s]\nfor: 2m\nlabels: {a: b}\nsummary: 'at 3 m'";
    assert_eq!(
        scale_durations(rules, 60),
        "expr: rate(x[1000ms]) > 0.5 and y[15000ms:30s]\nfor: 2000ms\nlabels: {a: b}\nsummary: 'at 3 m'"
    );
}
