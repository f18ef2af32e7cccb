//! `relation report`: the results table and plots of a folder of runs.

use crate::common::*;

/// `relation report` turns a folder of `<variant>-s<seed>` runs into the table and two plots;
/// unfinished runs are listed, not averaged.
#[test]
fn report_tabulates_finished_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let corpus = corpus(tmp.path());
    let runs = tmp.path().join("runs");
    for (name, pattern, steps) in [("A-s0", "A", "4"), ("F-s0", "F", "4"), ("F-s1", "F", "4")] {
        let args = with(
            tiny_args(&runs.join(name), &cache, &corpus),
            "--steps",
            steps,
        );
        let args = with(with(args, "--pattern", pattern), "--eval-every", "2");
        ok(&with(args, "--seed", &name[3..]));
    }
    // An unfinished run: stopped at step 2 of 4.
    let args = with(
        tiny_args(&runs.join("L-s0"), &cache, &corpus),
        "--steps",
        "4",
    );
    ok(&with(with(args, "--pattern", "L"), "--stop-at", "2"));

    let out_dir = tmp.path().join("results");
    let out = ok(&[
        "report".to_string(),
        runs.to_str().unwrap().to_string(),
        "--out".to_string(),
        out_dir.to_str().unwrap().to_string(),
    ]);
    let table = std::fs::read_to_string(out_dir.join("table.md")).unwrap();
    assert!(table.contains("| A | 0 |"), "{table}");
    assert!(table.contains("| F | 0, 1 |"), "{table}");
    assert!(
        !table.contains("| L |"),
        "unfinished runs stay out of the table:\n{table}"
    );
    assert!(
        out.contains("unfinished (not in the table): L-s0 at step 2/4"),
        "{out}"
    );
    for png in ["val.png", "gap.png"] {
        let bytes = std::fs::read(out_dir.join(png)).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{png}");
    }
}
