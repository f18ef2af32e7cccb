"""The two tables of a budget's section on the results page that `relation report` does not
make: the final validation loss of every run by seed (with each variant's paired difference to
the baseline), and the mean validation loss of every variant over training.

    python3 scripts/experiments/budget_tables.py docs/results/budget/8m/runs \
        [--baseline A] [--variants A,F,LLLF,L] [--steps 100,200,400,800,1000,1200,1600,2000]

Reads `<runs>/<variant>-s<seed>/metrics.csv` (the trainer's metrics: `step` and `val_loss`
columns); a run counts once its last row carries a validation loss. Standard library only.
"""
import argparse
import csv
import os
import re
import statistics


def read_runs(folder):
    """{variant: {seed: {step: validation loss}}} of the finished runs in `folder`."""
    runs = {}
    for name in sorted(os.listdir(folder)):
        m = re.fullmatch(r"(.+)-s(\d+)", name)
        path = os.path.join(folder, name, "metrics.csv")
        if not m or not os.path.exists(path):
            continue
        rows = list(csv.DictReader(open(path)))
        val = {int(r["step"]): float(r["val_loss"]) for r in rows if r.get("val_loss")}
        if not rows or not rows[-1].get("val_loss"):
            continue  # unfinished: the last step evaluates
        runs.setdefault(m.group(1), {})[int(m.group(2))] = val
    return runs


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("runs", help="folder of <variant>-s<seed> run folders")
    parser.add_argument("--baseline", default="A")
    parser.add_argument("--variants", help="comma-separated order of the columns and rows (default: the baseline, then by name)")
    parser.add_argument("--steps", help="comma-separated steps of the curve table (default: every evaluation)")
    args = parser.parse_args()
    runs = read_runs(args.runs)
    order = [args.baseline] + sorted(v for v in runs if v != args.baseline)
    if args.variants:
        order = args.variants.split(",")
    variants = [v for v in order if v in runs]
    final = {v: {s: c[max(c)] for s, c in runs[v].items()} for v in variants}
    seeds = sorted({s for v in variants for s in final[v]})
    others = [v for v in variants if v != args.baseline]

    # Final validation loss per seed, and each variant minus the baseline on the same seed.
    head = ["seed"] + variants + [f"{v} − {args.baseline}" for v in others]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for s in seeds:
        base = final.get(args.baseline, {}).get(s)
        cells = [str(s)] + [f"{final[v][s]:.4f}" if s in final[v] else "—" for v in variants]
        for v in others:
            ok = base is not None and s in final[v]
            cells.append(f"{final[v][s] - base:+.4f}".replace("-", "−") if ok else "—")
        print("| " + " | ".join(cells) + " |")
    print()

    # Mean validation loss over training, over the seeds each variant has.
    steps = sorted({st for v in variants for c in runs[v].values() for st in c})
    if args.steps:
        steps = [int(x) for x in args.steps.split(",")]
    print("| step | " + " | ".join(str(st) for st in steps) + " |")
    print("|" + "---|" * (len(steps) + 1))
    for v in variants:
        cells = []
        for st in steps:
            xs = [c[st] for c in runs[v].values() if st in c]
            cells.append(f"{statistics.mean(xs):.3f}" if xs else "—")
        n = len(runs[v])
        print(f"| {v} ({n} seed{'s' if n > 1 else ''}) | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
