// Author: who did something in a session — sent a message, answered,
// decided a plan, cancelled, switched the mode — as fwaid verified the
// caller (never as a client says). Events carry it (fwai.v1.Author).
#pragma once

#include <string>

namespace fwai {

namespace v1 {
class Author;
}

struct Author {
  std::string principal;  // "uid:1001", "user:bob"; empty: nobody (the agent itself)
  std::string user;       // as people name them: "bob"
  bool owner = true;      // the session's owner (false: a user it is shared with)

  bool empty() const { return principal.empty(); }
  // Fills `out` (left unset when empty).
  void ToProto(v1::Author* out) const;
};

}  // namespace fwai
