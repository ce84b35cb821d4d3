//! The docs as a user reads them, checked.
//!
//! Every JSON, YAML and TOML document shown in the README, the `docs/` pages and the crate
//! READMEs is read by the loader it is written for, so that a document a user copies
//! loads. A block names its loader after its format: ```` ```json client ````
//! (`ClientConfig`, either shape), `admission` (`AdmissionConfig`), `replicas`
//! (`ReplicaConfig`), `criticality` (`CriticalityTable`), `idempotency`
//! (`IdempotencyConfig`) or `kubernetes` (Kubernetes manifests: each a YAML document with
//! its `apiVersion`, `kind` and name, checked for what docs/kubernetes.md relies on); a
//! document without one fails here. (The Rust of the same pages is compiled as doc tests:
//! the README's by this crate, the others' by `stormguard-demo`.)
//!
//! Beside it: every `cargo test` command of the pages runs a test (`commands`), the
//! README's storm rows are `docs/storm.md`'s (`storm`), a published crate's docs import
//! from that crate (`imports`), no production file holds a test module and no layer's
//! `src/` imports the simulator (`layout`), and the published crates' public API, read from
//! rustdoc's JSON, gives every type one path from a layer's root (`api`, run by
//! `.ci/public-api`).
#![allow(clippy::unwrap_used)]

mod api;
mod commands;
mod imports;
mod layout;
mod storm;

use std::path::{Path, PathBuf};

use stormguard_core::AdmissionConfig;
use stormguard_core::CriticalityTable;
use stormguard_core::{ClientConfig, Format};

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
        (Some("replicas"), _) => stormguard_core::ReplicaConfig::from_text(text, format).map(drop),
        (Some("criticality"), Format::Json) => CriticalityTable::from_json(text).map(drop),
        (Some("idempotency"), _) => {
            stormguard_core::IdempotencyConfig::from_text(text, format).map(drop)
        }
        (Some("kubernetes"), Format::Yaml) => return Some(manifests(text)),
        (other, _) => {
            return Some(Err(format!(
                "names no loader ({other:?}): write ```{} client, admission, replicas, criticality, idempotency or kubernetes",
                block.info
            )));
        }
    };
    Some(loaded.map_err(|e| e.to_string()))
}

/// Kubernetes manifests: every YAML document (`---` between them) is an object with an
/// `apiVersion`, a `kind` and a `metadata.name`; a Service that a client resolves is
/// headless; a Deployment's containers have a gRPC readiness probe, and a grace period
/// longer than their pre-stop delay.
fn manifests(text: &str) -> Result<(), String> {
    use serde::Deserialize;
    let mut count = 0;
    for document in serde_norway::Deserializer::from_str(text) {
        let value = serde_norway::Value::deserialize(document).map_err(|e| e.to_string())?;
        count += 1;
        let str_at = |path: &[&str]| {
            path.iter()
                .try_fold(&value, |v, key| v.get(*key))
                .and_then(serde_norway::Value::as_str)
                .map(str::to_owned)
        };
        let kind = str_at(&["kind"]).ok_or("no kind")?;
        str_at(&["apiVersion"]).ok_or(format!("{kind}: no apiVersion"))?;
        str_at(&["metadata", "name"]).ok_or(format!("{kind}: no metadata.name"))?;
        match kind.as_str() {
            "Service" if str_at(&["spec", "clusterIP"]).as_deref() != Some("None") => {
                return Err("a Service clients resolve must be headless (clusterIP: None)".into());
            }
            "Deployment" => deployment(&value)?,
            _ => {}
        }
    }
    if count == 0 {
        return Err("no manifest".into());
    }
    Ok(())
}

fn deployment(value: &serde_norway::Value) -> Result<(), String> {
    let spec = &value["spec"]["template"]["spec"];
    let grace = spec["terminationGracePeriodSeconds"].as_u64().unwrap_or(30);
    let containers = spec["containers"].as_sequence().ok_or("no containers")?;
    for c in containers {
        if c["readinessProbe"]["grpc"]["port"].as_u64().is_none() {
            return Err("a container without a gRPC readiness probe".into());
        }
        let pre_stop = c["lifecycle"]["preStop"]["sleep"]["seconds"]
            .as_u64()
            .unwrap_or(0);
        if pre_stop >= grace {
            return Err(format!(
                "preStop sleep {pre_stop} s is not under the grace period {grace} s"
            ));
        }
    }
    Ok(())
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
    for page in [
        "README.md",
        "docs/config.md",
        "docs/admission.md",
        "docs/kubernetes.md",
    ] {
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
    // A manifest that is not one, a Service that is not headless.
    let bad = [
        "kind: Service\n",
        "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {clusterIP: 10.0.0.1}\n",
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: a}\nspec: {template: {spec: {containers: [{name: c}]}}}\n",
    ];
    for text in bad {
        assert!(manifests(text).is_err(), "{text}");
    }
}
