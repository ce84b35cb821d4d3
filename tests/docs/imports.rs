//! A published crate's docs speak of that crate: the Rust of its README and of its doc
//! examples names no other crate of the workspace (a user of `stormguard-client` needs
//! nothing of `stormguard-core` to follow its docs), and its README names no unpublished
//! crate (`stormguard_demo`, `stormguard_sim`, `stormguard_fuzz`), which a reader cannot add.

use std::path::{Path, PathBuf};

/// The published crates: the name their code uses, their directory.
const PUBLISHED: [(&str, &str); 5] = [
    ("stormguard", "."),
    ("stormguard_client", "crates/stormguard-client"),
    ("stormguard_server", "crates/stormguard-server"),
    ("stormguard_core", "crates/stormguard-core"),
    ("stormguard_grpc", "crates/stormguard-grpc"),
];

const UNPUBLISHED: [&str; 3] = ["stormguard_demo", "stormguard_sim", "stormguard_fuzz"];

/// The crates of the workspace that a line of Rust names by path (`stormguard_core::X`,
/// `stormguard::client`), each once.
fn crates_named(line: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("stormguard") {
        let before = rest[..at].chars().next_back();
        let word: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let after = &rest[at + word.len()..];
        let is_path =
            after.starts_with("::") || after.starts_with(';') || after.starts_with(" as ");
        let starts_word = !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        if is_path && starts_word && !out.contains(&word) {
            out.push(word.clone());
        }
        rest = &rest[at + word.len().max(1)..];
    }
    out
}

/// The Rust lines of a markdown page's ```` ```rust ```` blocks, with their line numbers.
fn readme_rust(markdown: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut rust = None;
    for (i, line) in markdown.lines().enumerate() {
        match (&rust, line.trim_start().strip_prefix("```")) {
            (None, Some(info)) => rust = Some(info.trim().is_empty() || info.starts_with("rust")),
            (Some(_), Some(_)) => rust = None,
            (Some(true), None) => out.push((i + 1, line.to_owned())),
            _ => {}
        }
    }
    out
}

/// The Rust lines of the code blocks in a source file's doc comments (`///`, `//!`), with
/// their line numbers.
fn doc_examples(source: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut rust: Option<bool> = None;
    for (i, line) in source.lines().enumerate() {
        let trimmed = line.trim_start();
        let Some(doc) = trimmed
            .strip_prefix("///")
            .or_else(|| trimmed.strip_prefix("//!"))
        else {
            rust = None;
            continue;
        };
        let doc = doc.strip_prefix(' ').unwrap_or(doc);
        match (&rust, doc.trim_start().strip_prefix("```")) {
            (None, Some(info)) => {
                let info = info.trim();
                rust = Some(
                    info.is_empty()
                        || info.split(',').all(|w| {
                            matches!(
                                w.trim(),
                                "rust" | "no_run" | "ignore" | "should_panic" | "compile_fail"
                            ) || w.trim().starts_with("edition")
                        }),
                );
            }
            (Some(_), Some(_)) => rust = None,
            (Some(true), None) => out.push((i + 1, doc.to_owned())),
            _ => {}
        }
    }
    out
}

/// Every `.rs` file under `dir`, in a stable order.
pub(crate) fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut found: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    found.sort();
    for path in found {
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `path` relative to the workspace's `root`.
pub(crate) fn relative(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .display()
        .to_string()
}

/// What is wrong in one published crate's docs, one line each.
fn problems(root: &Path, own: &str, dir: &str) -> (usize, Vec<String>) {
    let mut out = Vec::new();
    let mut lines = 0;
    let mut check = |place: String, line: &str| {
        lines += 1;
        for named in crates_named(line) {
            if named != own {
                out.push(format!(
                    "{place}: names {named} in {own}'s docs: {}",
                    line.trim()
                ));
            }
        }
    };
    let readme = root.join(dir).join("README.md");
    let readme_text = std::fs::read_to_string(&readme).unwrap_or_default();
    let readme_name = relative(root, &readme);
    for (at, line) in readme_rust(&readme_text) {
        check(format!("{readme_name}:{at}"), &line);
    }
    let mut files = Vec::new();
    sources(&root.join(dir).join("src"), &mut files);
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let name = relative(root, &file);
        for (at, line) in doc_examples(&text) {
            check(format!("{name}:{at}"), &line);
        }
    }
    for (at, line) in readme_text.lines().enumerate() {
        for crate_name in UNPUBLISHED {
            if line.contains(crate_name) {
                out.push(format!(
                    "{readme_name}:{}: names the unpublished {crate_name}",
                    at + 1
                ));
            }
        }
    }
    (lines, out)
}

#[test]
fn a_published_crate_s_docs_import_from_that_crate() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut failures = Vec::new();
    for (own, dir) in PUBLISHED {
        let (lines, found) = problems(root, own, dir);
        // Every published crate shows Rust in its README and its docs.
        assert!(lines >= 10, "{own}: only {lines} lines of Rust read");
        failures.extend(found);
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn another_crate_in_a_doc_example_is_reported() {
    assert_eq!(
        crates_named("use stormguard_core::{ClientConfig, Code};"),
        ["stormguard_core"]
    );
    assert_eq!(
        crates_named("# Ok::<(), stormguard::ConfigError>(()) // stormguard_client::X"),
        ["stormguard", "stormguard_client"]
    );
    // Header names, metric names and crate names in prose are not paths.
    assert!(crates_named(r#"let key = "stormguard-criticality"; // stormguard.layer"#).is_empty());
    let source = "//! Text naming stormguard_core::Code.\n//!\n//! ```\n//! use stormguard_core::Code;\n\
                  //! ```\n//!\n//! ```text\n//! stormguard_sim::run\n//! ```\nfn f() {}\n/// ```no_run\n\
                  /// let x = stormguard_client::RetryLayer::new;\n/// ```\n";
    let found: Vec<usize> = doc_examples(source).into_iter().map(|(at, _)| at).collect();
    assert_eq!(found, [4, 12]);
    let readme =
        "# x\n\n```rust,no_run\nuse stormguard_demo::Inventory;\n```\n\n```sh\ncargo run\n```\n";
    assert_eq!(
        readme_rust(readme),
        [(4, "use stormguard_demo::Inventory;".to_owned())]
    );
}
