// Renders session events for people (text, tool-call tree, usage) or as JSON
// lines flushed one by one. A sub-agent's text is shown under the call that
// started it, indented, a whole line at a time.
#pragma once

#include <cstdio>
#include <map>
#include <string>

namespace fwai::v1 {
class ServerEvent;
class ToolsOffered;
}  // namespace fwai::v1

namespace fwai {

class EventRenderer {
 public:
  // Writes the session's text to `out` and usage and errors to `err`.
  EventRenderer(bool json, bool show_user_messages, FILE* out = stdout, FILE* err = stderr)
      : json_(json), show_user_(show_user_messages), out_(out), err_(err) {}
  void Render(const fwai::v1::ServerEvent& ev);
  // Ends a partial line, if any.
  void EndLine();

 private:
  int Depth(const std::string& parent_call_id) const;
  void Line(FILE* f, const std::string& text);
  void ToolFinished(const fwai::v1::ServerEvent& ev);
  void Decision(const fwai::v1::ServerEvent& ev);
  // "[tools (reason): a, mcp_b (why it is offered), ...]": built-in ones without a why.
  void ToolsOffered(const fwai::v1::ToolsOffered& offered);
  // An edit waiting for the user's accept: its "-"/"+" lines.
  void EditPreview(const std::string& preview);
  // Prints the sub-agent's complete lines under `parent_call_id` (all of it if `all`).
  void SubText(const std::string& parent_call_id, bool all);
  const bool json_;
  const bool show_user_;
  FILE* const out_;
  FILE* const err_;
  bool mid_line_ = false;
  bool shared_ = false;               // someone other than the owner has written: name every author
  std::map<std::string, int> depth_;  // call_id -> nesting depth
  std::map<std::string, std::string> sub_;  // parent call_id -> sub-agent text not yet shown
};

}  // namespace fwai
