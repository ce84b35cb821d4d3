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
/// no-op when `cargo test` just did); returns the folder the binaries are in.
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
        .args(["build", "--quiet", "-p", "stormguard", "--profile", profile])
        .arg("--target-dir")
        .arg(target_dir);
    let mut features = Vec::new();
    if cfg!(feature = "opentelemetry") {
        features.push("opentelemetry");
    }
    if cfg!(feature = "otel-examples") {
        features.push("otel-examples");
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
