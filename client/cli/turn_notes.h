// What the CLI says when a turn's stream breaks: whether the connection
// dropped while fwaid lives (the turn goes on there) or fwaid itself went
// away. Turns left behind in the second case are noted, and the next command
// that reaches fwaid says how each of them ended.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>

#include "client/cli/cli.h"

namespace fwai {

struct LostTurn {
  bool daemon_answers = false;  // fwaid answered again on the same address
  bool still_running = false;   // ... and the session's turn runs there
  std::string ended;            // the turn's stop reason when it already ended
  std::string detail;
};

// Called after a stream that followed `turn_id` (empty: whichever runs) broke.
LostTurn DiagnoseLostTurn(const Globals& g, const std::string& session_id,
                          const std::string& turn_id, uint64_t after_seq);
// The message for a person, and the exit code, for a chat turn whose stream
// broke. Notes the turn when fwaid went away.
int ReportLostTurn(const Globals& g, const std::string& session_id, const std::string& turn_id,
                   uint64_t after_seq, const std::string& why);
// Says how noted turns ended, once each, when their fwaid answers again.
void ReportNotedTurns(const Globals& g, const std::shared_ptr<grpc::Channel>& channel);

}  // namespace fwai
