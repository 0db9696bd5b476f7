// chunk_dump FILE [N]: prints how fwai extracts and chunks a document (for tuning).
#include <cstdio>
#include <fstream>
#include <sstream>

#include "server/knowledge/chunker.h"
int main(int argc, char** argv) {
  std::ifstream f(argv[1]);
  std::stringstream ss;
  ss << f.rdbuf();
  auto doc = fwai::ExtractDocument(argv[1], ss.str());
  if (!doc.ok()) {
    printf("ERR %s\n", std::string(doc.status().message()).c_str());
    return 1;
  }
  auto chunks = fwai::ChunkDocument(*doc, {});
  int show = argc > 2 ? atoi(argv[2]) : 3;
  printf("%zu chunks, format %s, title '%s'\n", chunks.size(), fwai::DocFormatName(doc->format),
         doc->title.c_str());
  for (size_t i = 0; i < chunks.size() && (int)i < show; ++i) {
    auto& c = chunks[i];
    std::string path;
    for (auto& p : c.title_path) path += p + " > ";
    printf("--- #%zu p%d L%d-%d tok=%d type=%s path=[%s]\n%s\n", i, c.page, c.start_line,
           c.end_line, c.tokens, c.content_type.c_str(), path.c_str(),
           c.text.substr(0, 300).c_str());
  }
}
