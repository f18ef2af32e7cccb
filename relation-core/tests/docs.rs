//! The documents the code points at exist: every citation of a `docs/maths.md` heading in a file of
//! the workspace names a heading of `docs/maths.md`.

use std::fs;
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// GitHub's anchor of a Markdown heading: lower case, spaces to `-`, punctuation dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') {
                sources(&path, out);
            }
        } else if name.ends_with(".rs") || name.ends_with(".md") {
            out.push(path);
        }
    }
}

#[test]
fn every_cited_maths_anchor_exists() {
    let root = workspace();
    let maths = fs::read_to_string(root.join("docs/maths.md")).expect("docs/maths.md exists");
    let anchors: Vec<String> = maths
        .lines()
        .filter_map(|l| l.strip_prefix('#'))
        .map(|l| anchor(l.trim_start_matches('#')))
        .collect();
    let mut files = Vec::new();
    for dir in [
        "relation-core",
        "relation-kernels",
        "relation-model",
        "relation-train",
        "examples",
        "docs",
    ] {
        sources(&root.join(dir), &mut files);
    }
    files.push(root.join("README.md"));
    let mut cited = 0;
    for file in files {
        let text = fs::read_to_string(&file).unwrap();
        // (Spelled in two parts so that this file does not match itself.)
        let citation = concat!("maths.md", "#");
        for (at, _) in text.match_indices(citation) {
            let rest = &text[at + citation.len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '-' || *c == '_')
                .collect();
            assert!(
                anchors.contains(&name),
                "{} cites {citation}{name}, which is not a heading of docs/maths.md",
                file.display()
            );
            cited += 1;
        }
        // (Spelled in two parts so that this file does not match itself.)
        let old_citation = concat!("spec ", "§");
        assert!(
            !text.contains(old_citation),
            "{} cites \"{old_citation}\": the specification is docs/maths.md",
            file.display()
        );
    }
    assert!(cited > 10, "found only {cited} citations of docs/maths.md");
}
