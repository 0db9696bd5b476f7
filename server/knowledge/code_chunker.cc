// Code-aware chunking for C, C++ and assembly sources.
#include <cctype>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "server/knowledge/chunker.h"

namespace fwai {
namespace {

struct Unit {
  int start_line = 0, end_line = 0;
  std::string text;
  std::vector<std::string> symbols;
};

bool IsIdentChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// The name a top-level unit defines, if it can be seen on its first lines.
std::vector<std::string> Symbols(const std::string& text) {
  std::vector<std::string> out;
  size_t pos = 0;
  int lines = 0;
  while (pos < text.size() && lines < 200) {
    size_t e = text.find('\n', pos);
    if (e == std::string::npos) e = text.size();
    std::string line = text.substr(pos, e - pos);
    pos = e + 1;
    ++lines;
    size_t i = line.find_first_not_of(" \t");
    if (i == std::string::npos) continue;
    if (line.compare(i, 7, "#define") == 0) {
      size_t s = line.find_first_not_of(" \t", i + 7);
      size_t t = s;
      while (t < line.size() && IsIdentChar(line[t])) ++t;
      if (s != std::string::npos && t > s) out.push_back(line.substr(s, t - s));
      continue;
    }
    if (!out.empty() && lines > 1 && out.size() >= 8) break;
    for (const char* kw : {"struct ", "enum ", "union ", "class "}) {
      size_t k = line.find(kw);
      if (k != std::string::npos) {
        size_t s = k + std::char_traits<char>::length(kw);
        size_t t = s;
        while (t < line.size() && IsIdentChar(line[t])) ++t;
        if (t > s) out.push_back(line.substr(s, t - s));
      }
    }
    // name( ... at the start of a definition: the identifier before the first '('.
    size_t paren = line.find('(');
    if (paren != std::string::npos && line[i] != '#' && line.compare(i, 2, "//") != 0 &&
        line.compare(i, 2, "/*") != 0) {
      size_t t = paren;
      while (t > 0 && line[t - 1] == ' ') --t;
      size_t s = t;
      while (s > 0 && IsIdentChar(line[s - 1])) --s;
      std::string name = line.substr(s, t - s);
      if (!name.empty() && name != "if" && name != "for" && name != "while" && name != "switch" &&
          name != "return" && name != "sizeof") {
        out.push_back(name);
      }
    }
    // "} name_t;" closes a typedef.
    if (line[i] == '}') {
      size_t s = line.find_first_not_of(" \t}", i);
      size_t t = s;
      while (t != std::string::npos && t < line.size() && IsIdentChar(line[t])) ++t;
      if (s != std::string::npos && t > s) out.push_back(line.substr(s, t - s));
    }
  }
  std::vector<std::string> uniq;
  for (auto& s : out) {
    if (std::find(uniq.begin(), uniq.end(), s) == uniq.end()) uniq.push_back(s);
  }
  if (uniq.size() > 6) uniq.resize(6);
  return uniq;
}

// Splits a file into top-level units by brace depth (strings, chars and
// comments skipped) and blank lines at depth 0.
std::vector<Unit> Units(const std::string& text) {
  std::vector<Unit> units;
  Unit cur;
  int depth = 0;
  bool in_block_comment = false;
  size_t pos = 0;
  int n = 0;
  auto flush = [&] {
    if (cur.text.find_first_not_of(" \t\n") != std::string::npos) units.push_back(cur);
    cur = Unit{};
  };
  while (pos <= text.size()) {
    size_t e = text.find('\n', pos);
    if (e == std::string::npos) e = text.size();
    std::string line = text.substr(pos, e - pos);
    ++n;
    const bool blank = line.find_first_not_of(" \t\r") == std::string::npos;
    if (blank && depth == 0 && !in_block_comment) {
      flush();
    } else {
      if (cur.text.empty()) cur.start_line = n;
      if (!cur.text.empty()) cur.text.push_back('\n');
      cur.text += line;
      cur.end_line = n;
      bool in_str = false, in_chr = false;
      for (size_t i = 0; i < line.size(); ++i) {
        char c = line[i];
        char next = i + 1 < line.size() ? line[i + 1] : '\0';
        if (in_block_comment) {
          if (c == '*' && next == '/') {
            in_block_comment = false;
            ++i;
          }
          continue;
        }
        if (in_str) {
          if (c == '\\')
            ++i;
          else if (c == '"')
            in_str = false;
          continue;
        }
        if (in_chr) {
          if (c == '\\')
            ++i;
          else if (c == '\'')
            in_chr = false;
          continue;
        }
        if (c == '/' && next == '/') break;
        if (c == '/' && next == '*') {
          in_block_comment = true;
          ++i;
          continue;
        }
        if (c == '"')
          in_str = true;
        else if (c == '\'')
          in_chr = true;
        else if (c == '{')
          ++depth;
        else if (c == '}')
          depth = std::max(0, depth - 1);
      }
      // A definition ends where its braces close at depth 0.
      if (depth == 0 && !in_block_comment && line.find('}') != std::string::npos) flush();
    }
    if (e == text.size()) break;
    pos = e + 1;
  }
  flush();
  return units;
}

}  // namespace

std::vector<ChunkDraft> ChunkCode(const std::string& text, const ChunkOptions& o) {
  std::vector<ChunkDraft> out;
  ChunkDraft cur;
  auto emit = [&] {
    if (cur.text.empty()) return;
    cur.content_type = "code";
    cur.tokens = CountTokens(cur.text);
    if (cur.title_path.size() > 6) cur.title_path.resize(6);
    out.push_back(cur);
    cur = ChunkDraft{};
  };
  for (auto& u : Units(text)) {
    auto syms = Symbols(u.text);
    const int t = CountTokens(u.text);
    if (t > o.max_tokens) {
      emit();
      // One big unit: consecutive line windows, all named after the unit.
      size_t pos = 0;
      int line = u.start_line;
      while (pos < u.text.size()) {
        ChunkDraft piece;
        piece.start_line = line;
        while (pos < u.text.size() && CountTokens(piece.text) < o.target_tokens) {
          size_t e = u.text.find('\n', pos);
          if (e == std::string::npos) e = u.text.size();
          if (!piece.text.empty()) piece.text.push_back('\n');
          piece.text += u.text.substr(pos, e - pos);
          piece.end_line = line++;
          pos = e + 1;
        }
        piece.title_path = syms;
        cur = piece;
        emit();
      }
      continue;
    }
    if (!cur.text.empty() && CountTokens(cur.text) + t > o.target_tokens) emit();
    if (cur.text.empty()) cur.start_line = u.start_line;
    if (!cur.text.empty()) cur.text += "\n\n";
    cur.text += u.text;
    cur.end_line = u.end_line;
    for (auto& s : syms) cur.title_path.push_back(s);
  }
  emit();
  return out;
}

}  // namespace fwai
