#!/usr/bin/env python3
"""Writes the small tokenizer.json fixtures of hf_tokenizer_test (each exercises a set of Hugging
Face tokenizer components) and texts.json. Their expected ids come from Hugging Face's library:
`node scripts/hf_tokenizer_golden.js fixtures tests/text/hf_tokenizer` writes golden.json."""
import collections
import json
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))

TRAIN = """The quick brown fox jumps over the lazy dog. Hello world, hello there!
It's a test: we're testing they'll and you've. 1234567890 numbers 3.14159 and 2024-01-01.
Привет мир. 你好世界 こんにちは. the theory of the thing; then there they went.
tool call args --- value-added multi-word re-entry 42 + 58 = 100.""" * 3


def bytes_to_unicode():
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def train(words, vocab, merges_wanted):
    """Naive BPE: repeatedly merge the most frequent adjacent pair of `words` (lists of symbols)."""
    merges = []
    words = [list(w) for w in words]
    for _ in range(merges_wanted):
        counts = collections.Counter()
        for w in words:
            for a, b in zip(w, w[1:]):
                counts[(a, b)] += 1
        if not counts:
            break
        (a, b), _ = max(counts.items(), key=lambda kv: (kv[1], kv[0]))
        merges.append((a, b))
        if a + b not in vocab:
            vocab[a + b] = len(vocab)
        for w in words:
            i = 0
            while i < len(w) - 1:
                if w[i] == a and w[i + 1] == b:
                    w[i:i + 2] = [a + b]
                i += 1
    return merges


def byte_level_vocab():
    table = bytes_to_unicode()
    vocab = {}
    for b in range(256):
        vocab[table[b]] = len(vocab)
    return table, vocab


def byte_words(table, pieces):
    return [[table[b] for b in p.encode()] for p in pieces]


LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def added(id_, content, special, normalized=None, lstrip=False, rstrip=False, single_word=False):
    return {"id": id_, "content": content, "single_word": single_word, "lstrip": lstrip,
            "rstrip": rstrip, "normalized": (not special) if normalized is None else normalized,
            "special": special}


def write(name, tokenizer):
    with open(os.path.join(HERE, name + ".tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer, f, ensure_ascii=False)
        f.write("\n")


def bpe(vocab, merges, pairs, **extra):
    model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
             "ignore_merges": False, "vocab": vocab,
             "merges": [list(m) for m in merges] if pairs else [" ".join(m) for m in merges]}
    model.update(extra)
    return model


def tokenizer(model, added_tokens=(), normalizer=None, pre=None, post=None, decoder=None):
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": list(added_tokens),
            "normalizer": normalizer, "pre_tokenizer": pre, "post_processor": post,
            "decoder": decoder, "model": model}


def main():
    # 1. Llama 3 / Qwen style: NFC, Split (Isolated) + ByteLevel without regex, pair merges,
    #    ignore_merges, added tokens of every kind, TemplateProcessing BOS.
    table, vocab = byte_level_vocab()
    pieces = re.findall(r"'s|'t|'re|'ve|'m|'ll|'d|[^\r\n\w]?[^\W\d_]+|\d{1,3}| ?[^\s\w]+|\s+", TRAIN)
    merges = train(byte_words(table, pieces), vocab, 300)
    vocab["Ġhello"] = len(vocab)  # in the vocabulary, not reachable by merges: ignore_merges finds it
    n = len(vocab)
    specials = [added(n, "<|begin|>", True), added(n + 1, "<|end|>", True),
                added(n + 2, "<tool>", False, normalized=False, lstrip=True, rstrip=True),
                added(n + 3, "cat", False, normalized=True, single_word=True),
                added(n + 4, "Hello world", False, normalized=True),
                added(n + 5, "<|end|>x", True)]
    write("bytelevel_split", tokenizer(
        bpe(vocab, merges, True, ignore_merges=True), specials, {"type": "NFC"},
        {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_SPLIT}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        {"type": "TemplateProcessing",
         "single": [{"SpecialToken": {"id": "<|begin|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
         "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
         "special_tokens": {"<|begin|>": {"id": "<|begin|>", "ids": [n], "tokens": ["<|begin|>"]}}},
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}))

    # 2. GPT-2 style: ByteLevel with its own regex and add_prefix_space, "a b" merges.
    table, vocab = byte_level_vocab()
    pieces = re.findall(r" ?[^\W\d_]+| ?\d+| ?[^\s\w]+|\s+", " " + TRAIN)
    merges = train(byte_words(table, pieces), vocab, 250)
    write("gpt2", tokenizer(
        bpe(vocab, merges, False), [added(len(vocab), "<|endoftext|>", True)], None,
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}))

    # 3. Llama 2 style: Prepend + Replace normalizer, no pre-tokenizer, byte_fallback, fuse_unk.
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab["<0x%02X>" % b] = len(vocab)
    text = "▁" + TRAIN.replace(" ", "▁")
    for c in sorted(set(text) - set("你好世界")):  # the CJK characters go through byte fallback
        vocab.setdefault(c, len(vocab))
    words = [list(w) for w in re.findall(r"▁?[^▁]+", text)]
    words = [[c for c in w if c in vocab] for w in words]
    merges = train(words, vocab, 250)
    write("sentencepiece_bpe", tokenizer(
        bpe(vocab, merges, False, unk_token="<unk>", fuse_unk=True, byte_fallback=True),
        [added(0, "<unk>", True), added(1, "<s>", True), added(2, "</s>", True)],
        {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
                                             {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
        None,
        {"type": "TemplateProcessing",
         "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
         "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
         "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
            {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}))

    # 4. Character vocabulary with <unk> (no fuse), Metaspace (prepend first) + Digits + Splits of
    #    every behaviour, a regex Replace normalizer, Metaspace decoder. Merges cross the split
    #    points so that each split changes the ids.
    vocab = {"<unk>": 0, "<pad>": 1}
    text = "▁" + TRAIN.replace(" ", "▁")
    for c in sorted(set(text)):
        vocab.setdefault(c, len(vocab))
    merges = train([list(text[i:i + 40]) for i in range(0, len(text), 40)], vocab, 300)
    for behavior, invert, pattern in [("Removed", False, {"String": "-"}),
                                      ("MergedWithPrevious", False, {"Regex": "[.,;:!?]"}),
                                      ("MergedWithNext", True, {"Regex": "[^\\p{Lu}]+"}),
                                      ("Contiguous", False, {"Regex": "[eo]"}),
                                      ("Isolated", True, {"Regex": "\\p{L}+"})]:
        for scheme in (["first", "always", "never"] if behavior == "Removed" else ["first"]):
            write("metaspace_%s%s" % (behavior.lower(), "" if scheme == "first" else "_" + scheme), tokenizer(
                bpe(vocab, merges, True, unk_token="<unk>"),
                [added(1, "<pad>", True)],
                {"type": "Sequence", "normalizers": [{"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "},
                                                     {"type": "NFC"}]},
                {"type": "Sequence", "pretokenizers": [
                    {"type": "Split", "pattern": pattern, "behavior": behavior, "invert": invert},
                    {"type": "Metaspace", "replacement": "▁", "prepend_scheme": scheme, "split": True},
                    {"type": "Digits", "individual_digits": behavior != "Contiguous"}]},
                None,
                {"type": "Metaspace", "replacement": "▁", "prepend_scheme": scheme, "split": True}))

    # 5. WordPiece-like subword marks: continuing_subword_prefix "##" and end_of_word_suffix
    #    "</w>", words split at white space (Split, Removed), <unk> runs fused.
    vocab = {"[UNK]": 0}
    words = []
    for w in re.findall(r"\S+", TRAIN):
        symbols = [c if i == 0 else "##" + c for i, c in enumerate(w)]
        symbols[-1] += "</w>"
        words.append(symbols)
        for sym in symbols:
            vocab.setdefault(sym, len(vocab))
    for c in sorted(set(TRAIN) - set(" \n")):  # every character alone, first and inside a word
        for sym in (c, "##" + c, c + "</w>", "##" + c + "</w>"):
            vocab.setdefault(sym, len(vocab))
    merges = []
    for _ in range(200):
        counts = collections.Counter()
        for w in words:
            for x, y in zip(w, w[1:]):
                counts[(x, y)] += 1
        if not counts:
            break
        (x, y), _ = max(counts.items(), key=lambda kv: (kv[1], kv[0]))
        merges.append((x, y))
        vocab.setdefault(x + y[2:], len(vocab))
        for w in words:
            i = 0
            while i < len(w) - 1:
                if w[i] == x and w[i + 1] == y:
                    w[i:i + 2] = [x + y[2:]]
                i += 1
    write("subword_marks", tokenizer(
        bpe(vocab, merges, False, unk_token="[UNK]", fuse_unk=True, continuing_subword_prefix="##",
            end_of_word_suffix="</w>"),
        [added(0, "[UNK]", True)], None,
        {"type": "Split", "pattern": {"Regex": "\\s+"}, "behavior": "Removed", "invert": False}))

    long_word = "a" * 5000
    texts = [
        "Hello world", "hello world and Hello world", "", " ", "   ",
        "  multiple   spaces\t\ttabs  and trailing   ", "line1\r\nline2\n\n\nline3\r\n\r\n",
        "digits 1234567 and 3.14159, 2024-01-01, ١٢٣٤ ½",
        "I'M HE'S we'Re they'LL you'VE it'D don't DON'T Don'T 's 'S",
        "emoji 👨‍👩‍👧‍👦 family 🏳️‍🌈 flag 👍🏽 thumbs",
        "combining e\u0301 cafe\u0301 A\u030a \u212b Å",
        "scripts: Привет мир, γειά σου, שלום, مرحبا, नमस्ते, 你好世界, こんにちは, 안녕하세요, ไทย",
        "special <|end|> inside<|begin|>text<|end|>x<|end|>",
        "tool call  <tool>  args<tool>\n<tool>", "cat concat cat. cats cat", "Hello worldly Hello world",
        "\u00a0nbsp\u2009thin\u3000ideo \u0085nel\u2028ls", "ǅ ß ſ K k the THE The",
        "value-added multi-word re-entry --- -", "The Quick Brown Fox. Jumps! Over? the: lazy; dog",
        "<pad> padded<pad>", long_word, "x" + long_word + " " + long_word + "1",
    ]
    with open(os.path.join(HERE, "texts.json"), "w", encoding="utf-8") as f:
        json.dump(texts, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
