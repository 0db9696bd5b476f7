// fwai_bench: measures the daemon's streaming path with a real fwaid, real
// gRPC over the unix socket, and the fake provider over real HTTP.
//
//   throughput   events/s through Chat to one client (provider as fast as it can),
//                then the last of those sessions replayed whole through Attach
//   latency      added latency p50/p99 from the provider writing a chunk to the
//                client receiving it, with 1 and 50 concurrent sessions
//   memory       RSS per idle session and per attached client
//   load         1, 50 and 200 concurrent sessions streaming at 100 chunks/s each
//                (events/s, added latency in the first chunks and after, time
//                from the user's message to the provider's request, fwaid's
//                CPU per delivered event and the harness's CPU), each
//                again with stuck clients (one that never reads its own busy
//                session, one attached to a measured session that never reads);
//                then, as a separate figure, 50 sessions on a daemon that has
//                served one burst before, the clients connected before they
//                send at once
//   turn-start   fwaid's CPU per turn: turns of one chunk, 1 session (20 one
//                after another), 50 and 200 at once (also part of load)
//   shared       TLS beside the unix socket, 20 principals x 5 sessions, one
//                user's chat beside a flood and an ingest (shared_bench.cc;
//                only with --only shared, --tiny for a correctness check;
//                --part NAME for one figure; --part noisy-ab --fwaid A,B
//                --rounds N compares fwaid binaries on the noisy neighbour)
//   --turn-threads N  agent.turn_threads of the other phases' daemons (0: no
//                turn thread started with the daemon, as before that setting)
//   --batch-window-us N  subscribers.batch_window_us of the other phases'
//                daemons (0: each event stored and sent as soon as it can be)
//   --turn-starts N   agent.turn_starts of the other phases' daemons (0: no
//                limit on turns preparing their first request at once)
//   --fwaid PATH  the fwaid binary of the other phases' daemons
//   --sessions N  with --only load: that one load alone, at N sessions (no
//                stuck clients, no turn-start phase); exits 1 when a turn
//                did not finish or a chunk was not delivered
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/clock.h"
#include "tests/bench/bench_report.h"
#include "tests/bench/bench_util.h"
#include "tests/bench/chat_clients.h"
#include "tests/bench/shared_bench.h"
#include "tests/integration/daemon_fixture.h"

namespace fwai::testing {
namespace {

namespace pb = fwai::v1;

constexpr char kUsage[] =
    "usage: fwai_bench [--quick] [--only throughput|latency|memory|load|turn-start|shared]\n"
    "                  [--sessions N] [--turn-threads N] [--turn-starts N] [--batch-window-us N]\n"
    "                  [--fwaid PATH[,PATH]]\n"
    "                  [--pause S] [--json FILE]\n"
    "       fwai_bench --only shared [--tiny] [--runs N] [--part NAME] [--rounds N]\n"
    "Measures fwaid's streaming with a real fwaid, gRPC and the fake provider; the\n"
    "phases and options are described in docs/benchmarks.md.\n";

long RssKb(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6);
  }
  return -1;
}

// CPU seconds (user + system) used so far by process `pid`.
double CpuSeconds(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  size_t close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(text.substr(close + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::strtoull(field.c_str(), nullptr, 10);
    if (i == 15) stime = std::strtoull(field.c_str(), nullptr, 10);
  }
  return double(utime + stime) / sysconf(_SC_CLK_TCK);
}

// Task switches (voluntary and not) of process `pid`'s threads so far: a
// thread's wake-up is one, and on a virtual machine each costs more than
// most of the work it wakes for.
uint64_t TaskSwitches(pid_t pid) {
  uint64_t total = 0;
  const std::string dir = "/proc/" + std::to_string(pid) + "/task";
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator(dir, ec)) {
    std::ifstream f(task.path() / "status");
    std::string line;
    while (std::getline(f, line)) {
      if (line.find("ctxt_switches:") != std::string::npos)
        total += std::strtoull(line.c_str() + line.find(':') + 1, nullptr, 10);
    }
  }
  return total;
}

// Many sessions streaming at once; see RunLoad.
struct LoadStats {
  double fwaid_cpu_s = 0, bench_cpu_s = 0;  // CPU used while the turns ran
  double provider_cpu_s = 0;                // of bench_cpu_s: the fake provider's
  uint64_t fwaid_switches = 0;              // fwaid's task switches meanwhile
  std::vector<double> all, first, steady, turn_start_ms;
  uint64_t events = 0, chunks = 0;
  uint64_t offered = 0;        // chunks the provider was asked for
  double seconds = 0;          // the first delivered chunk to the last
  double offered_seconds = 0;  // the provider's first chunk sent to its last
  int unfinished = 0;
  std::string stuck;  // what became of the stuck clients
};

// Chunks/s the provider sent, over its own first chunk to its last.
double OfferedRate(const LoadStats& s) { return s.offered / std::max(s.offered_seconds, 1e-9); }

// Chunks/s delivered as a share of OfferedRate: 1 when the clients got
// every chunk as fast as the provider sent them (turns that start late
// stretch both).
double DeliveredShare(const LoadStats& s) {
  return s.chunks / std::max(s.seconds, 1e-9) / std::max(OfferedRate(s), 1e-9);
}

// fwaid's CPU per delivered event, turn starts included, in µs.
double CpuPerEventUs(const LoadStats& s) {
  return s.fwaid_cpu_s * 1e6 / std::max<double>(1, s.events);
}

double SwitchesPerEvent(const LoadStats& s) {
  return double(s.fwaid_switches) / std::max<double>(1, s.events);
}

// From the user's message leaving the client to the provider's request
// arriving: the daemon's work to start a turn (history, policy, tools,
// prompt). Turn i's message is "bench s<i>", sent at sent[i]; a request's
// last message is its turn's. Requests from `first_request` on.
std::vector<double> TurnStartsMs(FakeLlmServer& fake, size_t first_request,
                                 const std::vector<int64_t>& sent) {
  std::vector<double> out;
  auto reqs = fake.requests();
  for (size_t k = first_request; k < reqs.size(); ++k) {
    const std::string body = reqs[k].body.dump();
    size_t at = body.rfind("bench s");
    if (at == std::string::npos) continue;
    const int i = std::atoi(body.c_str() + at + 7);
    if (i >= 0 && i < static_cast<int>(sent.size()) && sent[i] > 0)
      out.push_back((reqs[k].received_ns - sent[i]) / 1e6);
  }
  return out;
}

// `sessions` turns at once, each streamed `chunks` chunks of 24 B at 100/s by
// the provider, each read by its own client. With `stuck`, first a session
// whose provider streams 4 KB chunks at the same pace to a client that never
// reads, and a client attached to the first measured session that never reads.
// With `warm`, as a long-running daemon with its users' clients connected
// meets a burst: the daemon first serves one burst of `sessions` turns of 10
// chunks in other sessions (not measured), then every client opens its Chat
// stream, and once all are open (and 300 ms more) they send their messages at
// once.
LoadStats RunLoad(FakeLlmServer& fake, Daemon& d, int sessions, int chunks, bool stuck,
                  bool warm = false) {
  LoadStats out;
  auto stub = d.sessions();
  if (warm) {
    std::vector<std::string> warm_ids;
    for (int i = 0; i < sessions; ++i) warm_ids.push_back(d.CreateSession().id());
    for (int i = 0; i < sessions; ++i) {
      FakeReply r;
      r.bench_chunks = 10;
      r.bench_chunk_bytes = 24;
      r.chunk_delay_ms = 10;
      fake.Enqueue(r);
    }
    std::vector<std::thread> warmers;
    for (int i = 0; i < sessions; ++i) {
      warmers.emplace_back([&, i] {
        auto own = d.sessions();
        (void)Stream(*own, warm_ids[i], false, 0, "warm-up " + std::to_string(i));
      });
    }
    for (auto& t : warmers) t.join();
  }
  // The clients that connect first: once all are open (and 300 ms more),
  // they send at once.
  std::function<void()> once_all_open;
  if (warm) once_all_open = [] { std::this_thread::sleep_for(std::chrono::milliseconds(300)); };
  grpc::ClientContext stuck_chat_ctx, stuck_attach_ctx;
  std::unique_ptr<grpc::ClientReaderWriter<pb::ClientEvent, pb::ServerEvent>> stuck_chat;
  std::unique_ptr<grpc::ClientReader<pb::ServerEvent>> stuck_attach;
  std::vector<std::string> ids;
  for (int i = 0; i < sessions; ++i) ids.push_back(d.CreateSession().id());
  if (stuck) {
    FakeReply big;
    big.bench_chunks = chunks * 3;
    big.bench_chunk_bytes = 4096;
    big.chunk_delay_ms = 10;
    fake.Enqueue(big);
    const size_t before = fake.request_count();
    stuck_chat = OpenChat(*stub, &stuck_chat_ctx, d.CreateSession().id(), "stuck");
    while (fake.request_count() == before)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    pb::AttachRequest req;
    req.set_session_id(ids[0]);
    stuck_attach = stub->Attach(&stuck_attach_ctx, req);
  }
  for (int i = 0; i < sessions; ++i) {
    FakeReply r;
    r.bench_chunks = chunks;
    r.bench_chunk_bytes = 24;
    r.chunk_delay_ms = 10;
    fake.Enqueue(r);
  }
  const size_t first_request = fake.request_count();
  const double fwaid_cpu0 = CpuSeconds(d.pid()), bench_cpu0 = CpuSeconds(getpid());
  const double provider_cpu0 = fake.served_cpu_s();
  const uint64_t switches0 = TaskSwitches(d.pid());
  std::vector<int64_t> sent(sessions);
  std::vector<ChatSpec> specs;
  for (int i = 0; i < sessions; ++i) specs.push_back({ids[i], "bench s" + std::to_string(i)});
  int64_t begin_ns = INT64_MAX, end_ns = 0, sent_begin_ns = INT64_MAX, sent_end_ns = 0;
  for (const StreamStats& st : RunChats(*stub, specs, true, chunks / 10, once_all_open, &sent)) {
    if (st.first_sent_ns > 0) sent_begin_ns = std::min(sent_begin_ns, st.first_sent_ns);
    sent_end_ns = std::max(sent_end_ns, st.last_sent_ns);
    if (!st.finished) ++out.unfinished;
    out.all.insert(out.all.end(), st.latency_ms.begin(), st.latency_ms.end());
    out.first.insert(out.first.end(), st.first_latency_ms.begin(), st.first_latency_ms.end());
    out.steady.insert(out.steady.end(), st.steady_latency_ms.begin(), st.steady_latency_ms.end());
    out.events += st.deltas;
    out.chunks += st.chunks;
    if (st.first_ns > 0) begin_ns = std::min(begin_ns, st.first_ns);
    end_ns = std::max(end_ns, st.last_ns);
  }
  out.fwaid_cpu_s = CpuSeconds(d.pid()) - fwaid_cpu0;
  out.bench_cpu_s = CpuSeconds(getpid()) - bench_cpu0;
  out.provider_cpu_s = fake.served_cpu_s() - provider_cpu0;
  out.fwaid_switches = TaskSwitches(d.pid()) - switches0;
  out.seconds = (end_ns - begin_ns) / 1e9;
  out.offered = uint64_t(sessions) * chunks;
  out.offered_seconds = (sent_end_ns - sent_begin_ns) / 1e9;
  out.turn_start_ms = TurnStartsMs(fake, first_request, sent);
  if (stuck) {
    stuck_chat_ctx.TryCancel();
    stuck_attach_ctx.TryCancel();
    (void)stuck_chat->Finish();
    (void)stuck_attach->Finish();
    out.stuck =
        "beside a client that never read its own session (4 KB chunks at 100/s) and one attached "
        "to a measured session that never read";
  }
  return out;
}

// A client attaching to a stored session and reading all of it (as `fwai
// attach` or VS Code opening a long session): events/s and fwaid's CPU per
// event, median of 3 reads of the same session.
void RunReplay(Daemon& d, const std::string& session_id) {
  std::vector<double> rates, cpu_us;
  uint64_t events = 0;
  for (int run = 0; run < 3; ++run) {
    auto stub = d.sessions();
    grpc::ClientContext ctx;
    pb::AttachRequest req;
    req.set_session_id(session_id);
    req.set_no_follow(true);
    const double cpu0 = CpuSeconds(d.pid());
    const auto t0 = std::chrono::steady_clock::now();
    auto reader = stub->Attach(&ctx, req);
    pb::ServerEvent ev;
    uint64_t n = 0;
    while (reader->Read(&ev)) ++n;
    const grpc::Status st = reader->Finish();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!st.ok() || n == 0) {
      std::fprintf(stderr, "replay run did not finish: %s\n", st.error_message().c_str());
      std::exit(1);
    }
    events = n;
    rates.push_back(n / s);
    cpu_us.push_back((CpuSeconds(d.pid()) - cpu0) * 1e6 / n);
  }
  std::printf(
      "RESULT replay_events_per_s median=%.0f fwaid_cpu_us_per_event=%.2f (input: a stored session "
      "of %llu events, read whole by one client, unix socket)\n",
      Percentile(rates, 0.5), Percentile(cpu_us, 0.5), static_cast<unsigned long long>(events));
  auto& r = Report().Add(
      "replay", "events/s replayed through `Attach` to one client",
      absl::StrCat("a stored session of ", events, " events read whole, unix socket; median of 3"),
      Percentile(rates, 0.5), "events/s");
  r["min"] = Percentile(rates, 0);
  r["max"] = Percentile(rates, 1);
  r["also"] = {
      {{"label", "fwaid's CPU per event"}, {"value", Percentile(cpu_us, 0.5)}, {"unit", "µs"}}};
}

// fwaid's CPU per turn start in one session with a long history: 200 turns
// answered with 1 KB each first (400 entries, about 210 KB), then 40 turns
// of one chunk measured one after another.
void RunLongHistory(FakeLlmServer& fake, Daemon& d, int pause_s) {
  constexpr int kBefore = 200, kMeasured = 40, kReplyBytes = 1000;
  std::this_thread::sleep_for(std::chrono::seconds(pause_s));
  const std::string id = d.CreateSession().id();
  auto stub = d.sessions();
  const auto turn = [&](int bytes, const std::string& text, int64_t* sent) {
    FakeReply r;
    r.bench_chunks = 1;
    r.bench_chunk_bytes = bytes;
    fake.Enqueue(r);
    return Stream(*stub, id, false, 0, text, sent).finished;
  };
  int unfinished = 0;
  for (int i = 0; i < kBefore; ++i)
    unfinished += !turn(kReplyBytes, "before " + std::to_string(i), nullptr);
  const size_t first_request = fake.request_count();
  std::vector<int64_t> sent(kMeasured);
  const double fwaid_cpu0 = CpuSeconds(d.pid()), bench_cpu0 = CpuSeconds(getpid());
  for (int i = 0; i < kMeasured; ++i)
    unfinished += !turn(24, "bench s" + std::to_string(i), &sent[i]);
  const double fwaid_cpu_s = CpuSeconds(d.pid()) - fwaid_cpu0;
  const double bench_cpu_s = CpuSeconds(getpid()) - bench_cpu0;
  const std::vector<double> start_ms = TurnStartsMs(fake, first_request, sent);
  const double per_turn_ms = fwaid_cpu_s * 1e3 / kMeasured;
  const std::string input = absl::StrCat(
      "1 session with a history of ", 2 * kBefore, " entries (", kBefore, " turns answered with ",
      kReplyBytes, " B each), then ", kMeasured, " turns of 1 chunk one after another");
  std::printf(
      "RESULT turn_start_cpu long_history fwaid_cpu_ms_per_turn=%.2f turn start p50=%.2f "
      "p99=%.2f ms (input: %s; harness %.2f s)%s\n",
      per_turn_ms, Percentile(start_ms, 0.5), Percentile(start_ms, 0.99), input.c_str(),
      bench_cpu_s, unfinished ? " UNFINISHED TURNS" : "");
  auto& r = Report().Add("turn_start_cpu_long_history", "fwaid CPU per turn start, long history",
                         input, per_turn_ms, "ms");
  r["also"] = {{{"label", "turn start p50"}, {"value", Percentile(start_ms, 0.5)}, {"unit", "ms"}},
               {{"label", "turn start p99"}, {"value", Percentile(start_ms, 0.99)}, {"unit", "ms"}},
               {{"label", "the harness's CPU"}, {"value", bench_cpu_s}, {"unit", "s"}}};
}

// Records one load phase: its added latency (against the same number of
// sessions alone, or on a fresh daemon, when it is a variant) and turn start.
void ReportLoad(const std::string& label, int sessions, int chunks, const LoadStats& s) {
  const std::string base = absl::StrCat("load_", sessions);
  const char* noun = sessions == 1 ? " session" : " sessions";
  std::string id = base, what = absl::StrCat(sessions, noun);
  if (label == " with_stuck_clients") {
    id += "_stuck";
    what += ", beside two stuck clients";
  } else if (!label.empty()) {
    id += "_warm";
    what += ", warm daemon, clients connected first";
  }
  const bool warm = id.ends_with("_warm");
  const std::string input = absl::StrCat(
      sessions, noun, " x ", chunks, " chunks of 24 B at 100/s, one client each, ",
      warm ? "on a daemon that served a burst of turns first, the clients connected before they "
             "send at once"
           : "on a fresh daemon, the turns starting at once");
  auto& lat =
      Report().Add(id + "_latency", "added latency, " + what, input, Percentile(s.all, 0.99), "ms");
  lat["p50"] = Percentile(s.all, 0.5);
  lat["p99"] = Percentile(s.all, 0.99);
  lat["max"] = Percentile(s.all, 1.0);
  lat["also"] = {
      {{"label", absl::StrCat("first ", chunks / 10, " chunks p99")},
       {"value", Percentile(s.first, 0.99)},
       {"unit", "ms"}},
      {{"label", "after them p99"}, {"value", Percentile(s.steady, 0.99)}, {"unit", "ms"}},
      {{"label", "delivered"},
       {"value", s.events / std::max(s.seconds, 1e-9)},
       {"unit", "events/s"}},
      {{"label", "offered (the provider's rate)"}, {"value", OfferedRate(s)}, {"unit", "chunks/s"}},
      {{"label", "delivered share of offered"}, {"value", DeliveredShare(s) * 100}, {"unit", "%"}},
      {{"label", "fwaid CPU"}, {"value", s.fwaid_cpu_s}, {"unit", "s"}},
      {{"label", "fwaid CPU per delivered event"}, {"value", CpuPerEventUs(s)}, {"unit", "µs"}},
      {{"label", "fwaid's task switches per delivered event"},
       {"value", SwitchesPerEvent(s)},
       {"unit", ""}},
      {{"label", "the harness's CPU (clients and provider)"},
       {"value", s.bench_cpu_s},
       {"unit", "s"}},
      {{"label", "of which the fake provider"}, {"value", s.provider_cpu_s}, {"unit", "s"}}};
  if (sessions == 50 && label.empty()) lat["target"] = "p99 ≤ 5 ms";
  if (sessions == 200 && label.empty()) {
    lat["target"] =
        "p99 ≤ 50 ms; delivered ≥ 95 % of offered; fwaid CPU ≤ 50 µs per delivered event";
  }
  if (id != base)
    Report().SetBaseline(lat, base + "_latency", absl::StrCat(sessions, " sessions alone"));
  auto& start = Report().Add(id + "_turn_start", "turn start (message → provider request), " + what,
                             input, Percentile(s.turn_start_ms, 0.99), "ms");
  start["p50"] = Percentile(s.turn_start_ms, 0.5);
  start["p99"] = Percentile(s.turn_start_ms, 0.99);
  if (sessions == 200 && label.empty()) start["target"] = "p99 ≤ 250 ms";
}

void PrintLoad(const char* label, int sessions, int chunks, const LoadStats& s) {
  std::printf(
      "RESULT load sessions=%d%s events_per_s=%.0f latency_ms p50=%.3f p99=%.3f max=%.3f | first "
      "%d chunks of "
      "each session p50=%.3f p99=%.3f | after them p50=%.3f p99=%.3f | turn start p50=%.2f "
      "p99=%.2f ms "
      "(input: %d sessions x %d chunks of 24 B at 100/s; %llu chunks in %llu events over %.2f "
      "s; the provider sent %.0f chunks/s, delivered %.1f%% of that)%s\n",
      sessions, label, s.events / std::max(s.seconds, 1e-9), Percentile(s.all, 0.5),
      Percentile(s.all, 0.99), Percentile(s.all, 1.0), chunks / 10, Percentile(s.first, 0.5),
      Percentile(s.first, 0.99), Percentile(s.steady, 0.5), Percentile(s.steady, 0.99),
      Percentile(s.turn_start_ms, 0.5), Percentile(s.turn_start_ms, 0.99), sessions, chunks,
      static_cast<unsigned long long>(s.chunks), static_cast<unsigned long long>(s.events),
      s.seconds, OfferedRate(s), DeliveredShare(s) * 100, s.unfinished ? " UNFINISHED TURNS" : "");
  std::printf(
      "       cpu while the turns ran: fwaid %.2f s (%.0f us per delivered event, %.2f task "
      "switches per delivered event), this process %.2f s (fake provider %.2f s, clients %.2f "
      "s)\n",
      s.fwaid_cpu_s, CpuPerEventUs(s), SwitchesPerEvent(s), s.bench_cpu_s, s.provider_cpu_s,
      s.bench_cpu_s - s.provider_cpu_s);
  if (!s.stuck.empty()) std::printf("       %s\n", s.stuck.c_str());
  std::fflush(stdout);
  ReportLoad(label, sessions, chunks, s);
}

int Main(int argc, char** argv) {
  int throughput_chunks = 200000;
  int latency_chunks = 300;
  int idle_sessions = 2000;
  int attached_clients = 200;
  std::string only;
  int pause_s = 0;           // pause between phases (lets background compaction settle)
  int turn_threads = -1;     // agent.turn_threads for the fresh daemons (-1: fwaid's default)
  int turn_starts = -1;      // agent.turn_starts for the fresh daemons (-1: fwaid's default)
  int batch_window_us = -1;  // subscribers.batch_window_us (-1: fwaid's default)
  int load_sessions = 0;     // --sessions N: the load phase at N sessions only, no stuck clients
  SharedBenchOptions shared;
  // Every option that takes a value, and what it sets; --json is the
  // report's (Report().Init reads it).
  const std::map<std::string, std::function<void(const char*)>> with_value = {
      {"--only", [&](const char* v) { only = v; }},
      {"--pause", [&](const char* v) { pause_s = std::atoi(v); }},
      {"--sessions", [&](const char* v) { load_sessions = std::max(1, std::atoi(v)); }},
      {"--turn-threads", [&](const char* v) { turn_threads = std::atoi(v); }},
      {"--turn-starts", [&](const char* v) { turn_starts = std::atoi(v); }},
      {"--batch-window-us", [&](const char* v) { batch_window_us = std::atoi(v); }},
      {"--runs", [&](const char* v) { shared.runs = std::max(1, std::atoi(v)); }},
      {"--part", [&](const char* v) { shared.part = v; }},
      {"--rounds", [&](const char* v) { shared.rounds = std::max(1, std::atoi(v)); }},
      {"--fwaid",
       [&](const char* v) { shared.fwaid_binaries = absl::StrSplit(v, ',', absl::SkipEmpty()); }},
      {"--json", [](const char*) {}},
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (a == "--tiny") {
      shared.tiny = true;
      continue;
    }
    if (a == "--quick") {
      shared.quick = true;
      throughput_chunks = 20000;
      latency_chunks = 100;
      idle_sessions = 200;
      attached_clients = 50;
      continue;
    }
    const auto set = with_value.find(a);
    if (set == with_value.end()) {
      std::fprintf(stderr, "fwai_bench: unknown option %s\n%s", a.c_str(), kUsage);
      return 2;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "fwai_bench: %s needs a value\n%s", a.c_str(), kUsage);
      return 2;
    }
    set->second(argv[++i]);
  }
  std::printf("fwai_bench  machine: %u cores, %s  commit: %s\n",
              std::thread::hardware_concurrency(), MachineJson()["cpu"].get<std::string>().c_str(),
              std::getenv("FWAI_COMMIT") ? std::getenv("FWAI_COMMIT") : "?");

  FakeLlmServer fake;
  if (fake.Start() <= 0) return 1;
  if (only == "shared") return RunSharedBench(fake, shared);
  // Each phase runs on a fresh daemon so one phase's heap and RocksDB state do
  // not colour the next one's figures.
  std::unique_ptr<Daemon> daemon;
  auto fresh = [&]() -> Daemon& {
    if (daemon) daemon->Stop();
    std::string yaml = "log_level: warn\n";
    if (turn_threads >= 0 || turn_starts >= 0) yaml += "agent:\n";
    if (turn_threads >= 0) yaml += "  turn_threads: " + std::to_string(turn_threads) + "\n";
    if (turn_starts >= 0) yaml += "  turn_starts: " + std::to_string(turn_starts) + "\n";
    if (batch_window_us >= 0) {
      yaml += "subscribers:\n  batch_window_us: " + std::to_string(batch_window_us) + "\n";
    }
    daemon = std::make_unique<Daemon>(&fake, yaml);
    if (!shared.fwaid_binaries.empty()) daemon->SetBinary(shared.fwaid_binaries.front());
    if (!daemon->Start()) {
      std::fprintf(stderr, "fwaid did not start:\n%s\n", daemon->log().c_str());
      std::exit(1);
    }
    return *daemon;
  };

  // --- Throughput to one client.
  if (only.empty() || only == "throughput") {
    Daemon& d = fresh();
    std::vector<double> rates, cpu_us;
    std::string last_session;
    for (int run = 0; run < 3; ++run) {
      FakeReply r;
      r.bench_chunks = throughput_chunks;
      r.bench_chunk_bytes = 24;
      fake.Enqueue(r);
      auto s = d.CreateSession();
      last_session = s.id();
      auto stub = d.sessions();
      const double cpu0 = CpuSeconds(d.pid());
      auto st = Stream(*stub, s.id(), false);
      if (!st.finished) {
        std::fprintf(stderr, "throughput run did not finish\n");
        return 1;
      }
      double rate = st.deltas / st.seconds;
      rates.push_back(rate);
      cpu_us.push_back((CpuSeconds(d.pid()) - cpu0) * 1e6 / std::max<uint64_t>(1, st.deltas));
      std::printf(
          "throughput run %d: %llu chunks from provider, %llu events delivered in %.3f s = %.0f "
          "events/s "
          "(%.0f provider chunks/s)\n",
          run + 1, static_cast<unsigned long long>(st.chunks),
          static_cast<unsigned long long>(st.deltas), st.seconds, rate, st.chunks / st.seconds);
    }
    std::printf(
        "RESULT throughput_events_per_s median=%.0f fwaid_cpu_us_per_event=%.2f (input: %d text "
        "chunks of 24 B, 1 client, unix socket) target>=20000\n",
        Percentile(rates, 0.5), Percentile(cpu_us, 0.5), throughput_chunks);
    auto& r = Report().Add(
        "throughput", "events/s through `Chat` to one client",
        absl::StrCat(throughput_chunks,
                     " text chunks of 24 B, provider as fast as it can, unix socket; median of 3"),
        Percentile(rates, 0.5), "events/s");
    r["min"] = Percentile(rates, 0);
    r["max"] = Percentile(rates, 1);
    r["also"] = {
        {{"label", "fwaid's CPU per event"}, {"value", Percentile(cpu_us, 0.5)}, {"unit", "µs"}}};
    r["target"] = "≥ 20,000";
    RunReplay(d, last_session);
  }

  // --- Added latency at 1 and 50 concurrent sessions.
  for (int sessions : {1, 50}) {
    if (!only.empty() && only != "latency") break;
    Daemon& d = fresh();
    std::this_thread::sleep_for(std::chrono::seconds(pause_s));
    for (int i = 0; i < sessions; ++i) {
      FakeReply r;
      r.bench_chunks = latency_chunks;
      r.bench_chunk_bytes = 24;
      r.chunk_delay_ms = 10;
      fake.Enqueue(r);
    }
    std::vector<std::string> ids;
    for (int i = 0; i < sessions; ++i) ids.push_back(d.CreateSession().id());
    std::vector<double> all, steady;
    std::vector<std::vector<double>> by_index(latency_chunks / 10);
    std::vector<std::pair<double, size_t>> indexed;  // (latency, chunk number)
    int unfinished = 0;
    std::vector<ChatSpec> specs;
    for (const std::string& id : ids) specs.push_back({id, "bench"});
    auto stub = d.sessions();
    for (const StreamStats& st : RunChats(*stub, specs, true, latency_chunks / 10, {}, nullptr)) {
      if (!st.finished) ++unfinished;
      all.insert(all.end(), st.latency_ms.begin(), st.latency_ms.end());
      steady.insert(steady.end(), st.steady_latency_ms.begin(), st.steady_latency_ms.end());
      for (size_t k = 0; k < st.first_by_index_ms.size() && k < by_index.size(); ++k) {
        by_index[k].push_back(st.first_by_index_ms[k]);
      }
      for (size_t k = 0; k < st.latency_ms.size(); ++k) indexed.emplace_back(st.latency_ms[k], k);
    }
    std::printf(
        "RESULT latency_ms sessions=%d p50=%.3f p99=%.3f max=%.3f (samples %zu, %d chunks/session "
        "at "
        "100/s) target p99<=5 at 50%s\n",
        sessions, Percentile(all, 0.5), Percentile(all, 0.99), Percentile(all, 1.0), all.size(),
        latency_chunks, unfinished ? " UNFINISHED TURNS" : "");
    auto& r =
        Report().Add(absl::StrCat("latency_", sessions),
                     absl::StrCat("added latency, provider write → client receive, ", sessions,
                                  sessions == 1 ? " session" : " concurrent sessions"),
                     absl::StrCat(sessions == 1 ? "" : absl::StrCat(sessions, " x "),
                                  latency_chunks, " chunks at 100/s on a fresh daemon",
                                  sessions == 1 ? "" : ", the turns starting at once"),
                     Percentile(all, 0.99), "ms");
    r["p50"] = Percentile(all, 0.5);
    r["p99"] = Percentile(all, 0.99);
    r["max"] = Percentile(all, 1.0);
    r["also"] = {
        {{"label", absl::StrCat("after each session's first ", latency_chunks / 10, " chunks p99")},
         {"value", Percentile(steady, 0.99)},
         {"unit", "ms"}}};
    if (sessions == 50) r["target"] = "p99 ≤ 5 ms";
    std::printf(
        "       steady state (after each session's first %d chunks): p50=%.3f p99=%.3f max=%.3f\n",
        latency_chunks / 10, Percentile(steady, 0.5), Percentile(steady, 0.99),
        Percentile(steady, 1.0));
    if (sessions > 1) {
      // Where the first chunks lose time: each chunk's median and slowest over the sessions.
      std::string line = "       first chunks, median/max over sessions:";
      for (size_t k = 0; k < by_index.size(); ++k) {
        absl::StrAppendFormat(&line, " #%d %.1f/%.1f", static_cast<int>(k + 1),
                              Percentile(by_index[k], 0.5), Percentile(by_index[k], 1.0));
      }
      std::printf("%s ms\n", line.c_str());
      // Which part of the turns the slowest 1% come from, by tenths of the turn.
      std::sort(indexed.begin(), indexed.end(), std::greater<>());
      std::vector<int> tenths(10, 0);
      for (size_t k = 0; k < indexed.size() / 100; ++k) {
        ++tenths[std::min<size_t>(9, indexed[k].second * 10 / latency_chunks)];
      }
      line = "       slowest 1% by tenth of the turn:";
      for (int t : tenths) absl::StrAppend(&line, " ", t);
      std::printf("%s\n", line.c_str());
    }
  }

  // --- One load alone, for profiling (`--only load --sessions N`; exits 1
  // when a turn did not finish or a chunk was not delivered): it takes
  // the place of the load and turn-start phases.
  const bool one_load = load_sessions > 0;
  if (one_load && (only.empty() || only == "load")) {
    Daemon& d = fresh();
    std::this_thread::sleep_for(std::chrono::seconds(pause_s));
    const LoadStats s = RunLoad(fake, d, load_sessions, latency_chunks, false);
    PrintLoad("", load_sessions, latency_chunks, s);
    if (s.unfinished > 0 || s.chunks != s.offered) {
      std::fprintf(stderr, "load: %d turn(s) unfinished, %llu of %llu chunks delivered\n",
                   s.unfinished, static_cast<unsigned long long>(s.chunks),
                   static_cast<unsigned long long>(s.offered));
      return 1;
    }
  }

  // --- Many sessions at once: 50 (the baseline) and 200, each alone and then
  // beside stuck clients. 50 is a load the machine carries, so that is where
  // "a stuck client slows nobody" can be read.
  if (!one_load && (only.empty() || only == "load")) {
    for (int sessions : {1, 50, 200}) {
      for (bool stuck : {false, true}) {
        if (sessions == 1 && stuck) continue;
        Daemon& d = fresh();
        std::this_thread::sleep_for(std::chrono::seconds(pause_s));
        PrintLoad(stuck ? " with_stuck_clients" : "", sessions, latency_chunks,
                  RunLoad(fake, d, sessions, latency_chunks, stuck));
      }
    }
    // A separate figure, not the one above: the daemon has served a burst
    // before, and the clients are connected before they send at once.
    Daemon& d = fresh();
    std::this_thread::sleep_for(std::chrono::seconds(pause_s));
    PrintLoad(" warm_daemon_clients_connected_first", 50, latency_chunks,
              RunLoad(fake, d, 50, latency_chunks, false, /*warm=*/true));
  }

  // --- fwaid's CPU per turn start: turns of one chunk, 1, 50 and 200 at
  // once on a fresh daemon (each turn's few events included).
  if (!one_load && (only.empty() || only == "load" || only == "turn-start")) {
    for (int sessions : {1, 50, 200}) {
      Daemon& d = fresh();
      std::this_thread::sleep_for(std::chrono::seconds(pause_s));
      // One session: 20 turns one after another, as the CPU is counted in
      // clock ticks.
      const int rounds = sessions == 1 ? 20 : 1;
      LoadStats s;
      for (int k = 0; k < rounds; ++k) {
        const LoadStats one = RunLoad(fake, d, sessions, /*chunks=*/1, false);
        s.fwaid_cpu_s += one.fwaid_cpu_s;
        s.bench_cpu_s += one.bench_cpu_s;
        s.unfinished += one.unfinished;
        s.turn_start_ms.insert(s.turn_start_ms.end(), one.turn_start_ms.begin(),
                               one.turn_start_ms.end());
      }
      const double per_turn_ms = s.fwaid_cpu_s * 1e3 / (sessions * rounds);
      const std::string input = sessions == 1
                                    ? std::string(
                                          "1 session, 20 turns of 1 chunk one after another, on a "
                                          "fresh daemon")
                                    : absl::StrCat(sessions,
                                                   " sessions x one turn of 1 chunk, the turns "
                                                   "starting at once, on a fresh daemon");
      std::printf(
          "RESULT turn_start_cpu sessions=%d fwaid_cpu_ms_per_turn=%.2f turn start p50=%.2f "
          "p99=%.2f ms (input: %s; harness %.2f s)%s\n",
          sessions, per_turn_ms, Percentile(s.turn_start_ms, 0.5),
          Percentile(s.turn_start_ms, 0.99), input.c_str(), s.bench_cpu_s,
          s.unfinished ? " UNFINISHED TURNS" : "");
      auto& r = Report().Add(absl::StrCat("turn_start_cpu_", sessions), "fwaid CPU per turn start",
                             input, per_turn_ms, "ms");
      r["also"] = {{{"label", "turn start p99"},
                    {"value", Percentile(s.turn_start_ms, 0.99)},
                    {"unit", "ms"}},
                   {{"label", "the harness's CPU"}, {"value", s.bench_cpu_s}, {"unit", "s"}}};
    }
    RunLongHistory(fake, fresh(), pause_s);
  }

  // --- Memory per idle session and per attached client.
  if (only.empty() || only == "memory") {
    Daemon& d = fresh();
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    long before = RssKb(d.pid());
    auto stub = d.sessions();
    std::vector<std::string> ids;
    std::vector<double> last_creates_ms;  // the last tenth: with most sessions already there
    for (int i = 0; i < idle_sessions; ++i) {
      const int64_t t0 = MonotonicNanos();
      auto s = d.CreateSession();
      if (i >= idle_sessions - idle_sessions / 10)
        last_creates_ms.push_back((MonotonicNanos() - t0) / 1e6);
      ids.push_back(s.id());
      grpc::ClientContext ctx;  // load its live state as a touched session
      pb::GetSessionRequest req;
      req.set_session_id(s.id());
      pb::Session out;
      stub->Get(&ctx, req, &out);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    long after_sessions = RssKb(d.pid());
    std::vector<std::unique_ptr<grpc::ClientContext>> ctxs;
    std::vector<std::unique_ptr<grpc::ClientReader<pb::ServerEvent>>> readers;
    for (int i = 0; i < attached_clients; ++i) {
      ctxs.push_back(std::make_unique<grpc::ClientContext>());
      pb::AttachRequest req;
      req.set_session_id(ids[i % ids.size()]);
      readers.push_back(stub->Attach(ctxs.back().get(), req));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    long after_clients = RssKb(d.pid());
    std::printf(
        "RESULT memory idle_session_kb=%.2f (over %d sessions) attached_client_kb=%.2f (over %d "
        "clients)"
        " rss_before_kb=%ld\n",
        double(after_sessions - before) / idle_sessions, idle_sessions,
        double(after_clients - after_sessions) / attached_clients, attached_clients, before);
    std::printf(
        "RESULT create_session_ms p50=%.2f p99=%.2f (the last %zu creates, with %d sessions "
        "already stored)\n",
        Percentile(last_creates_ms, 0.5), Percentile(last_creates_ms, 0.99), last_creates_ms.size(),
        idle_sessions - idle_sessions / 10);
    Report().Add("memory_idle_session", "memory per idle session",
                 absl::StrCat(idle_sessions, " sessions created and loaded"),
                 double(after_sessions - before) / idle_sessions, "KB RSS each");
    Report().Add("memory_attached_client", "memory per attached client",
                 absl::StrCat(attached_clients, " `Attach` streams following live"),
                 double(after_clients - after_sessions) / attached_clients, "KB RSS each");
    auto& c = Report().Add(
        "create_session", "creating a session with many already stored",
        absl::StrCat("the last ", last_creates_ms.size(), " creates of ", idle_sessions, ", ",
                     idle_sessions - idle_sessions / 10, " sessions already stored"),
        Percentile(last_creates_ms, 0.5), "ms");
    c["p50"] = Percentile(last_creates_ms, 0.5);
    c["p99"] = Percentile(last_creates_ms, 0.99);
    for (auto& c : ctxs) c->TryCancel();
    for (auto& r : readers) r->Finish();
  }
  return daemon->Stop() == 0 ? 0 : 1;
}

}  // namespace
}  // namespace fwai::testing

int main(int argc, char** argv) {
  // The results file's name: fwai_bench, fwai_bench-shared, fwai_bench-shared-noisy-ab...
  std::string name = "fwai_bench";
  for (int i = 1; i + 1 < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--only" || a == "--part") name += "-" + std::string(argv[i + 1]);
  }
  fwai::testing::Report().Init(name, argc, argv);
  const int rc = fwai::testing::Main(argc, argv);
  return rc == 0 && fwai::testing::Report().Write() ? rc : (rc == 0 ? 1 : rc);
}
