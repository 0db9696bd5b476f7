#include "server/knowledge/chunker.h"

#include <algorithm>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace fwai {

namespace {

std::string_view StripLeading(std::string_view s) {
  while (!s.empty() &&
         (s.front() == ' ' || s.front() == '\t' || s.front() == '\r' || s.front() == '\n'))
    s.remove_prefix(1);
  return s;
}
std::string_view StripTrailing(std::string_view s) {
  while (!s.empty() &&
         (s.back() == ' ' || s.back() == '\t' || s.back() == '\r' || s.back() == '\n'))
    s.remove_suffix(1);
  return s;
}
std::string_view Strip(std::string_view s) { return StripTrailing(StripLeading(s)); }
bool Contains(std::string_view s, std::string_view x) {
  return s.find(x) != std::string_view::npos;
}
std::vector<std::string_view> SplitLines(std::string_view s) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || s[i] == '\n') {
      out.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  }
  return out;
}

}  // namespace

int CountTokens(std::string_view text) { return static_cast<int>((text.size() + 3) / 4); }

std::vector<std::string> SplitSentences(std::string_view t) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    unsigned char c = t[i];
    size_t end = std::string_view::npos;
    if ((c == '.' || c == '!' || c == '?') && i + 2 < t.size() &&
        (t[i + 1] == ' ' || t[i + 1] == '\n')) {
      unsigned char n = t[i + 2];
      if (absl::ascii_isupper(n) || n == '(' || n == '[' || n == '"' || n >= 0x80) end = i + 1;
    } else if (c == 0xE3 && i + 2 < t.size() && static_cast<unsigned char>(t[i + 1]) == 0x80 &&
               static_cast<unsigned char>(t[i + 2]) == 0x82) {  // 。
      end = i + 3;
    } else if (c == 0xEF && i + 2 < t.size() && static_cast<unsigned char>(t[i + 1]) == 0xBC &&
               (static_cast<unsigned char>(t[i + 2]) == 0x81 ||
                static_cast<unsigned char>(t[i + 2]) == 0x9F)) {  // ！？
      end = i + 3;
    }
    if (end != std::string_view::npos) {
      out.emplace_back(Strip(t.substr(start, end - start)));
      start = end;
      i = end - 1;
    }
  }
  std::string_view rest = Strip(t.substr(start));
  if (!rest.empty()) out.emplace_back(rest);
  out.erase(std::remove_if(out.begin(), out.end(), [](const std::string& s) { return s.empty(); }),
            out.end());
  return out;
}

namespace {

enum class BlockKind { kHeading, kParagraph, kCode, kTable };

struct Block {
  explicit Block(BlockKind k, int lvl = 0) : kind(k), level(lvl) {}
  BlockKind kind;
  int level = 0;  // headings
  std::string text;
  std::string heading;  // clean heading text
  int start_line = 0, end_line = 0;
};

bool IsRstUnderline(std::string_view line, size_t min_len) {
  if (line.size() < std::max<size_t>(3, min_len)) return false;
  char c = line[0];
  if (std::string_view("=-~^\"'`#*+:.").find(c) == std::string_view::npos) return false;
  return std::all_of(line.begin(), line.end(), [c](char d) { return d == c; });
}

// "8.4.1 GPIO port mode register" -> level 3. Short, no final period.
int NumberedHeadingLevel(std::string_view line) {
  if (line.size() > 90 || line.size() < 3 || line.back() == '.' || line.back() == ',') return 0;
  size_t i = 0;
  int parts = 0;
  while (i < line.size()) {
    size_t j = i;
    while (j < line.size() && absl::ascii_isdigit(line[j])) ++j;
    if (j == i || j - i > 3) return 0;
    ++parts;
    if (j < line.size() && line[j] == '.') {
      i = j + 1;
      if (i < line.size() && line[i] == ' ') {
        i = j;
        break;
      }
      continue;
    }
    i = j;
    break;
  }
  if (parts == 0 || i >= line.size()) return 0;
  if (line[i] == '.') ++i;
  if (i >= line.size() || line[i] != ' ') return 0;
  while (i < line.size() && line[i] == ' ') ++i;
  if (i >= line.size() || !absl::ascii_isupper(line[i])) return 0;
  return std::min(parts, 6);
}

int Indent(std::string_view line) {
  int n = 0;
  while (n < static_cast<int>(line.size()) && line[n] == ' ') ++n;
  return n;
}

// Turns one page into blocks.
std::vector<Block> ParseBlocks(const std::string& text, DocFormat format) {
  std::vector<std::string_view> lines = SplitLines(text);
  std::vector<Block> blocks;
  std::map<std::string, int> rst_levels;
  Block para{BlockKind::kParagraph};
  auto flush_para = [&] {
    if (!para.text.empty()) blocks.push_back(para);
    para = Block{BlockKind::kParagraph};
  };
  auto add_line = [&](Block& b, std::string_view line, int n) {
    if (b.text.empty()) b.start_line = n;
    if (!b.text.empty()) b.text.push_back('\n');
    b.text.append(line);
    b.end_line = n;
  };
  const bool markdownish = format == DocFormat::kMarkdown || format == DocFormat::kHtml;
  const bool code_doc = format == DocFormat::kCode;
  std::string yaml_top;  // current top-level YAML key
  for (size_t i = 0; i < lines.size(); ++i) {
    std::string_view raw = lines[i];
    if (!raw.empty() && raw.back() == '\r') raw.remove_suffix(1);
    const int n = static_cast<int>(i) + 1;
    std::string_view line = StripTrailing(raw);
    std::string_view stripped = StripLeading(line);
    // Fenced code: kept as one block.
    if (!code_doc && (stripped.starts_with("```") || stripped.starts_with("~~~"))) {
      flush_para();
      Block code{BlockKind::kCode};
      add_line(code, line, n);
      std::string_view fence = stripped.substr(0, 3);
      for (++i; i < lines.size(); ++i) {
        std::string_view l = StripTrailing(lines[i]);
        add_line(code, l, static_cast<int>(i) + 1);
        if (StripLeading(l).starts_with(fence)) break;
      }
      blocks.push_back(code);
      continue;
    }
    if (line.empty()) {
      flush_para();
      continue;
    }
    // Markdown headings.
    if (markdownish && stripped[0] == '#') {
      size_t level = 0;
      while (level < stripped.size() && stripped[level] == '#') ++level;
      if (level <= 6 && level < stripped.size() && stripped[level] == ' ') {
        flush_para();
        Block h{BlockKind::kHeading, static_cast<int>(level)};
        add_line(h, line, n);
        h.heading = std::string(Strip(stripped.substr(level)));
        if (!h.heading.empty()) blocks.push_back(h);
        continue;
      }
    }
    // RST headings: text + underline (optional overline).
    if ((format == DocFormat::kRst || format == DocFormat::kText) && i + 1 < lines.size() &&
        !IsRstUnderline(stripped, 1) && Indent(line) == 0 &&
        IsRstUnderline(StripTrailing(lines[i + 1]), std::min<size_t>(stripped.size(), 60))) {
      bool overline = !blocks.empty() || !para.text.empty()
                          ? (!para.text.empty() && IsRstUnderline(para.text, 3) &&
                             para.text.find('\n') == std::string::npos)
                          : false;
      if (overline) para.text.clear();
      flush_para();
      std::string style = absl::StrCat(overline ? "o" : "u", std::string(1, lines[i + 1][0]));
      auto it = rst_levels.find(style);
      int level = it != rst_levels.end() ? it->second : static_cast<int>(rst_levels.size()) + 1;
      rst_levels.emplace(style, level);
      Block h{BlockKind::kHeading, std::min(level, 6)};
      add_line(h, line, n);
      add_line(h, StripTrailing(lines[i + 1]), n + 1);
      h.heading = std::string(stripped);
      blocks.push_back(h);
      ++i;
      continue;
    }
    // Numbered headings in PDFs and plain text.
    if ((format == DocFormat::kPdf || format == DocFormat::kText) && para.text.empty()) {
      int level = NumberedHeadingLevel(stripped);
      if (level > 0) {
        Block h{BlockKind::kHeading, level};
        add_line(h, line, n);
        h.heading = std::string(stripped);
        blocks.push_back(h);
        continue;
      }
    }
    // YAML (devicetree bindings): top-level keys are sections, keys under
    // `properties:` / `patternProperties:` are subsections.
    if (format == DocFormat::kYaml) {
      int ind = Indent(line);
      bool key = stripped.size() > 1 && stripped.back() == ':' &&
                 stripped.find(' ') == std::string_view::npos;
      if (ind == 0 && key) {
        flush_para();
        yaml_top = std::string(stripped.substr(0, stripped.size() - 1));
        Block h{BlockKind::kHeading, 3};  // small top-level keys merge
        add_line(h, line, n);
        h.heading = yaml_top;
        blocks.push_back(h);
        continue;
      }
      if (ind == 2 && key && (yaml_top == "properties" || yaml_top == "patternProperties")) {
        flush_para();
        Block h{BlockKind::kHeading, 4};
        add_line(h, line, n);
        h.heading = std::string(stripped.substr(0, stripped.size() - 1));
        blocks.push_back(h);
        continue;
      }
    }
    // Tables: runs of "|" rows or RST grid lines.
    if (!code_doc &&
        (stripped[0] == '|' || (stripped.starts_with("+-") && stripped.back() == '+') ||
         (stripped.starts_with("+=")))) {
      flush_para();
      Block t{BlockKind::kTable};
      for (; i < lines.size(); ++i) {
        std::string_view l = Strip(lines[i]);
        if (l.empty() || !(l[0] == '|' || l[0] == '+')) {
          --i;
          break;
        }
        add_line(t, StripTrailing(lines[i]), static_cast<int>(i) + 1);
      }
      blocks.push_back(t);
      continue;
    }
    add_line(para, line, n);
    if (code_doc) para.kind = BlockKind::kCode;
  }
  flush_para();
  return blocks;
}

bool LooksLikeRegister(std::string_view text) {
  static const char* kSignals[] = {"Reset value", "Address offset", "reset value",
                                   "Bit ",        "bits ",          "_bp ",
                                   "_gp ",        "_gm ",           "#define"};
  int hits = 0;
  for (const char* s : kSignals) hits += Contains(text, s) ? 1 : 0;
  return hits >= 2;
}

class Builder {
 public:
  Builder(const ChunkOptions& o, int page, bool line_structured, int* section,
          std::vector<ChunkDraft>* out)
      : o_(o), page_(page), line_structured_(line_structured), section_(section), out_(out) {}

  void Heading(const Block& h) {
    const bool primary = h.level <= 2;
    const bool secondary = h.level == 3;
    if (primary || (secondary && tokens_ >= o_.min_tokens) || tokens_ >= o_.target_tokens) {
      Flush(/*overlap=*/false);
    }
    if (primary) ++*section_;
    while (!path_.empty() && path_.back().first >= h.level) path_.pop_back();
    path_.emplace_back(h.level, h.heading);
    Append(h, h.text);
  }

  void Body(const Block& b) {
    const int t = CountTokens(b.text);
    if (t > o_.max_tokens) {
      Split(b);
      return;
    }
    if (tokens_ + t > o_.max_tokens) Flush(/*overlap=*/b.kind == BlockKind::kParagraph);
    Append(b, b.text);
    if (tokens_ >= o_.target_tokens) Flush(/*overlap=*/true);
  }

  void Flush(bool overlap) {
    if (text_.empty()) return;
    // Only a heading: keep it for the next chunk of the section.
    if (only_headings_) return;
    ChunkDraft c;
    c.text = text_;
    for (const auto& [lvl, title] : chunk_path_) c.title_path.push_back(title);
    c.page = page_;
    c.start_line = start_line_;
    c.end_line = end_line_;
    c.tokens = tokens_;
    c.section = chunk_section_;
    c.content_type = kinds_code_ > kinds_text_    ? "code"
                     : kinds_table_ > kinds_text_ ? "table"
                                                  : "text";
    if (LooksLikeRegister(c.text)) c.content_type = "register";
    // A small tail joins the previous chunk of the same section.
    if (c.tokens < o_.min_tokens && !out_->empty() && !overlap_started_) {
      ChunkDraft& prev = out_->back();
      if (prev.page == c.page && prev.title_path == c.title_path &&
          prev.tokens + c.tokens <= o_.max_tokens) {
        prev.text += "\n" + c.text;
        prev.end_line = c.end_line;
        prev.tokens += c.tokens;
        Reset();
        return;
      }
    }
    out_->push_back(c);
    std::string tail = overlap ? Tail(text_) : "";
    Reset();
    if (!tail.empty()) {
      text_ = tail;
      tokens_ = CountTokens(tail);
      start_line_ = end_line_ = out_->back().end_line;
      chunk_path_ = path_;
      chunk_section_ = *section_;
      overlap_started_ = true;
      only_headings_ = true;  // overlap alone does not make a chunk
    }
  }

 private:
  void Append(const Block& b, const std::string& text) {
    if (text_.empty()) start_line_ = b.start_line;
    // A chunk's title path is the one at its first body block (headings
    // that open it, or overlap carried over, do not fix it).
    if (text_.empty() || only_headings_) {
      chunk_path_ = path_;
      chunk_section_ = *section_;
    }
    if (!text_.empty()) text_ += "\n";
    text_ += text;
    end_line_ = b.end_line;
    tokens_ += CountTokens(text) + 1;
    if (b.kind != BlockKind::kHeading) only_headings_ = false;
    if (b.kind == BlockKind::kCode) ++kinds_code_;
    if (b.kind == BlockKind::kTable) ++kinds_table_;
    if (b.kind == BlockKind::kParagraph) ++kinds_text_;
  }

  // The last ~overlap tokens, cut at a sentence or line start.
  std::string Tail(const std::string& text) const {
    if (o_.overlap_tokens <= 0) return "";
    size_t want = static_cast<size_t>(o_.overlap_tokens) * 4;
    if (text.size() <= want) return "";
    size_t from = text.size() - want;
    size_t nl = text.find('\n', from);
    size_t dot = text.find(". ", from);
    size_t cut = std::min(nl == std::string::npos ? text.size() : nl + 1,
                          dot == std::string::npos ? text.size() : dot + 2);
    if (cut >= text.size()) return "";
    return text.substr(cut);
  }

  void Split(const Block& b) {
    if (b.kind == BlockKind::kTable) {
      std::vector<std::string> rows = absl::StrSplit(b.text, '\n');
      std::string header = rows.empty() ? "" : rows[0];
      size_t first = 1;
      if (rows.size() > 1 && (Contains(rows[1], "---") || Contains(rows[1], "==="))) {
        header += "\n" + rows[1];
        first = 2;
      }
      Flush(false);
      std::string part = header;
      for (size_t i = first; i < rows.size(); ++i) {
        if (CountTokens(part) + CountTokens(rows[i]) > o_.max_tokens && part != header) {
          Block piece = b;
          piece.text = part;
          Append(piece, part);
          Flush(false);
          part = header;
        }
        part += "\n" + rows[i];
      }
      Block piece = b;
      piece.text = part;
      Append(piece, part);
      return;
    }
    std::vector<std::string> pieces;
    // Prose is cut at sentences; line-structured text (YAML, lists, code,
    // register dumps) at lines, so its layout survives.
    const bool prose = b.kind == BlockKind::kParagraph && !line_structured_ &&
                       b.text.size() / (1 + std::count(b.text.begin(), b.text.end(), '\n')) > 50;
    if (prose) {
      pieces = SplitSentences(b.text);
    } else {
      pieces = absl::StrSplit(b.text, '\n');
    }
    std::string acc;
    auto emit = [&] {
      if (acc.empty()) return;
      Block piece = b;
      piece.text = acc;
      if (tokens_ + CountTokens(acc) > o_.max_tokens) Flush(b.kind == BlockKind::kParagraph);
      Append(piece, acc);
      if (tokens_ >= o_.target_tokens) Flush(b.kind == BlockKind::kParagraph);
      acc.clear();
    };
    for (auto& p : pieces) {
      // A single sentence longer than the max is cut by characters.
      while (CountTokens(p) > o_.max_tokens) {
        size_t cut = static_cast<size_t>(o_.target_tokens) * 4;
        size_t sp = p.rfind(' ', cut);
        if (sp == std::string::npos || sp < cut / 2) sp = cut;
        acc = p.substr(0, sp);
        emit();
        p = p.substr(sp);
      }
      if (!acc.empty() && CountTokens(acc) + CountTokens(p) > o_.target_tokens) emit();
      if (!acc.empty()) acc += (prose ? " " : "\n");
      acc += p;
    }
    emit();
  }

  void Reset() {
    text_.clear();
    tokens_ = 0;
    kinds_code_ = kinds_table_ = kinds_text_ = 0;
    overlap_started_ = false;
    only_headings_ = true;
  }

  const ChunkOptions& o_;
  const int page_;
  const bool line_structured_;
  int* const section_;  // the document's current section number
  int chunk_section_ = 0;
  std::vector<ChunkDraft>* out_;
  std::vector<std::pair<int, std::string>> path_;        // current heading stack
  std::vector<std::pair<int, std::string>> chunk_path_;  // path when the chunk began
  std::string text_;
  int tokens_ = 0;
  int start_line_ = 0, end_line_ = 0;
  int kinds_code_ = 0, kinds_table_ = 0, kinds_text_ = 0;
  bool overlap_started_ = false;
  bool only_headings_ = true;
};

}  // namespace

std::vector<ChunkDraft> ChunkDocument(const ExtractedDoc& doc, const ChunkOptions& options) {
  std::vector<ChunkDraft> out;
  if (!doc.prechunks.empty()) {
    // The format decided the chunks (SVD registers stay whole, whatever their size).
    for (const auto& p : doc.prechunks) {
      ChunkDraft c;
      c.text = p.text;
      c.title_path = p.title_path;
      c.content_type = p.content_type;
      c.tokens = CountTokens(p.text);
      out.push_back(std::move(c));
    }
    return out;
  }
  if (options.code_aware && doc.format == DocFormat::kCode) {
    for (const auto& page : doc.pages) {
      for (auto& c : ChunkCode(page.text, options)) out.push_back(std::move(c));
    }
    return out;
  }
  int section = 0;
  for (const auto& page : doc.pages) {
    const bool line_structured = doc.format == DocFormat::kYaml || doc.format == DocFormat::kCode;
    Builder b(options, page.number, line_structured, &section, &out);
    for (const Block& block : ParseBlocks(page.text, doc.format)) {
      if (block.kind == BlockKind::kHeading) {
        b.Heading(block);
      } else {
        b.Body(block);
      }
    }
    b.Flush(false);
  }
  if (doc.format == DocFormat::kCode) {
    for (auto& c : out) {
      if (c.content_type == "text") c.content_type = "code";
    }
  }
  return out;
}

}  // namespace fwai
