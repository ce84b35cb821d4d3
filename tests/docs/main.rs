//! Every JSON, YAML and TOML document shown in the README, the `docs/` pages and the crate
//! READMEs is read by the loader it is written for, so that a document a user copies
//! loads. A block names its loader after its format: ```` ```json client ````
//! (`ClientConfig`, either shape), `admission` (`AdmissionConfig`), `replicas`
//! (`ReplicaConfig`), `criticality` (`CriticalityTable`) or `idempotency`
//! (`IdempotencyConfig`); a document without one fails
//! here. (The Rust of the same pages is compiled as doc tests: the README's by this crate,
//! the others' by `stormguard-demo`.)
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use stormguard_core::admission::AdmissionConfig;
use stormguard_core::config::{ClientConfig, Format};
use stormguard_core::criticality::CriticalityTable;

/// One fenced block: where it is, its info string, its text.
struct Block {
    place: String,
    info: String,
    text: String,
}

fn pages() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut pages = vec![root.join("README.md")];
    for dir in ["docs", "crates"] {
        let mut found: Vec<PathBuf> = std::fs::read_dir(root.join(dir))
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .flat_map(|path| {
                if path.is_dir() {
                    vec![path.join("README.md")]
                } else {
                    vec![path]
                }
            })
            .filter(|path| path.extension().is_some_and(|e| e == "md") && path.is_file())
            .collect();
        found.sort();
        pages.extend(found);
    }
    pages
}

/// The fenced blocks of a markdown text.
fn blocks(name: &str, markdown: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<(usize, String, Vec<&str>)> = None;
    for (i, line) in markdown.lines().enumerate() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(info)) => open = Some((i + 1, info.trim().to_owned(), Vec::new())),
            (Some(_), Some(rest)) if rest.trim().is_empty() => {
                let (at, info, lines) = open.take().unwrap();
                out.push(Block {
                    place: format!("{name}:{at}"),
                    info,
                    text: lines.join("\n"),
                });
            }
            (Some((_, _, lines)), _) => lines.push(line),
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "{name}: a code block is not closed");
    out
}

/// Reads one document with the loader its block names; `None` for blocks that are not
/// documents.
fn load(block: &Block) -> Option<Result<(), String>> {
    let mut words = block.info.split_whitespace();
    let format = match words.next()? {
        "json" => Format::Json,
        "yaml" => Format::Yaml,
        "toml" => Format::Toml,
        _ => return None,
    };
    let text = block.text.as_str();
    let loaded = match (words.next(), format) {
        (Some("client"), _) => ClientConfig::from_text(text, format).map(drop),
        (Some("admission"), _) => AdmissionConfig::from_text(text, format).map(drop),
        (Some("replicas"), _) => {
            stormguard_core::replica::ReplicaConfig::from_text(text, format).map(drop)
        }
        (Some("criticality"), Format::Json) => CriticalityTable::from_json(text).map(drop),
        (Some("idempotency"), _) => {
            stormguard_core::idempotency::IdempotencyConfig::from_text(text, format).map(drop)
        }
        (other, _) => {
            return Some(Err(format!(
                "names no loader ({other:?}): write ```{} client, admission, replicas, criticality or idempotency",
                block.info
            )));
        }
    };
    Some(loaded.map_err(|e| e.to_string()))
}

#[test]
fn every_document_in_the_docs_loads() {
    let mut loaded = Vec::new();
    let mut failures = Vec::new();
    for page in pages() {
        let name = page
            .strip_prefix(env!("CARGO_MANIFEST_DIR"))
            .unwrap()
            .display()
            .to_string();
        let markdown = std::fs::read_to_string(&page).unwrap();
        for block in blocks(&name, &markdown) {
            match load(&block) {
                None => {}
                Some(Ok(())) => loaded.push(block.place),
                Some(Err(e)) => failures.push(format!("{}: {e}", block.place)),
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    // The pages that show documents: a reader that found none would pass vacuously.
    for page in ["README.md", "docs/config.md", "docs/admission.md"] {
        let prefix = format!("{page}:");
        assert!(
            loaded.iter().any(|place| place.starts_with(&prefix)),
            "no document loaded from {page}: {loaded:?}"
        );
    }
}

#[test]
fn a_document_that_does_not_load_is_reported_with_its_place() {
    let markdown = "text\n\n```json admission\n{ \"admission\": { \"workers\": \"many\" } }\n```\n\n\
                    ```yaml\nretry: {}\n```\n\n```sh\ncargo test\n```\n";
    let found = blocks("page.md", markdown);
    assert_eq!(found.len(), 3);
    assert_eq!(found[0].place, "page.md:3");
    let error = load(&found[0]).unwrap().unwrap_err();
    assert!(error.contains("admission.workers"), "{error}");
    let error = load(&found[1]).unwrap().unwrap_err();
    assert!(error.contains("names no loader"), "{error}");
    assert!(load(&found[2]).is_none());
}
