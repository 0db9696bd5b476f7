// Turns a document's bytes into text pages, keeping structure the chunker
// uses (headings as "# " lines, code fences, table rows).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace fwai {

enum class DocFormat { kPdf, kMarkdown, kRst, kHtml, kText, kCode, kYaml, kSvd };
const char* DocFormatName(DocFormat f);

struct ExtractedPage {
  int number = 0;  // 1-based PDF page, 0 for formats without pages
  std::string text;
};

// A chunk decided by the format itself (CMSIS-SVD: one per peripheral and
// per register); the chunker keeps it as it is.
struct PreChunk {
  std::vector<std::string> title_path;
  std::string text;
  std::string content_type;
};

struct ExtractedDoc {
  DocFormat format = DocFormat::kText;
  std::string title;  // from <title>, the first heading, or empty
  std::vector<ExtractedPage> pages;
  std::vector<PreChunk> prechunks;
};

// Picks the format from the name's extension and the content.
DocFormat DetectFormat(std::string_view name, std::string_view bytes);

// INVALID_ARGUMENT names the reason: empty, binary, not valid UTF-8,
// encrypted or unreadable PDF, a PDF without text.
[[nodiscard]] absl::StatusOr<ExtractedDoc> ExtractDocument(std::string_view name,
                                                           std::string_view bytes);

// CMSIS-SVD XML -> one chunk per peripheral (base address, interrupts,
// register map) and one per register (address, size, access, reset value,
// fields with bit ranges and enumerated values). Handles derivedFrom and
// clusters. INVALID_ARGUMENT names the line of malformed XML.
[[nodiscard]] absl::StatusOr<ExtractedDoc> ExtractSvd(std::string_view name, std::string_view xml);

// HTML -> text with "# " headings, "- " list items, "| " table rows and ```
// fences around <pre>; scripts and styles dropped; entities decoded.
std::string HtmlToText(std::string_view html, std::string* title);

}  // namespace fwai
