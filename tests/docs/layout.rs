//! The source tree keeps two conventions. A production file holds no test module: unit
//! tests sit in a `tests.rs` beside the file they test (`#[cfg(test)] mod tests;`), so a
//! file's lines are the code it runs. And no crate's `src/` imports the simulator
//! (`stormguard_sim`) but the simulator's own and the demo's: a layer's tests that compare
//! it with the simulator are integration tests, so no drawing of the crates puts a layer
//! above the simulator.

use std::path::Path;

use crate::imports::{relative, sources};

/// The crates whose `src/` may import the simulator: the simulator and the demo.
const MAY_IMPORT_THE_SIMULATOR: [&str; 2] = ["crates/stormguard-sim", "crates/stormguard-demo"];

/// Whether an attribute line is a `cfg` that holds for tests (`#[cfg(test)]`,
/// `#[cfg(all(test, ...))]`), not one that excludes them (`#[cfg(not(test))]`).
fn is_test_cfg(attribute: &str) -> bool {
    let Some(predicate) = attribute
        .strip_prefix("#[cfg(")
        .and_then(|rest| rest.strip_suffix(")]"))
    else {
        return false;
    };
    // Strings (`feature = "test-util"`) and negations (`not(test)`) taken out.
    let mut rest: String = predicate.split('"').step_by(2).collect();
    while let Some(at) = rest.find("not(") {
        let end = rest[at..].find(')').map_or(rest.len(), |e| at + e + 1);
        rest.replace_range(at..end, "");
    }
    rest.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .any(|word| word == "test")
}

/// Whether a line of code (its attributes taken off) opens a module with a body:
/// `mod name {`, `pub(crate) mod name {`.
fn opens_module_body(code: &str) -> bool {
    let code = code
        .strip_prefix("pub")
        .map_or(code, |rest| match rest.strip_prefix('(') {
            Some(scoped) => scoped.split_once(')').map_or(rest, |(_, after)| after),
            None => rest,
        })
        .trim_start();
    let Some(rest) = code.strip_prefix("mod ") else {
        return false;
    };
    let name_end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    name_end > 0 && rest[name_end..].trim_start().starts_with('{')
}

/// The lines (1-based) of a source file that open a test module with a body: a module
/// under a test `cfg`, the attribute on its own line above it (other attributes, doc
/// comments and blank lines between) or on the same line.
fn inline_test_modules(source: &str) -> Vec<usize> {
    let mut found = Vec::new();
    let mut under_test_cfg = false;
    for (i, line) in source.lines().enumerate() {
        let mut code = line.trim();
        // Attributes at the start of the line, each read for a test cfg.
        while code.starts_with("#[") {
            let end = code.find(']').map_or(code.len(), |e| e + 1);
            let attribute = &code[..end];
            under_test_cfg |= is_test_cfg(&attribute.replace(' ', ""));
            code = code[end..].trim_start();
        }
        if code.is_empty() || code.starts_with("//") {
            continue;
        }
        if under_test_cfg && opens_module_body(code) {
            found.push(i + 1);
        }
        under_test_cfg = false;
    }
    found
}

/// The lines (1-based) of a source file whose code (not a comment) names the simulator's
/// crate.
fn simulator_imports(source: &str) -> Vec<usize> {
    source
        .lines()
        .enumerate()
        .filter(|(_, line)| {
            let code = line.split("//").next().unwrap_or_default();
            code.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .any(|word| word == "stormguard_sim")
        })
        .map(|(i, _)| i + 1)
        .collect()
}

#[test]
fn no_production_file_holds_a_test_module_and_no_layer_imports_the_simulator() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut crates: Vec<String> = std::fs::read_dir(root.join("crates"))
        .unwrap()
        .map(|entry| relative(root, &entry.unwrap().path()))
        .collect();
    crates.sort();
    crates.push(".".to_owned());
    let mut failures = Vec::new();
    for dir in &crates {
        let mut files = Vec::new();
        sources(&root.join(dir).join("src"), &mut files);
        // A walk that found no source would pass vacuously.
        assert!(!files.is_empty(), "{dir}: no source file under src/");
        let may_import = MAY_IMPORT_THE_SIMULATOR.contains(&dir.as_str());
        for file in files {
            let name = relative(root, &file);
            // A test module's own file (`tests.rs`, or one it declares beside it) is
            // test code.
            let is_test_file = file
                .components()
                .any(|c| c.as_os_str() == "tests.rs" || c.as_os_str() == "tests");
            let text = std::fs::read_to_string(&file).unwrap();
            if !is_test_file {
                for at in inline_test_modules(&text) {
                    failures.push(format!(
                        "{name}:{at}: a test module with a body: move it to a tests.rs beside the file (`#[cfg(test)] mod tests;`)"
                    ));
                }
            }
            if !may_import {
                for at in simulator_imports(&text) {
                    failures.push(format!(
                        "{name}:{at}: imports the simulator under src/: compare with it from an integration test"
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn an_inline_test_module_and_a_simulator_import_are_reported() {
    let source = "\
//! A file.
use stormguard_sim::SimServer;
// Prose naming stormguard_sim::SimServer is no import.
#[cfg(test)]
mod tests;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
/// Docs.
mod tests {
    use super::*;
}

#[cfg(all(test, feature = \"tower\"))]
pub(crate) mod tower_tests {}

#[cfg(test)] mod one_line { }

#[cfg(not(test))]
mod metrics {}

#[cfg(feature = \"x\")]
mod x {}

#[cfg(test)]
fn helper() {}
mod after_a_function {}
";
    assert_eq!(inline_test_modules(source), [10, 15, 17]);
    assert_eq!(simulator_imports(source), [2]);
    assert!(is_test_cfg("#[cfg(test)]"));
    assert!(is_test_cfg("#[cfg(all(test,feature=\"tower\"))]"));
    assert!(!is_test_cfg("#[cfg(not(test))]"));
    assert!(!is_test_cfg("#[cfg(feature=\"test-util\")]"));
    assert!(!is_test_cfg("#[allow(clippy::unwrap_used)]"));
}
