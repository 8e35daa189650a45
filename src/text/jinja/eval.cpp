// Rendering a parsed Jinja template (see jinja.h): Jinja2's scoping (each loop iteration and each
// macro call has its own frame, so `set` inside a loop does not leak; namespace() objects carry
// state out), loop objects, loop controls and transformers' globals.
#include <ctime>
#include <deque>
#include <unordered_map>

#include "text/jinja/builtins.h"
#include "text/jinja/jinja.h"
#include "text/jinja/parser.h"

namespace longtron::text::jinja {

Raised::Raised(const std::string& template_name, int line, std::string message)
    : Error(fmt::format("{}: template line {}: raise_exception: {}", template_name, line, message)),
      line(line),
      message(std::move(message)) {}

namespace {

constexpr int64_t kMaxRange = 1'000'000;  // range() longer than this is refused
constexpr size_t kMaxOutput = size_t{1} << 30;  // 1 GiB of rendered text
constexpr int kMaxValueDepth = 100;  // lists and dicts stored in a namespace nest at most this deep

// Whether `v` holds the dict `target` or nests deeper than `depth_left` levels. A namespace
// attribute is the only place a value can grow across loop iterations ({% set ns.a = [ns.a] %})
// or refer to itself ({% set ns.x = ns %}); printing, comparing or freeing such a value recursed
// without end.
bool too_deep_or_cyclic(const Value& v, const Dict* target, int depth_left) {
  if (v.is_list()) {
    if (depth_left == 0) return true;
    for (const auto& item : *v.list)
      if (too_deep_or_cyclic(item, target, depth_left - 1)) return true;
  } else if (v.is_dict()) {
    if (v.dict.get() == target || depth_left == 0) return true;
    for (const auto& [key, item] : v.dict->items)
      if (too_deep_or_cyclic(item, target, depth_left - 1)) return true;
  }
  return false;
}

using Frame = std::unordered_map<std::string, Value>;

struct RaisedHere {  // raise_exception's message, turned into Raised with the template name
  int line;
  std::string message;
};

class Renderer {
 public:
  Renderer(const std::string& name, std::time_t now) : name_(name), now_(now) {}

  std::string run(const Body& body, const Dict& variables) {
    frames_.emplace_back();
    add_globals(frames_.back());
    for (const auto& [k, v] : variables.items) frames_.back()[k] = v;
    std::string out;
    out_ = &out;
    exec(body);
    return out;
  }

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  void add_globals(Frame& g) {
    g["range"] = Value::from(Function([](const CallArgs& a, int line) {
      int64_t start = 0, stop = 0, step = 1;
      auto as_int = [&](const Value& v) {
        if (v.kind != Value::Kind::kInt && v.kind != Value::Kind::kBool)
          fail("template line {}: range() takes integers, got {}", line, type_name(v));
        return v.kind == Value::Kind::kBool ? int64_t{v.boolean} : v.integer;
      };
      if (a.args.size() == 1) stop = as_int(a.args[0]);
      else if (a.args.size() == 2 || a.args.size() == 3) start = as_int(a.args[0]), stop = as_int(a.args[1]);
      else fail("template line {}: range() takes 1 to 3 arguments", line);
      if (a.args.size() == 3) step = as_int(a.args[2]);
      check(step != 0, "template line {}: range() step must not be zero", line);
      // In 128 bits: stop - start and i + step can leave int64 (range(2**63 - 2, 2**63 - 1, 5)
      // wrapped around and never ended).
      using Wide = __int128;
      const Wide span = step > 0 ? Wide{stop} - start : Wide{start} - stop;
      const Wide magnitude = step > 0 ? Wide{step} : -Wide{step};
      const Wide n = span > 0 ? (span + magnitude - 1) / magnitude : 0;
      check(n <= kMaxRange, "template line {}: range() longer than {}", line, kMaxRange);
      List out;
      for (Wide k = 0; k < n; ++k) out.push_back(Value::from(static_cast<int64_t>(Wide{start} + k * step)));
      return Value::from(std::move(out));
    }));
    auto make_dict = [](bool is_namespace) {
      return Value::from(Function([is_namespace](const CallArgs& a, int line) {
        auto d = std::make_shared<Dict>();
        for (const auto& positional : a.args) {
          if (!positional.is_dict())
            fail("template line {}: {}() takes a mapping or keyword arguments", line,
                 is_namespace ? "namespace" : "dict");
          for (const auto& [k, v] : positional.dict->items) d->set(k, v);
        }
        for (const auto& [k, v] : a.kwargs) d->set(k, v);
        Value out = Value::from(std::move(d));
        out.namespace_ = is_namespace;
        return out;
      }));
    };
    g["namespace"] = make_dict(true);
    g["dict"] = make_dict(false);
    g["raise_exception"] = Value::from(Function([](const CallArgs& a, int line) -> Value {
      throw RaisedHere{line, a.args.empty() ? "" : str(a.args[0])};
    }));
    const std::time_t now = now_;
    g["strftime_now"] = Value::from(Function([now](const CallArgs& a, int line) {
      check(a.args.size() == 1 && a.args[0].is_string(), "template line {}: strftime_now(format) takes a "
            "format string", line);
      std::tm tm{};
      if (now >= 0) {
        gmtime_r(&now, &tm);
      } else {
        const std::time_t t = std::time(nullptr);
        localtime_r(&t, &tm);
      }
      char buf[512];
      const size_t n = std::strftime(buf, sizeof buf, a.args[0].text.c_str(), &tm);
      return Value::from(std::string(buf, n));
    }));
  }

  void write(const std::string& text) {
    out_->append(text);
    check(out_->size() <= kMaxOutput, "{}: the rendered text exceeds {} bytes", name_, kMaxOutput);
  }

  Value lookup(const std::string& name) const {
    for (auto f = frames_.rbegin(); f != frames_.rend(); ++f) {
      const auto it = f->find(name);
      if (it != f->end()) return it->second;
    }
    return Value::undefined(fmt::format("'{}' is undefined", name));
  }

  void assign(const std::vector<std::string>& targets, const Value& value, int line) {
    if (targets.size() == 1) {
      frames_.back()[targets[0]] = value;
      return;
    }
    const List items = iterate(value, line);
    check(items.size() == targets.size(), "template line {}: cannot unpack {} values into {} names", line,
          items.size(), targets.size());
    for (size_t i = 0; i < targets.size(); ++i) frames_.back()[targets[i]] = items[i];
  }

  Flow exec(const Body& body) {
    for (const auto& s : body) {
      const Flow flow = exec(*s);
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  Flow exec(const Stmt& s) {
    switch (s.kind) {
      case Stmt::Kind::kText: write(s.text); return Flow::kNormal;
      case Stmt::Kind::kPrint: write(str(eval(*s.expr))); return Flow::kNormal;
      case Stmt::Kind::kIf:
        for (const auto& [condition, body] : s.branches)
          if (truthy(eval(*condition))) return exec(body);
        return exec(s.else_body);
      case Stmt::Kind::kFor: return exec_for(s);
      case Stmt::Kind::kSet: {
        const Value value = eval(*s.expr);
        if (s.attr.empty()) {
          assign(s.targets, value, s.line);
        } else {
          const Value target = lookup(s.targets[0]);
          check(target.is_dict() && target.namespace_, "{}: template line {}: cannot assign attribute '{}' "
                "on '{}', which is not a namespace", name_, s.line, s.attr, s.targets[0]);
          check(!too_deep_or_cyclic(value, target.dict.get(), kMaxValueDepth),
                "{}: template line {}: the value assigned to '{}.{}' holds the namespace itself or nests "
                "deeper than {} levels", name_, s.line, s.targets[0], s.attr, kMaxValueDepth);
          target.dict->set(s.attr, value);
        }
        return Flow::kNormal;
      }
      case Stmt::Kind::kSetBlock: {
        std::string captured;
        std::string* saved = out_;
        out_ = &captured;
        exec(s.body);
        out_ = saved;
        assign(s.targets, Value::from(captured), s.line);
        return Flow::kNormal;
      }
      case Stmt::Kind::kMacro: define_macro(s); return Flow::kNormal;
      case Stmt::Kind::kBreak: return Flow::kBreak;
      case Stmt::Kind::kContinue: return Flow::kContinue;
      case Stmt::Kind::kBody: return exec(s.body);
    }
    return Flow::kNormal;
  }

  Flow exec_for(const Stmt& s) {
    List items = iterate(eval(*s.expr), s.line);
    if (s.filter) {  // `for x in y if c`: the loop (and loop.length) sees only the kept items
      List kept;
      for (const auto& item : items) {
        frames_.emplace_back();
        assign(s.targets, item, s.line);
        const bool keep = truthy(eval(*s.filter));
        frames_.pop_back();
        if (keep) kept.push_back(item);
      }
      items = std::move(kept);
    }
    const auto n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      auto loop = std::make_shared<Dict>();
      loop->set("index0", Value::from(i));
      loop->set("index", Value::from(i + 1));
      loop->set("revindex0", Value::from(n - i - 1));
      loop->set("revindex", Value::from(n - i));
      loop->set("first", Value::from(i == 0));
      loop->set("last", Value::from(i == n - 1));
      loop->set("length", Value::from(n));
      loop->set("depth", Value::from(int64_t{1}));
      loop->set("depth0", Value::from(int64_t{0}));
      loop->set("previtem", i > 0 ? items[i - 1] : Value::undefined("there is no previous item"));
      loop->set("nextitem", i + 1 < n ? items[i + 1] : Value::undefined("there is no next item"));
      loop->set("cycle", Value::from(Function([i](const CallArgs& a, int line) {
        check(!a.args.empty(), "template line {}: loop.cycle() needs at least one value", line);
        return a.args[static_cast<size_t>(i) % a.args.size()];
      })));
      frames_.emplace_back();
      frames_.back()["loop"] = Value::from(loop);
      assign(s.targets, items[i], s.line);
      const Flow flow = exec(s.body);
      frames_.pop_back();
      if (flow == Flow::kBreak) break;
    }
    if (n == 0) return exec(s.else_body);
    return Flow::kNormal;
  }

  void define_macro(const Stmt& s) {
    const Stmt* macro = &s;
    Renderer* self = this;
    frames_.back()[s.text] = Value::from(Function([self, macro](const CallArgs& a, int line) {
      check(a.args.size() <= macro->params.size(), "template line {}: macro '{}' takes {} arguments, got {}",
            line, macro->text, macro->params.size(), a.args.size());
      Frame frame;
      for (size_t p = 0; p < macro->params.size(); ++p) {
        Value v = p < a.args.size() ? a.args[p]
                  : macro->defaults[p]  ? self->eval(*macro->defaults[p])
                                        : Value::undefined(fmt::format("'{}' is undefined", macro->params[p]));
        frame[macro->params[p]] = std::move(v);
      }
      for (const auto& [k, v] : a.kwargs) {
        check(std::find(macro->params.begin(), macro->params.end(), k) != macro->params.end(),
              "template line {}: macro '{}' has no argument '{}'", line, macro->text, k);
        frame[k] = v;
      }
      check(self->macro_depth_ < 100, "template line {}: macros call each other too deeply", line);
      // A macro sees the template's top level and its own arguments, not the caller's locals.
      std::deque<Frame> saved;
      while (self->frames_.size() > 1) {
        saved.push_front(std::move(self->frames_.back()));
        self->frames_.pop_back();
      }
      self->frames_.push_back(std::move(frame));
      std::string captured;
      std::string* out = self->out_;
      self->out_ = &captured;
      ++self->macro_depth_;
      try {
        self->exec(macro->body);
      } catch (...) {
        --self->macro_depth_;
        self->out_ = out;
        self->frames_.pop_back();
        for (auto& f : saved) self->frames_.push_back(std::move(f));
        throw;
      }
      --self->macro_depth_;
      self->out_ = out;
      self->frames_.pop_back();
      for (auto& f : saved) self->frames_.push_back(std::move(f));
      return Value::from(captured);
    }));
  }

  CallArgs eval_args(const Expr& e, size_t from) {
    CallArgs a;
    for (size_t i = from; i < e.args.size(); ++i) a.args.push_back(eval(*e.args[i]));
    for (const auto& [k, v] : e.kwargs) a.kwargs.emplace_back(k, eval(*v));
    return a;
  }

  Value eval(const Expr& e) {
    using K = Expr::Kind;
    switch (e.kind) {
      case K::kConst: return e.value;
      case K::kName: return lookup(e.name);
      case K::kList: {
        List items;
        for (const auto& item : e.args) items.push_back(eval(*item));
        return Value::from(std::move(items), e.tuple);
      }
      case K::kDict: {
        auto d = std::make_shared<Dict>();
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          const Value key = eval(*e.args[i]);
          check(key.is_string(), "{}: template line {}: dict keys must be strings here, got {}", name_, e.line,
                type_name(key));
          d->set(key.text, eval(*e.args[i + 1]));
        }
        return Value::from(std::move(d));
      }
      case K::kAttr: return get_attr(eval(*e.args[0]), e.name, e.line);
      case K::kItem: return get_item(eval(*e.args[0]), eval(*e.args[1]), e.line);
      case K::kSlice: {
        const Value subject = eval(*e.args[0]);
        Value parts[3];
        const Value* ptr[3] = {nullptr, nullptr, nullptr};
        for (int k = 0; k < 3; ++k)
          if (e.args[k + 1]) parts[k] = eval(*e.args[k + 1]), ptr[k] = &parts[k];
        return get_slice(subject, ptr[0], ptr[1], ptr[2], e.line);
      }
      case K::kCall: {
        const Value callee = eval(*e.args[0]);
        return call(callee, eval_args(e, 1), e.line);
      }
      case K::kFilter: return apply_filter(e.name, eval(*e.args[0]), eval_args(e, 1), e.line);
      case K::kTest: return Value::from(apply_test(e.name, eval(*e.args[0]), eval_args(e, 1), e.line) != e.negate);
      case K::kNot: return Value::from(!truthy(eval(*e.args[0])));
      case K::kNeg:
      case K::kPos: {
        const Value v = eval(*e.args[0]);
        if (v.is_undefined()) undefined_error(v, e.line);
        check(v.is_number(), "{}: template line {}: bad operand type for unary {}: '{}'", name_, e.line,
              e.kind == K::kNeg ? '-' : '+', type_name(v));
        if (e.kind == K::kPos) return v;
        if (v.kind == Value::Kind::kFloat) return Value::from(-v.real);
        return Value::from(-(v.kind == Value::Kind::kBool ? int64_t{v.boolean} : v.integer));
      }
      case K::kBinary: return binary(e.name, eval(*e.args[0]), eval(*e.args[1]), e.line);
      case K::kAnd: {
        Value left = eval(*e.args[0]);
        return truthy(left) ? eval(*e.args[1]) : left;
      }
      case K::kOr: {
        Value left = eval(*e.args[0]);
        return truthy(left) ? left : eval(*e.args[1]);
      }
      case K::kCond:
        if (truthy(eval(*e.args[1]))) return eval(*e.args[0]);
        return e.args[2] ? eval(*e.args[2]) : Value::undefined("the condition was false and there is no else");
    }
    return Value::undefined();
  }

  const std::string& name_;
  std::time_t now_;
  std::vector<Frame> frames_;
  std::string* out_ = nullptr;
  int macro_depth_ = 0;
};

}  // namespace

Template Template::parse(const std::string& source, const std::string& name) {
  Template t;
  t.name_ = name;
  t.body_ = std::make_shared<const Body>(jinja::parse(tokenize(source, name), name));
  return t;
}

std::string Template::render(const Dict& variables, std::time_t now) const {
  try {
    return Renderer(name_, now).run(*body_, variables);
  } catch (const RaisedHere& r) {
    throw Raised(name_, r.line, r.message);
  } catch (const Raised&) {
    throw;
  } catch (const Error& e) {
    const std::string what = e.what();
    if (what.rfind("template line ", 0) == 0) throw Error(name_ + ": " + what);
    throw;
  }
}

}  // namespace longtron::text::jinja
