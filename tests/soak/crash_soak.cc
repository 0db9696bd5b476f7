// fwai_crash_soak: runs a real fwaid on one data directory under load and
// kills it with SIGKILL, cycle after cycle, restarting it each time and
// checking that nothing it acknowledged was lost.
//
// The load, all at once against the daemon:
//   chat      three sessions holding turns against the fake provider (text
//             and tool calls); an event is acknowledged when the client read it
//   kb        `fwai kb add` of a new Markdown file; acknowledged when it exits 0
//   skills    `fwai run soak --ci` (a shell step; the run's evidence record is
//             written before it returns); acknowledged with its run id
//   leases    `fwai hw lease` / `fwai hw release` of the simulated board in turn
//
// The kill is not timed: each cycle draws (seeded) one kind of acknowledgement
// and a count k, and the daemon is killed by the thread that receives the k-th
// one, right after it was received. After each restart every acknowledged item
// of every earlier cycle is checked: each event is stored under its seq with
// the same content (a coalesced text delta against the stored deltas it
// merged), each turn with an acknowledged event has ended (normally, or
// "interrupted" by the kill), the sessions' event logs have no gap, each
// document is listed (and this cycle's are found by search), each run is in
// the evidence log, a lease held is still held by the same lease and a lease
// released is not back, and `fwai evidence verify` passes.
//
//   fwai_crash_soak [--cycles N] [--seed S] [--verbose] [--json FILE]
//
// Prints cycles run, records checked and losses; exits 1 on any loss or error.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/bench/bench_report.h"
#include "tests/fakes/fake_llm_server.h"
#include "tests/integration/daemon_fixture.h"

namespace fwai::testing {
namespace {

namespace fs = std::filesystem;
namespace pb = fwai::v1;
using json = nlohmann::json;

constexpr int kChatSessions = 3;
constexpr char kBoard[] = "sim-stm32vl";

enum Kind { kEvent = 0, kDocument, kRun, kLeaseOp, kKinds };
const char* const kKindNames[] = {"event", "document", "skill run", "lease operation"};
// The k of each kind's kill is drawn from 1..kMaxK[kind].
const int kMaxK[] = {240, 3, 3, 4};

enum class LeaseState { kFree, kHeld, kUnknown };

struct AckedEvent {
  uint64_t seq;
  std::string bytes;
};

// What the daemon acknowledged, over all cycles.
struct Ledger {
  std::mutex mu;
  std::map<std::string, std::vector<AckedEvent>> events;           // session -> in order received
  std::map<std::string, std::set<std::string>> turns;              // session -> turn ids
  std::vector<std::string> documents;                              // file names
  std::vector<std::pair<std::string, std::string>> new_documents;  // this cycle: (name, token)
  std::vector<std::string> runs;                                   // run ids
  LeaseState lease = LeaseState::kFree;
  std::string lease_id;
  uint64_t acked[kKinds] = {};
};

// Fires SIGKILL at the daemon on the k-th acknowledgement of one kind.
struct KillTrigger {
  Kind kind = kEvent;
  int k = 1;
  pid_t pid = -1;
  std::atomic<int> counts[kKinds] = {};
  std::atomic<bool> fired{false};

  void Ack(Kind what) {
    const int n = ++counts[what];
    if (what == kind && n == k && !fired.exchange(true)) kill(pid, SIGKILL);
  }
};

struct Totals {
  uint64_t checked = 0;      // individual checks of acknowledged items
  uint64_t losses = 0;       // acknowledged items missing or changed after a restart
  uint64_t errors = 0;       // anything else wrong (a failed verify, a turn ending in error, ...)
  uint64_t interrupted = 0;  // turns found ended as "interrupted"
};

class Soak {
 public:
  Soak(uint64_t seed, bool verbose) : rng_(seed), seed_(seed), verbose_(verbose) {}

  int Run(int cycles) {
    signal(SIGPIPE, SIG_IGN);
    if (fake_.Start() <= 0) return Fatal("the fake provider did not start");
    daemon_ = std::make_unique<Daemon>(&fake_, "log_level: warn\n");
    project_ = daemon_->dir() + "/blinky";
    std::error_code ec;
    fs::copy(FWAI_EXAMPLES_DIR "/stm32vl-blinky", project_, fs::copy_options::recursive, ec);
    if (ec) return Fatal("cannot copy the example project: " + ec.message());
    fs::remove_all(project_ + "/build", ec);
    fs::remove_all(project_ + "/.fwai/runs", ec);
    fs::create_directories(project_ + "/.fwai/skills");
    std::ofstream(project_ + "/.fwai/skills/soak.yaml")
        << "name: soak\nsteps:\n  - name: note\n    tool: shell\n    command: echo soak "
           "${RUN_ID}\n";
    docs_dir_ = daemon_->dir() + "/docs";
    fs::create_directories(docs_dir_);
    std::printf("fwai_crash_soak: seed %llu, %d cycles, data dir %s\n",
                static_cast<unsigned long long>(seed_), cycles, daemon_->data_dir().c_str());
    if (!daemon_->Start()) return Fatal("fwaid did not start:\n" + daemon_->log());
    for (int i = 0; i < kChatSessions; ++i) {
      auto s = daemon_->CreateSession();
      if (s.id().rfind("s-", 0) != 0) return Fatal("cannot create a session: " + s.id());
      sessions_.push_back(s.id());
    }
    int cycle = 0;
    for (; cycle < cycles; ++cycle) {
      if (!LoadAndKill(cycle)) break;
      if (!daemon_->Start()) {
        ++totals_.errors;
        std::printf("cycle %d: fwaid did not start again after the kill:\n%s\n", cycle + 1,
                    LogTail().c_str());
        break;
      }
      Verify(cycle);
    }
    // A clean stop at the end, then one more look.
    const int rc = daemon_->Stop();
    if (rc != 0) {
      ++totals_.errors;
      std::printf("fwaid exited %d on SIGTERM\n", rc);
    }
    clean_stop_ = true;
    if (daemon_->Start()) {
      Verify(cycle);
      daemon_->Stop();
    } else {
      ++totals_.errors;
      std::printf("fwaid did not start after the clean stop:\n%s\n", LogTail().c_str());
    }
    std::printf(
        "RESULT crash_soak cycles=%d kills=%d records_checked=%llu losses=%llu errors=%llu "
        "(acknowledged: %llu events "
        "in %zu turns, %llu documents, %llu skill runs, %llu lease operations; %llu turns ended "
        "interrupted; seed %llu)\n",
        cycle, cycle, static_cast<unsigned long long>(totals_.checked),
        static_cast<unsigned long long>(totals_.losses),
        static_cast<unsigned long long>(totals_.errors),
        static_cast<unsigned long long>(ledger_.acked[kEvent]), TurnCount(),
        static_cast<unsigned long long>(ledger_.acked[kDocument]),
        static_cast<unsigned long long>(ledger_.acked[kRun]),
        static_cast<unsigned long long>(ledger_.acked[kLeaseOp]),
        static_cast<unsigned long long>(totals_.interrupted),
        static_cast<unsigned long long>(seed_));
    ReportTotals(cycle);
    if (totals_.losses > 0 || totals_.errors > 0 || cycle < cycles) {
      std::printf("FAILED (keep the data dir with FWAI_KEEP_TEST_DIRS=1; fwaid's log:)\n%s\n",
                  LogTail().c_str());
      return 1;
    }
    return 0;
  }

 private:
  int Fatal(const std::string& what) {
    std::fprintf(stderr, "fwai_crash_soak: %s\n", what.c_str());
    return 1;
  }

  std::string LogTail() const {
    std::string log = daemon_->log();
    return log.size() > 4000 ? log.substr(log.size() - 4000) : log;
  }

  // The run's figures for the results file: the losses, with what was checked.
  void ReportTotals(int cycles) {
    auto& r = Report().Add(
        "crash_soak", "records lost after SIGKILL and restart",
        absl::StrCat(cycles,
                     " cycles (kills) under load: 3 sessions' turns, kb add, skill runs, "
                     "lease operations; seed ",
                     seed_),
        static_cast<double>(totals_.losses), "lost");
    r["target"] = "0";
    auto n = [](const char* label, uint64_t v) {
      return BenchReport::Json{{"label", label}, {"value", v}, {"unit", ""}};
    };
    r["also"] = {n("records checked", totals_.checked),
                 n("errors", totals_.errors),
                 n("events acknowledged", ledger_.acked[kEvent]),
                 n("turns", TurnCount()),
                 n("ended interrupted", totals_.interrupted),
                 n("documents", ledger_.acked[kDocument]),
                 n("skill runs", ledger_.acked[kRun]),
                 n("lease operations", ledger_.acked[kLeaseOp])};
  }

  size_t TurnCount() {
    size_t n = 0;
    for (const auto& [s, t] : ledger_.turns) n += t.size();
    return n;
  }

  int Fwai(std::vector<std::string> args, std::string* out, std::string* err = nullptr) {
    std::vector<std::string> argv = {std::string(FWAI_BIN_DIR) + "/fwai", "--daemon",
                                     daemon_->address(), "--project", project_};
    argv.insert(argv.end(), args.begin(), args.end());
    std::string o, e;
    const int rc = RunCommand(argv, &o, &e, {}, 120);
    if (out) *out = o;
    if (err) *err = e;
    return rc;
  }

  void Error(int cycle, const std::string& what) {
    std::lock_guard<std::mutex> lock(print_mu_);
    ++totals_.errors;
    std::printf("cycle %d: ERROR %s\n", cycle + 1, what.c_str());
  }

  void Loss(int cycle, const std::string& what) {
    std::lock_guard<std::mutex> lock(print_mu_);
    ++totals_.losses;
    std::printf("cycle %d: LOST %s\n", cycle + 1, what.c_str());
  }

  // ---- load ----------------------------------------------------------------

  // One turn's replies: sometimes a tool call first (the history then holds a
  // tool_use and its result), then text streamed in small chunks.
  void EnqueueTurn(std::mt19937_64& rng) {
    if (rng() % 3 == 0) {
      FakeReply tool;
      tool.tool_calls = {
          {"call-" + std::to_string(rng() % 1000000),
           "todoWrite",
           {{"todos", {{{"id", "a"}, {"content", "soak"}, {"status", "in_progress"}}}}}}};
      fake_.Enqueue(tool);
    }
    FakeReply text;
    const int chunks = 10 + static_cast<int>(rng() % 30);
    for (int i = 0; i < chunks; ++i) text.chunks.push_back(absl::StrCat("word", i, " "));
    text.chunk_delay_ms = 1 + static_cast<int>(rng() % 3);
    fake_.Enqueue(text);
  }

  void ChatLoop(int cycle, int idx, uint64_t seed, std::shared_ptr<grpc::Channel> channel,
                KillTrigger* trigger) {
    std::mt19937_64 rng(seed);
    const std::string& session = sessions_[idx];
    auto stub = pb::Sessions::NewStub(channel);
    for (int n = 0; !trigger->fired; ++n) {
      EnqueueTurn(rng);
      const std::string turn_id = absl::StrCat("c", cycle + 1, "-s", idx, "-t", n);
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
      auto stream = OpenChat(*stub, &ctx, session, "soak turn " + turn_id, "", turn_id);
      pb::ServerEvent ev;
      std::string stop_reason;
      bool finished = false;
      while (stream->Read(&ev)) {
        {
          std::lock_guard<std::mutex> lock(ledger_.mu);
          ledger_.events[session].push_back({ev.seq(), ev.SerializeAsString()});
          if (!ev.turn_id().empty()) ledger_.turns[session].insert(ev.turn_id());
          ++ledger_.acked[kEvent];
        }
        trigger->Ack(kEvent);
        if (ev.has_turn_finished() && ev.turn_id() == turn_id) {
          stop_reason = ev.turn_finished().stop_reason();
          finished = true;
          break;
        }
      }
      stream->WritesDone();
      grpc::Status st = stream->Finish();
      if (!finished) {
        if (!trigger->fired)
          Error(cycle, absl::StrCat("turn ", turn_id, " broke off: ", st.error_message()));
        return;
      }
      if (stop_reason != "end_turn")
        Error(cycle, absl::StrCat("turn ", turn_id, " ended ", stop_reason));
    }
  }

  void KbLoop(int cycle, KillTrigger* trigger) {
    for (int n = 0; !trigger->fired; ++n) {
      const std::string token = absl::StrCat("soakdoc", cycle + 1, "n", n);
      const std::string name = token + ".md";
      std::ofstream(docs_dir_ + "/" + name)
          << "# Soak document " << cycle + 1 << "." << n << "\n\nThe register " << token
          << " holds the soak counter. It is written once a cycle and read back after each "
             "restart.\n\n"
          << "## Fields\n\nBits 0-7 count cycles; bits 8-15 count documents.\n";
      std::string out, err;
      const int rc = Fwai({"--json", "kb", "add", docs_dir_ + "/" + name}, &out, &err);
      if (rc != 0) {
        if (!trigger->fired) Error(cycle, absl::StrCat("kb add ", name, " exited ", rc, ": ", err));
        return;
      }
      {
        std::lock_guard<std::mutex> lock(ledger_.mu);
        ledger_.documents.push_back(name);
        ledger_.new_documents.push_back({name, token});
        ++ledger_.acked[kDocument];
      }
      trigger->Ack(kDocument);
    }
  }

  static json LastJsonLine(const std::string& out) {
    std::istringstream in(out);
    std::string line, last;
    while (std::getline(in, line)) {
      if (!line.empty()) last = line;
    }
    return json::parse(last, nullptr, false);
  }

  void RunLoop(int cycle, KillTrigger* trigger) {
    while (!trigger->fired) {
      std::string out, err;
      const int rc = Fwai({"--json", "run", "soak", "--ci"}, &out, &err);
      if (rc != 0) {
        if (!trigger->fired) Error(cycle, absl::StrCat("run soak exited ", rc, ": ", err));
        return;
      }
      json summary = LastJsonLine(out);
      const std::string run_id = summary.is_object() ? summary.value("run_id", "") : "";
      if (run_id.empty()) {
        Error(cycle, "run soak printed no run id: " + out);
        return;
      }
      {
        std::lock_guard<std::mutex> lock(ledger_.mu);
        ledger_.runs.push_back(run_id);
        ++ledger_.acked[kRun];
      }
      trigger->Ack(kRun);
    }
  }

  void LeaseLoop(int cycle, KillTrigger* trigger) {
    while (!trigger->fired) {
      LeaseState state;
      {
        std::lock_guard<std::mutex> lock(ledger_.mu);
        state = ledger_.lease;
        ledger_.lease = LeaseState::kUnknown;  // until this operation returns
      }
      std::string out, err;
      int rc;
      LeaseState next;
      std::string lease_id;
      if (state == LeaseState::kHeld) {
        rc = Fwai({"--json", "hw", "release", kBoard}, &out, &err);
        next = LeaseState::kFree;
      } else {
        rc = Fwai({"--json", "hw", "lease", kBoard, "--ttl", "3600"}, &out, &err);
        next = LeaseState::kHeld;
        json j = LastJsonLine(out);
        lease_id = j.is_object() ? j.value("lease_id", "") : "";
        if (rc == 0 && lease_id.empty()) {
          Error(cycle, "hw lease printed no lease id: " + out);
          return;
        }
      }
      if (rc != 0) {
        if (!trigger->fired) Error(cycle, absl::StrCat("hw lease/release exited ", rc, ": ", err));
        return;  // the state stays unknown: the restart finds out
      }
      {
        std::lock_guard<std::mutex> lock(ledger_.mu);
        ledger_.lease = next;
        ledger_.lease_id = lease_id;
        ++ledger_.acked[kLeaseOp];
      }
      trigger->Ack(kLeaseOp);
    }
  }

  bool LoadAndKill(int cycle) {
    KillTrigger trigger;
    trigger.kind = static_cast<Kind>(rng_() % kKinds);
    trigger.k = 1 + static_cast<int>(rng_() % kMaxK[trigger.kind]);
    trigger.pid = daemon_->pid();
    {
      std::lock_guard<std::mutex> lock(ledger_.mu);
      ledger_.new_documents.clear();
    }
    uint64_t before[kKinds];
    std::copy(std::begin(ledger_.acked), std::end(ledger_.acked), before);
    std::vector<std::thread> threads;
    for (int i = 0; i < kChatSessions; ++i) {
      threads.emplace_back(&Soak::ChatLoop, this, cycle, i, rng_(), daemon_->channel(), &trigger);
    }
    threads.emplace_back(&Soak::KbLoop, this, cycle, &trigger);
    threads.emplace_back(&Soak::RunLoop, this, cycle, &trigger);
    threads.emplace_back(&Soak::LeaseLoop, this, cycle, &trigger);
    // The load always makes progress, so the trigger fires; a daemon that
    // stops answering is an error, found by this bound.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (!trigger.fired && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    bool ok = true;
    if (!trigger.fired.exchange(true)) {
      Error(cycle, absl::StrCat("the load stalled: no ", kKindNames[trigger.kind], " number ",
                                trigger.k, " within 120 s"));
      ok = false;
    }
    daemon_->Kill9();
    for (auto& t : threads) t.join();
    std::printf(
        "cycle %d: killed at %s #%d; acknowledged %llu events, %llu documents, %llu runs, %llu "
        "lease ops\n",
        cycle + 1, kKindNames[trigger.kind], trigger.k,
        static_cast<unsigned long long>(ledger_.acked[kEvent] - before[kEvent]),
        static_cast<unsigned long long>(ledger_.acked[kDocument] - before[kDocument]),
        static_cast<unsigned long long>(ledger_.acked[kRun] - before[kRun]),
        static_cast<unsigned long long>(ledger_.acked[kLeaseOp] - before[kLeaseOp]));
    std::fflush(stdout);
    return ok;
  }

  // ---- checks after a restart ------------------------------------------------

  void VerifyEvents(int cycle, uint64_t* checked) {
    auto stub = daemon_->sessions();
    for (const auto& session : sessions_) {
      std::map<uint64_t, pb::ServerEvent> stored;
      std::map<std::string, std::string> finished;  // turn -> stop reason
      uint64_t expect = 1;
      for (auto& ev : ReadAll(*stub, session)) {
        if (ev.seq() != expect) {
          Error(cycle, absl::StrCat("session ", session, ": stored events jump from seq ",
                                    expect - 1, " to ", ev.seq()));
        }
        expect = ev.seq() + 1;
        if (ev.has_turn_finished()) finished[ev.turn_id()] = ev.turn_finished().stop_reason();
        stored[ev.seq()] = ev;
      }
      const auto& acked = ledger_.events[session];
      uint64_t prev = 0;
      for (const auto& a : acked) {
        ++*checked;
        auto it = stored.find(a.seq);
        if (it == stored.end()) {
          Loss(cycle, absl::StrCat("session ", session, ": acknowledged event seq ", a.seq,
                                   " is not stored"));
        } else if (it->second.SerializeAsString() != a.bytes) {
          // A client that fell behind gets adjacent text deltas merged into
          // one with the last one's seq: compare with the stored deltas.
          pb::ServerEvent got;
          got.ParseFromString(a.bytes);
          std::string text;
          for (auto j = stored.upper_bound(prev); j != stored.end() && j->first <= a.seq; ++j) {
            if (j->second.has_text_delta()) text += j->second.text_delta().text();
          }
          if (!got.has_text_delta() || text != got.text_delta().text()) {
            Loss(cycle, absl::StrCat("session ", session, ": event seq ", a.seq,
                                     " differs from what was acknowledged"));
          }
        }
        prev = a.seq;
      }
      for (const auto& turn : ledger_.turns[session]) {
        ++*checked;
        auto it = finished.find(turn);
        if (it == finished.end()) {
          Error(cycle, absl::StrCat("session ", session, ": turn ", turn,
                                    " never ended (no turn_finished)"));
        } else if (it->second == "interrupted") {
          ++interrupted_now_;
        } else if (it->second != "end_turn") {
          Error(cycle, absl::StrCat("session ", session, ": turn ", turn, " ended ", it->second));
        }
      }
    }
  }

  void VerifyDocuments(int cycle, uint64_t* checked) {
    std::string out, err;
    if (Fwai({"--json", "kb", "ls"}, &out, &err) != 0) {
      Error(cycle, "kb ls failed: " + err);
      return;
    }
    json docs = json::parse(out, nullptr, false);
    std::set<std::string> names;
    if (docs.is_array()) {
      for (const auto& d : docs) names.insert(fs::path(d.value("name", "")).filename().string());
    }
    for (const auto& name : ledger_.documents) {
      ++*checked;
      if (!names.count(name)) Loss(cycle, "document " + name + " is not listed by kb ls");
    }
    // The indexes are rebuilt or reloaded after a kill: this cycle's documents
    // are found by their own word.
    for (const auto& [name, token] : ledger_.new_documents) {
      ++*checked;
      if (Fwai({"--json", "kb", "search", token, "--mode", "lexical", "-n", "3"}, &out, &err) !=
              0 ||
          out.find(name) == std::string::npos) {
        Loss(cycle, absl::StrCat("document ", name, " is not found by searching for ", token, ": ",
                                 out, err));
      }
    }
  }

  void VerifyRuns(int cycle, uint64_t* checked) {
    std::string out, err;
    if (Fwai({"--json", "evidence", "ls", "-n", "0"}, &out, &err) != 0) {
      Error(cycle, "evidence ls failed: " + err);
      return;
    }
    std::set<std::string> ids;
    std::istringstream lines(out);
    for (std::string line; std::getline(lines, line);) {
      auto j = json::parse(line, nullptr, false);
      if (j.is_object()) ids.insert(j.value("run_id", ""));
    }
    for (const auto& run : ledger_.runs) {
      ++*checked;
      if (!ids.count(run)) Loss(cycle, "skill run " + run + " has no evidence record");
    }
    ++*checked;
    if (Fwai({"evidence", "verify"}, &out, &err) != 0)
      Error(cycle, "evidence verify failed: " + out + err);
  }

  void VerifyLease(int cycle, uint64_t* checked) {
    std::string out, err;
    if (Fwai({"--json", "hw", "who"}, &out, &err) != 0) {
      Error(cycle, "hw who failed: " + err);
      return;
    }
    std::string held_by;
    std::istringstream lines(out);
    for (std::string line; std::getline(lines, line);) {
      auto j = json::parse(line, nullptr, false);
      if (j.is_object() && j.value("device_id", "") == kBoard) held_by = j.value("lease_id", "");
    }
    ++*checked;
    switch (ledger_.lease) {
      case LeaseState::kHeld:
        if (held_by != ledger_.lease_id) {
          Loss(cycle, absl::StrCat("lease ", ledger_.lease_id, " on ", kBoard, " is gone (now: '",
                                   held_by, "')"));
        }
        break;
      case LeaseState::kFree:
        if (!held_by.empty())
          Error(cycle, absl::StrCat("released board ", kBoard, " is held again by ", held_by));
        break;
      case LeaseState::kUnknown:  // cut mid-operation: either outcome is right
        break;
    }
    ledger_.lease = held_by.empty() ? LeaseState::kFree : LeaseState::kHeld;
    ledger_.lease_id = held_by;
  }

  void Verify(int cycle) {
    uint64_t checked = 0;
    const uint64_t losses = totals_.losses, errors = totals_.errors;
    interrupted_now_ = 0;
    VerifyEvents(cycle, &checked);
    VerifyDocuments(cycle, &checked);
    VerifyRuns(cycle, &checked);
    VerifyLease(cycle, &checked);
    totals_.checked += checked;
    totals_.interrupted = std::max<uint64_t>(totals_.interrupted, interrupted_now_);
    if (verbose_ || totals_.losses != losses || totals_.errors != errors) {
      std::printf(
          "%s %d: after restart checked %llu records, %llu lost, %llu errors, %llu turns "
          "interrupted so far\n",
          clean_stop_ ? "after the clean stop, cycle" : "cycle", cycle + (clean_stop_ ? 0 : 1),
          static_cast<unsigned long long>(checked),
          static_cast<unsigned long long>(totals_.losses - losses),
          static_cast<unsigned long long>(totals_.errors - errors),
          static_cast<unsigned long long>(interrupted_now_));
    }
    std::fflush(stdout);
  }

  std::mt19937_64 rng_;
  const uint64_t seed_;
  const bool verbose_;
  FakeLlmServer fake_;
  std::unique_ptr<Daemon> daemon_;
  std::string project_, docs_dir_;
  std::vector<std::string> sessions_;
  Ledger ledger_;
  Totals totals_;
  uint64_t interrupted_now_ = 0;
  bool clean_stop_ = false;
  std::mutex print_mu_;
};

}  // namespace
}  // namespace fwai::testing

int main(int argc, char** argv) {
  int cycles = 5;
  uint64_t seed = 1;
  bool verbose = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--cycles" && i + 1 < argc) {
      cycles = std::atoi(argv[++i]);
    } else if (a == "--seed" && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--verbose" || a == "-v") {
      verbose = true;
    } else if (a == "--json" && i + 1 < argc) {
      ++i;  // read by the report
    } else {
      std::fprintf(stderr,
                   "usage: fwai_crash_soak [--cycles N] [--seed S] [--verbose] [--json FILE]\n");
      return 2;
    }
  }
  if (cycles < 1) {
    std::fprintf(stderr, "fwai_crash_soak: --cycles: expected a positive number\n");
    return 2;
  }
  fwai::testing::Report().Init("fwai_crash_soak", argc, argv);
  fwai::testing::Report().SetQuick(cycles < 100);  // 100 cycles is the full run
  const int rc = fwai::testing::Soak(seed, verbose).Run(cycles);
  return rc == 0 && !fwai::testing::Report().Write() ? 1 : rc;
}
