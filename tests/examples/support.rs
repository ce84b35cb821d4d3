//! Building the examples from a test, with the test's own profile and features, so that
//! the binaries run are those of the sources under test.

#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// `<target>/<profile>`, the folder this test binary's `deps/` is in.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent()
        .and_then(Path::parent)
        .unwrap_or_else(|| panic!("{} is not in <target>/<profile>/deps", exe.display()))
        .to_path_buf()
}

/// Builds the examples `names` with the profile and features this test was built with (a
/// no-op when `cargo test --workspace` just did); returns the folder the binaries are in.
///
/// The build resolves features over the whole workspace, as `cargo test --workspace` does:
/// `-p stormguard` alone would resolve its dependencies' features differently and build
/// every crate of the workspace a second time, in the middle of the tests.
pub fn build_examples(names: &[&str]) -> PathBuf {
    let profile_dir = profile_dir();
    let target_dir = profile_dir.parent().unwrap();
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "dev",
        Some(other) => other,
        None => panic!("no profile in {}", profile_dir.display()),
    };
    let mut cargo = Command::new(env!("CARGO"));
    cargo
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["build", "--quiet", "--workspace", "--profile", profile])
        .arg("--target-dir")
        .arg(target_dir);
    let mut features = Vec::new();
    if cfg!(feature = "opentelemetry") {
        features.push("stormguard/opentelemetry");
    }
    if cfg!(feature = "otel-examples") {
        features.push("stormguard/otel-examples");
    }
    if !features.is_empty() {
        cargo.args(["--features", &features.join(",")]);
    }
    for name in names {
        cargo.args(["--example", name]);
    }
    let built = cargo.output().unwrap();
    assert!(
        built.status.success(),
        "cargo build of the examples failed:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    profile_dir.join("examples")
}

/// Builds the example `name`, runs it with `args` plus `--json FILE --svg FILE` in a
/// fresh temporary folder, checks that it succeeded and drew an SVG, and returns the JSON
/// report (and prints the example's stdout, shown when the test fails).
pub fn run_with_report(name: &str, args: &[&str]) -> serde_json::Value {
    let exe = build_examples(&[name]).join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    let dir = std::env::temp_dir().join(format!("stormguard-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (json_path, svg_path) = (
        dir.join(format!("{name}.json")),
        dir.join(format!("{name}.svg")),
    );
    let out = Command::new(&exe)
        .args(args)
        .arg("--json")
        .arg(&json_path)
        .arg("--svg")
        .arg(&svg_path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{name} {args:?}: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{stdout}");
    let report = serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    assert!(svg.contains("<svg"), "not an SVG: {svg:.200}");
    std::fs::remove_dir_all(&dir).unwrap();
    report
}
