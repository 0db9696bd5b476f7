// Renders session events for people (text, tool-call tree, usage) or as JSON
// lines flushed one by one.
#pragma once

#include <cstdio>
#include <map>
#include <string>

namespace fwai::v1 {
class ServerEvent;
}

namespace fwai {

class EventRenderer {
 public:
  EventRenderer(bool json, bool show_user_messages) : json_(json), show_user_(show_user_messages) {}
  void Render(const fwai::v1::ServerEvent& ev);
  // Ends a partial line, if any.
  void EndLine();

 private:
  int Depth(const std::string& parent_call_id) const;
  void Line(FILE* f, const std::string& text);
  const bool json_;
  const bool show_user_;
  bool mid_line_ = false;
  std::map<std::string, int> depth_;  // call_id -> nesting depth
};

}  // namespace fwai
