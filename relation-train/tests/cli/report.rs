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
    // Where a run ran, as the experiment runner records it beside the metrics.
    std::fs::write(
        runs.join("F-s1").join("machines.tsv"),
        "2026-12-07T01:36:33Z\thost-a\tfrom step 0\tSome CPU\t2 cores\tAVX-512 yes\n\
         2026-12-07T04:18:36Z\thost-b\tfrom step 2\tOther CPU\t16 cores\tAVX-512 no\n",
    )
    .unwrap();
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
    // F's difference to A pairs seed 0 only (A has no seed 1): one paired seed, no s.e.
    assert!(table.contains(" ± —, 1 paired |"), "{table}");
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
    // seeds.md: every finished run's final loss by seed and F − A on the seed both have, then
    // the mean curve at the evaluated steps, each from the runs' own metrics.
    let final_loss = |name: &str| -> f64 {
        let csv = std::fs::read_to_string(runs.join(name).join("metrics.csv")).unwrap();
        let last = csv.lines().last().unwrap();
        last.split(',').nth(7).unwrap().parse().unwrap()
    };
    let (a0, f0, f1) = (final_loss("A-s0"), final_loss("F-s0"), final_loss("F-s1"));
    let seeds = std::fs::read_to_string(out_dir.join("seeds.md")).unwrap();
    let diff = format!("{:+.4}", f0 - a0).replace('-', "−");
    assert!(seeds.contains("| seed | A | F | F − A |"), "{seeds}");
    assert!(
        seeds.contains(&format!("| 0 | {a0:.4} | {f0:.4} | {diff} |")),
        "{seeds}"
    );
    assert!(
        seeds.contains(&format!("| 1 | — | {f1:.4} | — |")),
        "{seeds}"
    );
    assert!(seeds.contains("| step | 2 | 4 |"), "{seeds}");
    let f_mean = format!("{:.3}", (f0 + f1) / 2.0);
    assert!(
        seeds.contains("| F (2 seeds) | ") && seeds.contains(&format!(" | {f_mean} |\n")),
        "{seeds}"
    );
    // Every finished run's machines, in the order of its starts and resumes.
    assert!(
        seeds.contains(
            "| F-s1 | 2026-12-07T01:36:33Z, host-a, from step 0, Some CPU, 2 cores, AVX-512 yes; \
             2026-12-07T04:18:36Z, host-b, from step 2, Other CPU, 16 cores, AVX-512 no |"
        ),
        "{seeds}"
    );
    assert!(seeds.contains("| A-s0 | not recorded |"), "{seeds}");

    // Budgets: the same folder twice stands in for two budgets of one grid. F pairs with A on
    // seed 0 only (A has no seed 1); the unfinished L pairs with nothing.
    let budget = |spec: &str| format!("{spec}={}", runs.to_str().unwrap());
    let out = ok(&[
        "report".to_string(),
        "--budget".to_string(),
        budget("small"),
        "--budget".to_string(),
        budget("again"),
        "--out".to_string(),
        out_dir.to_str().unwrap().to_string(),
    ]);
    let table = std::fs::read_to_string(out_dir.join("budget.md")).unwrap();
    assert!(out.contains(table.lines().next().unwrap()), "{out}");
    for name in ["small", "again"] {
        assert!(
            table.contains(&format!("| F | {name} | 0.00M | 1 | ")),
            "F paired on one seed at {name}:\n{table}"
        );
    }
    assert!(
        !table.contains("| L |"),
        "unfinished runs pair with nothing:\n{table}"
    );
    let bytes = std::fs::read(out_dir.join("budget.png")).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    fails_with(
        &[
            "report".to_string(),
            "--budget".to_string(),
            runs.to_str().unwrap().to_string(),
            "--out".to_string(),
            out_dir.to_str().unwrap().to_string(),
        ],
        &[],
        "expected NAME=DIR",
    );
}

/// `relation report --long-context CSV` plots the finished rows of the long-context benchmark
/// (failed rows are skipped); a CSV without one is refused.
#[test]
fn report_plots_the_long_context_table() {
    let tmp = tempfile::tempdir().unwrap();
    let csv = tmp.path().join("long-context.csv");
    std::fs::write(
        &csv,
        "pattern,mode,seq_len,status,s_per_step,tokens_per_s,peak_rss_mib\n\
         L,checkpointed,4096,ok,1.52,2698,302\n\
         L,checkpointed,16384,ok,6.17,2656,655\n\
         L,plain,4096,ok,1.10,3724,410\n\
         L,plain,16384,over 20 GiB,,,20480\n\
         F,checkpointed,4096,ok,2.0,2048,350\n",
    )
    .unwrap();
    let out_dir = tmp.path().join("plots");
    let report = |csv: &std::path::Path| {
        vec![
            "report".to_string(),
            "--long-context".to_string(),
            csv.to_str().unwrap().to_string(),
            "--out".to_string(),
            out_dir.to_str().unwrap().to_string(),
        ]
    };
    let out = ok(&report(&csv));
    assert!(out.contains("long-context.png"), "{out}");
    let bytes = std::fs::read(out_dir.join("long-context.png")).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");

    let empty = tmp.path().join("empty.csv");
    std::fs::write(
        &empty,
        "pattern,mode,seq_len,status,s_per_step,tokens_per_s,peak_rss_mib\nL,plain,4096,over 20 GiB,,,20480\n",
    )
    .unwrap();
    fails_with(&report(&empty), &[], "has no finished long-context row");
}
