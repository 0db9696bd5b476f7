#include "client/cli/watch.h"

#include <grpcpp/grpcpp.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/lib/client.h"
#include "fwai/v1/hardware.grpc.pb.h"
#include "server/project/project.h"

namespace fwai {

namespace pb = fwai::v1;
using json = nlohmann::json;

namespace {

// "10", "10s", "2m" as seconds; -1 when not one.
int Seconds(std::string t) {
  int mult = 1;
  if (!t.empty() && (t.back() == 's' || t.back() == 'm')) {
    mult = t.back() == 'm' ? 60 : 1;
    t.pop_back();
  }
  int v = -1;
  return absl::SimpleAtoi(t, &v) && v >= 0 ? v * mult : -1;
}

void ToSpec(const WatchRule& r, pb::WatchRuleSpec* p) {
  p->set_name(r.name);
  p->set_board(r.board);
  p->set_stream(r.stream);
  p->set_pattern(r.pattern);
  p->set_count(r.count);
  p->set_within_s(r.within_s);
  p->set_capture(r.capture);
  p->set_notify(r.notify);
  p->set_wake_session(r.wake_session);
  p->set_min_interval_s(r.min_interval_s);
  p->set_source(r.source);
}

std::string Describe(const pb::Watch& w) {
  const auto& r = w.rule();
  std::string actions;
  if (r.capture()) actions += "capture ";
  if (r.notify()) actions += "notify ";
  if (!r.wake_session().empty()) actions += "wake:" + r.wake_session() + " ";
  return absl::StrCat(
      r.board(), "  ", r.name(), "  /", r.pattern(), "/ on ", r.stream(),
      r.count() > 1 ? absl::StrCat(", ", r.count(), " within ", r.within_s(), " s") : "", "  [",
      actions.empty() ? "" : actions.substr(0, actions.size() - 1), "]  ",
      w.active() ? "" : absl::StrCat("ended: ", w.ended(), "  "), "fired ", w.fired(),
      w.held_back() ? absl::StrCat(" (", w.held_back(), " held back)") : "",
      w.last_line().empty() ? "" : absl::StrCat(", last: ", w.last_line()),
      w.last_capture().empty() ? "" : absl::StrCat(" (", w.last_capture(), ")"));
}

}  // namespace

WatchCommands::WatchCommands(CLI::App& app, Globals& g) : g_(g) {
  auto* watch =
      app.add_subcommand("watch", "Rules on a held board's output: capture, notify, wake");
  watch->require_subcommand(1);
  add_ = watch->add_subcommand("add", "Watch a board you hold for a pattern");
  add_->add_option("board", board_, "Board id (default: the one you hold)");
  add_->add_option("--name", name_, "The rule's name")->required();
  add_->add_option("--pattern", pattern_, "An RE2 pattern a line must match")->required();
  add_->add_option("--stream", stream_, "uart (default), rtt:N or semihosting");
  add_->add_option("--count", count_, "Fire after this many matches ... (default 1)");
  add_->add_option("--within", within_, "... within this long (10s, 2m)");
  add_->add_flag("--capture", capture_, "Capture the core when it fires (fwai fault decode)");
  add_->add_flag("--no-notify", no_notify_, "No notice when it fires (the record is kept)");
  add_->add_option("--wake", wake_, "Start a turn in this session of yours with the capture");
  add_->add_option("--min-interval", interval_, "Fire at most once this long (default 60s)");
  load_ = watch->add_subcommand("load", "Start the project's watch: rules on a board you hold");
  load_->add_option("board", board_, "Board id (default: the one you hold)");
  ls_ = watch->add_subcommand("ls", "Your watches: running and ended, how often they fired");
  rm_ = watch->add_subcommand("rm", "Stop a watch");
  rm_->add_option("name", name_, "The rule's name")->required();
  rm_->add_option("board", board_, "Board id (default: any)");
}

std::optional<int> WatchCommands::RunIfParsed() {
  if (add_->parsed()) return Add();
  if (load_->parsed()) return Load();
  if (ls_->parsed()) return List();
  if (rm_->parsed()) return Remove();
  return std::nullopt;
}

namespace {

int AddRule(const Globals& g, pb::Hardware::Stub& stub, const WatchRule& rule,
            const std::string& root) {
  pb::AddWatchRequest req;
  ToSpec(rule, req.mutable_rule());
  req.set_project_root(root);
  pb::Watch w;
  grpc::ClientContext ctx;
  auto st = stub.AddWatch(&ctx, req, &w);
  if (!st.ok()) return FailGrpc(g, st);
  if (g.json) {
    std::cout << ProtoToJson(w).dump() << std::endl;
  } else {
    std::cout << "watching " << Describe(w) << std::endl;
  }
  return kExitOk;
}

}  // namespace

int WatchCommands::Add() {
  WatchRule r;
  r.name = name_;
  r.board = board_;
  r.stream = stream_ == "uart" ? "" : stream_;
  r.pattern = pattern_;
  r.count = count_;
  r.within_s = Seconds(within_);
  r.min_interval_s = Seconds(interval_);
  r.capture = capture_;
  r.notify = !no_notify_;
  r.wake_session = wake_;
  if (r.within_s < 0) return Fail(g_, kExitUsage, "--within: expected a duration (10s, 2m)");
  if (r.min_interval_s < 0)
    return Fail(g_, kExitUsage, "--min-interval: expected a duration (10s, 2m)");
  if (auto s = CheckWatchRule(r, "fwai watch add"); !s.ok())
    return Fail(g_, kExitUsage, std::string(s.message()));
  auto ch = ConnectChannel(g_);
  if (!ch.ok()) return Fail(g_, kExitUnreachable, std::string(ch.status().message()));
  auto stub = pb::Hardware::NewStub(*ch);
  return AddRule(g_, *stub, r, ProjectRoot(g_));
}

int WatchCommands::Load() {
  const std::string root = ProjectRoot(g_);
  const std::string file = root + "/.fwai/project.yaml";
  std::ifstream in(file);
  if (!in) return Fail(g_, kExitError, absl::StrCat(file, ": cannot be read"));
  std::stringstream ss;
  ss << in.rdbuf();
  auto settings = ParseProjectYaml(ss.str(), file);
  if (!settings.ok()) return Fail(g_, kExitError, std::string(settings.status().message()));
  if (settings->watch.empty())
    return Fail(g_, kExitError, absl::StrCat(file, " has no watch: rules"));
  auto ch = ConnectChannel(g_);
  if (!ch.ok()) return Fail(g_, kExitUnreachable, std::string(ch.status().message()));
  auto stub = pb::Hardware::NewStub(*ch);
  for (WatchRule r : settings->watch) {
    if (r.board.empty()) r.board = board_;
    if (int rc = AddRule(g_, *stub, r, root); rc != kExitOk) return rc;
  }
  return kExitOk;
}

int WatchCommands::List() {
  auto ch = ConnectChannel(g_);
  if (!ch.ok()) return Fail(g_, kExitUnreachable, std::string(ch.status().message()));
  auto stub = pb::Hardware::NewStub(*ch);
  pb::ListWatchesResponse resp;
  grpc::ClientContext ctx;
  auto st = stub->ListWatches(&ctx, pb::ListWatchesRequest(), &resp);
  if (!st.ok()) return FailGrpc(g_, st);
  for (const auto& w : resp.watches()) {
    if (g_.json) {
      std::cout << ProtoToJson(w).dump() << std::endl;
    } else {
      std::cout << Describe(w) << std::endl;
    }
  }
  if (!g_.json && resp.watches().empty()) std::cout << "no watches" << std::endl;
  return kExitOk;
}

int WatchCommands::Remove() {
  auto ch = ConnectChannel(g_);
  if (!ch.ok()) return Fail(g_, kExitUnreachable, std::string(ch.status().message()));
  auto stub = pb::Hardware::NewStub(*ch);
  pb::RemoveWatchRequest req;
  req.set_name(name_);
  req.set_board(board_);
  pb::RemoveWatchResponse resp;
  grpc::ClientContext ctx;
  auto st = stub->RemoveWatch(&ctx, req, &resp);
  if (!st.ok()) return FailGrpc(g_, st);
  if (!g_.json) std::cout << "stopped the watch " << name_ << std::endl;
  return kExitOk;
}

}  // namespace fwai
