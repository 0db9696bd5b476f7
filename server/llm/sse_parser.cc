#include "server/llm/sse_parser.h"

namespace fwai {

void SseParser::Feed(std::string_view bytes, const std::function<void(const SseEvent&)>& fn) {
  for (char c : bytes) {
    if (c == '\n' && last_cr_) {  // the \n of a \r\n pair
      last_cr_ = false;
      continue;
    }
    last_cr_ = (c == '\r');
    if (c == '\n' || c == '\r') {
      Line(line_, fn);
      line_.clear();
    } else {
      line_.push_back(c);
    }
  }
}

void SseParser::Line(std::string_view line, const std::function<void(const SseEvent&)>& fn) {
  if (line.empty()) {
    if (has_data_ || !event_.empty()) {
      SseEvent ev{std::move(event_), std::move(data_)};
      event_.clear();
      data_.clear();
      has_data_ = false;
      fn(ev);
    }
    return;
  }
  if (line[0] == ':') return;  // comment / keep-alive
  std::string_view field = line, value;
  auto colon = line.find(':');
  if (colon != std::string_view::npos) {
    field = line.substr(0, colon);
    value = line.substr(colon + 1);
    if (!value.empty() && value[0] == ' ') value.remove_prefix(1);
  }
  if (field == "event") {
    event_ = std::string(value);
  } else if (field == "data") {
    if (has_data_) data_.push_back('\n');
    data_.append(value);
    has_data_ = true;
  }
  // id and retry are not used by LLM streams.
}

}  // namespace fwai
