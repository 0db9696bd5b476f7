// CMSIS-SVD: any bytes give an error naming the line, or one chunk per
// peripheral and register that the knowledge base can store.
#include "server/knowledge/chunker.h"
#include "server/knowledge/extract.h"
#include "tests/fuzz/document_fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fwai;
  using namespace fwai::fuzz;
  auto doc = ExtractSvd("device.svd", AsText(data, size));
  if (!doc.ok()) {
    FUZZ_CHECK(!doc.status().message().empty());
    return 0;
  }
  CheckExtracted(*doc);
  CheckChunks(ChunkDocument(*doc, ChunkOptions()));
  return 0;
}
