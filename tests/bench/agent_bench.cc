// fwai_agent_bench: the agent loop's own cost, with a real fwaid, real gRPC
// and the fake provider over real HTTP.
//
//   round trip   daemon overhead per tool round-trip: from the provider's last
//                byte of a tool-call reply to the next request arriving (parse,
//                history append, events, a trivial tool, next request), p50/p99
//   sub-agents   ten parallel sub-agents streaming through one session to two
//                attached clients: events/s per client and added latency
//   skill runs   a one-step skill (`true` in the sandbox) through Skills.Run:
//                the daemon's cost per run besides the command itself
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "fwai/v1/projects.grpc.pb.h"
#include "tests/bench/bench_report.h"
#include "tests/bench/bench_util.h"
#include "tests/integration/daemon_fixture.h"

namespace fwai::testing {
namespace {

namespace pb = fwai::v1;

int Main(int argc, char** argv) {
  const bool quick = Report().quick();
  const char* commit = std::getenv("FWAI_COMMIT");
  std::printf("fwai_agent_bench (commit %s, %s)\n", commit ? commit : "unknown",
              quick ? "quick" : "full");
  FakeLlmServer fake;
  if (fake.Start() <= 0) return 1;
  Daemon d(&fake, "agent:\n  max_iterations: 1000\n");
  if (!d.Start()) {
    std::fprintf(stderr, "fwaid did not start:\n%s\n", d.log().c_str());
    return 1;
  }

  // Tool round trips.
  const int rounds = quick ? 100 : 400;
  std::vector<double> all_overhead;
  for (int rep = 0; rep < 3; ++rep) {
    const size_t first = fake.request_count();
    for (int i = 0; i < rounds; ++i) {
      FakeReply r;
      r.tool_calls = {{"c" + std::to_string(i), "todoRead", nlohmann::json::object()}};
      fake.Enqueue(r);
    }
    FakeReply done;
    done.chunks = {"done"};
    fake.Enqueue(done);
    auto s = d.CreateSession();
    auto out = RunChat(*d.sessions(), s.id(), "bench", 600);
    if (!out.finished) {
      std::fprintf(stderr, "round-trip turn did not finish\n");
      return 1;
    }
    auto reqs = fake.requests();
    std::vector<double> overhead;
    for (size_t i = first + 1; i < reqs.size(); ++i) {
      if (reqs[i - 1].responded_ns > 0)
        overhead.push_back((reqs[i].received_ns - reqs[i - 1].responded_ns) / 1e6);
    }
    std::printf(
        "round trips run %d: %zu gaps, p50 %.3f ms p99 %.3f ms (first 10 p50 %.3f, last 10 p50 "
        "%.3f)\n",
        rep + 1, overhead.size(), Percentile(overhead, 0.5), Percentile(overhead, 0.99),
        Percentile(std::vector<double>(overhead.begin(),
                                       overhead.begin() + std::min<size_t>(10, overhead.size())),
                   0.5),
        Percentile(std::vector<double>(overhead.end() - std::min<size_t>(10, overhead.size()),
                                       overhead.end()),
                   0.5));
    all_overhead.insert(all_overhead.end(), overhead.begin(), overhead.end());
  }
  std::printf(
      "RESULT tool_round_trip_overhead_ms p50=%.3f p99=%.3f (trivial tool todoRead, %d round trips "
      "x 3 "
      "turns, provider reply end -> next request received; target p50 <= 2 ms)\n",
      Percentile(all_overhead, 0.5), Percentile(all_overhead, 0.99), rounds);
  auto& rt = Report().Add(
      "tool_round_trip", "daemon overhead per tool round trip",
      absl::StrCat("3 turns x ", rounds,
                   " round trips of a trivial tool (`todoRead`); from the provider's last byte to "
                   "the next request arriving"),
      Percentile(all_overhead, 0.5), "ms");
  rt["p50"] = Percentile(all_overhead, 0.5);
  rt["p99"] = Percentile(all_overhead, 0.99);
  rt["target"] = "p50 ≤ 2 ms";

  // Ten parallel sub-agents, two attached clients.
  const int chunks = quick ? 500 : 2000;
  auto s = d.CreateSession();
  FakeReply m1;
  for (int i = 0; i < 10; ++i) {
    m1.tool_calls.push_back(
        {"d" + std::to_string(i),
         "delegateSubagent",
         {{"agent_type", "codebase-explorer"}, {"task", "part " + std::to_string(i)}}});
  }
  fake.Enqueue(m1);
  for (int i = 0; i < 10; ++i) {
    FakeReply sub;
    sub.bench_chunks = chunks;
    sub.bench_chunk_bytes = 32;
    fake.Enqueue(sub);
  }
  FakeReply m2;
  m2.chunks = {"all parts done"};
  fake.Enqueue(m2);
  struct Client {
    std::unique_ptr<grpc::ClientContext> ctx;
    std::unique_ptr<grpc::ClientReader<pb::ServerEvent>> reader;
    std::vector<double> latency_ms;
    uint64_t events = 0, sub_deltas = 0;
    int64_t first_ns = 0, last_ns = 0;
    std::thread thread;
  };
  std::vector<std::unique_ptr<Client>> clients;
  std::atomic<int> ready{0};
  for (int i = 0; i < 2; ++i) {
    auto c = std::make_unique<Client>();
    c->ctx = std::make_unique<grpc::ClientContext>();
    pb::AttachRequest req;
    req.set_session_id(s.id());
    c->reader = d.sessions()->Attach(c->ctx.get(), req);
    Client* raw = c.get();
    c->thread = std::thread([raw, &ready] {
      pb::ServerEvent ev;
      ready++;
      while (raw->reader->Read(&ev)) {
        const int64_t now = MonotonicNanos();
        ++raw->events;
        if (raw->first_ns == 0) raw->first_ns = now;
        raw->last_ns = now;
        if (ev.has_text_delta() && ev.text_delta().origin().agent() != "main") {
          ++raw->sub_deltas;
          for (int64_t sent : ChunkStamps(ev.text_delta().text()))
            raw->latency_ms.push_back((now - sent) / 1e6);
        }
        if (ev.has_turn_finished()) break;
      }
      raw->ctx->TryCancel();
    });
    clients.push_back(std::move(c));
  }
  while (ready < 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  auto out = RunChat(*d.sessions(), s.id(), "explore in parallel", 600);
  for (auto& c : clients) {
    c->thread.join();
    c->reader->Finish();
  }
  if (!out.finished) {
    std::fprintf(stderr, "sub-agent turn did not finish\n%s\n", d.log().c_str());
    return 1;
  }
  for (size_t i = 0; i < clients.size(); ++i) {
    const auto& c = *clients[i];
    const double secs = (c.last_ns - c.first_ns) / 1e9;
    std::printf(
        "RESULT subagents client=%zu events=%llu (sub-agent text deltas %llu, %d x %d chunks of 32 "
        "B) "
        "events_per_s=%.0f latency_ms p50=%.3f p99=%.3f\n",
        i + 1, static_cast<unsigned long long>(c.events),
        static_cast<unsigned long long>(c.sub_deltas), 10, chunks, c.events / std::max(secs, 1e-9),
        Percentile(c.latency_ms, 0.5), Percentile(c.latency_ms, 0.99));
    auto& r =
        Report().Add(absl::StrCat("subagents_client_", i + 1),
                     absl::StrCat("ten parallel sub-agents → attached client ", i + 1, " of 2"),
                     absl::StrCat("10 sub-agents, each streamed ", chunks,
                                  " chunks of 32 B by the provider as fast as it can"),
                     c.events / std::max(secs, 1e-9), "events/s");
    r["also"] = {
        {{"label", "latency p50"}, {"value", Percentile(c.latency_ms, 0.5)}, {"unit", "ms"}},
        {{"label", "p99"}, {"value", Percentile(c.latency_ms, 0.99)}, {"unit", "ms"}}};
  }

  // Skill runs: wall time of Skills.Run minus the step's own duration.
  std::filesystem::create_directories(d.project_dir() + "/.fwai/skills");
  std::ofstream(d.project_dir() + "/.fwai/skills/noop.yaml")
      << "name: noop\nsteps:\n  - tool: shell\n    command: \"true\"\n";
  auto skills = pb::Skills::NewStub(d.channel());
  std::vector<double> total_ms, overhead_ms;
  const int runs = quick ? 20 : 100;
  for (int i = 0; i < runs; ++i) {
    grpc::ClientContext ctx;
    pb::RunSkillRequest req;
    req.set_project_root(d.project_dir());
    req.set_skill("noop");
    req.set_ci(true);
    const int64_t t0 = MonotonicNanos();
    auto reader = skills->Run(&ctx, req);
    pb::SkillEvent ev;
    double step_ms = -1;
    while (reader->Read(&ev)) {
      if (ev.kind() == "step_finished")
        step_ms = nlohmann::json::parse(ev.json()).value("duration_ms", -1.0);
    }
    const double total = (MonotonicNanos() - t0) / 1e6;
    if (!reader->Finish().ok() || step_ms < 0) {
      std::fprintf(stderr, "skill run %d failed\n%s\n", i, d.log().c_str());
      return 1;
    }
    total_ms.push_back(total);
    overhead_ms.push_back(total - step_ms);
  }
  std::printf(
      "RESULT skill_run ms p50=%.2f p99=%.2f daemon_overhead_ms p50=%.2f p99=%.2f (%d runs of a "
      "one-step skill, "
      "`true` in the sandbox; overhead = wall time - the step's duration)\n",
      Percentile(total_ms, 0.5), Percentile(total_ms, 0.99), Percentile(overhead_ms, 0.5),
      Percentile(overhead_ms, 0.99), runs);
  const std::string input =
      absl::StrCat(runs, " runs of a one-step skill (`true` in the sandbox) through `Skills.Run`");
  auto& w =
      Report().Add("skill_run", "a skill run, wall time", input, Percentile(total_ms, 0.5), "ms");
  w["p50"] = Percentile(total_ms, 0.5);
  w["p99"] = Percentile(total_ms, 0.99);
  auto& o = Report().Add("skill_run_daemon",
                         "a skill run, the daemon's part (wall time − the step's own duration)",
                         input, Percentile(overhead_ms, 0.5), "ms");
  o["p50"] = Percentile(overhead_ms, 0.5);
  o["p99"] = Percentile(overhead_ms, 0.99);
  return 0;
}

}  // namespace
}  // namespace fwai::testing

int main(int argc, char** argv) {
  fwai::testing::Report().Init("fwai_agent_bench", argc, argv);
  const int rc = fwai::testing::Main(argc, argv);
  return rc == 0 && !fwai::testing::Report().Write() ? 1 : rc;
}
