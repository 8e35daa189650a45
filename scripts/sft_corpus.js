#!/usr/bin/env node
// A small supervised fine-tuning set from the demo corpus (the State of the Union speeches):
// each conversation is two exchanges of consecutive sentences of one speech, the user giving a
// sentence and the assistant answering with the one that follows it. Written as {"messages": …}
// JSON lines (the common chat format that `longtron prepare --chat` reads).
// Usage: node scripts/sft_corpus.js CORPUS_DIR OUT.jsonl [MAX_CONVERSATIONS]
"use strict";
const fs = require("fs");
const path = require("path");
const [dir, out, max] = process.argv.slice(2);
if (!dir || !out) {
  console.error("usage: node scripts/sft_corpus.js CORPUS_DIR OUT.jsonl [MAX_CONVERSATIONS]");
  process.exit(1);
}
const limit = max ? Number(max) : Infinity;
const lines = [];
for (const file of fs.readdirSync(dir).filter((f) => f.endsWith(".json")).sort()) {
  const text = JSON.parse(fs.readFileSync(path.join(dir, file), "utf8")).text;
  // Sentences: split after . ? ! followed by a space and a capital letter; keep readable lengths.
  const sentences = text.replace(/\s+/g, " ").split(/(?<=[.?!])\s+(?=[A-Z])/)
    .map((s) => s.trim()).filter((s) => s.length >= 20 && s.length <= 300);
  for (let i = 0; i + 3 < sentences.length && lines.length < limit; i += 4) {
    const messages = [
      { role: "user", content: sentences[i] }, { role: "assistant", content: sentences[i + 1] },
      { role: "user", content: sentences[i + 2] }, { role: "assistant", content: sentences[i + 3] },
    ];
    lines.push(JSON.stringify({ messages }));
  }
}
fs.mkdirSync(path.dirname(out), { recursive: true });
fs.writeFileSync(out, lines.join("\n") + "\n");
console.log(`sft_corpus: ${lines.length} conversations in ${out}`);
