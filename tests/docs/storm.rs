//! The README's storm rows are `docs/storm.md`'s: the figures live in one page, and the
//! README shows some of its rows as they are there.

use std::collections::BTreeMap;

/// A markdown table: its columns' names and its rows, each cell trimmed.
#[derive(Debug)]
pub(crate) struct Table {
    columns: Vec<String>,
    rows: Vec<Vec<String>>,
}

/// The first table after the line that starts with `heading`, whose header names `policy`.
pub(crate) fn table_after(markdown: &str, heading: &str) -> Option<Table> {
    let mut lines = markdown.lines().skip_while(|l| !l.starts_with(heading));
    let header = lines.find(|l| l.starts_with("| policy |"))?;
    let cells = |line: &str| -> Vec<String> {
        let inner = line.trim().trim_start_matches('|').trim_end_matches('|');
        inner.split('|').map(|c| c.trim().to_owned()).collect()
    };
    let columns = qualified(&cells(header));
    let rows = lines
        .skip(1) // the alignment row
        .take_while(|l| l.starts_with('|'))
        .map(cells)
        .collect();
    Some(Table { columns, rows })
}

/// Column names with what they measure: a bare `during` or `after` measures what the
/// column before it did (`goodput before | during | after` are goodput's, `attempts/call
/// during | after` attempts').
fn qualified(names: &[String]) -> Vec<String> {
    let mut measure = String::new();
    names
        .iter()
        .map(|name| match name.rsplit_once(' ') {
            Some((what, "before" | "during" | "after")) => {
                measure = what.to_owned();
                name.clone()
            }
            None if ["before", "during", "after"].contains(&name.as_str()) => {
                format!("{measure} {name}")
            }
            _ => name.clone(),
        })
        .collect()
}

/// Where the README's rows differ from the page's, one line each.
pub(crate) fn differences(readme: &Table, page: &Table) -> Vec<String> {
    let mut out = Vec::new();
    let shared: Vec<(usize, usize)> = readme
        .columns
        .iter()
        .enumerate()
        .filter_map(|(i, c)| page.columns.iter().position(|p| p == c).map(|j| (i, j)))
        .collect();
    let by_policy: BTreeMap<&str, &Vec<String>> =
        page.rows.iter().map(|r| (r[0].as_str(), r)).collect();
    for row in &readme.rows {
        let Some(theirs) = by_policy.get(row[0].as_str()) else {
            out.push(format!("{}: no such row in the page", row[0]));
            continue;
        };
        for &(i, j) in &shared[1..] {
            if row.get(i) != theirs.get(j) {
                out.push(format!(
                    "{}, {}: the README says {:?}, the page {:?}",
                    row[0],
                    readme.columns[i],
                    row.get(i),
                    theirs.get(j)
                ));
            }
        }
    }
    out
}

fn tables() -> (Table, Table) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap_or_default();
    let page = std::fs::read_to_string(root.join("docs/storm.md")).unwrap_or_default();
    let readme = table_after(&readme, "## The storm")
        .unwrap_or_else(|| panic!("README.md: no storm table under \"## The storm\""));
    let page = table_after(&page, "## The default run")
        .unwrap_or_else(|| panic!("docs/storm.md: no table under \"## The default run\""));
    (readme, page)
}

#[test]
fn the_readme_s_storm_rows_are_the_storm_page_s() {
    let (readme, page) = tables();
    assert!(readme.rows.len() >= 2, "{readme:?}");
    // The figures both tables show: goodput during and after, attempts per call, recovery.
    let shared = readme
        .columns
        .iter()
        .filter(|c| page.columns.contains(c))
        .count();
    assert!(
        shared >= 5,
        "README {:?}, page {:?}",
        readme.columns,
        page.columns
    );
    let found = differences(&readme, &page);
    assert!(found.is_empty(), "{found:#?}");
}

#[test]
fn a_figure_the_readme_changes_is_reported() {
    let (mut readme, page) = tables();
    let during = readme
        .columns
        .iter()
        .position(|c| c == "goodput during")
        .unwrap_or_else(|| panic!("{:?}", readme.columns));
    readme.rows[0][during] = "99.9 %".into();
    readme.rows[1][0] = "no-such-policy".into();
    let found = differences(&readme, &page);
    assert_eq!(found.len(), 2, "{found:#?}");
    assert!(found[0].contains("goodput during"), "{found:#?}");
    assert!(found[1].contains("no such row"), "{found:#?}");
}
