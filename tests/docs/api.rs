//! The published crates' public API, read from rustdoc's JSON: a layer's root is enough to
//! use the layer, and every type has one public path.
//!
//! For `stormguard-client`, `stormguard-server` and the facade `stormguard`:
//!
//! - **A path for every type the API names.** Every type, trait or error named in a public
//!   signature, a public field or a variant of an item reachable from the crate's root
//!   (a method's arguments and result, a trait it implements, an associated type, a bound)
//!   is reachable from the same root: a user never needs `stormguard-core` (or, through the
//!   facade, `stormguard::engine`) to name what a layer hands them. The items a layer
//!   crate defines are read whole; the engine's types it re-exports are read whole too,
//!   except the objects a layer takes or gives back built ([`ENGINE_OBJECTS`]): their own
//!   methods are the engine's API, reached through the facade's `engine` (which this check
//!   reads whole).
//! - **One path per item.** No item of the workspace's crates is reachable from a root by
//!   two paths (in the facade: `stormguard::client::X` and `stormguard::server::X`, or
//!   beside `stormguard::engine::X`).
//! - **The facade holds both layers.** Every item reachable from either layer's root is
//!   reachable from the facade's.
//!
//! rustdoc's JSON output is unstable: `.ci/public-api` builds it with the stable toolchain
//! (`RUSTC_BOOTSTRAP=1` for rustdoc alone, so that no dependency is built again) into
//! `target/lint/doc/`, then runs the test below, which is ignored by a plain `cargo test`
//! because it reads those files. The rules themselves are tested on a small document
//! (`the_rules_catch_what_they_say`), in every run.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

use serde_json::{Value, json};

/// The workspace's crates whose items the rules are about (the others' are external).
const WORKSPACE: [&str; 5] = [
    "stormguard_core",
    "stormguard_client",
    "stormguard_server",
    "stormguard_grpc",
    "stormguard",
];

/// The engine's objects that a layer takes built (`RetryLayer::new(RetryController)`,
/// `RetryLayer::with_adaptive_throttle(AdaptiveThrottle)`, `ShedLayer::new(AdmissionController)`)
/// or hands back: the layer's root exports them, their fields and variants are read, but
/// their methods are the engine's API (`stormguard::engine`), not the layer's.
pub(crate) const ENGINE_OBJECTS: [&str; 3] =
    ["RetryController", "AdaptiveThrottle", "AdmissionController"];

/// An item of one of the crates, by where it is defined: `stormguard_core::wire::code::Code`.
type Item = String;

/// One crate's rustdoc JSON, with its local items by defining path.
struct Doc {
    json: Value,
    by_path: HashMap<Item, String>,
}

/// The JSON of the workspace's crates, by crate name.
pub(crate) struct Api {
    docs: HashMap<String, Doc>,
}

fn inner(item: &Value) -> (&str, &Value) {
    item["inner"]
        .as_object()
        .and_then(|o| o.iter().next())
        .map(|(k, v)| (k.as_str(), v))
        .unwrap_or(("", &Value::Null))
}

fn key(id: &Value) -> String {
    match id {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

impl Api {
    /// Reads `<dir>/<crate>.json` for each of the workspace's published crates.
    pub(crate) fn load(dir: &Path) -> Result<Api, String> {
        let mut docs = Vec::new();
        for name in WORKSPACE {
            let file = dir.join(format!("{name}.json"));
            let text = std::fs::read_to_string(&file).map_err(|e| {
                format!(
                    "{}: {e}; build it with `bash .ci/public-api`",
                    file.display()
                )
            })?;
            docs.push(serde_json::from_str(&text).map_err(|e| format!("{}: {e}", file.display()))?);
        }
        Ok(Api::new(docs))
    }

    pub(crate) fn new(jsons: Vec<Value>) -> Api {
        let mut docs = HashMap::new();
        for json in jsons {
            let root = &json["index"][key(&json["root"])];
            let name = root["name"].as_str().unwrap_or_default().to_owned();
            let mut by_path = HashMap::new();
            if let Some(paths) = json["paths"].as_object() {
                for (id, summary) in paths {
                    if summary["crate_id"] == json!(0) {
                        by_path.insert(join(&summary["path"]), id.clone());
                    }
                }
            }
            docs.insert(name, Doc { json, by_path });
        }
        Api { docs }
    }

    /// Where an id of `krate`'s JSON is defined, in whichever crate.
    fn item(&self, krate: &str, id: &Value) -> Option<Item> {
        let doc = &self.docs[krate];
        let summary = doc.json["paths"].get(key(id))?;
        Some(join(&summary["path"]))
    }

    /// The crate and local id an item is defined at, when its crate's JSON is here.
    fn local(&self, item: &str) -> Option<(&str, &Value)> {
        let krate = item.split("::").next()?;
        let (name, doc) = self.docs.get_key_value(krate)?;
        let id = doc.by_path.get(item)?;
        Some((name.as_str(), &doc.json["index"][id]))
    }

    /// Every public path from `krate`'s root, by the item it names.
    pub(crate) fn paths(&self, krate: &str) -> BTreeMap<Item, Vec<String>> {
        let mut out = BTreeMap::new();
        let doc = &self.docs[krate];
        let root = &doc.json["index"][key(&doc.json["root"])];
        self.walk(krate, root, krate.to_owned(), &mut out, 0);
        out
    }

    fn walk(
        &self,
        krate: &str,
        module: &Value,
        prefix: String,
        out: &mut BTreeMap<Item, Vec<String>>,
        depth: usize,
    ) {
        assert!(
            depth < 16,
            "{prefix}: modules nested 16 deep (a cycle of re-exports?)"
        );
        let index = &self.docs[krate].json["index"];
        let items = inner(module).1["items"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for id in items {
            let item = &index[key(&id)];
            if item["visibility"] != json!("public") {
                continue;
            }
            let name = item["name"].as_str().unwrap_or_default();
            match inner(item) {
                ("module", _) => {
                    self.walk(krate, item, format!("{prefix}::{name}"), out, depth + 1)
                }
                ("use", u) => {
                    let Some(target) = u.get("id").filter(|t| !t.is_null()) else {
                        continue;
                    };
                    let glob = u["is_glob"] == json!(true);
                    let path = if glob {
                        prefix.clone()
                    } else {
                        format!("{prefix}::{}", u["name"].as_str().unwrap_or_default())
                    };
                    // The target: in this crate, or in another crate of the workspace.
                    let found = match index.get(key(target)) {
                        Some(t) => Some((krate, t)),
                        None => self.item(krate, target).and_then(|i| self.local(&i)),
                    };
                    match found {
                        Some((k, t)) if inner(t).0 == "module" => {
                            self.walk(k, t, path, out, depth + 1)
                        }
                        _ => {
                            if let Some(i) = self.item(krate, target) {
                                out.entry(i).or_default().push(path);
                            }
                        }
                    }
                }
                ("impl" | "struct_field" | "variant" | "assoc_type" | "assoc_const", _) => {}
                _ => {
                    if let Some(i) = self.item(krate, &id) {
                        out.entry(i).or_default().push(format!("{prefix}::{name}"));
                    }
                }
            }
        }
    }

    /// The workspace's items that `item`'s public face names, each with where: its
    /// generics, public fields, variants' fields, signature, type; and, when `methods`,
    /// its inherent public methods and the trait impls it has (trait, associated items).
    pub(crate) fn named(&self, item: &str, methods: bool) -> Vec<(Item, String)> {
        let mut out = Vec::new();
        let Some((krate, value)) = self.local(item) else {
            return out;
        };
        let index = &self.docs[krate].json["index"];
        let name = value["name"].as_str().unwrap_or("?");
        let mut add = |v: &Value, place: String| {
            let mut found = Vec::new();
            paths_in(v, &mut found);
            for id in found {
                if let Some(i) = self.item(krate, &id) {
                    out.push((i, place.clone()));
                }
            }
        };
        let (kind, body) = inner(value);
        add(&body["generics"], format!("{name}'s generics"));
        match kind {
            "function" => add(&body["sig"], format!("{name}()")),
            "type_alias" | "constant" | "static" => add(&body["type"], name.to_owned()),
            "trait" => {
                add(&body["bounds"], format!("{name}'s bounds"));
                for m in body["items"].as_array().into_iter().flatten() {
                    let m = &index[key(m)];
                    add(
                        inner(m).1,
                        format!("{name}::{}", m["name"].as_str().unwrap_or("?")),
                    );
                }
            }
            _ => {}
        }
        for field in fields(index, body) {
            let f = &index[key(&field)];
            if f["visibility"] == json!("public") {
                let place = format!("{name}.{}", f["name"].as_str().unwrap_or("?"));
                add(inner(f).1, place);
            }
        }
        for variant in body["variants"].as_array().into_iter().flatten() {
            let v = &index[key(variant)];
            let place = format!("{name}::{}", v["name"].as_str().unwrap_or("?"));
            for field in fields(index, inner(v).1) {
                add(inner(&index[key(&field)]).1, place.clone());
            }
        }
        if !methods {
            return out;
        }
        for imp in body["impls"].as_array().into_iter().flatten() {
            let imp = inner(&index[key(imp)]).1;
            if imp["is_synthetic"] == json!(true) || !imp["blanket_impl"].is_null() {
                continue;
            }
            let of_trait = !imp["trait"].is_null();
            if of_trait {
                let place = format!("{name}: {}", imp["trait"]["path"].as_str().unwrap_or("?"));
                add(&imp["trait"], place);
            }
            add(&imp["generics"], format!("{name}'s impl"));
            for m in imp["items"].as_array().into_iter().flatten() {
                let m = &index[key(m)];
                if of_trait || m["visibility"] == json!("public") {
                    add(
                        inner(m).1,
                        format!("{name}::{}", m["name"].as_str().unwrap_or("?")),
                    );
                }
            }
        }
        out
    }
}

/// The field ids of a struct's or a variant's kind (`plain`, `tuple` or `struct`).
fn fields(index: &Value, body: &Value) -> Vec<Value> {
    let kind = &body["kind"];
    let mut out: Vec<Value> = Vec::new();
    for list in [
        &kind["plain"]["fields"],
        &kind["struct"]["fields"],
        &kind["tuple"],
    ] {
        out.extend(
            list.as_array()
                .into_iter()
                .flatten()
                .filter(|f| !f.is_null())
                .cloned(),
        );
    }
    out.retain(|f| index.get(key(f)).is_some());
    out
}

/// The ids of every path (`{"path": .., "id": ..}`: a type, a trait) inside a value.
fn paths_in(v: &Value, out: &mut Vec<Value>) {
    match v {
        Value::Object(o) => {
            if let (Some(Value::String(_)), Some(id)) = (o.get("path"), o.get("id")) {
                out.push(id.clone());
            }
            for child in o.values() {
                paths_in(child, out);
            }
        }
        Value::Array(a) => a.iter().for_each(|c| paths_in(c, out)),
        _ => {}
    }
}

fn join(path: &Value) -> String {
    path.as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect::<Vec<_>>()
        .join("::")
}

fn in_workspace(item: &str) -> bool {
    WORKSPACE.contains(&item.split("::").next().unwrap_or_default())
}

/// What is wrong with `krate`'s public API, one line each (empty: nothing).
pub(crate) fn problems(api: &Api, krate: &str) -> Vec<String> {
    let paths = api.paths(krate);
    let mut out = BTreeSet::new();
    for (item, at) in &paths {
        if in_workspace(item) && at.len() > 1 {
            out.insert(format!(
                "{item} has {} public paths: {}",
                at.len(),
                at.join(", ")
            ));
        }
    }
    let facade = krate == "stormguard";
    for (item, at) in &paths {
        if !in_workspace(item) {
            continue;
        }
        // A layer reads its own items whole, and the engine's it re-exports but for their
        // methods of the engine objects; the facade reads everything it reaches whole.
        let own = item.starts_with(&format!("{krate}::"));
        let object = item.starts_with("stormguard_core::")
            && ENGINE_OBJECTS
                .iter()
                .any(|name| item.ends_with(&format!("::{name}")));
        let methods = facade || own || !object;
        for (named, place) in api.named(item, methods) {
            if in_workspace(&named) && !paths.contains_key(&named) {
                out.insert(format!(
                    "{named} has no path from {krate}'s root, and {} names it ({place})",
                    at[0]
                ));
            }
        }
    }
    if facade {
        for layer in ["stormguard_client", "stormguard_server", "stormguard_grpc"] {
            for (item, at) in api.paths(layer) {
                if in_workspace(&item) && !paths.contains_key(&item) {
                    out.insert(format!("{item} ({}) has no path in the facade", at[0]));
                }
            }
        }
    }
    out.into_iter().collect()
}

#[test]
#[ignore = "reads rustdoc's JSON from target/lint/doc: run `bash .ci/public-api`"]
fn every_type_a_layer_names_has_one_path_from_its_root() {
    let dir = std::env::var_os("STORMGUARD_RUSTDOC_JSON")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/lint/doc"));
    let api = Api::load(&dir).unwrap_or_else(|e| panic!("{e}"));
    // The reading itself: a format this check no longer understands must not pass as "no
    // problem". The roots reach what their docs start with, and a layer's constructor names
    // the config it takes.
    let client = api.paths("stormguard_client");
    let server = api.paths("stormguard_server");
    let find = |paths: &BTreeMap<Item, Vec<String>>, path: &str| {
        let found = paths.iter().find(|(_, at)| at.iter().any(|p| p == path));
        found
            .map(|(item, _)| item.clone())
            .unwrap_or_else(|| panic!("{path} not found: {paths:#?}"))
    };
    let layer = find(&client, "stormguard_client::RetryLayer");
    find(&server, "stormguard_server::ShedLayer");
    let named = api.named(&layer, true);
    assert!(
        named
            .iter()
            .any(|(n, place)| n.ends_with("::ClientConfig") && place.contains("from_config")),
        "RetryLayer::from_config's argument not read: {named:?}"
    );
    let mut failures = Vec::new();
    for krate in [
        "stormguard_client",
        "stormguard_server",
        "stormguard_grpc",
        "stormguard",
    ] {
        failures.extend(problems(&api, krate));
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A crate of a few items, in the JSON's shape: a root module `items`, an index, paths.
fn crate_json(name: &str, index: Value, paths: Value, external: Value, root: u32) -> Value {
    json!({
        "root": root, "index": index, "paths": paths, "external_crates": external,
        "crate_version": null, "format_version": 57, "name": name,
    })
}

#[test]
fn the_rules_catch_what_they_say() {
    // stormguard_core: `Code`, and `Config { pub code: Code, pub set: CodeSet }`.
    let core = crate_json(
        "stormguard_core",
        json!({
            "0": {"name": "stormguard_core", "visibility": "public",
                  "inner": {"module": {"items": []}}},
            "1": {"name": "Config", "visibility": "public",
                  "inner": {"struct": {"kind": {"plain": {"fields": [2, 3]}},
                                       "generics": {"params": []}, "impls": []}}},
            "2": {"name": "code", "visibility": "public",
                  "inner": {"struct_field": {"resolved_path": {"path": "Code", "id": 4, "args": null}}}},
            "3": {"name": "set", "visibility": "public",
                  "inner": {"struct_field": {"resolved_path": {"path": "CodeSet", "id": 5, "args": null}}}},
            "4": {"name": "Code", "visibility": "public",
                  "inner": {"enum": {"variants": [], "generics": {}, "impls": []}}},
            "5": {"name": "CodeSet", "visibility": "public",
                  "inner": {"struct": {"kind": {"plain": {"fields": []}}, "generics": {}, "impls": []}}},
        }),
        json!({
            "0": {"crate_id": 0, "path": ["stormguard_core"], "kind": "module"},
            "1": {"crate_id": 0, "path": ["stormguard_core", "config", "Config"], "kind": "struct"},
            "4": {"crate_id": 0, "path": ["stormguard_core", "code", "Code"], "kind": "enum"},
            "5": {"crate_id": 0, "path": ["stormguard_core", "code", "CodeSet"], "kind": "struct"},
        }),
        json!({}),
        0,
    );
    // stormguard_client re-exports `Config` and `Code` at its root, and `Code` again in a
    // module; its `Layer::new(Config) -> Layer` is its own.
    let use_ = |name: &str, id: u32| {
        json!({"name": null, "visibility": "public",
        "inner": {"use": {"source": name, "name": name, "id": id, "is_glob": false}}})
    };
    let client = crate_json(
        "stormguard_client",
        json!({
            "0": {"name": "stormguard_client", "visibility": "public",
                  "inner": {"module": {"items": [1, 2, 3, 4, 6]}}},
            "1": use_("Config", 100),
            "2": use_("Code", 101),
            "3": {"name": "codes", "visibility": "public",
                  "inner": {"module": {"items": [5]}}},
            "5": use_("Code", 101),
            "4": {"name": "Layer", "visibility": "public",
                  "inner": {"struct": {"kind": {"plain": {"fields": []}}, "generics": {}, "impls": [7]}}},
            "6": {"name": "Hidden", "visibility": "crate",
                  "inner": {"struct": {"kind": {"plain": {"fields": []}}, "generics": {}, "impls": []}}},
            "7": {"name": null, "visibility": "default",
                  "inner": {"impl": {"trait": null, "is_synthetic": false, "blanket_impl": null,
                                     "generics": {}, "items": [8]}}},
            "8": {"name": "new", "visibility": "public",
                  "inner": {"function": {"generics": {}, "sig": {
                      "inputs": [["config", {"resolved_path": {"path": "Config", "id": 100, "args": null}}]],
                      "output": {"resolved_path": {"path": "Hidden", "id": 6, "args": null}}}}}},
        }),
        json!({
            "0": {"crate_id": 0, "path": ["stormguard_client"], "kind": "module"},
            "4": {"crate_id": 0, "path": ["stormguard_client", "layer", "Layer"], "kind": "struct"},
            "6": {"crate_id": 0, "path": ["stormguard_client", "layer", "Hidden"], "kind": "struct"},
            "100": {"crate_id": 1, "path": ["stormguard_core", "config", "Config"], "kind": "struct"},
            "101": {"crate_id": 1, "path": ["stormguard_core", "code", "Code"], "kind": "enum"},
        }),
        json!({"1": {"name": "stormguard_core"}}),
        0,
    );
    let api = Api::new(vec![core, client]);
    let found = problems(&api, "stormguard_client");
    let expected = [
        // Two paths to one item.
        "stormguard_core::code::Code has 2 public paths: stormguard_client::Code, stormguard_client::codes::Code",
        // A field of a re-exported config names a type the root does not export.
        "stormguard_core::code::CodeSet has no path from stormguard_client's root, and stormguard_client::Config names it (Config.set)",
        // A method of the crate's own type returns a type nobody can name.
        "stormguard_client::layer::Hidden has no path from stormguard_client's root, and stormguard_client::Layer names it (Layer::new)",
    ];
    assert_eq!(
        found,
        expected
            .map(String::from)
            .to_vec()
            .into_iter()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect::<Vec<_>>()
    );
}
