#!/usr/bin/env node
// Token ids from Hugging Face's own `tokenizers` library (its Rust crate, through the npm package
// `tokenizers`), to make and check longtron's tokenizer.json fixtures. Not used by the test suite.
// Needs NODE_PATH (or a node_modules above the working folder) holding `tokenizers`.
//
//   node scripts/hf_tokenizer_golden.js fixtures DIR
//       For every DIR/*.tokenizer.json, encodes the texts of DIR/texts.json (a list of strings)
//       with encode(text, null, {addSpecialTokens: false}) and writes DIR/golden.json:
//       {"<file>": [{"ids": [...], "decoded": "..."}, ...]} in the order of texts.json.
//   node scripts/hf_tokenizer_golden.js jsonl IN OUT.jsonl
//       Writes the documents of IN (a folder of .json files with a "text" field, read in sorted
//       name order, or a .json list of strings) as {"text": ...} lines, the input `prepare` reads
//       (blank documents, which prepare skips, left out).
//   node scripts/hf_tokenizer_golden.js compare TOKENIZER.json DOCS.jsonl TOKENS.bin
//       Encodes every document of DOCS.jsonl and compares with the ids in TOKENS.bin (an
//       InternEvo .bin that `longtron prepare --format internevo --no-bos-eos` wrote from
//       DOCS.jsonl); prints the number of identical documents and the first difference.
//   node scripts/hf_tokenizer_golden.js time TOKENIZER.json DOCS.jsonl
//       Seconds encodeBatch takes for all documents (texts in memory; set RAYON_NUM_THREADS).
'use strict';
const fs = require('fs');
const path = require('path');
const { Tokenizer } = require('tokenizers');

function readJsonl(file) {
  return fs.readFileSync(file, 'utf8').split('\n').filter((l) => l.length > 0).map((l) => JSON.parse(l));
}

async function encodeAll(tokenizer, texts) {
  const out = [];
  for (const text of texts) {
    const e = await tokenizer.encode(text, null, { addSpecialTokens: false });
    out.push(Array.from(e.getIds()));
  }
  return out;
}

async function fixtures(dir) {
  const texts = JSON.parse(fs.readFileSync(path.join(dir, 'texts.json'), 'utf8'));
  const golden = {};
  for (const name of fs.readdirSync(dir).filter((f) => f.endsWith('.tokenizer.json')).sort()) {
    const tokenizer = Tokenizer.fromFile(path.join(dir, name));
    const ids = await encodeAll(tokenizer, texts);
    golden[name] = [];
    for (const list of ids) {
      golden[name].push({ ids: list, decoded: await tokenizer.decode(list, true) });
    }
  }
  fs.writeFileSync(path.join(dir, 'golden.json'), JSON.stringify(golden) + '\n');
  console.log(`golden: ${Object.keys(golden).length} tokenizers x ${texts.length} texts`);
}

function jsonl(input, output) {
  let texts;
  if (fs.statSync(input).isDirectory()) {
    const files = fs.readdirSync(input).filter((f) => f.endsWith('.json')).sort();
    texts = files.map((f) => JSON.parse(fs.readFileSync(path.join(input, f), 'utf8')).text);
  } else {
    texts = JSON.parse(fs.readFileSync(input, 'utf8'));
  }
  // prepare skips blank documents (nothing but ASCII white space): leave them out here too.
  texts = texts.filter((t) => !/^[ \t\n\v\f\r]*$/.test(t));
  fs.writeFileSync(output, texts.map((t) => JSON.stringify({ text: t })).join('\n') + '\n');
  console.log(`jsonl: ${texts.length} documents`);
}

async function compare(tokenizerFile, docsFile, binFile) {
  const tokenizer = Tokenizer.fromFile(tokenizerFile);
  const texts = readJsonl(docsFile).map((d) => d.text);
  const ours = readJsonl(binFile).map((d) => d.tokens);
  if (ours.length !== texts.length) {
    console.log(`compare: ${ours.length} documents in ${binFile}, ${texts.length} in ${docsFile}`);
    process.exit(1);
  }
  const theirs = await encodeAll(tokenizer, texts);
  let same = 0;
  let tokens = 0;
  let first = null;
  for (let i = 0; i < texts.length; ++i) {
    tokens += theirs[i].length;
    const a = ours[i];
    const b = theirs[i];
    let k = 0;
    while (k < a.length && k < b.length && a[k] === b[k]) ++k;
    if (k === a.length && k === b.length) {
      ++same;
    } else if (first === null) {
      first = `document ${i}: first difference at token ${k}: longtron ${JSON.stringify(a.slice(k, k + 8))}` +
        ` vs Hugging Face ${JSON.stringify(b.slice(k, k + 8))}`;
    }
  }
  console.log(`compare ${path.basename(path.dirname(path.dirname(tokenizerFile)))}: ${same} of ${texts.length} ` +
    `documents identical (${tokens} Hugging Face tokens)${first ? '; ' + first : ''}`);
  if (same !== texts.length) process.exitCode = 1;
}

async function time(tokenizerFile, docsFile) {
  const tokenizer = Tokenizer.fromFile(tokenizerFile);
  const texts = readJsonl(docsFile).map((d) => d.text);
  const start = process.hrtime.bigint();
  const encodings = await tokenizer.encodeBatch(texts, { addSpecialTokens: false });
  const seconds = Number(process.hrtime.bigint() - start) / 1e9;
  let tokens = 0;
  for (const e of encodings) tokens += e.getIds().length;
  console.log(`encodeBatch: ${tokens} tokens in ${seconds.toFixed(2)} s ` +
    `(RAYON_NUM_THREADS=${process.env.RAYON_NUM_THREADS || 'unset'})`);
}

const [mode, ...args] = process.argv.slice(2);
const modes = { fixtures, jsonl, compare, time };
if (!modes[mode]) {
  console.error('usage: hf_tokenizer_golden.js fixtures DIR | jsonl IN OUT | compare TOKENIZER DOCS BIN | time TOKENIZER DOCS');
  process.exit(2);
}
Promise.resolve(modes[mode](...args)).catch((e) => {
  console.error(e);
  process.exit(1);
});
