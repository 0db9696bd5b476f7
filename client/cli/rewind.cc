#include "client/cli/rewind.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <iostream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/lib/client.h"
#include "fwai/v1/sessions.grpc.pb.h"

namespace fwai {

namespace pb = fwai::v1;

namespace {

std::string Short(const std::string& sha) { return sha.empty() ? "-" : sha.substr(0, 12); }

std::string When(int64_t us) {
  return absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixMicros(us), absl::LocalTimeZone());
}

std::string Describe(const pb::CheckpointInfo& c) {
  std::string boards;
  for (const auto& [board, sha] : c.boards()) absl::StrAppend(&boards, " ", board, "=", Short(sha));
  return absl::StrCat(c.seq(), "  ", When(c.time_us()), "  ",
                      c.turn_id().empty() ? c.reason() : "before turn " + c.turn_id(), "  ",
                      c.files(), " files, ", c.bytes(), " bytes",
                      boards.empty() ? "" : absl::StrCat(", boards", boards),
                      c.skipped().empty() ? "" : absl::StrCat(", ", c.skipped_size(), " not kept"));
}

// What a rewind changes (or would), for people.
void PrintPlan(const pb::RewindResponse& r, bool conversation) {
  std::cout << "checkpoint " << Describe(r.checkpoint()) << "\n";
  for (const auto& f : r.files()) std::cout << "  " << f.action() << "  " << f.path() << "\n";
  for (const auto& b : r.boards()) {
    std::cout << "  " << (b.action() == "flash" ? "flash" : "unchanged") << "  " << b.board()
              << "  " << Short(b.now_sha256()) << " -> " << Short(b.then_sha256()) << "\n";
  }
  if (conversation) std::cout << "  conversation: " << r.history_dropped() << " entries cut\n";
  if (r.files().empty() && r.boards().empty() && r.history_dropped() == 0)
    std::cout << "  nothing differs\n";
}

}  // namespace

RewindCommands::RewindCommands(CLI::App& app, Globals& g) : g_(g) {
  cmd_ = app.add_subcommand(
      "rewind", "A session's files, boards and conversation back to a checkpoint (docs/agent.md)");
  cmd_->add_option("session", session_, "Session id")->required();
  cmd_->add_option("--to", to_, "Checkpoint number or the turn id it precedes (default: latest)");
  cmd_->add_flag("--files", files_, "Restore the project's files");
  cmd_->add_flag("--board", board_, "Flash each held board back to its image then");
  cmd_->add_flag("--all", all_, "Files and boards (the default)");
  cmd_->add_flag("--conversation", conversation_, "Also cut the conversation back to that turn");
  cmd_->add_flag("--dry-run", dry_run_, "Say what it would change; change nothing");
  cmd_->add_flag("--list", list_, "The session's checkpoints");
  cmd_->add_flag("--yes,-y", yes_, "Do it without asking");
}

std::optional<int> RewindCommands::RunIfParsed() {
  if (!cmd_->parsed()) return std::nullopt;
  if (list_) return ListCheckpoints(g_, session_);
  RewindChoice c;
  c.session = session_;
  c.to = to_;
  const bool some = files_ || board_;
  c.files = all_ || files_ || !some;
  c.boards = all_ || board_ || !some;
  c.conversation = conversation_;
  c.dry_run = dry_run_;
  c.yes = yes_;
  return RunRewind(g_, c);
}

int ListCheckpoints(const Globals& g, const std::string& session) {
  auto ch = ConnectChannel(g);
  if (!ch.ok()) return Fail(g, kExitUnreachable, std::string(ch.status().message()));
  auto stub = pb::Sessions::NewStub(*ch);
  pb::ListCheckpointsRequest req;
  req.set_session_id(session);
  pb::ListCheckpointsResponse resp;
  grpc::ClientContext ctx;
  auto st = stub->ListCheckpoints(&ctx, req, &resp);
  if (!st.ok()) return FailGrpc(g, st);
  for (const auto& c : resp.checkpoints()) {
    if (g.json)
      std::cout << ProtoToJson(c).dump() << "\n";
    else
      std::cout << Describe(c) << "\n";
  }
  if (!g.json && resp.checkpoints().empty()) std::cout << "no checkpoints\n";
  std::cout.flush();
  return kExitOk;
}

int RunRewind(const Globals& g, const RewindChoice& c) {
  const std::string& session = c.session;
  auto ch = ConnectChannel(g);
  if (!ch.ok()) return Fail(g, kExitUnreachable, std::string(ch.status().message()));
  auto stub = pb::Sessions::NewStub(*ch);
  pb::RewindRequest req;
  req.set_session_id(session);
  req.set_to(c.to);
  req.set_files(c.files);
  req.set_boards(c.boards);
  req.set_conversation(c.conversation);
  // The plan first; then, confirmed, the rewind.
  req.set_dry_run(true);
  pb::RewindResponse plan;
  {
    grpc::ClientContext ctx;
    auto st = stub->Rewind(&ctx, req, &plan);
    if (!st.ok()) return FailGrpc(g, st);
  }
  if (!g.json) PrintPlan(plan, c.conversation);
  int flashes = 0;
  for (const auto& b : plan.boards()) flashes += b.action() == "flash";
  if (!c.dry_run && plan.files().empty() && flashes == 0 && plan.history_dropped() == 0) {
    if (g.json) std::cout << ProtoToJson(plan).dump() << std::endl;
    return kExitOk;  // nothing differs: nothing to do
  }
  if (c.dry_run) {
    if (g.json) std::cout << ProtoToJson(plan).dump() << std::endl;
    return kExitOk;
  }
  if (!c.yes) {
    if (!isatty(0) || !isatty(2) || g.json)
      return Fail(g, kExitUsage, "not rewound: add --yes to rewind without a terminal");
    std::fprintf(stderr, "Rewind session %s to checkpoint %llu? [y/N] ", session.c_str(),
                 static_cast<unsigned long long>(plan.checkpoint().seq()));
    std::string answer;
    std::getline(std::cin, answer);
    if (answer != "y" && answer != "Y" && answer != "yes")
      return Fail(g, kExitError, "not rewound (not confirmed)");
  }
  // Exactly the checkpoint shown, even if a newer one came meanwhile.
  req.set_to(std::to_string(plan.checkpoint().seq()));
  req.set_dry_run(false);
  pb::RewindResponse done;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(10));
  auto st = stub->Rewind(&ctx, req, &done);
  if (!st.ok()) return FailGrpc(g, st);
  if (g.json) {
    std::cout << ProtoToJson(done).dump() << std::endl;
  } else {
    int flashed = 0;
    for (const auto& b : done.boards()) flashed += b.action() == "flash";
    std::cout << "rewound session " << session << " to checkpoint " << done.checkpoint().seq()
              << ": " << done.files_size() << " files, " << flashed << " boards flashed"
              << (c.conversation ? absl::StrCat(", ", done.history_dropped(), " entries cut") : "")
              << std::endl;
    if (done.undo_checkpoint() > 0) {
      std::cout << "the files as they were are checkpoint " << done.undo_checkpoint()
                << " (fwai rewind " << session << " --to " << done.undo_checkpoint()
                << " --files undoes this)" << std::endl;
    }
  }
  return kExitOk;
}

}  // namespace fwai
