#include "client/cli/hw.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/cli/fault.h"
#include "client/lib/client.h"
#include "common/clock.h"
#include "common/grpc_status.h"
#include "common/verdict.h"
#include "fwai/v1/hardware.grpc.pb.h"

namespace fwai {

namespace pb = fwai::v1;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::atomic<bool> g_interrupted{false};

void Tag(grpc::ClientContext& ctx) {
  ctx.AddMetadata("fwai-client", absl::StrCat("fwai pid ", getpid()));
}

std::string HourMinSec(int64_t us) { return FormatLocalTime(us, "%H:%M:%S"); }

void PrintJson(const google::protobuf::Message& m) {
  std::cout << ProtoToJson(m).dump() << std::endl;
}

// One tagged unary call on the Hardware stub.
template <typename Req, typename Resp>
grpc::Status Call(pb::Hardware::Stub& stub,
                  grpc::Status (pb::Hardware::Stub::*method)(grpc::ClientContext*, const Req&,
                                                             Resp*),
                  const Req& req, Resp* resp) {
  grpc::ClientContext ctx;
  Tag(ctx);
  return (stub.*method)(&ctx, req, resp);
}

}  // namespace

HwCommands::HwCommands(CLI::App& app, Globals& g) : g_(g) {
  auto* hw = app.add_subcommand("hw", "Boards and devices: list, lease, release, health");
  hw->require_subcommand(1);
  ls_ = hw->add_subcommand("ls", "Every device and board: kind, ids, health, holder");
  ls_->add_flag("--verbose,-v", verbose_,
                "When the lab's registry cannot be read: what each of its members answered");
  lease_ = hw->add_subcommand("lease", "Lease a board (or device) for yourself");
  lease_->add_option("board", board_, "Board or device id (or use --tag)");
  lease_->add_option("--tag", tags_, "Any free board with these tags (repeatable)")
      ->allow_extra_args(false);
  lease_->add_option(
      "--ttl", ttl_,
      "Seconds until the lease lapses without a renewal (default: the daemon's, 900)");
  lease_->add_option("--wait", wait_,
                     "Wait up to this many seconds for a held board (default: fail at once)");
  lease_->add_flag(
      "--hold", hold_,
      "Stay running; fwaid keeps the lease while this runs and releases it when it stops");
  lease_->add_option("--session", session_,
                     "Bind the lease to a session (released when it is deleted)");
  release_ =
      hw->add_subcommand("release", "Release your lease (admins: --force releases anyone's)");
  release_->add_option("board", board_, "Board or device id");
  release_->add_flag("--force", force_,
                     "Take another holder's lease away (root or the daemon's user)");
  who_ =
      hw->add_subcommand("who", "Who holds what since when, and who waits for it (in queue order)");
  test_ = hw->add_subcommand("test", "Run a board's self-test; its health follows the result");
  test_->add_option("board", board_, "Board id");
  health_ = hw->add_subcommand("health", "Set a board's health (root or the daemon's user)");
  health_->add_option("board", board_, "Board id")->required();
  health_
      ->add_option("state", state_,
                   "good | bad | maintenance | quarantined (good returns a quarantined board)")
      ->required()
      ->check(CLI::IsMember({"good", "bad", "maintenance", "quarantined"}));
  health_->add_option("--reason", reason_, "Why");
  reset_ = hw->add_subcommand("reset", "Reset a board you hold");
  reset_->add_option("board", board_, "Board id");

  monitor_ = app.add_subcommand("monitor",
                                "Read a board's serial output (and send commands with the lease)");
  monitor_->add_option("board", board_, "Board id (default: your leased board, or the only one)");
  monitor_->add_option("--until", until_, "Exit 0 when a line matches this regex");
  monitor_->add_option("--timeout", timeout_,
                       "Give up after this many seconds (exit 1 with --until)");
  monitor_
      ->add_option("--send", send_, "Send this line after opening (repeatable; needs the lease)")
      ->allow_extra_args(false);
  monitor_->add_flag("--history", history_, "Start with the buffered history");
  rtt_opt_ = monitor_
                 ->add_option("--rtt", rtt_,
                              "Read RTT up-channel N (default 0) instead of the serial port; "
                              "--send writes to down-channel N (give the board first)")
                 ->expected(0, 1)
                 ->check(CLI::NonNegativeNumber);
  monitor_
      ->add_flag("--semihosting", semihosting_,
                 "Read the firmware's semihosting console (a simulated board configured with "
                 "semihosting: true)")
      ->excludes(rtt_opt_);

  flash_ =
      app.add_subcommand("flash", "Flash an image to a board you hold, behind the flash guard");
  flash_->add_option("args", positional_, "[BOARD] [IMAGE.elf]");
  flash_->add_flag("--yes,-y", yes_, "Approve without asking");
  flash_->add_option("--project-root", project_root_,
                     "Where the image's sources are (default: found above it)");

  debug_ = app.add_subcommand("debug", "Run GDB commands on a board you hold");
  debug_
      ->add_option("args", positional_,
                   "[BOARD] CMD... (quote multi-word commands: 'print counter')")
      ->required();
  debug_->add_option("--timeout", debug_timeout_, "Seconds per command (default 10)");
  debug_->add_option("--save", save_,
                     "Also capture the stopped core (registers, fault status, RAM, the serial "
                     "lines before) into this file, for `fwai fault decode`");
}

std::optional<int> HwCommands::RunIfParsed() {
  if (ls_->parsed()) return Ls();
  if (lease_->parsed()) return Lease();
  if (release_->parsed()) return Release();
  if (who_->parsed()) return Who();
  if (test_->parsed()) return Test();
  if (health_->parsed()) return Health();
  if (reset_->parsed()) return Reset();
  if (monitor_->parsed()) return Monitor();
  if (flash_->parsed()) return Flash();
  if (debug_->parsed()) return Debug();
  return std::nullopt;
}

#define CONNECT_OR_FAIL(stub)                                                            \
  auto ch_ = ConnectChannel(g_);                                                         \
  if (!ch_.ok()) return Fail(g_, kExitUnreachable, std::string(ch_.status().message())); \
  auto stub = pb::Hardware::NewStub(*ch_)

int HwCommands::Ls() {
  CONNECT_OR_FAIL(stub);
  pb::ListDevicesResponse resp;
  auto st = Call(*stub, &pb::Hardware::Stub::ListDevices, pb::ListDevicesRequest(), &resp);
  if (!st.ok()) return FailGrpc(g_, st);
  if (g_.json) {
    for (const auto& d : resp.devices()) PrintJson(d);
    return kExitOk;
  }
  if (!resp.lab_error().empty()) {
    std::fprintf(
        stderr,
        "warning: the lab's registry cannot be read (%s); only this node's devices are listed\n",
        resp.lab_error().c_str());
    if (verbose_) {
      for (const auto& m : resp.lab_error_detail()) std::fprintf(stderr, "  etcd %s\n", m.c_str());
    } else if (!resp.lab_error_detail().empty()) {
      std::fprintf(stderr, "  (fwai hw ls --verbose: what each member answered)\n");
    }
  }
  // In a lab, the node (bench host) each board is attached to.
  bool lab = false;
  for (const auto& d : resp.devices()) lab = lab || !d.node().empty();
  if (lab) std::printf("%-12s ", "NODE");
  std::printf("%-22s %-10s %-12s %-26s %s\n", "ID", "KIND", "HEALTH", "HELD BY", "DETAILS");
  for (const auto& d : resp.devices()) {
    if (lab) std::printf("%-12s ", d.node().c_str());
    std::string details = d.name();
    if (!d.vid_pid().empty()) absl::StrAppend(&details, " [", d.vid_pid(), "]");
    if (!d.serial_number().empty()) absl::StrAppend(&details, " sn ", d.serial_number());
    if (!d.path().empty()) absl::StrAppend(&details, " ", d.path());
    if (d.kind() == "simulated" || d.kind() == "board") {
      absl::StrAppend(&details, " ",
                      d.state().empty() ? (d.running() ? "running" : "stopped") : d.state());
      if (!d.image().empty())
        absl::StrAppend(&details, " ", fs::path(d.image()).filename().string());
      // Its firmware's RTT channels (fwai monitor BOARD --rtt N).
      std::vector<std::string> rtt;
      for (const auto& s : d.streams()) {
        if (s.id() != "uart") rtt.push_back(s.name().empty() ? s.id() : s.id() + " " + s.name());
      }
      if (!rtt.empty()) absl::StrAppend(&details, " [", absl::StrJoin(rtt, ", "), "]");
    }
    std::string health = d.health();
    if (!d.health_reason().empty()) absl::StrAppend(&health, " (", d.health_reason(), ")");
    std::string holder = d.holder().empty()
                             ? "-"
                             : absl::StrCat(d.holder(), " since ", HourMinSec(d.held_since_us()));
    std::printf("%-22s %-10s %-12s %-26s %s\n", d.id().c_str(), d.kind().c_str(),
                d.health().c_str(), holder.c_str(), details.c_str());
    if (!d.health_reason().empty())
      std::printf("%-*s%-22s   %s\n", lab ? 13 : 0, "", "", d.health_reason().c_str());
  }
  return kExitOk;
}

void AddBoardTags(const std::vector<std::string>& tags, pb::AcquireRequest* req) {
  for (const auto& t : tags) {
    auto* tag = req->add_tags();
    auto c = t.find(':');
    tag->set_key(c == std::string::npos ? t : t.substr(0, c));
    if (c != std::string::npos) tag->set_value(t.substr(c + 1));
  }
}

int HwCommands::Lease() {
  if (board_.empty() && tags_.empty()) return Fail(g_, kExitUsage, "name a board, or give --tag");
  CONNECT_OR_FAIL(stub);
  pb::AcquireRequest req;
  req.set_device_id(board_);
  AddBoardTags(tags_, &req);
  req.set_ttl_s(ttl_);
  req.set_wait_s(wait_);
  req.set_session_id(session_);
  if (wait_ > 0 && !g_.json)
    std::fprintf(stderr, "waiting up to %d s for %s...\n", wait_,
                 board_.empty() ? "a board" : board_.c_str());
  auto print = [&](const pb::Lease& lease) {
    if (g_.json) {
      PrintJson(lease);
    } else {
      std::printf("leased %s (lease %s, ttl %d s, expires %s)\n", lease.device_id().c_str(),
                  lease.lease_id().c_str(), lease.ttl_s(), HourMinSec(lease.expires_us()).c_str());
    }
    std::fflush(stdout);
  };
  if (!hold_) {
    pb::Lease lease;
    auto st = Call(*stub, &pb::Hardware::Stub::Acquire, req, &lease);
    if (!st.ok()) return FailGrpc(g_, st);
    print(lease);
    return kExitOk;
  }
  // Held by this stream: renewed by fwaid while it is open, released the
  // moment it ends (Ctrl-C, or this process dying).
  grpc::ClientContext ctx;
  Tag(ctx);
  static grpc::ClientContext* active = nullptr;
  active = &ctx;
  struct sigaction sa {};
  sa.sa_handler = [](int) {
    g_interrupted = true;
    if (active) active->TryCancel();
  };
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  auto reader = stub->Hold(&ctx, req);
  pb::Lease lease;
  if (!reader->Read(&lease)) {
    active = nullptr;
    return FailGrpc(g_, reader->Finish());
  }
  print(lease);
  while (reader->Read(&lease)) {
  }
  auto st = reader->Finish();
  active = nullptr;
  if (g_interrupted) {
    if (!g_.json) std::printf("released %s\n", lease.device_id().c_str());
    return kExitOk;
  }
  return Fail(g_, kExitError,
              absl::StrCat("lost the lease on ", lease.device_id(), ": ", st.error_message()));
}

int HwCommands::Release() {
  CONNECT_OR_FAIL(stub);
  if (board_.empty()) {
    // The caller's only lease.
    pb::ListDevicesResponse resp;
    auto st = Call(*stub, &pb::Hardware::Stub::ListDevices, pb::ListDevicesRequest(), &resp);
    if (!st.ok()) return FailGrpc(g_, st);
    if (resp.leases_size() == 1) board_ = resp.leases(0).device_id();
    if (board_.empty()) return Fail(g_, kExitUsage, "name the board to release");
  }
  pb::ReleaseRequest req;
  req.set_device_id(board_);
  req.set_force(force_);
  pb::ReleaseResponse resp;
  auto st = Call(*stub, &pb::Hardware::Stub::Release, req, &resp);
  if (!st.ok()) return FailGrpc(g_, st);
  if (g_.json) {
    std::cout << json{{"released", board_}}.dump() << std::endl;
  } else {
    std::printf("released %s\n", board_.c_str());
  }
  return kExitOk;
}

int HwCommands::Who() {
  CONNECT_OR_FAIL(stub);
  pb::WhoResponse resp;
  auto st = Call(*stub, &pb::Hardware::Stub::Who, pb::WhoRequest(), &resp);
  if (!st.ok()) return FailGrpc(g_, st);
  if (g_.json) {
    // One line per lease (as before), then one per waiter, earliest first.
    for (const auto& l : resp.leases()) PrintJson(l);
    for (const auto& w : resp.waiters()) {
      nlohmann::json j = ProtoToJson(w);
      j["waiting"] = true;
      std::cout << j.dump() << std::endl;
    }
    return kExitOk;
  }
  if (resp.leases_size() == 0) std::printf("no leases\n");
  // In a lab, the node each board is on (leases) and the node each waiter came through.
  bool lab = false;
  for (const auto& l : resp.leases()) lab = lab || !l.node().empty();
  for (const auto& w : resp.waiters()) lab = lab || !w.node().empty();
  if (resp.leases_size() > 0) {
    if (lab) std::printf("%-12s ", "NODE");
    std::printf("%-22s %-34s %-9s %-9s %s\n", "DEVICE", "HOLDER", "SINCE", "EXPIRES", "LEASE");
    bool tokens = false;
    for (const auto& l : resp.leases()) {
      if (lab) std::printf("%-12s ", l.node().c_str());
      std::printf("%-22s %-34s %-9s %-9s %s%s%s\n", l.device_id().c_str(), l.holder().c_str(),
                  HourMinSec(l.acquired_us()).c_str(), HourMinSec(l.expires_us()).c_str(),
                  l.lease_id().c_str(),
                  l.session_id().empty() ? "" : (" session " + l.session_id()).c_str(),
                  l.token_id().empty() ? "" : (" token " + l.token_id()).c_str());
      tokens = tokens || !l.token_id().empty();
    }
    if (tokens) {
      std::printf(
          "\nA lease taken with a token ends at once when that token is revoked (fwai token "
          "revoke);\nan expired token renews nothing, so its lease ends at EXPIRES.\n");
    }
  }
  if (resp.waiters_size() > 0) {
    std::printf("\n%-4s ", "POS");
    if (lab) std::printf("%-12s ", "VIA");
    std::printf("%-22s %-34s %-9s %s\n", "WANTS", "WAITING", "SINCE", "GIVES UP");
    for (const auto& w : resp.waiters()) {
      std::printf("%-4d ", w.position());
      if (lab) std::printf("%-12s ", w.node().c_str());
      std::printf("%-22s %-34s %-9s %s\n", w.wants().c_str(), w.holder().c_str(),
                  HourMinSec(w.since_us()).c_str(), HourMinSec(w.until_us()).c_str());
    }
  }
  return kExitOk;
}

int HwCommands::Test() {
  CONNECT_OR_FAIL(stub);
  pb::SelfTestRequest req;
  req.set_device_id(board_);
  pb::SelfTestResponse resp;
  auto st = Call(*stub, &pb::Hardware::Stub::SelfTest, req, &resp);
  if (!st.ok()) return FailGrpc(g_, st);
  if (g_.json) {
    PrintJson(resp);
  } else {
    std::printf("self-test passed: %s\n", resp.report().c_str());
  }
  return kExitOk;
}

int HwCommands::Health() {
  CONNECT_OR_FAIL(stub);
  pb::SetHealthRequest req;
  req.set_device_id(board_);
  req.set_health(state_);
  req.set_reason(reason_);
  pb::SetHealthResponse resp;
  auto st = Call(*stub, &pb::Hardware::Stub::SetHealth, req, &resp);
  if (!st.ok()) return FailGrpc(g_, st);
  if (!g_.json) std::printf("%s is now %s\n", board_.c_str(), state_.c_str());
  return kExitOk;
}

int HwCommands::Reset() {
  CONNECT_OR_FAIL(stub);
  pb::ResetRequest req;
  req.set_device_id(board_);
  pb::ResetResponse resp;
  auto st = Call(*stub, &pb::Hardware::Stub::Reset, req, &resp);
  if (!st.ok()) return FailGrpc(g_, st);
  if (!g_.json) std::printf("reset %s\n", board_.empty() ? "the board" : board_.c_str());
  return kExitOk;
}

int HwCommands::Monitor() {
  std::regex until;
  if (!until_.empty()) {
    try {
      until = std::regex(until_);
    } catch (const std::regex_error& e) {
      return Fail(g_, kExitUsage,
                  absl::StrCat("--until: not a valid regular expression: ", e.what()));
    }
  }
  CONNECT_OR_FAIL(stub);
  grpc::ClientContext ctx;
  Tag(ctx);
  if (timeout_ > 0) {
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(timeout_ * 1000)));
  }
  auto stream = stub->Serial(&ctx);
  pb::SerialClientMessage open;
  open.mutable_open()->set_device_id(board_);
  open.mutable_open()->set_from_history(history_);
  if (rtt_opt_->count() > 0) {
    open.mutable_open()->set_stream(absl::StrCat("rtt:", rtt_.empty() ? 0u : rtt_[0]));
  }
  if (semihosting_) open.mutable_open()->set_stream("semihosting");
  if (!stream->Write(open)) return FailGrpc(g_, stream->Finish());
  // Ctrl-C ends the monitor cleanly.
  static grpc::ClientContext* active = nullptr;
  active = &ctx;
  struct sigaction sa {};
  sa.sa_handler = [](int) {
    g_interrupted = true;
    if (active) active->TryCancel();
  };
  sigaction(SIGINT, &sa, nullptr);
  pb::SerialServerMessage m;
  bool matched = false;
  bool refused = false;
  std::string end_reason;
  std::string board;
  while (stream->Read(&m)) {
    if (!m.opened().empty()) {
      board = m.opened();
      const std::string what =
          m.stream().empty() || m.stream() == "uart" ? board : board + " " + m.stream();
      if (!g_.json && isatty(2))
        std::fprintf(stderr, "monitoring %s (Ctrl-C to stop)\n", what.c_str());
      for (const auto& s : send_) {
        pb::SerialClientMessage w;
        w.set_send_line(s);
        stream->Write(w);
      }
      continue;
    }
    if (!m.error().empty()) {
      if (g_.json) {
        std::cout << json{{"error", m.error()}}.dump() << std::endl;
      } else {
        std::fprintf(stderr, "fwai: %s\n", m.error().c_str());
      }
      refused = true;
      ctx.TryCancel();
      break;
    }
    if (m.end_of_stream()) {
      end_reason = m.reason();
      break;
    }
    if (m.dropped() > 0)
      std::fprintf(stderr, "fwai: %llu lines dropped (this reader fell behind)\n",
                   static_cast<unsigned long long>(m.dropped()));
    for (const auto& l : m.lines()) {
      if (l.notice()) {  // fwaid's word about the board, not its output
        if (g_.json)
          std::cout << json{{"time_us", l.time_us()}, {"notice", l.line()}}.dump() << "\n";
        else
          std::fprintf(stderr, "fwai: %s\n", l.line().c_str());
        continue;
      }
      if (g_.json) {
        std::cout << json{{"time_us", l.time_us()}, {"seq", l.seq()}, {"line", l.line()}}.dump()
                  << "\n";
      } else {
        std::cout << l.line() << "\n";
      }
      if (!until_.empty() && std::regex_search(l.line(), until)) {
        matched = true;
        break;
      }
    }
    std::cout.flush();
    if (matched) {
      ctx.TryCancel();
      break;
    }
  }
  stream->WritesDone();
  auto st = stream->Finish();
  active = nullptr;
  if (matched) return kExitOk;
  if (refused) return kExitError;
  if (!end_reason.empty()) {
    if (g_.json)
      std::cout << json{{"end_of_stream", true}, {"reason", end_reason}}.dump() << std::endl;
    return Fail(g_, kExitError, absl::StrCat("serial stream ended: ", end_reason));
  }
  if (g_interrupted) return kExitOk;
  if (st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    if (until_.empty()) return kExitOk;
    return Fail(g_, kExitError, absl::StrCat("'", until_, "' not seen within ", timeout_, " s"));
  }
  if (!st.ok() && st.error_code() != grpc::StatusCode::CANCELLED) return FailGrpc(g_, st);
  return kExitOk;
}

int HwCommands::Flash() {
  std::string board, image;
  for (const auto& p : positional_) {
    std::error_code ec;
    if (image.empty() && (p.ends_with(".elf") || fs::is_regular_file(p, ec))) {
      image = p;
    } else if (board.empty()) {
      board = p;
    } else {
      return Fail(
          g_, kExitUsage,
          absl::StrCat("unexpected argument '", p, "' (usage: fwai flash [BOARD] [IMAGE.elf])"));
    }
  }
  if (image.empty()) {
    std::vector<std::string> found;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator("build", ec)) {
      if (e.path().extension() == ".elf") found.push_back(e.path().string());
    }
    if (found.size() != 1) {
      return Fail(g_, kExitUsage,
                  found.empty() ? "no image given and no build/*.elf here"
                                : "several build/*.elf here; name the image");
    }
    image = found[0];
  }
  std::error_code ec;
  fs::path abs = fs::absolute(image, ec);
  bool approved = yes_;
  if (!approved && isatty(0) && isatty(2) && !g_.json) {
    std::fprintf(stderr, "Flash %s to %s? [y/N] ", abs.c_str(),
                 board.empty() ? "your board" : board.c_str());
    std::string answer;
    std::getline(std::cin, answer);
    approved = answer == "y" || answer == "Y" || answer == "yes";
    if (!approved) return Fail(g_, kExitError, "not flashed (not confirmed)");
  }
  CONNECT_OR_FAIL(stub);
  grpc::ClientContext ctx;
  Tag(ctx);
  pb::FlashRequest req;
  req.set_device_id(board);
  req.set_image_path(abs.string());
  req.set_approved(approved);
  if (!project_root_.empty()) req.set_project_root(fs::absolute(project_root_, ec).string());
  auto reader = stub->Flash(&ctx, req);
  pb::FlashProgress p;
  pb::FlashProgress last;
  while (reader->Read(&p)) {
    if (g_.json) {
      PrintJson(p);
    } else if (!p.done()) {
      std::printf("[%-7s %3.0f%%] %s\n", p.stage().c_str(), p.fraction() * 100,
                  p.message().c_str());
      std::fflush(stdout);
    }
    if (p.done()) last = p;
  }
  auto st = reader->Finish();
  if (!st.ok()) {
    // Whose failure it was, when fwaid says: the exit code tells CI (docs/hil.md).
    const std::string verdict = VerdictOf(st);
    if (verdict.empty()) return FailGrpc(g_, st);
    if (g_.json) {
      std::cout << json({{"type", "error"},
                         {"message", st.error_message()},
                         {"verdict", verdict},
                         {"exit_code", VerdictExitCode(verdict)}})
                       .dump()
                << std::endl;
    }
    std::cerr << "fwai: flash failed (verdict " << verdict << "): " << st.error_message()
              << std::endl;
    return VerdictExitCode(verdict);
  }
  if (!g_.json) {
    std::printf(
        "%s: sha256 %s, %.2f s%s\n", last.message().c_str(), last.image_sha256().c_str(),
        last.seconds(),
        last.boot_line().empty() ? "" : absl::StrCat(", booted: ", last.boot_line()).c_str());
  }
  return kExitOk;
}

int HwCommands::Debug() {
  CONNECT_OR_FAIL(stub);
  std::vector<std::string> cmds = positional_;
  std::string board;
  if (cmds.size() > 1) {
    pb::ListDevicesResponse resp;
    if (Call(*stub, &pb::Hardware::Stub::ListDevices, pb::ListDevicesRequest(), &resp).ok()) {
      for (const auto& d : resp.devices()) {
        if (d.id() == cmds[0]) {
          board = cmds[0];
          cmds.erase(cmds.begin());
          break;
        }
      }
    }
  }
  if (!save_.empty() && std::find(cmds.begin(), cmds.end(), "capture") == cmds.end())
    cmds.push_back("capture");
  pb::DebugRequest req;
  req.set_device_id(board);
  for (const auto& c : cmds) req.add_commands(c);
  req.set_timeout_s(debug_timeout_);
  pb::DebugResponse resp;
  auto st = Call(*stub, &pb::Hardware::Stub::Debug, req, &resp);
  if (!st.ok()) return FailGrpc(g_, st);
  if (!save_.empty()) {
    json results = json::parse(resp.result_json(), nullptr, false);
    const json* capture = nullptr;
    for (const auto& r : results)
      if (r.is_object() && r.contains("capture")) capture = &r["capture"];
    if (!capture) {
      for (const auto& o : resp.outputs()) std::cerr << o << std::endl;
      return Fail(g_, kExitError, "no capture was taken");
    }
    if (int rc = SaveCapture(g_, save_, capture->dump()); rc != kExitOk) return rc;
  }
  if (g_.json) {
    json results = json::parse(resp.result_json(), nullptr, false);
    for (const auto& r : results) std::cout << r.dump() << std::endl;
    return kExitOk;
  }
  bool any_error = false;
  for (int i = 0; i < resp.outputs_size(); ++i) {
    if (cmds.size() > 1)
      std::printf("(gdb) %s\n", i < static_cast<int>(cmds.size()) ? cmds[i].c_str() : "");
    std::printf("%s\n", resp.outputs(i).c_str());
    any_error |= resp.outputs(i).rfind("error: ", 0) == 0;
  }
  return any_error ? kExitError : kExitOk;
}

}  // namespace fwai
