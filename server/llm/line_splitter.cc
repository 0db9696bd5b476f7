#include "server/llm/line_splitter.h"

namespace fwai {
namespace {

void Emit(std::string_view line, const std::function<void(std::string_view)>& fn) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (line.find_first_not_of(" \t\r") == std::string_view::npos) return;
  fn(line);
}

}  // namespace

void LineSplitter::Feed(std::string_view bytes, const std::function<void(std::string_view)>& fn) {
  while (!bytes.empty()) {
    const size_t nl = bytes.find('\n');
    if (nl == std::string_view::npos) {
      partial_.append(bytes);
      return;
    }
    if (partial_.empty()) {
      Emit(bytes.substr(0, nl), fn);
    } else {
      partial_.append(bytes.substr(0, nl));
      std::string line = std::move(partial_);
      partial_.clear();
      Emit(line, fn);
    }
    bytes.remove_prefix(nl + 1);
  }
}

}  // namespace fwai
