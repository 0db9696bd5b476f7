// Incremental parser for text/event-stream (Server-Sent Events) bodies.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace fwai {

struct SseEvent {
  std::string event;  // "" when the server sent no `event:` field
  std::string data;   // data lines joined with '\n'
};

class SseParser {
 public:
  // Feeds raw bytes (any split); calls `fn` for each complete event.
  void Feed(std::string_view bytes, const std::function<void(const SseEvent&)>& fn);
  // True if bytes of an unfinished event are buffered.
  bool HasPartial() const { return !line_.empty() || has_data_ || !event_.empty(); }

 private:
  void Line(std::string_view line, const std::function<void(const SseEvent&)>& fn);
  std::string line_;
  std::string event_;
  std::string data_;
  bool has_data_ = false;
  bool last_cr_ = false;
};

}  // namespace fwai
