// What the knowledge base does with a document's chunks, for the document
// targets: every chunk goes into RocksDB as JSON (its title path, text and
// identifiers), so text and headings must be valid UTF-8 and the numbers
// must make sense.
#pragma once

#include <nlohmann/json.hpp>

#include "server/knowledge/chunker.h"
#include "tests/fuzz/fuzz_support.h"

namespace fwai::fuzz {

inline void CheckExtracted(const ExtractedDoc& doc) {
  (void)nlohmann::json(doc.title).dump();
  for (const auto& p : doc.pages) (void)nlohmann::json(p.text).dump();
}

inline void CheckChunks(const std::vector<ChunkDraft>& chunks) {
  for (const auto& c : chunks) {
    const nlohmann::json meta = {
        {"title_path", c.title_path}, {"text", c.text}, {"content_type", c.content_type}};
    (void)meta.dump();
    FUZZ_CHECK(!c.content_type.empty());
    FUZZ_CHECK(c.start_line <= c.end_line);
    FUZZ_CHECK(c.tokens >= 0);
  }
}

}  // namespace fwai::fuzz
