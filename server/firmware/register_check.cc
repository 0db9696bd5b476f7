#include "server/firmware/register_check.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <functional>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace fwai {
namespace {

// ---- Tokens ----------------------------------------------------------------

enum class Tok { kIdent, kNumber, kPunct, kString };

struct Token {
  Tok kind = Tok::kPunct;
  std::string text;
  int line = 0, column = 0;
  std::string origin;  // the outermost macro this token came from ("" : the source)
};

bool IsIdentStart(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool IsIdentChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

const char* const kPuncts[] = {"<<=", ">>=", "->", "<<", ">>", "|=", "&=", "^=", "+=", "-=", "*=",
                               "/=",  "==",  "!=", "<=", ">=", "&&", "||", "++", "--", "::"};

// The tokens of `text` from (line, column); comments dropped.
std::vector<Token> Lex(std::string_view text, int line = 1, int column = 1) {
  std::vector<Token> out;
  size_t i = 0;
  auto advance = [&](size_t n) {
    for (size_t k = 0; k < n && i < text.size(); ++k, ++i) {
      if (text[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
  };
  while (i < text.size()) {
    const char c = text[i];
    if (std::isspace(static_cast<unsigned char>(c)) || c == '\\') {
      advance(1);
    } else if (c == '/' && i + 1 < text.size() && text[i + 1] == '/') {
      while (i < text.size() && text[i] != '\n') advance(1);
    } else if (c == '/' && i + 1 < text.size() && text[i + 1] == '*') {
      advance(2);
      while (i < text.size() && !(text[i] == '*' && i + 1 < text.size() && text[i + 1] == '/')) {
        advance(1);
      }
      advance(2);
    } else if (c == '"' || c == '\'') {
      Token t{Tok::kString, "", line, column, ""};
      advance(1);
      while (i < text.size() && text[i] != c && text[i] != '\n') advance(text[i] == '\\' ? 2 : 1);
      advance(1);
      out.push_back(t);
    } else if (IsIdentStart(c)) {
      Token t{Tok::kIdent, "", line, column, ""};
      const size_t start = i;
      while (i < text.size() && IsIdentChar(text[i])) advance(1);
      t.text = std::string(text.substr(start, i - start));
      out.push_back(std::move(t));
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      Token t{Tok::kNumber, "", line, column, ""};
      const size_t start = i;
      while (i < text.size() && (IsIdentChar(text[i]) || text[i] == '.')) advance(1);
      t.text = std::string(text.substr(start, i - start));
      out.push_back(std::move(t));
    } else {
      Token t{Tok::kPunct, std::string(1, c), line, column, ""};
      for (const char* p : kPuncts) {
        if (text.substr(i, std::strlen(p)) == p) {
          t.text = p;
          break;
        }
      }
      advance(t.text.size());
      out.push_back(std::move(t));
    }
  }
  return out;
}

// An integer literal (0x.., 0b.., octal, decimal; u/l suffixes).
std::optional<uint64_t> IntLiteral(const std::string& s) {
  std::string t = s;
  while (!t.empty() && (t.back() == 'u' || t.back() == 'U' || t.back() == 'l' || t.back() == 'L')) {
    t.pop_back();
  }
  if (t.empty()) return std::nullopt;
  int base = 10;
  size_t at = 0;
  if (t.size() > 2 && t[0] == '0' && (t[1] == 'x' || t[1] == 'X')) {
    base = 16;
    at = 2;
  } else if (t.size() > 2 && t[0] == '0' && (t[1] == 'b' || t[1] == 'B')) {
    base = 2;
    at = 2;
  } else if (t.size() > 1 && t[0] == '0') {
    base = 8;
    at = 1;
  }
  uint64_t v = 0;
  for (size_t k = at; k < t.size(); ++k) {
    const char c = static_cast<char>(std::tolower(static_cast<unsigned char>(t[k])));
    int d = std::isdigit(static_cast<unsigned char>(c)) ? c - '0'
            : (c >= 'a' && c <= 'f')                    ? c - 'a' + 10
                                                        : -1;
    if (d < 0 || d >= base) return std::nullopt;
    v = v * static_cast<uint64_t>(base) + static_cast<uint64_t>(d);
  }
  return v;
}

std::string Hex(uint64_t v) { return absl::StrFormat("0x%08X", v); }

// "bits 14, 0" / "bits 14-15".
std::string Bits(uint64_t mask) {
  std::vector<std::string> out;
  for (int b = 0; b < 64; ++b) {
    if (!(mask >> b & 1)) continue;
    int e = b;
    while (e + 1 < 64 && (mask >> (e + 1) & 1)) ++e;
    out.push_back(e == b ? std::to_string(b) : absl::StrCat(b, "-", e));
    b = e;
  }
  return absl::StrCat(out.size() == 1 && out[0].find('-') == std::string::npos ? "bit " : "bits ",
                      absl::StrJoin(out, ", "));
}

std::string FieldList(const SvdRegister& r, uint64_t near = ~uint64_t{0}) {
  std::vector<std::string> out;
  for (const auto& f : r.fields) {
    if (!(f.Mask() & near) && near != ~uint64_t{0}) continue;
    out.push_back(f.bit_width == 1 ? absl::StrCat(f.name, " [", f.bit_offset, "]")
                                   : absl::StrCat(f.name, " [", f.bit_offset + f.bit_width - 1, ":",
                                                  f.bit_offset, "]"));
  }
  return absl::StrJoin(out, ", ");
}

bool IsTypeWord(const std::string& w) {
  static const std::set<std::string> kWords = {
      "volatile",  "const",  "unsigned", "signed",   "int",      "long",      "short", "char",
      "void",      "struct", "__IO",     "__I",      "__O",      "__IM",      "__OM",  "__IOM",
      "uintptr_t", "size_t", "bool",     "typename", "restrict", "__restrict"};
  return kWords.count(w) || absl::EndsWith(w, "_t") || absl::EndsWith(w, "_TypeDef") ||
         absl::EndsWith(w, "_Type");
}

// Width in bits of a scalar type word (0: not one).
int TypeBits(const std::string& w) {
  if (w == "uint8_t" || w == "int8_t" || w == "char") return 8;
  if (w == "uint16_t" || w == "int16_t" || w == "short") return 16;
  if (w == "uint64_t" || w == "int64_t") return 64;
  if (w == "uint32_t" || w == "int32_t" || w == "int" || w == "unsigned" || w == "long") return 32;
  return 0;
}

}  // namespace

// A register the code reaches, and how it named it.
struct RegisterChecker::RegRef {
  const SvdPeripheral* peripheral = nullptr;
  const SvdRegister* reg = nullptr;
  uint64_t address = 0;
  int width = 32;
  std::string symbol;  // "RCC->APB2ENR" or "0x40021018" or the macro's name
  std::string macro;   // the macro the access came from
};

// One pass over one file's statements: macro expansion, expression values,
// and the checks on each register access.
class RegisterScan {
 public:
  RegisterScan(RegisterChecker& c, const std::string& file) : c_(c), file_(file) {}

  struct Value {
    bool known = false;  // an integer whose value is known
    uint64_t v = 0;
    int pointer_bits = 0;  // a pointer to an integer of this width (a cast)
    std::optional<RegisterChecker::RegRef> reg;
    const SvdPeripheral* peripheral = nullptr;          // a peripheral pointer (P, before ->)
    std::vector<std::pair<uint64_t, uint64_t>> shifts;  // (K << N) terms of the value
  };

  void Define(const std::string& body_text, const std::string& name, int line,
              std::vector<std::string> params, bool function_like) {
    RegisterChecker::Macro m;
    m.params = std::move(params);
    m.function_like = function_like;
    m.body = body_text;
    m.file = file_;
    m.line = line;
    c_.macros_[name] = m;
    CheckDefine(name, line);
  }

  void Statement(std::vector<Token> toks) {
    if (toks.empty()) return;
    toks = Expand(toks, {}, 0);
    for (const Token& t : toks) {
      if (!t.origin.empty() && c_.wrong_macros_.count(t.origin)) return;  // said at its #define
    }
    // The top-level assignment, if any.
    int depth = 0;
    size_t op = std::string::npos;
    for (size_t k = 0; k < toks.size(); ++k) {
      const std::string& t = toks[k].text;
      if (toks[k].kind != Tok::kPunct) continue;
      if (t == "(" || t == "[") ++depth;
      if (t == ")" || t == "]") --depth;
      if (depth == 0 && (t == "=" || t == "|=" || t == "&=" || t == "^=")) {
        op = k;
        break;
      }
    }
    if (op == std::string::npos) {
      Eval(toks);
      return;
    }
    std::vector<Token> lhs(toks.begin(), toks.begin() + static_cast<long>(op));
    std::vector<Token> rhs(toks.begin() + static_cast<long>(op) + 1, toks.end());
    // A declaration's name is no register: only its initialiser is looked at.
    Value target = Eval(lhs);
    const std::string how = toks[op].text;
    bool inverted = false;
    if (how == "&=" && !rhs.empty() && rhs[0].text == "~") {
      inverted = true;
      rhs.erase(rhs.begin());
    }
    unknown_.clear();
    Value value = Eval(rhs);
    if (target.reg && target.reg->reg && value.known) {
      CheckWrite(*target.reg, value, how, inverted, toks[op]);
    } else if (target.reg && target.reg->reg) {
      // Written with a name no source checked defines: said, never guessed.
      for (const Token& t : unknown_) ReportUnresolved(t, *target.reg);
    }
  }

 private:
  // ---- Macro expansion ----
  std::vector<Token> Expand(const std::vector<Token>& in, std::set<std::string> hidden, int depth) {
    std::vector<Token> out;
    for (size_t k = 0; k < in.size(); ++k) {
      const Token& t = in[k];
      auto it = t.kind == Tok::kIdent ? c_.macros_.find(t.text) : c_.macros_.end();
      // A peripheral's own name stays a name: RCC->APB2ENR is checked by name.
      if (it == c_.macros_.end() || hidden.count(t.text) || depth > 32 ||
          c_.svd_.Peripheral(t.text)) {
        out.push_back(t);
        continue;
      }
      const RegisterChecker::Macro& m = it->second;
      std::vector<Token> body = Lex(m.body);
      if (m.function_like) {
        if (k + 1 >= in.size() || in[k + 1].text != "(") {
          out.push_back(t);
          continue;
        }
        // Arguments, split at top-level commas.
        std::vector<std::vector<Token>> args(1);
        int level = 0;
        size_t j = k + 2;
        for (; j < in.size(); ++j) {
          const std::string& s = in[j].text;
          if (s == "(") ++level;
          if (s == ")") {
            if (level == 0) break;
            --level;
          }
          if (s == "," && level == 0) {
            args.emplace_back();
            continue;
          }
          args.back().push_back(in[j]);
        }
        std::vector<Token> substituted;
        for (const Token& b : body) {
          auto p = std::find(m.params.begin(), m.params.end(), b.text);
          if (b.kind == Tok::kIdent && p != m.params.end()) {
            const size_t n = static_cast<size_t>(p - m.params.begin());
            if (n < args.size())
              substituted.insert(substituted.end(), args[n].begin(), args[n].end());
          } else {
            substituted.push_back(b);
          }
        }
        body = std::move(substituted);
        k = j;  // past the ')'
      }
      auto next = hidden;
      next.insert(t.text);
      for (Token& b : Expand(body, next, depth + 1)) {
        b.line = t.line;
        b.column = t.column;
        if (t.origin.empty())
          b.origin = t.text;
        else
          b.origin = t.origin;
        out.push_back(std::move(b));
      }
    }
    return out;
  }

  // ---- Expressions ----
  struct Cursor {
    const std::vector<Token>& t;
    size_t at = 0;
    bool done() const { return at >= t.size(); }
    const std::string& peek() const {
      static const std::string kEnd;
      return done() ? kEnd : t[at].text;
    }
  };

  Value Eval(const std::vector<Token>& toks) {
    if (toks.empty()) return {};
    Cursor c{toks};
    Value v;
    while (!c.done()) {
      const size_t before = c.at;
      v = Binary(c, 0);
      if (c.at == before) ++c.at;  // something this evaluator does not read: skip it
    }
    return v;
  }

  static int Precedence(const std::string& op) {
    if (op == "*" || op == "/" || op == "%") return 10;
    if (op == "+" || op == "-") return 9;
    if (op == "<<" || op == ">>") return 8;
    if (op == "<" || op == ">" || op == "<=" || op == ">=") return 7;
    if (op == "==" || op == "!=") return 6;
    if (op == "&") return 5;
    if (op == "^") return 4;
    if (op == "|") return 3;
    if (op == "&&") return 2;
    if (op == "||") return 1;
    return -1;
  }

  Value Binary(Cursor& c, int min) {
    Value left = Unary(c);
    while (!c.done()) {
      const std::string op = c.peek();
      const int p = Precedence(op);
      if (p < 0 || p <= min - 1 || p < min) break;
      const Token& at = c.t[c.at];
      ++c.at;
      Value right = Binary(c, p + 1);
      left = Apply(op, left, right, at);
    }
    return left;
  }

  Value Apply(const std::string& op, const Value& a, const Value& b, const Token& at) {
    // A register read against a mask: the bits it tests.
    if (op == "&" && (a.reg || b.reg) && (a.known || b.known)) {
      const auto& reg = a.reg ? *a.reg : *b.reg;
      const Value& mask = a.reg ? b : a;
      if (reg.reg) CheckRead(reg, mask.v, at);
    }
    Value out;
    if (!a.known || !b.known) return out;
    out.known = true;
    const uint64_t x = a.v, y = b.v;
    if (op == "*") out.v = x * y;
    if (op == "/") out.v = y ? x / y : 0;
    if (op == "%") out.v = y ? x % y : 0;
    if (op == "+") out.v = x + y;
    if (op == "-") out.v = x - y;
    if (op == "<<") out.v = y < 64 ? x << y : 0;
    if (op == ">>") out.v = y < 64 ? x >> y : 0;
    if (op == "<") out.v = x < y;
    if (op == ">") out.v = x > y;
    if (op == "<=") out.v = x <= y;
    if (op == ">=") out.v = x >= y;
    if (op == "==") out.v = x == y;
    if (op == "!=") out.v = x != y;
    if (op == "&") out.v = x & y;
    if (op == "^") out.v = x ^ y;
    if (op == "|") out.v = x | y;
    if (op == "&&") out.v = x && y;
    if (op == "||") out.v = x || y;
    if (op == "<<") out.shifts.push_back({x, y});
    if (op == "|" || op == "+") {
      out.shifts = a.shifts;
      out.shifts.insert(out.shifts.end(), b.shifts.begin(), b.shifts.end());
    }
    out.pointer_bits = a.pointer_bits;
    return out;
  }

  Value Unary(Cursor& c) {
    if (c.done()) return {};
    const Token& t = c.t[c.at];
    if (t.text == "~" || t.text == "-" || t.text == "!" || t.text == "+") {
      ++c.at;
      Value v = Unary(c);
      if (v.known) {
        v.v = t.text == "~" ? ~v.v : t.text == "-" ? uint64_t{0} - v.v : t.text == "!" ? !v.v : v.v;
        v.shifts.clear();
      }
      return v;
    }
    if (t.text == "*") {  // a dereference: of an address, a register
      ++c.at;
      Value p = Unary(c);
      Value out;
      if (p.known && p.pointer_bits) out.reg = AtAddress(p.v, p.pointer_bits, t);
      return out;
    }
    if (t.text == "&") {  // an address taken: not a register access
      ++c.at;
      (void)Unary(c);
      return {};
    }
    if (t.text == "(") {
      // A cast: type words and '*' up to the ')'.
      size_t k = c.at + 1;
      bool cast = k < c.t.size() && c.t[k].kind == Tok::kIdent;
      int bits = 0;
      bool pointer = false;
      for (; k < c.t.size() && c.t[k].text != ")"; ++k) {
        const Token& w = c.t[k];
        if (w.text == "*") {
          pointer = true;
        } else if (w.kind != Tok::kIdent || !IsTypeWord(w.text)) {
          cast = false;
          break;
        } else if (TypeBits(w.text)) {
          bits = TypeBits(w.text);
        }
      }
      if (cast && k < c.t.size()) {
        c.at = k + 1;
        Value v = Unary(c);
        if (pointer) v.pointer_bits = bits ? bits : 32;
        return v;
      }
      ++c.at;
      Value v = Binary(c, 0);
      if (c.peek() == ")") ++c.at;
      return Postfix(c, v);
    }
    if (t.kind == Tok::kNumber) {
      ++c.at;
      Value v;
      if (auto n = IntLiteral(t.text)) {
        v.known = true;
        v.v = *n;
      }
      return v;
    }
    if (t.kind == Tok::kIdent) {
      ++c.at;
      Value v;
      if (const SvdPeripheral* p = c_.svd_.Peripheral(t.text)) {
        v.peripheral = p;
        return Postfix(c, v, t.text);
      }
      if (t.text == "sizeof") return {};
      // return (x) & m, if (...), while (...): what follows is an expression, not arguments.
      static const std::set<std::string> kKeywords = {"return", "if",   "while", "switch",
                                                      "for",    "case", "else",  "do"};
      if (kKeywords.count(t.text)) return {};
      if (c.peek() == "(") {  // a call: its arguments are still looked at
        ++c.at;
        int level = 0;
        std::vector<Token> arg;
        for (; !c.done(); ++c.at) {
          const std::string& s = c.peek();
          if (s == "(") ++level;
          if (s == ")" && level-- == 0) break;
          if (s == "," && level == 0) {
            Eval(arg);
            arg.clear();
            continue;
          }
          arg.push_back(c.t[c.at]);
        }
        Eval(arg);
        if (c.peek() == ")") ++c.at;
        return {};
      }
      Unresolved(t);
      return Postfix(c, v, t.text);
    }
    ++c.at;
    return {};
  }

  // P->REG, P->REG[2], P->CH[1].CCR, (pointer)->REG.
  Value Postfix(Cursor& c, Value v, const std::string& name = "") {
    if (c.peek() != "->") return v;
    const Token& arrow = c.t[c.at];
    ++c.at;
    const SvdPeripheral* p = v.peripheral;
    std::string symbol = name;
    if (!p && v.known) {
      p = c_.svd_.PeripheralAt(v.v);
      symbol = Hex(v.v);
    }
    std::string member;
    while (!c.done()) {
      const Token& m = c.t[c.at];
      if (m.kind != Tok::kIdent) break;
      member += m.text;
      ++c.at;
      if (c.peek() == "[") {
        size_t k = c.at + 1;
        std::vector<Token> index;
        int level = 0;
        for (; k < c.t.size(); ++k) {
          if (c.t[k].text == "[") ++level;
          if (c.t[k].text == "]" && level-- == 0) break;
          index.push_back(c.t[k]);
        }
        Value i = Eval(index);
        member += i.known ? absl::StrCat("[", i.v, "]") : "[?]";
        c.at = k + 1;
      }
      if (c.peek() != ".") break;
      member += ".";
      ++c.at;
    }
    Value out;
    if (!p || member.empty() || absl::StrContains(member, "[?]")) return out;
    RegisterChecker::RegRef r;
    r.peripheral = p;
    r.symbol = absl::StrCat(symbol, "->", member);
    r.reg = p->Register(member);
    ++c_.stats_.accesses;
    if (!r.reg) {
      // CMSIS arrays: CCR[1] in the header, CCR1 or CCR[1] in the SVD.
      std::string flat = member;
      flat.erase(
          std::remove_if(flat.begin(), flat.end(), [](char ch) { return ch == '[' || ch == ']'; }),
          flat.end());
      r.reg = p->Register(flat);
    }
    if (!r.reg) {
      std::vector<std::string> names;
      for (const auto& reg : p->registers) names.push_back(reg.name);
      Report(arrow, "error", "unknown-register", r.symbol,
             absl::StrCat("accesses register ", member, " of ", p->name),
             absl::StrCat(p->name, " has no register ", member,
                          "; its registers: ", absl::StrJoin(names, ", ")),
             p->name,
             "use one of the peripheral's registers (fwai kb search the reference manual)");
      return out;
    }
    r.address = p->base + r.reg->offset;
    r.width = static_cast<int>(r.reg->size);
    out.reg = r;
    return out;
  }

  // The register at an absolute address, as the code reached it.
  std::optional<RegisterChecker::RegRef> AtAddress(uint64_t address, int bits, const Token& at) {
    const SvdPeripheral* p = c_.svd_.PeripheralAt(address);
    if (!p) return std::nullopt;  // not a peripheral of this device: RAM, core, another chip
    ++c_.stats_.accesses;
    RegisterChecker::RegRef r;
    r.peripheral = p;
    r.address = address;
    r.width = bits;
    r.macro = defining_.empty() ? at.origin : defining_;
    r.symbol = r.macro.empty() ? Hex(address) : r.macro;
    const uint64_t offset = address - p->base;
    r.reg = p->RegisterAt(offset);
    if (!r.reg) {
      const SvdRegister* before = nullptr;
      const SvdRegister* after = nullptr;
      for (const auto& reg : p->registers) {
        if (reg.offset < offset) before = &reg;
        if (reg.offset > offset && !after) after = &reg;
      }
      std::string near;
      if (before) near += absl::StrCat(before->name, " at +", Hex(before->offset));
      if (after)
        absl::StrAppend(&near, near.empty() ? "" : ", ", after->name, " at +", Hex(after->offset));
      Report(at, "error", "unknown-register", r.symbol,
             absl::StrCat("accesses ", Hex(address), " (", p->name, " + ", Hex(offset), ")"),
             absl::StrCat(p->name, " has no register at offset ", Hex(offset),
                          near.empty() ? "" : "; nearest: " + near),
             p->name, "check the offset against the reference manual's register map");
      return std::nullopt;
    }
    const uint64_t bytes = std::max<uint64_t>(1, r.reg->size / 8);
    if (r.reg->offset != offset || address % bytes != 0) {
      Report(at, "error", "misaligned", r.symbol,
             absl::StrCat("accesses ", Hex(address), " (", p->name, " + ", Hex(offset), ")"),
             absl::StrCat(r.reg->name, " is the ", r.reg->size, "-bit register at ",
                          Hex(p->base + r.reg->offset)),
             r.reg->path, absl::StrCat("use ", Hex(p->base + r.reg->offset)));
      return std::nullopt;
    }
    return r;
  }

  // ---- Checks ----
  void CheckWrite(const RegisterChecker::RegRef& r, const Value& v, const std::string& how,
                  bool inverted, const Token& at) {
    const SvdRegister& reg = *r.reg;
    const uint64_t width_mask = reg.size >= 64 ? ~uint64_t{0} : (uint64_t{1} << reg.size) - 1;
    const uint64_t bits = v.v & width_mask;
    const std::string name = absl::StrCat(r.peripheral->name, ".", reg.name);
    if (!reg.Writable()) {
      Report(at, "error", "read-only", r.symbol, absl::StrCat("writes ", name),
             absl::StrCat(reg.name, " is read-only"), reg.path, "do not write it");
      return;
    }
    if (how == "=" && !inverted) {
      // Every bit is written; the ones set must be fields.
    }
    if (v.known && v.v > width_mask && !inverted) {
      Report(
          at, "error", "value-overflow", r.symbol, absl::StrCat("writes ", Hex(v.v), " to ", name),
          absl::StrCat(reg.name, " is ", reg.size, " bits wide"), reg.path, "check the constant");
    }
    const uint64_t reserved = bits & ~reg.FieldBits();
    if (reserved) {
      Report(at, "error", "reserved-bits", r.symbol,
             absl::StrCat(inverted     ? "clears "
                          : how == "=" ? "writes "
                                       : "sets ",
                          Bits(reserved), " of ", name),
             absl::StrCat(Bits(reserved), " of ", reg.name, " ",
                          reserved == (reserved & -reserved) ? "is" : "are",
                          " reserved; its fields: ", FieldList(reg)),
             reg.path, Suggest(reg, reserved));
    }
    if (how == "=" && !inverted && !reserved) CheckEnumWrite(r, bits, at);
    if (!inverted) {
      for (const auto& f : reg.fields) {
        if ((f.Mask() & bits) && !f.Writable()) {
          Report(at, "error", "read-only", r.symbol, absl::StrCat("writes ", f.name, " of ", name),
                 absl::StrCat(f.name, " is read-only"), f.path,
                 absl::StrCat("do not write ", f.name));
        }
      }
      // A value shifted to a field's position that does not fit in it: its
      // high bits land on part of another multi-bit field (bits that cover
      // whole fields are read as meant: `3u << 2` sets RE and TE).
      for (const auto& [k, n] : v.shifts) {
        if (n >= 64 || (k & 1) == 0) continue;
        for (const auto& f : reg.fields) {
          if (f.bit_offset != n || f.bit_width >= 64) continue;
          const uint64_t spilled = (k << n) & ~f.Mask();
          bool splits = false;
          for (const auto& g : reg.fields) {
            const uint64_t hit = g.Mask() & spilled;
            splits = splits || (g.bit_width > 1 && hit && hit != g.Mask());
          }
          if (spilled && splits) {
            Report(at, "error", "value-overflow", r.symbol,
                   absl::StrCat("puts ", k, " << ", n, " into ", f.name, " of ", name),
                   absl::StrCat(f.name, " is ", f.bit_width, " bit", f.bit_width == 1 ? "" : "s",
                                " wide (values up to ", (uint64_t{1} << f.bit_width) - 1, ")"),
                   f.path, "check the value or the field's position");
          }
        }
      }
    }
  }

  void CheckRead(const RegisterChecker::RegRef& r, uint64_t mask, const Token& at) {
    const SvdRegister& reg = *r.reg;
    const std::string name = absl::StrCat(r.peripheral->name, ".", reg.name);
    const uint64_t width_mask = reg.size >= 64 ? ~uint64_t{0} : (uint64_t{1} << reg.size) - 1;
    const uint64_t reserved = mask & width_mask & ~reg.FieldBits();
    if (reserved) {
      Report(at, "error", "reserved-bits", r.symbol,
             absl::StrCat("tests ", Bits(reserved), " of ", name),
             absl::StrCat(Bits(reserved), " of ", reg.name,
                          " hold no field; its fields: ", FieldList(reg)),
             reg.path, Suggest(reg, reserved));
    }
    for (const auto& f : reg.fields) {
      if ((f.Mask() & mask) && !f.Readable()) {
        Report(at, "warning", "write-only", r.symbol, absl::StrCat("reads ", f.name, " of ", name),
               absl::StrCat(f.name, " is write-only: it reads as an undefined value"), f.path,
               "keep the value written in a variable instead");
      }
    }
  }

  // A fix for bits that hold no field: the field the name or a neighbour suggests.
  static std::string Suggest(const SvdRegister& reg, uint64_t reserved) {
    const int bit = __builtin_ctzll(reserved);
    const SvdField* best = nullptr;
    int distance = 64;
    for (const auto& f : reg.fields) {
      const int d = std::abs(static_cast<int>(f.bit_offset) - bit);
      if (d < distance) {
        distance = d;
        best = &f;
      }
    }
    if (!best) return "check the bit against the reference manual";
    return absl::StrCat("the nearest field is ", best->name, " at ", Bits(best->Mask()),
                        "; use the field's position from the SVD");
  }

  // A macro named like PERIPH_REG (or PERIPH_REG_OFFSET, PERIPH_BASE): the
  // register (offset, base) it names must be the one it is.
  void CheckNamedRegister(const RegisterChecker::RegRef& r, const Token& at) {
    auto named = NamedRegister(r.macro);
    if (!named || named->second == r.reg) return;
    Report(at, "error", "wrong-register", r.macro,
           absl::StrCat(r.macro, " is ", Hex(r.address), " (", r.peripheral->name, ".", r.reg->name,
                        ")"),
           absl::StrCat(named->first->name, ".", named->second->name, " is at ",
                        Hex(named->first->base + named->second->offset)),
           named->second->path,
           absl::StrCat("use ", Hex(named->first->base + named->second->offset)));
  }

  // The peripheral and register a name like USART1_CR1 (or RCC_APB2ENR_REG) names.
  std::optional<std::pair<const SvdPeripheral*, const SvdRegister*>> NamedRegister(
      const std::string& name) const {
    const std::vector<std::string> parts = absl::StrSplit(name, '_');
    for (size_t k = 1; k < parts.size(); ++k) {
      const std::string periph =
          absl::StrJoin(parts.begin(), parts.begin() + static_cast<long>(k), "_");
      const SvdPeripheral* p = c_.svd_.Peripheral(periph);
      if (!p) continue;
      for (size_t e = parts.size(); e > k; --e) {
        const std::string reg = absl::StrJoin(parts.begin() + static_cast<long>(k),
                                              parts.begin() + static_cast<long>(e), "_");
        if (const SvdRegister* r = p->Register(reg)) {
          const std::string rest =
              absl::StrJoin(parts.begin() + static_cast<long>(e), parts.end(), "_");
          // RCC_APB2ENR, RCC_APB2ENR_REG, TI's SYSCTL_RCGC1_R.
          if (rest.empty() || rest == "REG" || rest == "ADDR" || rest == "R")
            return std::make_pair(p, r);
          return std::nullopt;  // a field's name, not the register's
        }
      }
    }
    return std::nullopt;
  }

  // A #define named after a field (PERIPH_REG_FIELD, _Pos, _Msk), a
  // register's offset or a peripheral's base: its value must be the SVD's.
  void CheckDefine(const std::string& name, int line) {
    const RegisterChecker::Macro& m = c_.macros_[name];
    if (m.function_like) return;
    Token at{Tok::kIdent, name, line, 1, ""};
    std::vector<Token> body = Expand(Lex(m.body, line), {name}, 0);
    // Registers the body reaches (a REG(0x...) macro) are checked by their
    // name here, once, where they are defined.
    Value v;
    {
      Cursor c{body};
      defining_ = name;
      v = body.empty() ? Value{} : Binary(c, 0);
      defining_.clear();
    }
    if (v.reg && v.reg->reg) {
      RegisterChecker::RegRef r = *v.reg;
      r.macro = name;
      CheckNamedRegister(r, at);
      return;
    }
    if (!v.known) return;
    std::string stem = name;
    std::string kind;
    for (const char* suffix : {"_Pos", "_Msk", "_OFFSET", "_OFS", "_BASE"}) {
      if (absl::EndsWith(stem, suffix)) {
        kind = suffix;
        stem.resize(stem.size() - std::strlen(suffix));
        break;
      }
    }
    if (kind == "_BASE") {
      if (const SvdPeripheral* p = c_.svd_.Peripheral(stem); p && p->base != v.v) {
        ++c_.stats_.accesses;
        Report(at, "error", "wrong-register", name, absl::StrCat(name, " is ", Hex(v.v)),
               absl::StrCat(p->name, " is at ", Hex(p->base)), p->name,
               absl::StrCat("use ", Hex(p->base)));
      }
      return;
    }
    const std::vector<std::string> parts = absl::StrSplit(stem, '_');
    for (size_t k = 1; k < parts.size(); ++k) {
      const std::string periph =
          absl::StrJoin(parts.begin(), parts.begin() + static_cast<long>(k), "_");
      for (const auto& p : c_.svd_.peripherals) {
        if (p.name != periph && p.group != periph) continue;
        for (size_t e = k + 1; e <= parts.size(); ++e) {
          const std::string reg_name = absl::StrJoin(parts.begin() + static_cast<long>(k),
                                                     parts.begin() + static_cast<long>(e), "_");
          const SvdRegister* reg = p.Register(reg_name);
          if (!reg) continue;
          const std::string rest =
              absl::StrJoin(parts.begin() + static_cast<long>(e), parts.end(), "_");
          if (rest.empty()) {
            if ((kind == "_OFFSET" || kind == "_OFS") && v.v != reg->offset) {
              ++c_.stats_.accesses;
              Report(at, "error", "wrong-register", name, absl::StrCat(name, " is ", Hex(v.v)),
                     absl::StrCat(reg->name, " is at offset ", Hex(reg->offset), " of ", p.name),
                     reg->path, absl::StrCat("use ", Hex(reg->offset)));
            }
            return;
          }
          CheckFieldMacro(name, stem, kind, rest, p, *reg, v.v, at);
          return;
        }
      }
    }
  }

  void CheckFieldMacro(const std::string& name, const std::string& stem, const std::string& kind,
                       const std::string& rest, const SvdPeripheral& p, const SvdRegister& reg,
                       uint64_t value, const Token& at) {
    // The field is `rest` (ST: USART_CR1_UE) or the whole name (TI's SVDs
    // name fields UART_CTL_UARTEN), or either less a bit index or a value's
    // name (RCC_CFGR_SW_0, RCC_CFGR_SW_HSE, UART_LCRH_WLEN_8).
    const SvdField* f = reg.Field(rest);
    if (!f) f = reg.Field(stem);
    bool part = false;
    if (!f) {
      for (const auto& cand : reg.fields) {
        const bool prefix =
            absl::StartsWith(rest, cand.name + "_") || absl::StartsWith(stem, cand.name + "_");
        if (prefix && (!f || cand.name.size() > f->name.size())) f = &cand;
      }
      part = f != nullptr;
    }
    if (!f) return;  // not a field's name: nothing to say
    ++c_.stats_.accesses;
    const std::string where = absl::StrCat(p.name, ".", reg.name, ".", f->name);
    if (kind == "_Pos") {
      if (!part && value != f->bit_offset) {
        Report(at, "error", "field-position", name, absl::StrCat(name, " is ", value),
               absl::StrCat(where, " starts at bit ", f->bit_offset), f->path,
               absl::StrCat("use ", f->bit_offset));
      }
      return;
    }
    if (part) {
      if (value & ~f->Mask()) {
        Report(at, "error", "field-mask", name,
               absl::StrCat(name, " is ", Hex(value), " (", Bits(value), ")"),
               absl::StrCat(where, " is ", Bits(f->Mask())), f->path,
               absl::StrCat("keep the value within ", Hex(f->Mask())));
        return;
      }
      CheckEnumMacro(name, stem, where, *f, value, at);
      return;
    }
    if (value != f->Mask()) {
      // The field's width at another position; a part or more of the field;
      // or bits of no shape the field has.
      const bool contiguous = value != 0 && (((value >> __builtin_ctzll(value)) + 1) &
                                             (value >> __builtin_ctzll(value))) == 0;
      const bool moved =
          contiguous && static_cast<uint32_t>(__builtin_popcountll(value)) == f->bit_width;
      const bool sized =
          contiguous && ((value & f->Mask()) == value || (value & f->Mask()) == f->Mask());
      Report(at, "error",
             moved   ? "field-position"
             : sized ? "field-width"
                     : "field-mask",
             name, absl::StrCat(name, " is ", Hex(value), " (", Bits(value), ")"),
             absl::StrCat(where, " is ", Bits(f->Mask()), " (mask ", Hex(f->Mask()), ")"), f->path,
             absl::StrCat("use ", Hex(f->Mask())));
    }
  }

  // A value's macro (UART_LCRH_WLEN_8, RCC_CFGR_SW_HSE) of a field with
  // enumerated values: the value its name says, or at least one of them.
  void CheckEnumMacro(const std::string& name, const std::string& stem, const std::string& where,
                      const SvdField& f, uint64_t value, const Token& at) {
    if (f.values.empty()) return;
    const uint64_t v = value >> f.bit_offset;
    const SvdEnumValue* named = nullptr;
    for (const auto& e : f.values) {
      if (e.name == stem || absl::EndsWith(stem, "_" + e.name)) named = &e;
    }
    if (named ? named->value == v : ValueIsEnumerated(f, v)) return;
    Report(
        at, "error", "enum-value", name, absl::StrCat(name, " puts ", v, " in ", f.name),
        named ? absl::StrCat(where, " ", named->name, " is ", named->value)
              : absl::StrCat(where, " takes ", EnumList(f)),
        f.path,
        absl::StrCat("use ", Hex((named ? named->value : f.values.front().value) << f.bit_offset)));
  }

  static bool ValueIsEnumerated(const SvdField& f, uint64_t v) {
    for (const auto& e : f.values) {
      if (e.value == v) return true;
    }
    return f.values.empty();
  }

  static std::string EnumList(const SvdField& f) {
    std::string out;
    for (const auto& e : f.values)
      absl::StrAppend(&out, out.empty() ? "" : ", ", e.name, " = ", e.value);
    return out;
  }

  // A whole-register write (`=`) of a known value: each field with
  // enumerated values gets one of them.
  void CheckEnumWrite(const RegisterChecker::RegRef& r, uint64_t bits, const Token& at) {
    for (const auto& f : r.reg->fields) {
      const uint64_t v = (bits & f.Mask()) >> f.bit_offset;
      if (f.values.empty() || !f.Writable() || ValueIsEnumerated(f, v)) continue;
      Report(
          at, "error", "enum-value", r.symbol,
          absl::StrCat("writes ", v, " to ", f.name, " of ", r.peripheral->name, ".", r.reg->name),
          absl::StrCat(f.name, " takes ", EnumList(f)), f.path, "write one of the field's values");
    }
  }

  void Unresolved(const Token& t) { unknown_.push_back(t); }

  // A macro-like (upper-case) name a register write depends on that no
  // source checked defines; variables and functions are not reported.
  void ReportUnresolved(const Token& t, const RegisterChecker::RegRef& r) {
    bool upper = t.text.size() >= 3;
    for (char ch : t.text) {
      upper = upper && (std::isupper(static_cast<unsigned char>(ch)) ||
                        std::isdigit(static_cast<unsigned char>(ch)) || ch == '_');
    }
    if (!upper || c_.reported_unresolved_[t.text]) return;
    c_.reported_unresolved_[t.text] = true;
    ++c_.stats_.unresolved;
    Report(t, "warning", "unresolved", t.text,
           absl::StrCat("writes ", t.text, " to ", r.peripheral->name, ".", r.reg->name),
           absl::StrCat(t.text, " is defined in no file checked: its bits are not checked"),
           r.reg->path, "check the header that defines it too (add it to the paths)");
  }

  void Report(const Token& at, const std::string& severity, const std::string& kind,
              const std::string& symbol, const std::string& code, const std::string& svd,
              const std::string& element, const std::string& fix) {
    RegisterFinding f;
    f.file = file_;
    f.line = at.line;
    f.column = defining_.empty() ? at.column : 1;  // a #define's finding is at the directive
    f.severity = severity;
    f.kind = kind;
    f.symbol = symbol;
    f.code_says = code;
    f.svd_says = svd;
    f.source = absl::StrCat(c_.svd_.source, ": ", element);
    f.fix = fix;
    if (severity == "error" &&
        (!defining_.empty() || kind == "wrong-register" || absl::StartsWith(kind, "field-"))) {
      c_.wrong_macros_.insert(defining_.empty() ? symbol : defining_);
    }
    for (const auto& g : c_.findings_) {
      if (g.file == f.file && g.line == f.line && g.kind == f.kind && g.symbol == f.symbol) return;
    }
    c_.findings_.push_back(std::move(f));
  }

  RegisterChecker& c_;
  const std::string file_;
  std::vector<Token> unknown_;  // identifiers of the expression being read
  std::string defining_;        // the #define being checked, if any
};

nlohmann::json RegisterFinding::ToJson() const {
  return {{"file", file},     {"line", line},     {"column", column},       {"severity", severity},
          {"kind", kind},     {"symbol", symbol}, {"code_says", code_says}, {"svd_says", svd_says},
          {"source", source}, {"fix", fix}};
}

RegisterChecker::RegisterChecker(const SvdDevice& svd) : svd_(svd) {}

void RegisterChecker::Check(const std::string& file, std::string_view text) {
  ++stats_.files;
  RegisterScan scan(*this, file);
  // Preprocessor lines (with their continuations) first, in order; the rest
  // is cut into statements.
  std::string code;
  code.reserve(text.size());
  int line = 1;
  size_t i = 0;
  while (i < text.size()) {
    size_t end = text.find('\n', i);
    if (end == std::string_view::npos) end = text.size();
    std::string_view l = text.substr(i, end - i);
    const size_t first = l.find_first_not_of(" \t");
    if (first != std::string_view::npos && l[first] == '#') {
      std::string directive(l.substr(first + 1));
      int lines = 1;
      while (!directive.empty() && directive.back() == '\\' && end < text.size()) {
        directive.pop_back();
        const size_t next = text.find('\n', end + 1);
        const size_t stop = next == std::string_view::npos ? text.size() : next;
        directive += " ";
        directive += std::string(text.substr(end + 1, stop - end - 1));
        end = stop;
        ++lines;
      }
      std::vector<Token> d = Lex(directive, line);
      if (d.size() >= 2 && d[0].text == "define" && d[1].kind == Tok::kIdent) {
        // NAME( directly after the name: function-like.
        const size_t name_at = directive.find(d[1].text, directive.find("define") + 6);
        const size_t after = name_at + d[1].text.size();
        std::vector<std::string> params;
        bool function_like = after < directive.size() && directive[after] == '(';
        size_t body_at = after;
        if (function_like) {
          const size_t close = directive.find(')', after);
          for (auto p : absl::StrSplit(
                   directive.substr(after + 1, close == std::string::npos ? 0 : close - after - 1),
                   ',')) {
            std::string s(absl::StripAsciiWhitespace(p));
            if (!s.empty()) params.push_back(s);
          }
          body_at = close == std::string::npos ? directive.size() : close + 1;
        }
        // Comments in the body are dropped by the lexer later.
        scan.Define(directive.substr(std::min(body_at, directive.size())), d[1].text, line,
                    std::move(params), function_like);
      }
      code.append(static_cast<size_t>(lines), '\n');
      line += lines;
      i = end + 1;
      continue;
    }
    code.append(l);
    code.push_back('\n');
    ++line;
    i = end + 1;
  }
  stats_.lines += line - 1;
  std::vector<Token> stmt;
  for (Token& t : Lex(code)) {
    if (t.kind == Tok::kPunct && (t.text == ";" || t.text == "{" || t.text == "}")) {
      scan.Statement(std::move(stmt));
      stmt.clear();
      continue;
    }
    stmt.push_back(std::move(t));
  }
  scan.Statement(std::move(stmt));
}

nlohmann::json RegisterChecker::ToJson() const {
  nlohmann::json out = {{"findings", nlohmann::json::array()}};
  for (const auto& f : findings_) out["findings"].push_back(f.ToJson());
  int errors = 0, warnings = 0;
  for (const auto& f : findings_) (f.severity == "error" ? errors : warnings)++;
  out["checked"] = {{"svd", svd_.source},    {"device", svd_.name},         {"files", stats_.files},
                    {"lines", stats_.lines}, {"accesses", stats_.accesses}, {"errors", errors},
                    {"warnings", warnings}};
  return out;
}

}  // namespace fwai
