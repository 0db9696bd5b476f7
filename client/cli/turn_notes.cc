#include "client/cli/turn_notes.h"

#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "client/lib/client.h"
#include "common/paths.h"
#include "fwai/v1/sessions.grpc.pb.h"

namespace fwai {
namespace {

namespace pb = fwai::v1;
using json = nlohmann::json;

std::string NotesPath() { return DefaultDataDir() + "/unfinished-turns.json"; }

json LoadNotes() {
  std::ifstream in(NotesPath());
  if (!in) return json::array();
  std::stringstream ss;
  ss << in.rdbuf();
  auto j = json::parse(ss.str(), nullptr, false);
  return j.is_array() ? j : json::array();
}

void SaveNotes(const json& notes) {
  std::error_code ec;
  if (notes.empty()) {
    std::filesystem::remove(NotesPath(), ec);
    return;
  }
  (void)MakeDirs(DefaultDataDir(), 0700);
  const std::string tmp = NotesPath() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << notes.dump() << '\n';
  }
  std::filesystem::rename(tmp, NotesPath(), ec);
}

std::string DaemonKey(const Globals& g) {
  auto a = ResolveDaemonAddress(g.daemon);
  return a.ok() ? a->grpc_target : g.daemon;
}

// The end of `turn_id` among the session's events after `after_seq`, if stored.
bool FindTurnEnd(pb::Sessions::Stub& stub, const std::string& session_id,
                 const std::string& turn_id, uint64_t after_seq, pb::TurnFinished* out,
                 bool* session_gone) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  pb::AttachRequest req;
  req.set_session_id(session_id);
  req.set_after_seq(after_seq);
  req.set_no_follow(true);
  auto reader = stub.Attach(&ctx, req);
  pb::ServerEvent ev;
  bool found = false;
  while (reader->Read(&ev)) {
    if (ev.has_turn_finished() && (turn_id.empty() || ev.turn_id() == turn_id)) {
      *out = ev.turn_finished();
      found = true;
    }
  }
  auto st = reader->Finish();
  *session_gone = st.error_code() == grpc::StatusCode::NOT_FOUND;
  return found;
}

}  // namespace

LostTurn DiagnoseLostTurn(const Globals& g, const std::string& session_id,
                          const std::string& turn_id, uint64_t after_seq) {
  LostTurn r;
  auto ch = ConnectChannel(g, /*autostart=*/false, 1000);
  if (!ch.ok()) return r;
  r.daemon_answers = true;
  auto stub = pb::Sessions::NewStub(*ch);
  pb::TurnFinished end;
  bool gone = false;
  if (FindTurnEnd(*stub, session_id, turn_id, after_seq, &end, &gone)) {
    r.ended = end.stop_reason();
    r.detail = end.detail();
    return r;
  }
  grpc::ClientContext ctx;
  pb::GetSessionRequest req;
  req.set_session_id(session_id);
  pb::Session s;
  if (stub->Get(&ctx, req, &s).ok()) r.still_running = s.turn_running();
  return r;
}

int ReportLostTurn(const Globals& g, const std::string& session_id, const std::string& turn_id,
                   uint64_t after_seq, const std::string& why) {
  LostTurn lost = DiagnoseLostTurn(g, session_id, turn_id, after_seq);
  if (lost.daemon_answers && lost.still_running) {
    return Fail(g, kExitUnreachable,
                absl::StrCat("lost the connection to fwaid during the turn (", why,
                             "); fwaid is running and the turn goes on there: fwai attach ",
                             session_id, " --after ", after_seq));
  }
  if (!lost.ended.empty()) {
    return Fail(g, kExitTurnFailed,
                absl::StrCat("the turn ended while the connection was down: ", lost.ended,
                             lost.detail.empty() ? "" : " — " + lost.detail,
                             " (fwai sessions show ", session_id, ")"));
  }
  // fwaid is gone (or restarted without the turn): remember to say how it ended.
  json notes = LoadNotes();
  notes.push_back({{"daemon", DaemonKey(g)},
                   {"session_id", session_id},
                   {"turn_id", turn_id},
                   {"after_seq", after_seq}});
  SaveNotes(notes);
  return Fail(g, kExitUnreachable,
              absl::StrCat("fwaid went away during the turn (", why,
                           "): it stopped or crashed, so the turn did not finish. The next fwai "
                           "command that reaches "
                           "fwaid says how it ended (fwai sessions show ",
                           session_id, ")"));
}

void ReportNotedTurns(const Globals& g, const std::shared_ptr<grpc::Channel>& channel) {
  std::error_code ec;
  if (!std::filesystem::exists(NotesPath(), ec)) return;
  json notes = LoadNotes();
  const std::string key = DaemonKey(g);
  auto stub = pb::Sessions::NewStub(channel);
  json kept = json::array();
  for (const auto& n : notes) {
    if (n.value("daemon", "") != key) {
      kept.push_back(n);
      continue;
    }
    const std::string session_id = n.value("session_id", ""), turn_id = n.value("turn_id", "");
    pb::TurnFinished end;
    bool gone = false;
    if (FindTurnEnd(*stub, session_id, turn_id, n.value("after_seq", uint64_t{0}), &end, &gone)) {
      std::cerr << "fwai: your turn " << turn_id << " in session " << session_id
                << " ended while fwai was away: " << end.stop_reason()
                << (end.detail().empty() ? "" : " — " + end.detail()) << " (fwai sessions show "
                << session_id << ")" << std::endl;
    } else if (!gone) {
      kept.push_back(n);  // not ended yet (or fwaid still starting): ask again next time
    }
  }
  if (kept.size() != notes.size()) SaveNotes(kept);
}

}  // namespace fwai
