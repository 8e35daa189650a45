#include "text/hf_tokenizer.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cctype>
#include <optional>
#include <fstream>
#include <queue>
#include <sstream>
#include <unordered_map>

#include "core/error.h"
#include "core/json_read.h"
#include "core/shorten.h"
#include "text/hf_components.h"
#include "text/unicode_text.h"

namespace longtron::text {

using namespace hf;  // the components (hf_components.h)

namespace {

// ---------------------------------------------------------------------------------------------
// Added tokens (tokenizers/src/tokenizer/added_vocabulary.rs).

struct AddedToken {
  int32_t id;
  std::string content;
  bool single_word, lstrip, rstrip, normalized, special;
};

// Leftmost-longest matching of a set of strings (what aho-corasick's MatchKind::LeftmostLongest
// finds): candidates bucketed by first byte, longest first.
class TokenMatcher {
 public:
  void add(std::string pattern, size_t token) {
    if (pattern.empty()) return;
    auto& bucket = buckets_[static_cast<unsigned char>(pattern[0])];
    bucket.push_back({std::move(pattern), token});
    std::stable_sort(bucket.begin(), bucket.end(),
                     [](const Entry& a, const Entry& b) { return a.text.size() > b.text.size(); });
    any_ = true;
  }
  // First match at or after `from`: (begin, token index); begin = npos when none.
  std::pair<size_t, size_t> find(std::string_view text, size_t from, size_t* length) const {
    if (!any_) return {std::string_view::npos, 0};
    for (size_t i = from; i < text.size(); ++i) {
      const auto& bucket = buckets_[static_cast<unsigned char>(text[i])];
      for (const auto& e : bucket)
        if (text.compare(i, e.text.size(), e.text) == 0) {
          *length = e.text.size();
          return {i, e.token};
        }
    }
    return {std::string_view::npos, 0};
  }
  bool empty() const { return !any_; }

 private:
  struct Entry {
    std::string text;
    size_t token;
  };
  std::array<std::vector<Entry>, 256> buckets_;
  bool any_ = false;
};

// A split of the text: an added token's id, or text (id -1) with its origin flag.
struct Split {
  int32_t id;
  std::string text;
  bool origin;
};

bool ends_with_word(std::string_view s) {
  if (s.empty()) return false;
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  size_t n = 0;
  return unicode::is_alphanumeric(unicode::decode_at(s, i, &n));
}

bool starts_with_word(std::string_view s) {
  size_t n = 0;
  return !s.empty() && unicode::is_alphanumeric(unicode::decode_at(s, 0, &n));
}

// Start of the run of whitespace that ends `s` (s.size() if none): space_leftmost_at_end.
size_t space_leftmost_at_end(std::string_view s) {
  size_t at = s.size();
  while (at > 0) {
    size_t i = at - 1;
    while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
    size_t n = 0;
    if (!unicode::is_whitespace(unicode::decode_at(s, i, &n))) break;
    at = i;
  }
  return at;
}

// space_rightmost_at_start: the byte offset of the last leading whitespace character + 1 (as
// Hugging Face computes it), 0 if none.
size_t space_rightmost_at_start(std::string_view s) {
  size_t last = std::string_view::npos;
  for (size_t at = 0; at < s.size();) {
    size_t n = 0;
    if (!unicode::is_whitespace(unicode::decode_at(s, at, &n))) break;
    last = at;
    at += n;
  }
  return last == std::string_view::npos ? 0 : last + 1;
}

// ---------------------------------------------------------------------------------------------
// BPE (tokenizers/src/models/bpe).

struct Symbol {
  int32_t id, prev, next, len;
};

// The merge ranks: (left id, right id) -> (rank, merged id), in an open-addressing table (linear
// probing, Fibonacci hashing) since BPE looks a pair up for every merge it considers.
class MergeMap {
 public:
  using Value = std::pair<int32_t, int32_t>;
  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  void reserve(size_t n) {
    size_t capacity = 16;
    while (capacity < 2 * n) capacity *= 2;
    keys_.assign(capacity, kEmpty);
    values_.assign(capacity, {});
    shift_ = 64 - static_cast<int>(std::countr_zero(capacity));
  }
  void insert_or_assign(uint64_t k, Value v) {
    if (2 * (size_ + 1) > keys_.size()) grow();
    size_t i = slot(k);
    while (keys_[i] != kEmpty && keys_[i] != k) i = (i + 1) & (keys_.size() - 1);
    if (keys_[i] == kEmpty) ++size_;
    keys_[i] = k;
    values_[i] = v;
  }
  const Value* find(int32_t a, int32_t b) const {
    if (keys_.empty()) return nullptr;
    const uint64_t k = key(a, b);
    for (size_t i = slot(k);; i = (i + 1) & (keys_.size() - 1)) {
      if (keys_[i] == k) return &values_[i];
      if (keys_[i] == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};  // ids are below 2^31: no real key is this
  size_t slot(uint64_t k) const { return static_cast<size_t>((k * 0x9E3779B97F4A7C15ull) >> shift_); }
  void grow() {
    std::vector<uint64_t> keys = std::move(keys_);
    std::vector<Value> values = std::move(values_);
    reserve(std::max<size_t>(16, keys.size()));
    size_ = 0;
    for (size_t i = 0; i < keys.size(); ++i)
      if (keys[i] != kEmpty) insert_or_assign(keys[i], values[i]);
  }
  std::vector<uint64_t> keys_;
  std::vector<Value> values_;
  size_t size_ = 0;
  int shift_ = 60;
};

struct MergeCandidate {
  int32_t rank, pos, new_id;
  bool operator<(const MergeCandidate& o) const {  // priority_queue pops the lowest rank, then pos
    return rank != o.rank ? rank > o.rank : pos > o.pos;
  }
};

std::atomic<uint64_t> next_instance{1};

}  // namespace

// ---------------------------------------------------------------------------------------------

struct HfTokenizer::Impl {
  std::string name, json_text;
  uint64_t instance = next_instance++;
  // model
  Vocab vocab;
  MergeMap merges;  // (a, b) -> (rank, new id)
  std::optional<std::string> unk_token, continuing_subword_prefix, end_of_word_suffix;
  int32_t unk_id = -1;
  bool fuse_unk = false, byte_fallback = false, ignore_merges = false;
  std::array<int32_t, 256> byte_ids{};  // <0xXX> ids for byte_fallback (-1 when absent)
  // pipeline
  std::vector<AddedToken> added;
  TokenMatcher raw_matcher, normalized_matcher;
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<Decoder> decoder;
  std::vector<int32_t> prefix, suffix;
  // id -> token
  std::vector<std::string> id_to_token;
  std::vector<char> special;
  Vocab added_ids;

  std::vector<Split> split_added(const std::string& text, bool origin, const TokenMatcher& m) const;
  void tokenize_word(const std::string& word, std::vector<int32_t>& out) const;
  void merge_word(const std::string& word, std::vector<int32_t>& out) const;
};

namespace {

// A thread's word cache for one tokenizer instance (cleared when another instance uses it).
struct WordCache {
  uint64_t instance = 0;
  std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> words;
};

constexpr size_t kCacheWords = 1 << 15;  // about 4 MB a thread
constexpr size_t kCacheWordBytes = 256;

}  // namespace

std::vector<Split> HfTokenizer::Impl::split_added(const std::string& text, bool origin,
                                                  const TokenMatcher& m) const {
  std::vector<Split> out;
  if (m.empty()) {
    out.push_back({-1, text, origin});
    return out;
  }
  size_t start_offset = 0, search = 0;
  while (true) {
    size_t length = 0;
    const auto [found, index] = m.find(text, search, &length);
    if (found == std::string_view::npos) break;
    search = found + length;
    const AddedToken& token = added[index];
    size_t start = found, stop = found + length;
    const std::string_view sv(text);
    if (token.single_word) {
      const bool start_space = start == 0 || !ends_with_word(sv.substr(0, start));
      const bool stop_space = stop == text.size() || !starts_with_word(sv.substr(stop));
      if (!start_space || !stop_space) continue;
    }
    if (token.lstrip) start = std::max(space_leftmost_at_end(sv.substr(0, start)), start_offset);
    if (token.rstrip) stop += space_rightmost_at_start(sv.substr(stop));
    if (start > start_offset)
      out.push_back({-1, text.substr(start_offset, start - start_offset), origin && start_offset == 0});
    out.push_back({token.id, {}, false});
    start_offset = stop;
  }
  if (start_offset < text.size())
    out.push_back({-1, text.substr(start_offset), origin && start_offset == 0});
  return out;
}

void HfTokenizer::Impl::merge_word(const std::string& w, std::vector<int32_t>& out) const {
  std::vector<Symbol> symbols;
  symbols.reserve(w.size());
  auto add = [&](int32_t id, int32_t len) {
    const auto n = static_cast<int32_t>(symbols.size());
    if (n > 0) symbols.back().next = n;
    symbols.push_back({id, n - 1, -1, len});
  };
  int32_t unk = -1, unk_len = 0;  // a pending <unk> (fuse_unk joins consecutive ones)
  std::string s;
  for (size_t i = 0; i < w.size();) {
    size_t n = 0;
    unicode::decode_at(w, i, &n);
    const bool first = i == 0, last = i + n == w.size();
    s.assign(w, i, n);
    if (!first && continuing_subword_prefix) s.insert(0, *continuing_subword_prefix);
    if (last && end_of_word_suffix) s += *end_of_word_suffix;
    const auto byte_len = static_cast<int32_t>(n);
    i += n;
    if (const auto it = vocab.find(s); it != vocab.end()) {
      if (unk >= 0) add(unk, unk_len);
      unk = -1;
      add(it->second, byte_len);
      continue;
    }
    if (byte_fallback) {  // as Hugging Face: a pending <unk> is not flushed first
      bool all = true;
      for (const char c : s) all = all && byte_ids[static_cast<unsigned char>(c)] >= 0;
      if (all) {
        for (const char c : s) add(byte_ids[static_cast<unsigned char>(c)], 1);
        continue;
      }
    }
    if (unk_token) {
      if (unk >= 0 && fuse_unk) {
        unk_len += byte_len;
      } else {
        if (unk >= 0) add(unk, unk_len);
        unk = unk_id;
        unk_len = byte_len;
      }
    }
  }
  if (unk >= 0) add(unk, unk_len);

  std::priority_queue<MergeCandidate> queue;
  auto rank_of = [&](int32_t a, int32_t b) { return merges.find(a, b); };
  for (size_t i = 0; i + 1 < symbols.size(); ++i)
    if (const auto* m = rank_of(symbols[i].id, symbols[i + 1].id))
      queue.push({m->first, static_cast<int32_t>(i), m->second});
  const auto count = static_cast<int32_t>(symbols.size());
  while (!queue.empty()) {
    const MergeCandidate top = queue.top();
    queue.pop();
    Symbol& cur = symbols[top.pos];
    if (cur.len == 0 || cur.next == -1) continue;
    const int32_t next_pos = cur.next;
    const Symbol right = symbols[next_pos];
    const auto* m = rank_of(cur.id, right.id);
    if (m == nullptr || m->second != top.new_id) continue;
    cur.id = top.new_id;
    cur.len += right.len;
    cur.next = right.next;
    symbols[next_pos].len = 0;
    if (right.next > -1 && right.next < count) symbols[right.next].prev = top.pos;
    if (cur.prev >= 0)
      if (const auto* p = rank_of(symbols[cur.prev].id, cur.id))
        queue.push({p->first, cur.prev, p->second});
    if (cur.next >= 0 && cur.next < count)
      if (const auto* p = rank_of(cur.id, symbols[cur.next].id))
        queue.push({p->first, top.pos, p->second});
  }
  for (const auto& sym : symbols)
    if (sym.len != 0) out.push_back(sym.id);
}

void HfTokenizer::Impl::tokenize_word(const std::string& word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges)
    if (const auto it = vocab.find(word); it != vocab.end()) {
      out.push_back(it->second);
      return;
    }
  thread_local WordCache cache;
  if (cache.instance != instance) {
    cache.words.clear();
    cache.instance = instance;
  }
  if (const auto it = cache.words.find(word); it != cache.words.end()) {
    out.insert(out.end(), it->second.begin(), it->second.end());
    return;
  }
  const size_t before = out.size();
  merge_word(word, out);
  if (word.size() < kCacheWordBytes) {
    if (cache.words.size() >= kCacheWords) cache.words.clear();
    cache.words.emplace(word, std::vector<int32_t>(out.begin() + static_cast<std::ptrdiff_t>(before), out.end()));
  }
}

// ---------------------------------------------------------------------------------------------

HfTokenizer::HfTokenizer() : impl_(std::make_unique<Impl>()) {}
HfTokenizer::~HfTokenizer() = default;
HfTokenizer::HfTokenizer(HfTokenizer&&) noexcept = default;
HfTokenizer& HfTokenizer::operator=(HfTokenizer&&) noexcept = default;

HfTokenizer HfTokenizer::load(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  check(in.good(), "{}: cannot open tokenizer.json for reading", path.string());
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return from_json(bytes.str(), path.string());
}

namespace {

void parse_model(const Reader& r, const json& model, HfTokenizer::Impl& t);

void parse_post_processor(const Reader& r, const json& j, HfTokenizer::Impl& t) {
  if (j.is_null()) return;
  const std::string type = r.type(j, "post_processor");
  const std::string where = "post_processor " + type;
  if (type == "ByteLevel") return;
  if (type == "Sequence") {
    const json& list = r.field(j, "processors", where);
    if (!list.is_array()) r.bad(where, "\"processors\" is not a list");
    for (const auto& p : list) parse_post_processor(r, p, t);
    return;
  }
  if (type == "TemplateProcessing") {
    const json& single = r.field(j, "single", where);
    const json& specials = r.field(j, "special_tokens", where);
    if (!single.is_array()) r.bad(where, "\"single\" is not a list");
    t.prefix.clear();
    t.suffix.clear();
    bool seen_sequence = false;
    for (const auto& piece : single) {
      if (piece.contains("Sequence")) {
        seen_sequence = true;
        continue;
      }
      if (!piece.contains("SpecialToken")) r.bad(where, "a piece of \"single\" is not Sequence or SpecialToken");
      const std::string name = r.string(piece["SpecialToken"], "id", where);
      if (!specials.contains(name)) r.bad(where, fmt::format("special token \"{}\" is not in special_tokens", name));
      const json& ids = r.field(specials[name], "ids", where);
      if (!ids.is_array()) r.bad(where, fmt::format("special token \"{}\": \"ids\" is not a list", name));
      for (const auto& id : ids) {
        const auto value = static_cast<int32_t>(r.integer(id, where));
        (seen_sequence ? t.suffix : t.prefix).push_back(value);
      }
    }
    return;
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    const json& cls = r.field(j, "cls", where);
    const json& sep = r.field(j, "sep", where);
    if (!cls.is_array() || cls.size() != 2 || !sep.is_array() || sep.size() != 2)
      r.bad(where, "\"cls\" and \"sep\" must be [token, id]");
    t.prefix = {static_cast<int32_t>(r.integer(cls[1], where))};
    t.suffix = {static_cast<int32_t>(r.integer(sep[1], where))};
    return;
  }
  r.bad("post_processor", fmt::format("\"{}\" is not supported (longtron reads TemplateProcessing, "
                                      "ByteLevel, BertProcessing, RobertaProcessing and Sequence)",
                                      type));
}

void parse_model(const Reader& r, const json& model, HfTokenizer::Impl& t) {
  if (!model.is_object()) r.bad("model", "is not an object");
  const std::string type = model.contains("type") ? r.type(model, "model") : "BPE";
  if (type != "BPE")
    r.bad("model", fmt::format("type \"{}\" is not supported (longtron reads BPE)", type));
  if (model.contains("dropout") && !model["dropout"].is_null() &&
      !(model["dropout"].is_number() && model["dropout"].get<double>() == 0.0))
    r.bad("model", "BPE dropout is not supported (it makes encoding random)");
  auto optional_string = [&](const char* key) -> std::optional<std::string> {
    if (!model.contains(key) || model[key].is_null()) return std::nullopt;
    return r.string(model, key, "model");
  };
  t.unk_token = optional_string("unk_token");
  t.continuing_subword_prefix = optional_string("continuing_subword_prefix");
  t.end_of_word_suffix = optional_string("end_of_word_suffix");
  t.fuse_unk = r.boolean(model, "fuse_unk", false, "model");
  t.byte_fallback = r.boolean(model, "byte_fallback", false, "model");
  t.ignore_merges = r.boolean(model, "ignore_merges", false, "model");

  const json& vocab = r.field(model, "vocab", "model");
  if (!vocab.is_object()) r.bad("model", "\"vocab\" is not an object of token: id");
  t.vocab.reserve(vocab.size());
  std::unordered_map<int32_t, const std::string*> seen;
  for (const auto& [token, id] : vocab.items()) {
    const auto value = static_cast<int32_t>(r.integer(id, fmt::format("model vocab \"{}\"", token)));
    const auto [it, inserted] = t.vocab.emplace(token, value);
    (void)it;
    (void)inserted;
  }
  for (const auto& [token, id] : t.vocab) {
    const auto [it, inserted] = seen.emplace(id, &token);
    if (!inserted)
      r.bad("model vocab", fmt::format("id {} is given to both \"{}\" and \"{}\"", id, *it->second, token));
  }
  if (t.unk_token) {
    const auto it = t.vocab.find(*t.unk_token);
    if (it == t.vocab.end()) r.bad("model", fmt::format("unk_token \"{}\" is not in the vocabulary", *t.unk_token));
    t.unk_id = it->second;
  }
  t.byte_ids.fill(-1);
  for (int b = 0; b < 256; ++b)
    if (const auto it = t.vocab.find(fmt::format("<0x{:02X}>", b)); it != t.vocab.end())
      t.byte_ids[b] = it->second;

  const json& merges = r.field(model, "merges", "model");
  if (!merges.is_array()) r.bad("model", "\"merges\" is not a list");
  t.merges.reserve(merges.size());
  const size_t prefix_len = t.continuing_subword_prefix ? t.continuing_subword_prefix->size() : 0;
  std::string a, b;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const json& m = merges[rank];
    if (m.is_string()) {
      const std::string& line = m.get_ref<const std::string&>();
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos)
        r.bad("model merges", fmt::format("merge {} \"{}\" is not two tokens separated by a space", rank, line));
      a = line.substr(0, space);
      b = line.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      r.bad("model merges", fmt::format("merge {} {} is not \"a b\" or [\"a\", \"b\"]", rank, m.dump()));
    }
    const auto ia = t.vocab.find(a), ib = t.vocab.find(b);
    if (ia == t.vocab.end() || ib == t.vocab.end())
      r.bad("model merges", fmt::format("merge {} (\"{}\", \"{}\") names \"{}\", which is not in the "
                                        "vocabulary", rank, a, b, ia == t.vocab.end() ? a : b));
    // As Hugging Face: with a continuing_subword_prefix, the right token loses that many bytes.
    if (b.size() < prefix_len)
      r.bad("model merges", fmt::format("merge {} (\"{}\", \"{}\"): \"{}\" is shorter than the "
                                        "continuing_subword_prefix", rank, a, b, b));
    const std::string merged = a + b.substr(prefix_len);
    const auto im = t.vocab.find(merged);
    if (im == t.vocab.end())
      r.bad("model merges", fmt::format("merge {} (\"{}\", \"{}\") makes \"{}\", which is not in the "
                                        "vocabulary", rank, a, b, merged));
    t.merges.insert_or_assign(MergeMap::key(ia->second, ib->second),
                              {static_cast<int32_t>(rank), im->second});
  }
}

}  // namespace

HfTokenizer HfTokenizer::from_json(const std::string& json_text, const std::string& name) {
  JsonProblem problem;
  std::optional<json> parsed = try_parse_json(json_text, &problem);  // depth-bounded
  if (!parsed) fail("{}, byte {}: not a tokenizer.json: {}", name, problem.byte, problem.what);
  json root = std::move(*parsed);
  const Reader r{name};
  if (!root.is_object()) r.bad("top level", "is not an object");
  HfTokenizer tokenizer;
  Impl& t = *tokenizer.impl_;
  t.name = name;
  t.json_text = json_text;
  parse_model(r, r.field(root, "model", "top level"), t);
  if (root.contains("normalizer") && !root["normalizer"].is_null())
    t.normalizer = parse_normalizer(r, root["normalizer"]);
  if (root.contains("pre_tokenizer") && !root["pre_tokenizer"].is_null())
    t.pre_tokenizer = parse_pre_tokenizer(r, root["pre_tokenizer"]);
  if (root.contains("decoder") && !root["decoder"].is_null()) t.decoder = parse_decoder(r, root["decoder"]);

  int64_t size = 0;
  for (const auto& [token, id] : t.vocab) size = std::max<int64_t>(size, id + 1);
  if (root.contains("added_tokens") && !root["added_tokens"].is_null()) {
    const json& list = root["added_tokens"];
    if (!list.is_array()) r.bad("added_tokens", "is not a list");
    for (const auto& a : list) {
      const std::string where = "added_tokens";
      AddedToken token;
      token.id = static_cast<int32_t>(r.integer(r.field(a, "id", where), where));
      token.content = r.string(a, "content", where);
      const std::string w = fmt::format("added token \"{}\"", token.content);
      token.single_word = r.boolean(a, "single_word", false, w);
      token.lstrip = r.boolean(a, "lstrip", false, w);
      token.rstrip = r.boolean(a, "rstrip", false, w);
      token.special = r.boolean(a, "special", false, w);
      token.normalized = r.boolean(a, "normalized", !token.special, w);
      if (token.content.empty()) r.bad(w, "is empty");
      if (unicode::invalid_utf8_at(token.content) != std::string::npos) r.bad(w, "is not UTF-8");
      size = std::max<int64_t>(size, token.id + 1);
      t.added_ids[token.content] = token.id;
      t.added.push_back(std::move(token));
    }
  }
  // Non-normalized tokens are matched in the raw text, the others in the normalized text with
  // their own content normalized (AddedVocabulary::refresh_added_tokens).
  for (size_t i = 0; i < t.added.size(); ++i) {
    const AddedToken& a = t.added[i];
    if (!a.normalized) {
      t.raw_matcher.add(a.content, i);
    } else {
      std::string pattern = a.content;
      if (t.normalizer) t.normalizer->apply(pattern);
      t.normalized_matcher.add(pattern, i);
    }
  }
  // The id table has max id + 1 entries: a file with a few tokens and an id of 2e9 would make
  // gigabytes of it (and a model with that many embedding rows). Real vocabularies are dense.
  const int64_t held = static_cast<int64_t>(t.vocab.size() + t.added.size());
  if (size > 4 * held + 65536)
    r.bad("model vocab", fmt::format("the largest id, {}, is far beyond the {} tokens the file holds "
                                     "(ids must be dense: below 4 x tokens + 65536)", size - 1, held));
  t.id_to_token.assign(static_cast<size_t>(size), {});
  t.special.assign(static_cast<size_t>(size), 0);
  for (const auto& [token, id] : t.vocab) t.id_to_token[id] = token;
  for (const auto& a : t.added) {
    t.id_to_token[a.id] = a.content;
    t.special[a.id] = a.special;
  }
  if (root.contains("post_processor"))
    parse_post_processor(r, root["post_processor"], t);
  for (const int32_t id : t.prefix)
    if (id >= size) r.bad("post_processor", fmt::format("id {} is out of range [0, {})", id, size));
  for (const int32_t id : t.suffix)
    if (id >= size) r.bad("post_processor", fmt::format("id {} is out of range [0, {})", id, size));
  return tokenizer;
}

std::vector<int32_t> HfTokenizer::encode(std::string_view text) const {
  const Impl& t = *impl_;
  if (const size_t bad = unicode::invalid_utf8_at(text); bad != std::string_view::npos)
    fail("{}: the text is not valid UTF-8 (byte {})", t.name, bad);
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  std::vector<Piece> pieces;
  for (auto& raw : t.split_added(std::string(text), true, t.raw_matcher)) {
    if (raw.id >= 0) {
      ids.push_back(raw.id);
      continue;
    }
    if (t.normalizer) {
      try {
        t.normalizer->apply(raw.text);
      } catch (const Error& e) {
        fail("{}: {}", t.name, e.what());
      }
    }
    for (auto& split : t.split_added(raw.text, raw.origin, t.normalized_matcher)) {
      if (split.id >= 0) {
        ids.push_back(split.id);
        continue;
      }
      if (split.text.empty()) continue;
      pieces.clear();
      pieces.push_back({std::move(split.text), split.origin});
      if (t.pre_tokenizer) t.pre_tokenizer->apply(pieces);
      for (const auto& p : pieces) t.tokenize_word(p.text, ids);
    }
  }
  return ids;
}

std::string HfTokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  const Impl& t = *impl_;
  Tokens tokens;
  for (const int32_t id : ids) {
    if (id < 0 || id >= static_cast<int32_t>(t.id_to_token.size()) || t.id_to_token[id].empty()) continue;
    if (skip_special_tokens && t.special[id]) continue;
    tokens.push_back(t.id_to_token[id]);
  }
  if (!t.decoder) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  t.decoder->apply(tokens);
  std::string out;
  for (const auto& s : tokens) out += s;
  return out;
}

int32_t HfTokenizer::token_id(std::string_view token) const {
  if (const auto it = impl_->added_ids.find(token); it != impl_->added_ids.end()) return it->second;
  if (const auto it = impl_->vocab.find(token); it != impl_->vocab.end()) return it->second;
  return -1;
}

std::string HfTokenizer::token(int32_t id) const {
  if (id < 0 || id >= static_cast<int32_t>(impl_->id_to_token.size())) return {};
  return impl_->id_to_token[id];
}

bool HfTokenizer::is_special(int32_t id) const {
  return id >= 0 && id < static_cast<int32_t>(impl_->special.size()) && impl_->special[id];
}

int64_t HfTokenizer::vocab_size() const { return static_cast<int64_t>(impl_->id_to_token.size()); }
const std::vector<int32_t>& HfTokenizer::template_prefix() const { return impl_->prefix; }
const std::vector<int32_t>& HfTokenizer::template_suffix() const { return impl_->suffix; }
const std::string& HfTokenizer::json_text() const { return impl_->json_text; }
const std::string& HfTokenizer::name() const { return impl_->name; }

}  // namespace longtron::text
