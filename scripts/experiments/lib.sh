#!/usr/bin/env bash
# Shared runner of the experiment grids (sourced by small.sh, packing.sh and budget.sh).
#
# The caller sets: BIN (the relation binary), OUT (runs folder), STEPS, SEEDS, VARIANTS, the
# array COMMON (flags every run shares) and a function variant_flags VARIANT (the variant's own
# flags). `run_grid` trains every (seed, variant) pair into $OUT/<variant>-s<seed>: a finished run
# is skipped (its metrics.csv has STEPS rows, in the run folder or, when the caller sets RAW, among
# the raw metrics the repository keeps there, so a fresh clone without runs/ redoes nothing), an
# unfinished one resumed bit-exactly from its latest checkpoint, so a grid can be stopped
# (STOP_AT=N, or a kill) and rerun at will. `ON_FINISH` (optional) names a command run with the
# run folder after each run that finished.

# Builds the binary unless BIN pins one, and runs a copy of it named by the commit it was built
# from (under $RUNS/bin when RUNS is set), so that rebuilding the workspace while runs go on cannot
# change the code under them; run_grid resumes a run with the binary that started it.
ensure_bin() {
  export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/relation-target}"
  if [ -z "${BIN:-}" ]; then
    cargo build --release -p relation-train --bin relation
    local dir="${RUNS:-runs}/bin" rev
    rev=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
    git diff --quiet HEAD -- 2>/dev/null || rev="$rev-dirty"
    mkdir -p "$dir"
    [ -x "$dir/relation-$rev" ] || cp "$CARGO_TARGET_DIR/release/relation" "$dir/relation-$rev"
    BIN="$dir/relation-$rev"
  fi
}

# Appends one line to $1.machines (beside the run folder, so a fresh run's folder stays empty):
# when, where and at which step the run $1 starts or resumes, so the page can say which CPU ran
# which part of it.
note_machine() {
  local cpu avx512=no step=0
  [ -f "$1/checkpoints/latest" ] && step=$(sed 's/^step-0*//; s/^$/0/' "$1/checkpoints/latest")
  cpu=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n 1)
  cpu="$cpu (family $(sed -n 's/^cpu family[[:space:]]*: //p' /proc/cpuinfo | head -n 1)"
  cpu="$cpu model $(sed -n 's/^model[[:space:]]*: //p' /proc/cpuinfo | head -n 1))"
  grep -qw avx512f /proc/cpuinfo 2>/dev/null && avx512=yes
  printf '%s\t%s\tfrom step %s\t%s\t%s cores\tAVX-512 %s\n' "$(date -u +%FT%TZ)" \
    "$(hostname)" "$step" "${cpu:-unknown CPU}" "$(nproc)" "$avx512" \
    >> "$1.machines"
}

# Rows of a run's metrics.csv (0 when it has none).
finished_steps() {
  if [ -f "$1/metrics.csv" ]; then echo $(($(wc -l < "$1/metrics.csv") - 1)); else echo 0; fi
}

run_grid() {
  mkdir -p "$OUT"
  local seed variant dir stop
  for seed in $SEEDS; do
    for variant in $VARIANTS; do
      dir="$OUT/$variant-s$seed"
      if [ "$(finished_steps "$dir")" -ge "$STEPS" ]; then
        echo "== $dir: finished, skipped"
        continue
      fi
      if [ -n "${RAW:-}" ] && [ "$(finished_steps "$RAW/$variant-s$seed")" -ge "$STEPS" ]; then
        echo "== $dir: finished (metrics in $RAW), skipped"
        continue
      fi
      stop=()
      [ -n "${STOP_AT:-}" ] && stop=(--stop-at "$STOP_AT")
      if [ -f "$dir/checkpoints/latest" ]; then
        local bin="$BIN"
        [ -x "$(cat "$dir.bin" 2>/dev/null)" ] && bin=$(cat "$dir.bin")
        echo "== $dir: resuming with $bin"
        note_machine "$dir"
        "$bin" train --run-dir "$dir" --resume "${stop[@]}" --no-progress
      else
        echo "== $dir: $(variant_flags "$variant") seed $seed"
        rm -rf "$dir"
        realpath "$BIN" > "$dir.bin"
        rm -f "$dir.machines"
        note_machine "$dir"
        # shellcheck disable=SC2046 # the variant's flags are words
        "$BIN" train --run-dir "$dir" $(variant_flags "$variant") --seed "$seed" \
          "${COMMON[@]}" "${stop[@]}"
      fi
      if [ "$(finished_steps "$dir")" -ge "$STEPS" ] && [ -n "${ON_FINISH:-}" ]; then
        "$ON_FINISH" "$dir"
      fi
    done
  done
}

# Copies the raw metrics of every run under $OUT that has any into $1 (what `relation report`
# reads, and what the repository keeps).
collect_raw() {
  local raw="$1" dir name
  for dir in "$OUT"/*-s*/; do
    name=$(basename "$dir")
    [ -f "$dir/metrics.csv" ] || continue
    mkdir -p "$raw/$name"
    cp "$dir/metrics.csv" "$dir/config.json" "$dir/model.json" "$raw/$name/"
    # Where the run ran, when the runner recorded it (machines.tsv: one line per start or resume).
    [ -f "${dir%/}.machines" ] && cp "${dir%/}.machines" "$raw/$name/machines.tsv"
  done
}

# Copies the raw metrics into $RAW and, with COMMIT_EACH=1, commits run $1's (the message names
# $LABEL); retries while another commit holds the index.
commit_finished_run() {
  collect_raw "$RAW"
  [ "${COMMIT_EACH:-0}" = 1 ] || return 0
  local name try
  name=$(basename "$1")
  git add "$RAW/$name"
  for try in 1 2 3 4 5; do
    git commit -q -m "Results: $LABEL run $name finished" -- "$RAW/$name" && return 0
    sleep 5
  done
  echo "could not commit $RAW/$name" >&2
}
