#!/usr/bin/env bash
# Writes every paragraph (blank-line separated) of the given text files as one JSON Lines record
# {"text": ...} to OUT: a corpus of many short documents from the shipped books.
#
#   scripts/paragraphs.sh OUT.jsonl data/austen.txt relation-train/data/moby_dick.txt
set -euo pipefail
out=$1
shift
for f in "$@"; do
  awk 'BEGIN { RS = "" } {
    gsub(/\r/, ""); gsub(/[\001-\010\013\014\016-\037]/, "")
    gsub(/\\/, "\\\\"); gsub(/"/, "\\\""); gsub(/\t/, "\\t"); gsub(/\n/, "\\n")
    printf "{\"text\": \"%s\"}\n", $0
  }' "$f"
done > "$out.tmp"
mv "$out.tmp" "$out"
