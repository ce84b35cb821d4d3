//! Every example's command line, run as the example binary: `--help` exits 0 and describes
//! every flag; the flags are exactly the ones that docs, scripts and tests use (a contract:
//! one dropped or renamed breaks them); an unknown flag or a bad value exits 2 with a
//! message that names it.
//!
//! The binaries are built by `cargo build --example ...` into the target directory this test
//! runs from (a no-op when `cargo test` has just built them), so the test never runs a stale
//! binary.
#![allow(clippy::unwrap_used)]

use crate::support;

use std::path::Path;
use std::process::{Command, Output};

/// An example, the long flags its `--help` lists (`--help` itself aside), and a command
/// line with a bad value it must refuse.
struct Example {
    name: &'static str,
    flags: &'static [&'static str],
    bad_value: &'static [&'static str],
}

const EXAMPLES: &[Example] = &[
    Example {
        name: "adaptive",
        flags: &[
            "--json",
            "--secs",
            "--warmup",
            "--capacity",
            "--service-ms",
            "--load",
            "--only",
            "--storm",
        ],
        bad_value: &["--capacity", "3"],
    },
    Example {
        name: "chain",
        flags: &["--quick", "--json", "--seed", "--metrics-addr"],
        bad_value: &["--seed", "1.5"],
    },
    Example {
        name: "client",
        flags: &[
            "--target",
            "--requests",
            "--concurrency",
            "--deadline-ms",
            "--policy",
            "--service-config",
            "--seed",
            "--payload-bytes",
            "--otel-stdout",
            "--metrics-addr",
        ],
        bad_value: &["--requests", "many"],
    },
    Example {
        name: "fleet",
        flags: &[
            "--quick",
            "--replicas",
            "--scenarios",
            "--policies",
            "--seed",
            "--json",
            "--svg",
            "--load",
            "--deadline-ms",
            "--discovery",
            "--metrics-addr",
            "--no-health-checks",
        ],
        bad_value: &["--scenarios", "fail-fast,flood"],
    },
    Example {
        name: "fleet_sim",
        flags: &["--quick", "--seed", "--clients", "--json"],
        bad_value: &["--clients", "0"],
    },
    Example {
        name: "process_faults",
        flags: &[
            "--fault",
            "--seconds",
            "--overload",
            "--clients",
            "--deadline-ms",
            "--fault-after-ms",
            "--down-ms",
            "--max-connection-age-ms",
            "--server",
            "--json",
        ],
        bad_value: &["--fault", "flood"],
    },
    Example {
        name: "relay",
        flags: &["--addr", "--target", "--service-config"],
        bad_value: &["--addr", "nowhere", "--target", "http://127.0.0.1:1"],
    },
    Example {
        name: "server",
        flags: &[
            "--config",
            "--addr",
            "--workers",
            "--queue",
            "--service-time-ms",
            "--fail-rate",
            "--no-shed",
            "--retry-depth",
            "--lifo-depth",
            "--seed",
            "--max-pending-resets",
            "--log-calls",
            "--otel-stdout",
            "--metrics-addr",
            "--load-reports",
            "--max-connection-age-ms",
        ],
        bad_value: &["--fail-rate", "2"],
    },
    Example {
        name: "server_measure",
        flags: &["--secs", "--load", "--only", "--seed"],
        bad_value: &["--secs", "many"],
    },
    Example {
        name: "sim",
        flags: &["--quick", "--seed", "--json"],
        bad_value: &["--seed", "one"],
    },
    Example {
        name: "soak",
        flags: &[
            "--seconds",
            "--overload",
            "--clients",
            "--deadline-ms",
            "--server",
        ],
        bad_value: &["--clients", "0"],
    },
    Example {
        name: "steady",
        flags: &[
            "--handler-ms",
            "--callers",
            "--watchers",
            "--rounds",
            "--secs",
            "--guards",
            "--limits",
        ],
        bad_value: &["--rounds", "many"],
    },
    Example {
        name: "storm",
        flags: &[
            "--quick",
            "--json",
            "--svg",
            "--seed",
            "--model",
            "--policies",
            "--load",
            "--deadline-ms",
            "--limit",
            "--overload",
            "--reject-cost-us",
            "--metrics-addr",
            "--client",
        ],
        bad_value: &["--policies", "naive,patient"],
    },
    Example {
        name: "tail",
        flags: &["--quick", "--json", "--svg", "--policies", "--seed"],
        bad_value: &["--policies", "none,fast"],
    },
];

fn run(dir: &Path, name: &str, args: &[&str]) -> Output {
    let path = dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    Command::new(&path)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", path.display()))
}

/// The long flags in the options of a `--help` text, each with whether it has a
/// description: on its own line (`--seed <N>  Seed of ...`) or, in clap's long layout,
/// on the lines below it, indented further.
fn described_flags(help: &str) -> Vec<(String, bool)> {
    let lines: Vec<&str> = help.lines().collect();
    let mut flags = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let text = line.trim_start();
        if !text.starts_with('-') {
            continue;
        }
        let indent = line.len() - text.len();
        let (spec, rest) = text.split_once("  ").unwrap_or((text, ""));
        let below = lines.get(i + 1).is_some_and(|next| {
            let next_text = next.trim_start();
            !next_text.is_empty() && next.len() - next_text.len() > indent
        });
        let described = !rest.trim().is_empty() || below;
        for word in spec.split([',', ' ']) {
            if let Some(flag) = word.strip_prefix("--") {
                flags.push((format!("--{flag}"), described));
            }
        }
    }
    flags
}

#[test]
fn every_example_is_listed_here() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|entry| {
            let name = entry.unwrap().file_name().into_string().unwrap();
            name.strip_suffix(".rs").map(str::to_owned)
        })
        .collect();
    on_disk.sort_unstable();
    let listed: Vec<&str> = EXAMPLES.iter().map(|e| e.name).collect();
    assert_eq!(on_disk, listed, "examples/*.rs against EXAMPLES");
}

#[test]
fn help_describes_every_flag_and_bad_input_exits_2() {
    let names: Vec<_> = EXAMPLES.iter().map(|e| e.name).collect();
    let dir = support::build_examples(&names);
    for example in EXAMPLES {
        let name = example.name;
        let help = run(&dir, name, &["--help"]);
        let stdout = String::from_utf8_lossy(&help.stdout);
        assert_eq!(help.status.code(), Some(0), "{name} --help: {help:?}");
        assert!(
            stdout.contains(&format!("Usage: {name}")),
            "{name} --help:\n{stdout}"
        );
        let first = stdout.lines().next().unwrap_or("");
        assert!(
            !first.trim().is_empty() && !first.starts_with("Usage:"),
            "{name} --help starts with what the example does:\n{stdout}"
        );
        let flags = described_flags(&stdout);
        for (flag, described) in &flags {
            assert!(
                described,
                "{name} --help: {flag} has no description:\n{stdout}"
            );
        }
        let mut listed: Vec<&str> = flags
            .iter()
            .map(|(f, _)| f.as_str())
            .filter(|f| *f != "--help")
            .collect();
        let mut expected = example.flags.to_vec();
        listed.sort_unstable();
        expected.sort_unstable();
        assert_eq!(listed, expected, "{name} --help:\n{stdout}");

        let unknown = run(&dir, name, &["--no-such-flag"]);
        let stderr = String::from_utf8_lossy(&unknown.stderr);
        assert_eq!(
            unknown.status.code(),
            Some(2),
            "{name} --no-such-flag: {unknown:?}"
        );
        assert!(stderr.contains("--no-such-flag"), "{name}: {stderr}");
        assert!(
            unknown.stdout.is_empty(),
            "{name} --no-such-flag printed to stdout"
        );

        let bad = run(&dir, name, example.bad_value);
        let stderr = String::from_utf8_lossy(&bad.stderr);
        assert_eq!(
            bad.status.code(),
            Some(2),
            "{name} {:?}: {bad:?}",
            example.bad_value
        );
        assert!(
            stderr.contains(example.bad_value[0]),
            "{name} {:?}: the error names the flag: {stderr}",
            example.bad_value
        );
    }
}
