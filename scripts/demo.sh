#!/usr/bin/env bash
# The main job on the demo corpus: install and build (scripts/setup.sh), fetch the State of the
# Union speeches, and tokenize them with a trained 8192-token SentencePiece BPE vocabulary, 2% of
# the documents held out for validation.
set -euo pipefail
cd "$(dirname "$0")/.."
# Only the binary the demo runs: the tests and benchmarks are built by scripts/test.sh.
SETUP_TARGETS=longtron scripts/setup.sh build
scripts/fetch_corpus.sh demo/corpus
if [ -f demo/data/dataset.json ]; then
  echo "demo: demo/data already prepared (remove it to prepare again)"
else
  build/longtron prepare --input demo/corpus --output demo/data --train-tokenizer \
    --vocab-size 8192 --valid-fraction 0.02
fi
# Train configs/demo.toml (the SOTU model, 100 steps), then a sampled continuation from the
# trained checkpoint (the checkpoint carries tokenizer.model, so generate needs nothing else).
# Re-runnable: a new run replaces the checkpoints of the last one (--overwrite), unless the caller
# passes --resume DIR to continue them.
overwrite=(--overwrite)
for arg in "$@"; do
  if [ "$arg" = --resume ] || [ "${arg%%=*}" = --resume ]; then overwrite=(); fi
done
build/longtron train --config configs/demo.toml "${overwrite[@]}" "$@"
echo "demo: sample from demo/checkpoints (temperature 0.8, top-p 0.9, seed 1):"
build/longtron generate --checkpoint demo/checkpoints --prompt "Fellow citizens of the Senate and" \
  --max-new-tokens 40 --temperature 0.8 --top-p 0.9 --seed 1
