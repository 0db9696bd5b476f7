// Structure-first chunking: heading tree (H1/H2 always cut, H3 cuts once the
// chunk has its minimum size), no chunk across documents or pages' sections,
// token budgets (min/target/max) with overlap when a section is cut by size,
// sentence splitting (English and Chinese), code blocks and tables kept whole
// (a table over the maximum is split by rows with its header repeated).
#pragma once

#include <string>
#include <vector>

#include "server/knowledge/extract.h"

namespace fwai {

struct ChunkOptions {
  int min_tokens = 100;
  int target_tokens = 300;
  int max_tokens = 512;
  int overlap_tokens = 50;
  // Source code added as code (fwai kb add --kind code): cut at functions,
  // types and macro groups, symbol names in the title path.
  bool code_aware = false;
};

struct ChunkDraft {
  std::string text;
  std::vector<std::string> title_path;  // section headings, outermost first
  int page = 0;
  int start_line = 0;  // 1-based, within the page
  int end_line = 0;
  std::string content_type;  // text | code | table | register
  int tokens = 0;
  // Sections are numbered in document order, a new one at each level 1-2
  // heading (across pages); passages grow within a chunk's section.
  int section = 0;
};

// Approximate token count (about four characters a token).
int CountTokens(std::string_view text);

std::vector<ChunkDraft> ChunkDocument(const ExtractedDoc& doc, const ChunkOptions& options);

// Code-aware chunks for C-like sources: top-level units (functions, structs,
// enums, typedefs, #define groups) merged up to the target size; a unit over
// the maximum is cut by lines. title_path = {symbol names}.
std::vector<ChunkDraft> ChunkCode(const std::string& text, const ChunkOptions& options);

// Splits text into sentences (". ", "? ", "! " before a capital; 。！？).
std::vector<std::string> SplitSentences(std::string_view text);

}  // namespace fwai
