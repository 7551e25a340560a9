//! The documents hold together: every seed the code and the documents cite is one
//! `docs/seeds.md` defines, and every file that page names is in the repository.

use std::path::{Path, PathBuf};

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every `.rs` and `.md` file under `dir`, but build output.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') {
                sources(&path, out);
            }
        } else if name.ends_with(".rs") || name.ends_with(".md") {
            out.push(path);
        }
    }
}

/// The seed numbers `text` cites ("seed 000", any case), each with the text around it.
fn cited(text: &str) -> Vec<(String, String)> {
    let lower = text.to_ascii_lowercase();
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = lower[from..].find("seed ") {
        let start = from + at + "seed ".len();
        let digits: String = lower[start..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        if digits.len() == 3 {
            let context = lower[from + at..].chars().take(40).collect();
            out.push((digits, context));
        }
        from = start;
    }
    out
}

#[test]
fn every_seed_cited_is_one_the_seeds_page_defines_and_every_file_it_names_exists() {
    let page = std::fs::read_to_string(root().join("docs/seeds.md")).unwrap();
    let defined: Vec<String> = page
        .lines()
        .filter_map(|l| l.strip_prefix("## seed "))
        .map(str::to_owned)
        .collect();
    assert_eq!(defined, ["000", "001", "002", "003", "004"]);
    let mut files = Vec::new();
    for dir in [
        "gateway",
        "gateway-common",
        "gateway-ebpf",
        "tests",
        "docs",
        "xtask",
    ] {
        sources(&root().join(dir), &mut files);
    }
    files.push(root().join("README.md"));
    let mut citations = 0;
    let mut unknown = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        for (n, context) in cited(&text) {
            citations += 1;
            if !defined.contains(&n) {
                unknown.push(format!("{}: {context}", f.display()));
            }
        }
    }
    assert!(unknown.is_empty(), "seeds no page defines: {unknown:#?}");
    assert!(citations > 20, "{citations} citations found");
    // Every repository path the page names in backticks is there.
    let mut missing = Vec::new();
    for (i, part) in page.split('`').enumerate() {
        let named = i % 2 == 1
            && ["gateway/", "gateway-common/", "gateway-ebpf/", "tests/"]
                .iter()
                .any(|p| part.starts_with(p));
        if named && !root().join(part).exists() {
            missing.push(part.to_owned());
        }
    }
    assert!(
        missing.is_empty(),
        "named on docs/seeds.md, not in the repository: {missing:?}"
    );
}

#[test]
fn a_citation_is_found_in_any_case_and_a_number_of_other_length_is_not() {
    let found = cited("Seed 000's effect; seed 4; see seed 0042 and SEED 003.");
    let numbers: Vec<&str> = found.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(numbers, ["000", "003"]);
}
