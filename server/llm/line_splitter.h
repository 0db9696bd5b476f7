// Incremental splitter for line protocols: newline-delimited JSON (Ollama's
// /api/chat) and JSON-RPC over stdio (MCP servers).
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace fwai {

class LineSplitter {
 public:
  // Feeds raw bytes (any split); calls `fn` with each complete line, without
  // its "\n" or "\r\n". Lines that are empty or blank (spaces, tabs, "\r")
  // are skipped. Linear in the bytes fed, however many lines a read holds.
  void Feed(std::string_view bytes, const std::function<void(std::string_view line)>& fn);
  // True if bytes of an unfinished line are buffered.
  bool HasPartial() const { return !partial_.empty(); }

 private:
  std::string partial_;  // the start of a line whose end has not come yet
};

}  // namespace fwai
