//! Every `cargo test` command in the `docs/` pages and the README runs at least one test.
//!
//! A command's target (`-p`, `--lib`, `--test NAME`) is read from the package's
//! `Cargo.toml` and its sources: the module tree from the target's root file (`mod x;`,
//! `#[path]`, inline modules), and in it every `#[test]` / `#[tokio::test]` function and
//! every function of a `proptest!` block, by its full name (`admission::limit::tests::x`).
//! The command's filters (before and after `--`, `--exact`, `--ignored`) must select one of
//! them. A static reading, so it costs nothing; it does not see `#[cfg]`, so a test behind a
//! feature the command does not turn on still counts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A `cargo test` command as a page shows it, and where.
#[derive(Debug)]
pub(crate) struct Command {
    pub(crate) place: String,
    pub(crate) words: Vec<String>,
}

/// The `cargo test` commands of a markdown page: in fenced `sh` blocks, one a line, and in
/// inline code (which may break across lines).
pub(crate) fn commands(name: &str, markdown: &str) -> Vec<Command> {
    let mut out = Vec::new();
    let mut prose = String::new();
    let mut fence = false;
    for (i, line) in markdown.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fence = !fence;
            prose.push('\n');
            continue;
        }
        if fence {
            let code = line.split(" #").next().unwrap_or_default();
            if let Some(words) = cargo_test(code) {
                out.push(Command {
                    place: format!("{name}:{}", i + 1),
                    words,
                });
            }
            prose.push('\n');
        } else {
            prose.push_str(line);
            prose.push('\n');
        }
    }
    // Inline code: between pairs of backticks, outside fenced blocks.
    let mut rest = prose.as_str();
    let mut offset = 0;
    while let Some(start) = rest.find('`') {
        let after = &rest[start + 1..];
        let Some(len) = after.find('`') else { break };
        let span = &after[..len];
        if let Some(words) = cargo_test(span) {
            let line = prose[..offset + start].matches('\n').count() + 1;
            out.push(Command {
                place: format!("{name}:{line}"),
                words,
            });
        }
        let consumed = start + 1 + len + 1;
        offset += consumed;
        rest = &rest[consumed..];
    }
    out
}

/// The words of `cargo test ...` in a piece of code, if it holds one (after any leading
/// environment assignments).
fn cargo_test(code: &str) -> Option<Vec<String>> {
    let words: Vec<String> = code.split_whitespace().map(str::to_owned).collect();
    let at = words
        .windows(2)
        .position(|w| w[0] == "cargo" && w[1] == "test")?;
    Some(words[at + 2..].to_vec())
}

/// What a command selects: packages' targets and the test filters.
#[derive(Debug, Default)]
struct Selection {
    package: Option<String>,
    workspace: bool,
    lib: bool,
    doc: bool,
    no_run: bool,
    tests: Vec<String>,
    filters: Vec<String>,
    exact: bool,
    ignored: bool,
    include_ignored: bool,
}

fn parse(words: &[String]) -> Result<Selection, String> {
    let mut s = Selection::default();
    let mut it = words.iter();
    let mut harness = false;
    while let Some(w) = it.next() {
        let mut value = || it.next().cloned().ok_or(format!("{w} without a value"));
        match (harness, w.as_str()) {
            (false, "--") => harness = true,
            (false, "-p" | "--package") => s.package = Some(value()?),
            (false, "--test") => s.tests.push(value()?),
            (false, "--features" | "-F" | "--target-dir" | "-j" | "--jobs") => drop(value()?),
            (false, "--workspace" | "--all") => s.workspace = true,
            (false, "--lib") => s.lib = true,
            (false, "--doc") => s.doc = true,
            (false, "--no-run") => s.no_run = true,
            (false, "--release" | "--locked" | "-q" | "--quiet" | "--all-features") => {}
            (true, "--exact") => s.exact = true,
            (true, "--ignored") => s.ignored = true,
            (true, "--include-ignored") => s.include_ignored = true,
            (true, "--nocapture" | "--show-output" | "-q" | "--quiet") => {}
            (true, "--test-threads") => drop(value()?),
            (_, flag) if flag.starts_with('-') => {
                return Err(format!("{flag}: a flag this check does not read"));
            }
            (_, filter) => s.filters.push(filter.to_owned()),
        }
    }
    Ok(s)
}

/// One test function: its full name and whether it is `#[ignore]`d.
#[derive(Debug, Clone)]
pub(crate) struct Test {
    pub(crate) name: String,
    pub(crate) ignored: bool,
}

/// Why `command` runs no test, if it runs none. `root`: the workspace's directory.
pub(crate) fn runs_nothing(root: &Path, command: &Command) -> Option<String> {
    let s = match parse(&command.words) {
        Ok(s) => s,
        Err(e) => return Some(e),
    };
    if s.no_run {
        return None;
    }
    if s.doc {
        // The doc tests of a crate: their names are the items they document.
        return (!s.filters.is_empty()).then(|| "a doc test filter this check cannot read".into());
    }
    let packages = match (&s.package, s.workspace) {
        (_, true) => packages(root).into_values().collect(),
        (Some(name), false) => match packages(root).remove(name) {
            Some(dir) => vec![dir],
            None => return Some(format!("no package {name}")),
        },
        (None, false) => vec![root.to_path_buf()],
    };
    let mut found = Vec::new();
    for dir in &packages {
        let targets = match targets(dir, &s) {
            Ok(t) => t,
            Err(e) => return Some(e),
        };
        for file in targets {
            found.extend(tests_of(&file));
        }
    }
    let runs = |t: &Test| {
        let chosen = s.filters.is_empty()
            || s.filters.iter().any(|f| {
                if s.exact {
                    t.name == *f
                } else {
                    t.name.contains(f.as_str())
                }
            });
        chosen && (s.include_ignored || s.ignored == t.ignored)
    };
    if found.iter().any(runs) {
        None
    } else {
        Some(format!(
            "selects none of the {} tests of its target{}",
            found.len(),
            if s.filters.is_empty() {
                String::new()
            } else {
                format!(" (filter {:?})", s.filters)
            }
        ))
    }
}

/// The workspace's packages: name to directory.
fn packages(root: &Path) -> BTreeMap<String, PathBuf> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![root.to_path_buf()];
    if let Ok(entries) = std::fs::read_dir(root.join("crates")) {
        let mut found: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        found.sort();
        dirs.extend(found);
    }
    for dir in dirs {
        let Ok(text) = std::fs::read_to_string(dir.join("Cargo.toml")) else {
            continue;
        };
        let Ok(manifest) = text.parse::<toml_like::Manifest>() else {
            continue;
        };
        if let Some(name) = manifest.package_name {
            out.insert(name, dir);
        }
    }
    out
}

/// The root files of the test targets a command selects in one package.
fn targets(dir: &Path, s: &Selection) -> Result<Vec<PathBuf>, String> {
    let text = std::fs::read_to_string(dir.join("Cargo.toml")).map_err(|e| e.to_string())?;
    let manifest: toml_like::Manifest = text.parse()?;
    let test_root = |name: &str| -> Option<PathBuf> {
        if let Some(path) = manifest.tests.get(name) {
            return Some(dir.join(path));
        }
        [format!("tests/{name}.rs"), format!("tests/{name}/main.rs")]
            .into_iter()
            .map(|p| dir.join(p))
            .find(|p| p.is_file())
    };
    let lib = dir.join("src/lib.rs");
    let mut out = Vec::new();
    for name in &s.tests {
        out.push(test_root(name).ok_or(format!("no test target {name} in {}", dir.display()))?);
    }
    if s.lib {
        out.push(lib.clone());
    }
    if s.tests.is_empty() && !s.lib {
        // Every target `cargo test` runs: the library, and every test target.
        if lib.is_file() {
            out.push(lib);
        }
        let mut names: Vec<String> = manifest.tests.keys().cloned().collect();
        if let Ok(entries) = std::fs::read_dir(dir.join("tests")) {
            for entry in entries.flatten() {
                let path = entry.path();
                let name = path
                    .file_stem()
                    .and_then(|n| n.to_str())
                    .unwrap_or_default();
                let is_target =
                    path.extension().is_some_and(|e| e == "rs") || path.join("main.rs").is_file();
                if is_target && !names.iter().any(|n| n == name) {
                    names.push(name.to_owned());
                }
            }
        }
        out.extend(names.iter().filter_map(|n| test_root(n)));
    }
    Ok(out)
}

/// Every test of the crate whose root file is `root`, by full name.
pub(crate) fn tests_of(root: &Path) -> Vec<Test> {
    let mut out = Vec::new();
    let children = root.parent().map(Path::to_path_buf).unwrap_or_default();
    walk(root, &[], &children, &mut out, 0);
    out
}

/// Reads one module file: its tests, and the files of the modules it declares.
/// `children`: the directory where its `mod x;` files are.
fn walk(file: &Path, module: &[String], children: &Path, out: &mut Vec<Test>, depth: usize) {
    let Ok(text) = std::fs::read_to_string(file) else {
        return;
    };
    if depth > 32 {
        return;
    }
    let code = strip(&text);
    let tokens = tokenize(&code, &text);
    // Inline modules open: (name, brace depth at which it closes), and `proptest!` blocks.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut proptest_until: Option<usize> = None;
    let mut braces = 0usize;
    let mut path_attr: Option<String> = None;
    let mut test_attr = false;
    let mut ignore_attr = false;
    let mut i = 0;
    while i < tokens.len() {
        let t = tokens[i].as_str();
        match t {
            "{" => braces += 1,
            "}" => {
                braces = braces.saturating_sub(1);
                if inline.last().is_some_and(|(_, d)| *d == braces) {
                    inline.pop();
                }
                if proptest_until == Some(braces) {
                    proptest_until = None;
                }
            }
            "#" if tokens.get(i + 1).is_some_and(|n| n == "[") => {
                // An attribute: up to its closing bracket.
                let mut j = i + 2;
                let mut words = Vec::new();
                let mut level = 1;
                while j < tokens.len() && level > 0 {
                    match tokens[j].as_str() {
                        "[" => level += 1,
                        "]" => level -= 1,
                        w => words.push(w.to_owned()),
                    }
                    j += 1;
                }
                match words.first().map(String::as_str) {
                    Some("test") => test_attr = true,
                    Some("tokio")
                        if words.get(1).is_some_and(|w| w == "::")
                            && words.get(2).is_some_and(|w| w == "test") =>
                    {
                        test_attr = true
                    }
                    Some("ignore") => ignore_attr = true,
                    Some("path") => {
                        path_attr = words.iter().find_map(|w| {
                            w.strip_prefix('"')
                                .map(|s| s.trim_end_matches('"').to_owned())
                        })
                    }
                    _ => {}
                }
                i = j;
                continue;
            }
            "proptest"
                if tokens.get(i + 1).is_some_and(|n| n == "!")
                    && tokens.get(i + 2).is_some_and(|n| n == "{") =>
            {
                proptest_until = Some(braces);
            }
            "mod" => {
                let name = tokens.get(i + 1).cloned().unwrap_or_default();
                match tokens.get(i + 2).map(String::as_str) {
                    Some(";") => {
                        let mut full: Vec<String> = module.to_vec();
                        full.extend(inline.iter().map(|(n, _)| n.clone()));
                        full.push(name.clone());
                        let inline_dir: PathBuf = inline.iter().map(|(n, _)| n.as_str()).collect();
                        let (path, next) = match path_attr.take() {
                            Some(p) => {
                                let here = file.parent().unwrap_or(Path::new("")).join(&inline_dir);
                                let path = here.join(p);
                                let next = path.parent().unwrap_or(Path::new("")).join(&name);
                                (path, next)
                            }
                            None => {
                                let base = children.join(&inline_dir);
                                let flat = base.join(format!("{name}.rs"));
                                if flat.is_file() {
                                    (flat, base.join(&name))
                                } else {
                                    (base.join(&name).join("mod.rs"), base.join(&name))
                                }
                            }
                        };
                        // A `mod.rs` holds its children beside it.
                        let next = if path.file_name().is_some_and(|f| f == "mod.rs") {
                            path.parent().unwrap_or(Path::new("")).to_path_buf()
                        } else {
                            next
                        };
                        walk(&path, &full, &next, out, depth + 1);
                        i += 3;
                        test_attr = false;
                        ignore_attr = false;
                        continue;
                    }
                    Some("{") => {
                        inline.push((name, braces));
                        path_attr = None;
                    }
                    _ => {}
                }
            }
            "fn" => {
                let name = tokens.get(i + 1).cloned().unwrap_or_default();
                if test_attr || proptest_until.is_some() {
                    let mut full: Vec<String> = module.to_vec();
                    full.extend(inline.iter().map(|(n, _)| n.clone()));
                    full.push(name);
                    out.push(Test {
                        name: full.join("::"),
                        ignored: ignore_attr,
                    });
                }
                test_attr = false;
                ignore_attr = false;
            }
            _ => {}
        }
        i += 1;
    }
}

/// The code of a Rust file with its comments, and the insides of its strings and chars,
/// replaced by spaces (a string keeps its quotes, so `#[path = "x.rs"]` is read from the
/// original text by position).
fn strip(text: &str) -> Vec<u8> {
    let b = text.as_bytes();
    let mut out = b.to_vec();
    let mut i = 0;
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for c in &mut out[from..to] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    };
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                let end = b[i..]
                    .iter()
                    .position(|&c| c == b'\n')
                    .map_or(b.len(), |p| i + p);
                blank(&mut out, i, end);
                i = end;
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let mut level = 0;
                let mut j = i;
                while j < b.len() {
                    if b[j] == b'/' && b.get(j + 1) == Some(&b'*') {
                        level += 1;
                        j += 2;
                    } else if b[j] == b'*' && b.get(j + 1) == Some(&b'/') {
                        level -= 1;
                        j += 2;
                        if level == 0 {
                            break;
                        }
                    } else {
                        j += 1;
                    }
                }
                blank(&mut out, i, j.min(b.len()));
                i = j;
            }
            b'r' if !ident_before(b, i)
                && (b.get(i + 1) == Some(&b'"') || b.get(i + 1) == Some(&b'#')) =>
            {
                let hashes = b[i + 1..].iter().take_while(|&&c| c == b'#').count();
                if b.get(i + 1 + hashes) != Some(&b'"') {
                    i += 1;
                    continue;
                }
                let open = i + 1 + hashes;
                let mut close = String::from("\"");
                close.push_str(&"#".repeat(hashes));
                let end = text[open + 1..]
                    .find(&close)
                    .map_or(b.len(), |p| open + 1 + p);
                blank(&mut out, open + 1, end);
                i = (end + close.len()).min(b.len());
            }
            b'"' => {
                let mut j = i + 1;
                while j < b.len() && b[j] != b'"' {
                    j += if b[j] == b'\\' { 2 } else { 1 };
                }
                blank(&mut out, i + 1, j.min(b.len()));
                i = j + 1;
            }
            b'\'' => {
                // A char literal ('x', '\n', '\u{..}'), or a lifetime ('a).
                let end = if b.get(i + 1) == Some(&b'\\') {
                    b.get(i + 3..)
                        .and_then(|rest| rest.iter().position(|&c| c == b'\''))
                        .map(|p| i + 3 + p)
                } else if b.get(i + 2) == Some(&b'\'') {
                    Some(i + 2)
                } else {
                    text[i + 1..].chars().next().and_then(|c| {
                        let after = i + 1 + c.len_utf8();
                        (b.get(after) == Some(&b'\'')).then_some(after)
                    })
                };
                match end {
                    Some(end) => {
                        blank(&mut out, i + 1, end);
                        i = end + 1;
                    }
                    None => i += 1,
                }
            }
            _ => i += 1,
        }
    }
    out
}

fn ident_before(b: &[u8], i: usize) -> bool {
    i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_')
}

/// Words, and punctuation one character each; a string is one token with its text from
/// the original (`"x.rs"`).
fn tokenize(code: &[u8], text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < code.len() {
        let c = code[i];
        if c.is_ascii_whitespace() {
            i += 1;
        } else if c.is_ascii_alphanumeric() || c == b'_' {
            let start = i;
            while i < code.len() && (code[i].is_ascii_alphanumeric() || code[i] == b'_') {
                i += 1;
            }
            out.push(String::from_utf8_lossy(&code[start..i]).into_owned());
        } else if c == b'"' {
            let end = code[i + 1..]
                .iter()
                .position(|&c| c == b'"')
                .map_or(code.len(), |p| i + 1 + p);
            out.push(text.get(i..=end).unwrap_or_default().to_owned());
            i = end + 1;
        } else if c == b':' && code.get(i + 1) == Some(&b':') {
            out.push("::".into());
            i += 2;
        } else if c.is_ascii() {
            out.push((c as char).to_string());
            i += 1;
        } else {
            i += 1;
        }
    }
    out
}

/// What this check reads of a `Cargo.toml`: the package's name and its `[[test]]` targets'
/// paths by name (without a TOML parser among the docs test's dependencies: the few lines
/// it needs).
mod toml_like {
    use std::collections::BTreeMap;

    #[derive(Debug, Default)]
    pub(crate) struct Manifest {
        pub(crate) package_name: Option<String>,
        pub(crate) tests: BTreeMap<String, String>,
    }

    impl std::str::FromStr for Manifest {
        type Err = String;

        fn from_str(text: &str) -> Result<Self, String> {
            let mut m = Manifest::default();
            let mut table = String::new();
            let mut test: (Option<String>, Option<String>) = (None, None);
            let flush = |m: &mut Manifest, test: &mut (Option<String>, Option<String>)| {
                if let (Some(name), path) = std::mem::take(test) {
                    let path = path.unwrap_or_default();
                    if !path.is_empty() {
                        m.tests.insert(name, path);
                    }
                }
            };
            for line in text.lines() {
                let line = line.split('#').next().unwrap_or_default().trim();
                if line.starts_with('[') {
                    flush(&mut m, &mut test);
                    table = line.trim_matches(['[', ']']).to_owned();
                    continue;
                }
                let Some((key, value)) = line.split_once('=') else {
                    continue;
                };
                let value = value.trim().trim_matches('"').to_owned();
                match (table.as_str(), key.trim()) {
                    ("package", "name") => m.package_name = Some(value),
                    ("test", "name") => test.0 = Some(value),
                    ("test", "path") => test.1 = Some(value),
                    _ => {}
                }
            }
            flush(&mut m, &mut test);
            Ok(m)
        }
    }
}

#[test]
fn every_cargo_test_command_in_the_docs_runs_a_test() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut checked = 0;
    let mut failures = Vec::new();
    for page in crate::pages() {
        let name = page
            .strip_prefix(root)
            .unwrap_or(&page)
            .display()
            .to_string();
        let text = std::fs::read_to_string(&page).unwrap_or_default();
        for command in commands(&name, &text) {
            checked += 1;
            if let Some(why) = runs_nothing(root, &command) {
                failures.push(format!(
                    "{}: `cargo test {}`: {why}",
                    command.place,
                    command.words.join(" ")
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    // The pages show a score of commands: a reader that found none would pass vacuously.
    assert!(checked >= 10, "only {checked} `cargo test` commands found");
}

#[test]
fn a_command_that_runs_no_test_is_reported() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let check = |line: &str| {
        let found = commands("page.md", line);
        assert_eq!(found.len(), 1, "{line}");
        runs_nothing(root, &found[0])
    };
    // The storm model of the adaptive limit is a unit test of the engine's library: aimed
    // at its integration tests, the command runs nothing, and passes.
    let stale = "`cargo test -p stormguard-core --release --test\nintegration limit_storm_model -- --nocapture`";
    let why = check(stale).expect("the stale command is reported");
    assert!(why.contains("limit_storm_model"), "{why}");
    assert_eq!(
        check("`cargo test -p stormguard-core --release --lib storm_model -- --nocapture`"),
        None
    );
    // A test of this binary, by its full name; an ignored test only with `--ignored`.
    assert_eq!(
        check(
            "`cargo test --test docs commands::a_command_that_runs_no_test_is_reported -- --exact`"
        ),
        None
    );
    assert!(
        check("`cargo test --test docs a_command_that_runs_no_test_is_reported -- --exact`")
            .is_some()
    );
    let ignored = "api::every_type_a_layer_names_has_one_path_from_its_root";
    assert!(check(&format!("`cargo test --test docs {ignored}`")).is_some());
    assert_eq!(
        check(&format!("`cargo test --test docs {ignored} -- --ignored`")),
        None
    );
    // A fenced line; a target or package that does not exist.
    assert_eq!(
        check("```sh\ncargo test --test e2e faults::   # comment\n```"),
        None
    );
    assert!(check("`cargo test --test no_such_binary`").is_some());
    assert!(check("`cargo test -p no-such-crate`").is_some());
}

#[test]
fn tests_are_named_by_their_module_path() {
    let dir = std::env::temp_dir().join(format!("stormguard-docs-commands-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("a")).unwrap();
    std::fs::write(
        dir.join("lib.rs"),
        "mod a;\n#[path = \"other.rs\"]\nmod b;\n// mod not_a_module;\n\
         const S: &str = \"mod c; #[test] fn no() {}\";\nconst C: char = '{';\n\
         #[cfg(test)]\nmod tests {\n    #[test]\n    fn inline() {}\n}\n#[tokio::test(start_paused = true)]\nasync fn top() {}\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("a.rs"),
        "mod deep;\n#[test]\n#[ignore = \"slow\"]\nfn in_a<'x>() {}\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("a/deep.rs"),
        "proptest! {\n    #[test]\n    fn prop(x in 0..1u8) { let _ = x; }\n}\nfn helper() {}\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("other.rs"),
        "#[test]\nfn by_path() { let _ = r#\"}\"#; }\n",
    )
    .unwrap();
    let mut found: Vec<(String, bool)> = tests_of(&dir.join("lib.rs"))
        .into_iter()
        .map(|t| (t.name, t.ignored))
        .collect();
    found.sort();
    let _ = std::fs::remove_dir_all(&dir);
    let want = [
        ("a::deep::prop", false),
        ("a::in_a", true),
        ("b::by_path", false),
        ("tests::inline", false),
        ("top", false),
    ];
    assert_eq!(found, want.map(|(n, i)| (n.to_owned(), i)).to_vec());
}
