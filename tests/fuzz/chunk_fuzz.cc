// A document format's extraction and chunking (FWAI_FUZZ_FORMAT names the
// file the input is read as: doc.md, doc.rst, doc.html, main.c): any bytes
// give an error or chunks the knowledge base can store.
#include "server/knowledge/chunker.h"
#include "server/knowledge/extract.h"
#include "tests/fuzz/document_fuzz.h"

#ifndef FWAI_FUZZ_FORMAT
#error "FWAI_FUZZ_FORMAT names the document"
#endif

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fwai;
  using namespace fwai::fuzz;
  const std::string_view bytes = AsText(data, size);
  if (DetectFormat(FWAI_FUZZ_FORMAT, bytes) == DocFormat::kPdf) return 0;  // pdftotext's business
  auto doc = ExtractDocument(FWAI_FUZZ_FORMAT, bytes);
  if (!doc.ok()) {
    FUZZ_CHECK(!doc.status().message().empty());
    return 0;
  }
  CheckExtracted(*doc);
  ChunkOptions options;
  options.code_aware = doc->format == DocFormat::kCode;
  CheckChunks(ChunkDocument(*doc, options));
  if (doc->format == DocFormat::kCode) {
    // Code added as plain text is chunked as text.
    options.code_aware = false;
    CheckChunks(ChunkDocument(*doc, options));
  }
  return 0;
}
