#include "server/knowledge/extract.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/strings.h"
#include "common/subprocess.h"
#include "common/utf8.h"

namespace fwai {

const char* DocFormatName(DocFormat f) {
  switch (f) {
    case DocFormat::kPdf:
      return "pdf";
    case DocFormat::kMarkdown:
      return "markdown";
    case DocFormat::kRst:
      return "rst";
    case DocFormat::kHtml:
      return "html";
    case DocFormat::kText:
      return "text";
    case DocFormat::kCode:
      return "code";
    case DocFormat::kYaml:
      return "yaml";
    case DocFormat::kSvd:
      return "svd";
  }
  return "text";
}

namespace {

std::string Ext(std::string_view name) {
  auto dot = name.rfind('.');
  auto slash = name.rfind('/');
  if (dot == std::string_view::npos || (slash != std::string_view::npos && dot < slash)) return "";
  return absl::AsciiStrToLower(AV(name.substr(dot + 1)));
}

// Share of bytes that are not part of well-formed UTF-8 sequences.
double InvalidUtf8Share(std::string_view s) {
  size_t bad = 0;
  for (size_t i = 0; i < s.size();) {
    const size_t n = Utf8SequenceLength(s, i);
    if (n == 0) {
      ++bad;
      ++i;
    } else {
      i += n;
    }
  }
  return s.empty() ? 0 : static_cast<double>(bad) / s.size();
}

// Latin-1 fallback for the rare old header that is not UTF-8.
std::string Latin1ToUtf8(std::string_view s) {
  std::string out;
  out.reserve(s.size() + s.size() / 8);
  for (unsigned char c : s) {
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back(static_cast<char>(0xC0 | (c >> 6)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    }
  }
  return out;
}

std::string DecodeEntity(std::string_view e) {
  if (e == "amp") return "&";
  if (e == "lt") return "<";
  if (e == "gt") return ">";
  if (e == "quot") return "\"";
  if (e == "apos" || e == "#39") return "'";
  if (e == "nbsp") return " ";
  if (e == "ndash") return "\xE2\x80\x93";
  if (e == "mdash") return "\xE2\x80\x94";
  if (e == "hellip") return "\xE2\x80\xA6";
  if (e == "copy") return "\xC2\xA9";
  if (e == "rsquo" || e == "lsquo") return "'";
  if (e == "rdquo" || e == "ldquo") return "\"";
  if (!e.empty() && e[0] == '#') {
    long cp = (e.size() > 1 && (e[1] == 'x' || e[1] == 'X'))
                  ? std::strtol(std::string(e.substr(2)).c_str(), nullptr, 16)
                  : std::strtol(std::string(e.substr(1)).c_str(), nullptr, 10);
    std::string out;
    if (cp <= 0 || cp > 0x10FFFF) return "";
    if (cp >= 0xD800 && cp <= 0xDFFF) return "\xEF\xBF\xBD";  // a surrogate is no character: U+FFFD
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
    return out;
  }
  return absl::StrCat("&", AV(e), ";");
}

std::string CollapseSpaces(std::string_view s) {
  std::string out;
  bool space = false;
  for (char c : s) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      space = true;
    } else {
      if (space && !out.empty()) out.push_back(' ');
      space = false;
      out.push_back(c);
    }
  }
  return out;
}

absl::StatusOr<ExtractedDoc> ExtractPdf(std::string_view name, std::string_view bytes) {
  std::string path =
      (std::filesystem::temp_directory_path() / "fwai-pdf-XXXXXX").string();  // honours TMPDIR
  char* tmpl = path.data();
  int fd = mkstemp(tmpl);
  if (fd < 0) return absl::InternalError("cannot create a temporary file for pdftotext");
  {
    size_t off = 0;
    while (off < bytes.size()) {
      ssize_t n = write(fd, bytes.data() + off, bytes.size() - off);
      if (n <= 0) break;
      off += n;
    }
    close(fd);
  }
  ProcessOptions po;
  po.timeout_ms = 120000;
  auto r = RunProcess({"pdftotext", "-enc", "UTF-8", tmpl, "-"}, po);
  unlink(tmpl);
  if (!r.ok()) {
    if (absl::IsNotFound(r.status())) {
      return absl::FailedPreconditionError(
          "pdftotext is not installed (Debian package poppler-utils)");
    }
    return r.status();
  }
  if (r->timed_out)
    return absl::DeadlineExceededError(absl::StrCat(AV(name), ": pdftotext took over 120 s"));
  if (r->exit_code != 0) {
    std::string first = r->err.substr(0, r->err.find('\n'));
    if (absl::StrContains(r->err, "Incorrect password") || absl::StrContains(r->err, "ncrypt")) {
      return absl::InvalidArgumentError(
          absl::StrCat(AV(name), ": encrypted PDF (password protected)"));
    }
    return absl::InvalidArgumentError(absl::StrCat(AV(name), ": not a readable PDF (", first, ")"));
  }
  ExtractedDoc doc;
  doc.format = DocFormat::kPdf;
  int number = 0;
  size_t chars = 0;
  for (absl::string_view page : absl::StrSplit(r->out, '\f')) {
    ++number;
    doc.pages.push_back({number, std::string(page)});
    chars += absl::StripAsciiWhitespace(page).size();
  }
  while (!doc.pages.empty() && absl::StripAsciiWhitespace(doc.pages.back().text).empty())
    doc.pages.pop_back();
  if (chars == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(AV(name), ": the PDF has no text (scanned images?)"));
  }
  return doc;
}

// A short description of the document: YAML `title:`, the first heading, or
// the first descriptive comment of a source file (not licence boilerplate).
std::string GuessTitle(std::string_view text, DocFormat f) {
  size_t pos = 0;
  int scanned = 0;
  std::string prev;
  while (pos < text.size() && scanned < 200) {
    size_t e = text.find('\n', pos);
    if (e == std::string_view::npos) e = text.size();
    std::string line(absl::StripAsciiWhitespace(AV(text.substr(pos, e - pos))));
    pos = e + 1;
    ++scanned;
    if (f == DocFormat::kYaml && line.rfind("title:", 0) == 0) {
      std::string t(absl::StripAsciiWhitespace(line.substr(6)));
      if (!t.empty() && t != "|" && t != ">") return t;
    }
    if ((f == DocFormat::kMarkdown || f == DocFormat::kHtml) && line.rfind("# ", 0) == 0)
      return line.substr(2);
    if ((f == DocFormat::kRst || f == DocFormat::kText) && !prev.empty() && line.size() >= 3 &&
        line.find_first_not_of(line[0]) == std::string::npos &&
        std::string("=-~#*").find(line[0]) != std::string::npos) {
      return prev;
    }
    if (f == DocFormat::kCode) {
      std::string c = line;
      for (const char* d : {"/*", "*/", "//", ";", "#"}) {
        size_t at;
        while ((at = c.find(d)) != std::string::npos && std::string(d) != "#")
          c.erase(at, std::string(d).size());
      }
      c = std::string(absl::StripAsciiWhitespace(c));
      while (!c.empty() && (c[0] == '*' || c[0] == '=' || c[0] == '-')) c.erase(0, 1);
      c = std::string(absl::StripAsciiWhitespace(c));
      const bool comment =
          line.rfind("/*", 0) == 0 || line.rfind("*", 0) == 0 || line.rfind("//", 0) == 0;
      if (comment && absl::StrContains(c, "definitions for")) {
        // The next comment line often completes it ("... for the TI\n MSP430x14x devices.").
        // (None when this comment is the file's last line.)
        std::string next;
        if (pos < text.size()) {
          size_t e2 = text.find('\n', pos);
          if (e2 == std::string_view::npos) e2 = text.size();
          next = std::string(absl::StripAsciiWhitespace(AV(text.substr(pos, e2 - pos))));
        }
        while (!next.empty() && (next[0] == '*' || next[0] == '/')) next.erase(0, 1);
        while (!next.empty() && (next.back() == '/' || next.back() == '*')) next.pop_back();
        next = std::string(absl::StripAsciiWhitespace(next));
        if (!c.empty() && c.back() != '.' && !next.empty()) c += " " + next;
        return c;
      }
    }
    prev = line;
  }
  return "";
}

}  // namespace

std::string HtmlToText(std::string_view h, std::string* title) {
  std::string out;
  std::string pending_prefix;
  int pre = 0;
  bool in_title = false;
  std::string title_text;
  auto newline = [&](int n = 1) {
    while (!out.empty() && out.back() == ' ') out.pop_back();
    int have = 0;
    for (auto it = out.rbegin(); it != out.rend() && *it == '\n'; ++it) ++have;
    if (out.empty()) return;
    for (int i = have; i < n; ++i) out.push_back('\n');
  };
  size_t i = 0;
  while (i < h.size()) {
    char c = h[i];
    if (c == '<') {
      if (h.compare(i, 4, "<!--") == 0) {
        size_t e = h.find("-->", i + 4);
        i = e == std::string_view::npos ? h.size() : e + 3;
        continue;
      }
      size_t e = h.find('>', i + 1);
      if (e == std::string_view::npos) break;
      std::string_view tag = h.substr(i + 1, e - i - 1);
      i = e + 1;
      bool closing = !tag.empty() && tag[0] == '/';
      if (closing) tag.remove_prefix(1);
      size_t name_end = 0;
      while (name_end < tag.size() && (absl::ascii_isalnum(tag[name_end]) || tag[name_end] == '!'))
        ++name_end;
      std::string name = absl::AsciiStrToLower(AV(tag.substr(0, name_end)));
      if (!closing && (name == "script" || name == "style")) {
        size_t end = absl::AsciiStrToLower(AV(h.substr(i))).find("</" + name);
        i = end == std::string::npos ? h.size() : i + end;
        continue;
      }
      if (name == "title") {
        in_title = !closing;
        continue;
      }
      if (name.size() == 2 && name[0] == 'h' && name[1] >= '1' && name[1] <= '6') {
        newline(2);
        if (!closing) {
          out.append(std::string(name[1] - '0', '#'));
          out.push_back(' ');
        }
        continue;
      }
      if (name == "pre") {
        newline(1);
        if (!closing) {
          out.append("```\n");
          ++pre;
        } else {
          if (pre > 0) --pre;
          out.append("```\n");
        }
        continue;
      }
      if (name == "p" || name == "div" || name == "section" || name == "article" ||
          name == "table" || name == "ul" || name == "ol" || name == "dl" || name == "blockquote") {
        newline(closing ? 2 : 2);
        continue;
      }
      if (name == "br" || name == "hr" || name == "dt" || name == "dd") {
        newline(1);
        continue;
      }
      if (name == "li" && !closing) {
        newline(1);
        out.append("- ");
        continue;
      }
      if (name == "tr") {
        newline(1);
        if (!closing) out.append("|");
        continue;
      }
      if ((name == "td" || name == "th") && closing) {
        out.append(" |");
        continue;
      }
      if ((name == "td" || name == "th") && !closing) {
        out.push_back(' ');
        continue;
      }
      continue;  // inline tags vanish
    }
    if (c == '&') {
      size_t semi = h.find(';', i);
      if (semi != std::string_view::npos && semi - i <= 10) {
        std::string dec = DecodeEntity(h.substr(i + 1, semi - i - 1));
        (in_title ? title_text : out).append(dec);
        i = semi + 1;
        continue;
      }
    }
    if (in_title) {
      title_text.push_back(c);
      ++i;
      continue;
    }
    if (pre == 0 && (c == '\n' || c == '\r' || c == '\t' || c == ' ')) {
      if (!out.empty() && out.back() != ' ' && out.back() != '\n') out.push_back(' ');
      ++i;
      continue;
    }
    out.push_back(c);
    ++i;
  }
  if (title) *title = CollapseSpaces(title_text);
  return out;
}

DocFormat DetectFormat(std::string_view name, std::string_view bytes) {
  const std::string ext = Ext(name);
  if (bytes.starts_with("%PDF-") || ext == "pdf") return DocFormat::kPdf;
  if (ext == "md" || ext == "markdown") return DocFormat::kMarkdown;
  if (ext == "rst" || ext == "rest") return DocFormat::kRst;
  if (ext == "html" || ext == "htm" || ext == "xhtml") return DocFormat::kHtml;
  if (ext == "svd") return DocFormat::kSvd;
  if (ext == "yaml" || ext == "yml") return DocFormat::kYaml;
  static const char* kCode[] = {"h",   "c",   "hpp", "cpp", "cc", "hh", "s",
                                "asm", "inc", "ld",  "cxx", "rs", "py", "lds"};
  for (const char* e : kCode) {
    if (ext == e) return DocFormat::kCode;
  }
  std::string_view head = bytes.substr(0, 512);
  if (ext == "xml" && (bytes.substr(0, 4096).find("<device") != std::string_view::npos))
    return DocFormat::kSvd;
  if (absl::StrContains(absl::AsciiStrToLower(AV(head)), "<!doctype html") ||
      absl::StrContains(absl::AsciiStrToLower(AV(head)), "<html")) {
    return DocFormat::kHtml;
  }
  return DocFormat::kText;
}

absl::StatusOr<ExtractedDoc> ExtractDocument(std::string_view name, std::string_view bytes) {
  if (bytes.empty()) return absl::InvalidArgumentError(absl::StrCat(AV(name), ": empty file"));
  DocFormat f = DetectFormat(name, bytes);
  if (f == DocFormat::kSvd) return ExtractSvd(name, bytes);
  if (f == DocFormat::kPdf) {
    if (!bytes.starts_with("%PDF-")) {
      return absl::InvalidArgumentError(absl::StrCat(AV(name), ": not a PDF (no %PDF- header)"));
    }
    return ExtractPdf(name, bytes);
  }
  std::string_view probe = bytes.substr(0, 8192);
  if (probe.find('\0') != std::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(AV(name), ": binary file (contains NUL bytes); not indexed"));
  }
  std::string text;
  double bad = InvalidUtf8Share(bytes);
  if (bad > 0.3) {
    return absl::InvalidArgumentError(
        absl::StrCat(AV(name), ": binary or unknown encoding; not indexed"));
  }
  text = bad > 0 ? Latin1ToUtf8(bytes) : std::string(bytes);
  ExtractedDoc doc;
  doc.format = f;
  if (f == DocFormat::kHtml) {
    text = HtmlToText(text, &doc.title);
  }
  if (absl::StripAsciiWhitespace(text).empty()) {
    return absl::InvalidArgumentError(absl::StrCat(AV(name), ": no text"));
  }
  if (doc.title.empty()) doc.title = GuessTitle(text, f);
  doc.pages.push_back({0, std::move(text)});
  return doc;
}

}  // namespace fwai
