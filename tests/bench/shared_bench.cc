// fwai_bench --only shared: a real fwaid serving several principals, real
// TLS (certificates from `fwaid tls init`), real tokens, the fake provider
// over real HTTP.
//
//   transport   the same turns over the unix socket and over tls:127.0.0.1
//               with a token, one after the other in each run (order
//               alternating): events/s and added latency of 20 sessions
//               streaming at 100 chunks/s, and events/s of one stream as
//               fast as the provider sends
//   principals  20 principals (20 tokens, one TLS connection each) x 5
//               sessions streaming at once: events/s, latency, and each
//               principal's share (events and latency, min and max)
//   noisy       one user's chat (4 sessions, turns back to back) alone, then
//               while another user floods cheap requests at ten times the
//               requests-per-second limit, then while a third adds a corpus
//               with `fwai kb add` to a personal collection: the chat's
//               added latency and turn start, p50/p99
//   noisy-ab    (only when named) the same chat in quiet and ingest rounds
//               taken in turn on one daemon (quiet, ingest, quiet, ...), each
//               ingest a new `fwai kb add` of the corpus; the chat's samples
//               of all quiet rounds and of all ingest rounds pooled into one
//               p99 each. With --fwaid A,B the runs alternate between two
//               fwaid binaries, so two builds are compared in one sitting.
#include "tests/bench/shared_bench.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/lib/client.h"
#include "common/clock.h"
#include "fwai/v1/auth.grpc.pb.h"
#include "fwai/v1/knowledge.grpc.pb.h"
#include "tests/bench/bench_report.h"
#include "tests/bench/bench_util.h"
#include "tests/bench/chat_clients.h"
#include "tests/integration/daemon_fixture.h"

namespace fwai::testing {
namespace {

namespace pb = fwai::v1;
namespace fs = std::filesystem;
using Channel = std::shared_ptr<grpc::Channel>;

Channel Connect(const std::string& address, const Credentials& creds) {
  auto addr = ResolveDaemonAddress(address);
  if (!addr.ok()) return nullptr;
  auto ch = ConnectToDaemon(*addr, false, 10000, creds);
  if (!ch.ok()) {
    std::fprintf(stderr, "cannot connect to %s: %s\n", address.c_str(),
                 std::string(ch.status().message()).c_str());
    return nullptr;
  }
  return *ch;
}

// A session of the channel's principal; a token without a local account
// has no project, a unix peer names one.
std::string CreateSession(const Channel& ch, const std::string& project_root = "") {
  grpc::ClientContext ctx;
  pb::CreateSessionRequest req;
  req.set_title("bench");
  req.set_project_root(project_root);
  pb::Session s;
  auto st = pb::Sessions::NewStub(ch)->Create(&ctx, req, &s);
  if (!st.ok()) std::fprintf(stderr, "create session: %s\n", st.error_message().c_str());
  return st.ok() ? s.id() : "";
}

// The shared daemon: TLS material from `fwaid tls init`, fwaid with a
// tls:127.0.0.1 listener beside its unix socket.
class SharedDaemon {
 public:
  SharedDaemon(FakeLlmServer& fake, const std::string& tls_dir, const std::string& extra_yaml,
               const std::string& binary = "") {
    d_ = std::make_unique<Daemon>(&fake, "log_level: warn\ntls: {cert: " + tls_dir +
                                             "/server.pem, key: " + tls_dir + "/server.key}\n" +
                                             extra_yaml);
    if (!binary.empty()) d_->SetBinary(binary);
    d_->AddListen("tls:127.0.0.1:0");
    ca_ = tls_dir + "/ca.pem";
  }
  bool Start() {
    if (!d_->Start()) {
      std::fprintf(stderr, "fwaid did not start:\n%s\n", d_->log().c_str());
      return false;
    }
    port_ = d_->TcpPort();
    return port_ > 0;
  }
  Daemon& d() { return *d_; }
  std::string tls_address() const { return "tls:localhost:" + std::to_string(port_); }
  const std::string& ca() const { return ca_; }
  // A user token, made over the unix socket by its admin peer.
  std::string Token(const std::string& user) {
    grpc::ClientContext ctx;
    pb::CreateTokenRequest req;
    req.set_user(user);
    req.set_role("user");
    pb::CreateTokenResponse resp;
    auto st = pb::Auth::NewStub(d_->channel())->CreateToken(&ctx, req, &resp);
    if (!st.ok())
      std::fprintf(stderr, "token for %s: %s\n", user.c_str(), st.error_message().c_str());
    return resp.token();
  }
  Channel Tls(const std::string& token) {
    return Connect(tls_address(), Credentials{ca_, "", "", token});
  }
  Channel Unix() { return Connect(d_->address(), Credentials{}); }

 private:
  std::unique_ptr<Daemon> d_;
  std::string ca_;
  int port_ = 0;
};

// Sessions streaming at once, each session a sequence of turns read by its
// own client; sessions are grouped by principal.
struct Load {
  std::vector<Channel> channels;      // per session
  std::vector<std::string> sessions;  // ids
  std::vector<int> principal;         // per session: index of its principal
  int turns = 1, chunks = 100, delay_ms = 10;
};

struct LoadResult {
  std::vector<double> latency_ms, turn_start_ms;
  std::vector<std::vector<double>> per_principal_latency;
  std::vector<uint64_t> per_principal_chunks;
  uint64_t chunks = 0;
  int turns = 0, unfinished = 0, short_turns = 0;
  double seconds = 0;
  double events_per_s() const { return chunks / std::max(seconds, 1e-9); }
};

LoadResult RunLoad(FakeLlmServer& fake, const Load& load, int principals) {
  LoadResult out;
  out.per_principal_latency.resize(principals);
  out.per_principal_chunks.resize(principals);
  const int n = static_cast<int>(load.sessions.size());
  // Each session's replies match its own tag: a turn refused or cut short
  // leaves its reply to nobody else.
  static std::atomic<int> next_session{0};
  std::vector<std::string> tags;
  for (int i = 0; i < n; ++i) {
    tags.push_back("[s" + std::to_string(next_session++) + "]");
    for (int k = 0; k < load.turns; ++k) {
      FakeReply r;
      r.bench_chunks = load.chunks;
      r.bench_chunk_bytes = 24;
      r.chunk_delay_ms = load.delay_ms;
      r.match = tags.back();
      fake.Enqueue(r);
    }
  }
  const size_t first_request = fake.request_count();
  std::mutex mu;
  std::vector<int64_t> sent(n * load.turns, 0);
  int64_t begin_ns = INT64_MAX, end_ns = 0;
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      auto stub = pb::Sessions::NewStub(load.channels[i]);
      for (int k = 0; k < load.turns; ++k) {
        const int tag = i * load.turns + k;
        const StreamStats t = Stream(*stub, load.sessions[i], true, 0,
                                     "bench t" + std::to_string(tag) + "; " + tags[i], &sent[tag]);
        std::lock_guard<std::mutex> lock(mu);
        ++out.turns;
        if (!t.finished) ++out.unfinished;
        if (t.chunks != static_cast<uint64_t>(load.chunks)) ++out.short_turns;
        out.chunks += t.chunks;
        out.per_principal_chunks[load.principal[i]] += t.chunks;
        auto& pp = out.per_principal_latency[load.principal[i]];
        pp.insert(pp.end(), t.latency_ms.begin(), t.latency_ms.end());
        out.latency_ms.insert(out.latency_ms.end(), t.latency_ms.begin(), t.latency_ms.end());
        if (t.first_ns > 0) begin_ns = std::min(begin_ns, t.first_ns);
        end_ns = std::max(end_ns, t.last_ns);
      }
    });
  }
  for (auto& t : threads) t.join();
  out.seconds = end_ns > begin_ns ? (end_ns - begin_ns) / 1e9 : 0;
  // Turn start: the user's message leaving the client to the provider's
  // request arriving. The latest user message of a request is its turn's.
  auto reqs = fake.requests();
  for (size_t k = first_request; k < reqs.size(); ++k) {
    const std::string body = reqs[k].body.dump();
    size_t at = body.rfind("bench t");
    if (at == std::string::npos) continue;
    int tag = std::atoi(body.c_str() + at + 7);
    if (tag >= 0 && tag < static_cast<int>(sent.size()) && sent[tag] > 0)
      out.turn_start_ms.push_back((reqs[k].received_ns - sent[tag]) / 1e6);
  }
  return out;
}

bool Complete(const LoadResult& r, const char* what) {
  if (r.unfinished == 0 && r.short_turns == 0) return true;
  std::printf("ERROR %s: %d of %d turns unfinished, %d turns missing chunks\n", what, r.unfinished,
              r.turns, r.short_turns);
  return false;
}

std::string Figures(const std::vector<double>& v) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "p50=%.2f p99=%.2f", Percentile(v, 0.5), Percentile(v, 0.99));
  return buf;
}

// Markdown-ish corpus of `files` files of about `kb` KB each: register
// descriptions, prose and code, distinct per file.
std::string MakeCorpus(int files, int kb) {
  std::string dir = MakeTempDir("fwai-bench-corpus-");
  uint64_t x = 88172645463325252ull;  // xorshift: the same corpus every run
  auto next = [&x] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  static const char* kWords[] = {
      "UART",     "DMA",      "interrupt", "register", "clock",      "prescaler",
      "baud",     "FIFO",     "timeout",   "buffer",   "peripheral", "enable",
      "status",   "flag",     "channel",   "transfer", "GPIO",       "pin",
      "reset",    "watchdog", "flash",     "sector",   "erase",      "bootloader",
      "the",      "is",       "when",      "set",      "cleared",    "by",
      "software", "hardware", "bit",       "mode",     "SPI",        "I2C"};
  const int nwords = sizeof kWords / sizeof kWords[0];
  for (int f = 0; f < files; ++f) {
    std::ofstream out(dir + "/note" + std::to_string(f) + ".md");
    out << "# Peripheral note " << f << "\n\n";
    size_t bytes = 0;
    int para = 0;
    while (bytes < static_cast<size_t>(kb) * 1024) {
      std::string p = "## Section " + std::to_string(para++) + "\n\n";
      for (int w = 0; w < 120; ++w) {
        p += kWords[next() % nwords];
        p += (w % 17 == 16) ? ".\n" : " ";
      }
      p += "\n\nREG_" + std::to_string(next() % 100000) + " offset 0x" +
           std::to_string(next() % 4096) + "\n\n";
      out << p;
      bytes += p.size();
    }
  }
  return dir;
}

int Median3(std::vector<double> v) { return static_cast<int>(Median(std::move(v))); }

// The number of documents in `collection` as `ch`'s principal sees it.
int CountDocuments(const Channel& ch, const std::string& collection) {
  grpc::ClientContext ctx;
  pb::ListDocumentsRequest req;
  req.set_collection(collection);
  pb::ListDocumentsResponse resp;
  return pb::Knowledge::NewStub(ch)->ListDocuments(&ctx, req, &resp).ok() ? resp.documents_size()
                                                                          : 0;
}

// One user's chat: `sessions` new sessions of `victim`, `turns` turns of
// `chunks` chunks at 100/s each, back to back.
LoadResult Chat(FakeLlmServer& fake, const Channel& victim, int sessions, int turns, int chunks) {
  Load load;
  load.turns = turns;
  load.chunks = chunks;
  for (int i = 0; i < sessions; ++i) {
    load.channels.push_back(victim);
    load.sessions.push_back(CreateSession(victim));
    load.principal.push_back(0);
  }
  return RunLoad(fake, load, 1);
}

// One fwaid's figures in the interleaved noisy-neighbour rounds.
struct PerBinary {
  std::vector<double> quiet, ingest;  // the samples of every run, pooled
  std::vector<double> run_ratio, run_quiet99, run_ingest99, docs_per_s;
};

// Records one fwaid's pooled quiet and beside-the-ingest figures, the latter
// against the former.
void ReportNoisyAb(const std::string& suffix, const std::string& binary, const PerBinary& p,
                   const std::string& input, const std::string& ingest) {
  const std::string of = suffix.empty() ? "" : " (fwaid " + binary + ")";
  auto& q = Report().Add("noisy_ab_quiet" + suffix, "the chat's added latency, quiet rounds" + of,
                         input, Percentile(p.quiet, 0.99), "ms");
  q["p50"] = Percentile(p.quiet, 0.5);
  q["p99"] = Percentile(p.quiet, 0.99);
  auto& i = Report().Add("noisy_ab_ingest" + suffix,
                         "the chat's added latency, rounds beside " + ingest + of, input,
                         Percentile(p.ingest, 0.99), "ms");
  i["p50"] = Percentile(p.ingest, 0.5);
  i["p99"] = Percentile(p.ingest, 0.99);
  i["also"] = {
      {{"label", "median of the runs' ratios"}, {"value", Median(p.run_ratio)}, {"unit", "x"}},
      {{"label", "ingest"}, {"value", Median(p.docs_per_s)}, {"unit", "files/s"}}};
  i["target"] = "p99 ≤ 2x quiet";
  Report().SetBaseline(i, "noisy_ab_quiet" + suffix, "quiet rounds");
}

// The noisy neighbour in interleaved rounds (part noisy-ab): see the top of
// this file. Returns false when a turn lost chunks or a daemon did not start.
bool RunNoisyAb(FakeLlmServer& fake, const SharedBenchOptions& o, const std::string& tls_dir,
                const std::string& limits) {
  const int sessions = 4, turns = o.quick ? 5 : 10, chunks = 50;
  const int files = o.quick ? 150 : 300, kb = 128;
  const int runs = o.runs, rounds = o.rounds;
  std::vector<std::string> binaries = o.fwaid_binaries;
  if (binaries.empty()) binaries.push_back(std::string(FWAI_BIN_DIR) + "/fwaid");
  for (const auto& b : binaries) {
    if (access(b.c_str(), X_OK) != 0) {
      std::fprintf(stderr, "--fwaid %s: not an executable file\n", b.c_str());
      return false;
    }
  }
  const std::string corpus = MakeCorpus(files, kb);
  bool ok = true;
  std::vector<PerBinary> per(binaries.size());
  std::vector<std::string> notes;
  for (int run = 0; run < runs; ++run) {
    const size_t which = run % binaries.size();
    SharedDaemon sd(fake, tls_dir, limits, binaries[which]);
    if (!sd.Start()) return false;
    Channel victim = sd.Tls(sd.Token("victim"));
    const std::string token = sd.Token("ingester");
    Channel ingester = sd.Tls(token);
    if (!victim || !ingester) return false;
    std::vector<double> quiet, ingest, quiet99, ingest99;
    int docs = 0;
    double ingest_s = 0;
    for (int round = 0; round < rounds; ++round) {
      LoadResult q = Chat(fake, victim, sessions, turns, chunks);
      ok &= Complete(q, "noisy-ab quiet");
      quiet.insert(quiet.end(), q.latency_ms.begin(), q.latency_ms.end());
      quiet99.push_back(Percentile(q.latency_ms, 0.99));

      // A new `fwai kb add` of the whole corpus into a collection of its own.
      const std::string collection = "~corpus" + std::to_string(round);
      BackgroundCommand add(
          {std::string(FWAI_BIN_DIR) + "/fwai", "kb", "add", corpus, "--collection", collection},
          {"FWAI_DAEMON=" + sd.tls_address(), "FWAI_CA_CERT=" + sd.ca(), "FWAI_TOKEN=" + token});
      while (CountDocuments(ingester, collection) < 2 && add.Wait(0) < 0)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      const int before = CountDocuments(ingester, collection);
      const int64_t t0 = MonotonicNanos();
      LoadResult r = Chat(fake, victim, sessions, turns, chunks);
      const double secs = (MonotonicNanos() - t0) / 1e9;
      const bool covered = add.Wait(0) < 0;
      const int after = CountDocuments(ingester, collection);
      ok &= Complete(r, "noisy-ab ingest");
      ingest.insert(ingest.end(), r.latency_ms.begin(), r.latency_ms.end());
      ingest99.push_back(Percentile(r.latency_ms, 0.99));
      docs += after - before;
      ingest_s += secs;
      if (!covered) {
        notes.push_back(absl::StrCat("ingest ended before the chat in run ", run + 1, " round ",
                                     round + 1, " (corpus too small)"));
      }
      kill(add.pid(), SIGTERM);
      add.Wait(30);
      // The next quiet round starts once the daemon has stored what it was
      // sent: the count holds still for half a second (at most 10 s).
      int last = -1;
      for (int k = 0; k < 20; ++k) {
        const int now = CountDocuments(ingester, collection);
        if (now == last) break;
        last = now;
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
      }
    }
    sd.d().Stop();
    const double q99 = Percentile(quiet, 0.99), i99 = Percentile(ingest, 0.99);
    PerBinary& p = per[which];
    p.quiet.insert(p.quiet.end(), quiet.begin(), quiet.end());
    p.ingest.insert(p.ingest.end(), ingest.begin(), ingest.end());
    p.run_quiet99.push_back(q99);
    p.run_ingest99.push_back(i99);
    p.run_ratio.push_back(i99 / std::max(q99, 1e-9));
    p.docs_per_s.push_back(docs / std::max(ingest_s, 1e-9));
    std::string rq, ri;
    for (size_t k = 0; k < quiet99.size(); ++k) {
      rq += absl::StrCat(k ? " " : "", absl::StrFormat("%.2f", quiet99[k]));
      ri += absl::StrCat(k ? " " : "", absl::StrFormat("%.2f", ingest99[k]));
    }
    std::printf(
        "shared noisy-ab run %d fwaid=%s: quiet p99 %.2f ms (rounds %s), beside the ingest "
        "p50 %.2f p99 %.2f ms (rounds %s): %.2fx; ingest %.1f docs/s\n",
        run + 1, binaries[which].c_str(), q99, rq.c_str(), Percentile(ingest, 0.5), i99, ri.c_str(),
        p.run_ratio.back(), p.docs_per_s.back());
    std::fflush(stdout);
  }
  for (size_t b = 0; b < binaries.size(); ++b) {
    const PerBinary& p = per[b];
    if (p.run_ratio.empty()) continue;
    std::string ratios;
    for (size_t k = 0; k < p.run_ratio.size(); ++k)
      ratios += absl::StrFormat("%s%.2f", k ? " " : "", p.run_ratio[k]);
    const double q99 = Percentile(p.quiet, 0.99), i99 = Percentile(p.ingest, 0.99);
    std::printf(
        "RESULT shared noisy-ab fwaid=%s pooled chat latency_ms quiet p50=%.2f p99=%.2f, beside "
        "the ingest p50=%.2f p99=%.2f: %.2fx quiet (target <=2x); per run %s (median %.2fx); "
        "ingest_docs_per_s=%.1f (median; %zu runs x %d rounds of each kind; input: one user's %d "
        "sessions x %d turns x %d chunks at 100/s a round; ingest: fwai kb add of %d files of %d "
        "KB into a new collection a round)\n",
        binaries[b].c_str(), Percentile(p.quiet, 0.5), q99, Percentile(p.ingest, 0.5), i99,
        i99 / std::max(q99, 1e-9), ratios.c_str(), Median(p.run_ratio), Median(p.docs_per_s),
        p.run_ratio.size(), rounds, sessions, turns, chunks, files, kb);
    ReportNoisyAb(binaries.size() > 1 ? absl::StrCat("_", b + 1) : "", binaries[b], p,
                  absl::StrCat("one user's ", sessions, " sessions x ", turns, " turns x ", chunks,
                               " chunks at 100/s a round over TLS, pooled over ",
                               p.run_ratio.size(), " runs x ", rounds, " rounds of each kind"),
                  absl::StrCat("fwai kb add of ", files, " files of ", kb, " KB"));
  }
  for (const auto& n : notes) std::printf("NOTE %s\n", n.c_str());
  std::fflush(stdout);
  fs::remove_all(corpus);
  return ok;
}

}  // namespace

int RunSharedBench(FakeLlmServer& fake, const SharedBenchOptions& o) {
  const int runs = o.tiny ? 1 : o.runs;
  const std::string tls_dir = MakeTempDir("fwai-bench-tls-") + "/tls";
  {
    std::string out, err;
    if (RunCommand({std::string(FWAI_BIN_DIR) + "/fwaid", "tls", "init", tls_dir, "--host",
                    "localhost", "--host", "127.0.0.1"},
                   &out, &err) != 0) {
      std::fprintf(stderr, "fwaid tls init: %s\n", err.c_str());
      return 1;
    }
  }
  bool ok = true;
  // 20 turns of one principal at once: over the default running_turns (4).
  const std::string limits = "limits: {running_turns: 32}\n";

  auto wanted = [&](const char* part) { return o.part.empty() || o.part == part; };
  if (o.part == "noisy-ab") {
    if (!o.tiny) ok = RunNoisyAb(fake, o, tls_dir, limits);
    fs::remove_all(fs::path(tls_dir).parent_path());
    std::printf("%s\n", ok ? "shared: every turn delivered every chunk"
                           : "shared: FAILED (see ERROR lines)");
    return ok ? 0 : 1;
  }
  // --- The same load over the unix socket and over TLS with a token.
  if (wanted("transport")) {
    const int sessions = o.tiny ? 2 : 20;
    const int chunks = o.tiny ? 20 : (o.quick ? 100 : 300);
    const int burst = o.tiny ? 200 : (o.quick ? 20000 : 100000);
    std::map<std::string, std::vector<double>> rate, p50, p99, start99, fast;
    for (int run = 0; run < runs; ++run) {
      SharedDaemon sd(fake, tls_dir, limits);
      if (!sd.Start()) return 1;
      const std::string token = sd.Token("tlsuser");
      std::vector<std::string> order = {"unix", "tls"};
      if (run % 2) std::swap(order[0], order[1]);
      for (const auto& transport : order) {
        auto connect = [&] { return transport == "unix" ? sd.Unix() : sd.Tls(token); };
        const std::string root = transport == "unix" ? sd.d().project_dir() : "";
        Load load;
        load.chunks = chunks;
        for (int i = 0; i < sessions; ++i) {
          load.channels.push_back(connect());
          if (!load.channels.back()) return 1;
          load.sessions.push_back(CreateSession(load.channels.back(), root));
          load.principal.push_back(0);
        }
        LoadResult r = RunLoad(fake, load, 1);
        ok &= Complete(r, transport.c_str());
        // One stream as fast as the provider sends.
        Load one;
        one.chunks = burst;
        one.delay_ms = 0;
        one.channels.push_back(connect());
        one.sessions.push_back(CreateSession(one.channels.back(), root));
        one.principal.push_back(0);
        LoadResult f = RunLoad(fake, one, 1);
        ok &= Complete(f, transport.c_str());
        rate[transport].push_back(r.events_per_s());
        p50[transport].push_back(Percentile(r.latency_ms, 0.5));
        p99[transport].push_back(Percentile(r.latency_ms, 0.99));
        start99[transport].push_back(Percentile(r.turn_start_ms, 0.99));
        fast[transport].push_back(f.events_per_s());
        std::printf(
            "shared transport run %d %-4s: %d sessions x %d chunks at 100/s: %.0f events/s, "
            "latency_ms %s, turn "
            "start %s ms | one stream of %d chunks: %.0f events/s\n",
            run + 1, transport.c_str(), sessions, chunks, r.events_per_s(),
            Figures(r.latency_ms).c_str(), Figures(r.turn_start_ms).c_str(), burst,
            f.events_per_s());
        std::fflush(stdout);
      }
      sd.d().Stop();
    }
    for (const std::string t : {"unix", "tls"}) {
      std::printf(
          "RESULT shared transport=%s events_per_s=%.0f latency_ms p50=%.2f p99=%.2f "
          "turn_start_p99_ms=%.1f "
          "one_stream_events_per_s=%.0f (medians of %d runs; input: %d sessions x %d chunks of 24 "
          "B at 100/s, one "
          "stream of %d chunks; %s)\n",
          t.c_str(), Median(rate[t]), Median(p50[t]), Median(p99[t]), Median(start99[t]),
          Median(fast[t]), runs, sessions, chunks, burst,
          t == "unix" ? "unix socket, the caller's uid"
                      : "tls:127.0.0.1, certificate from fwaid tls init, a token");
      const std::string how =
          t == "unix" ? "unix socket (the caller's uid)" : "tls:127.0.0.1 with a token";
      auto& r = Report().Add(
          "transport_" + t, "added latency, " + how,
          absl::StrCat(sessions, " sessions x ", chunks,
                       " chunks of 24 B at 100/s, the same daemon for both transports, order "
                       "alternating; medians of ",
                       runs, " runs"),
          Median(p99[t]), "ms");
      r["p50"] = Median(p50[t]);
      r["p99"] = Median(p99[t]);
      r["also"] = {{{"label", "delivered"}, {"value", Median(rate[t])}, {"unit", "events/s"}},
                   {{"label", "turn start p99"}, {"value", Median(start99[t])}, {"unit", "ms"}}};
      auto& f = Report().Add("one_stream_" + t, "one stream as fast as the provider sends, " + how,
                             absl::StrCat(burst, " chunks of 24 B; medians of ", runs, " runs"),
                             Median(fast[t]), "events/s");
      if (t == "tls") {
        Report().SetBaseline(r, "transport_unix", "unix socket");
        Report().SetBaseline(f, "one_stream_unix", "unix socket");
      }
    }
    std::fflush(stdout);
  }

  // --- 20 principals x 5 sessions at once, each principal on its own TLS connection.
  if (wanted("principals")) {
    const int principals = o.tiny ? 3 : 20, per = o.tiny ? 2 : 5;
    const int chunks = o.tiny ? 20 : (o.quick ? 100 : 300);
    std::vector<double> rate, p50, p99, min_share, max_share, min_p99, max_p99;
    for (int run = 0; run < runs; ++run) {
      SharedDaemon sd(fake, tls_dir, limits);
      if (!sd.Start()) return 1;
      Load load;
      load.chunks = chunks;
      for (int p = 0; p < principals; ++p) {
        Channel ch = sd.Tls(sd.Token("user" + std::to_string(p)));
        if (!ch) return 1;
        for (int s = 0; s < per; ++s) {
          load.channels.push_back(ch);
          load.sessions.push_back(CreateSession(ch));
          load.principal.push_back(p);
        }
      }
      LoadResult r = RunLoad(fake, load, principals);
      ok &= Complete(r, "principals");
      const uint64_t share = static_cast<uint64_t>(per) * chunks;
      for (int p = 0; p < principals; ++p) {
        if (r.per_principal_chunks[p] != share) {
          std::printf("ERROR principals: user%d got %llu of its %llu events\n", p,
                      static_cast<unsigned long long>(r.per_principal_chunks[p]),
                      static_cast<unsigned long long>(share));
          ok = false;
        }
      }
      std::vector<double> shares, p99s;
      for (int p = 0; p < principals; ++p) {
        shares.push_back(static_cast<double>(r.per_principal_chunks[p]));
        p99s.push_back(Percentile(r.per_principal_latency[p], 0.99));
      }
      rate.push_back(r.events_per_s());
      p50.push_back(Percentile(r.latency_ms, 0.5));
      p99.push_back(Percentile(r.latency_ms, 0.99));
      min_share.push_back(*std::min_element(shares.begin(), shares.end()));
      max_share.push_back(*std::max_element(shares.begin(), shares.end()));
      min_p99.push_back(*std::min_element(p99s.begin(), p99s.end()));
      max_p99.push_back(*std::max_element(p99s.begin(), p99s.end()));
      std::printf(
          "shared principals run %d: %d principals x %d sessions x %d chunks at 100/s: %.0f "
          "events/s, latency_ms %s, "
          "events per principal min %.0f max %.0f (of %llu), per-principal p99 min %.2f max %.2f "
          "ms\n",
          run + 1, principals, per, chunks, r.events_per_s(), Figures(r.latency_ms).c_str(),
          min_share.back(), max_share.back(), static_cast<unsigned long long>(share),
          min_p99.back(), max_p99.back());
      std::fflush(stdout);
      sd.d().Stop();
    }
    std::printf(
        "RESULT shared principals=%d sessions_each=%d events_per_s=%.0f latency_ms p50=%.2f "
        "p99=%.2f "
        "events_per_principal min=%d max=%d per_principal_p99_ms min=%.2f max=%.2f (medians of %d "
        "runs; input: %d "
        "chunks of 24 B at 100/s a session, tls:127.0.0.1, one token and one connection a "
        "principal)\n",
        principals, per, Median(rate), Median(p50), Median(p99), Median3(min_share),
        Median3(max_share), Median(min_p99), Median(max_p99), runs, chunks);
    auto& r = Report().Add(
        "principals",
        absl::StrCat(principals, " principals x ", per,
                     " sessions, TLS, one token and connection each"),
        absl::StrCat(chunks, " chunks of 24 B at 100/s a session (", principals * per * 100,
                     " events/s offered); medians of ", runs, " runs"),
        Median(rate), "events/s");
    r["also"] = {
        {{"label", "added latency p50"}, {"value", Median(p50)}, {"unit", "ms"}},
        {{"label", "p99"}, {"value", Median(p99)}, {"unit", "ms"}},
        {{"label", "events a principal got, fewest"}, {"value", Median3(min_share)}, {"unit", ""}},
        {{"label", "most"}, {"value", Median3(max_share)}, {"unit", ""}},
        {{"label", "a principal's p99, lowest"}, {"value", Median(min_p99)}, {"unit", "ms"}},
        {{"label", "highest"}, {"value", Median(max_p99)}, {"unit", "ms"}}};
    std::fflush(stdout);
  }

  // --- The noisy neighbour.
  if (!o.tiny && wanted("noisy")) {
    const int sessions = 4, turns = o.quick ? 5 : 10, chunks = 50;
    // Files larger than the requests-per-second limit (50 a second) would
    // hold back: one request a file.
    const int files = o.quick ? 150 : 300, kb = 128;
    const std::string corpus = MakeCorpus(files, kb);
    std::map<std::string, std::vector<double>> p50, p99, start50, start99;
    std::vector<std::string> notes;
    std::vector<double> ingest_rate;  // documents/s the ingester added while the chat ran
    for (int run = 0; run < runs; ++run) {
      SharedDaemon sd(fake, tls_dir, limits);
      if (!sd.Start()) return 1;
      const std::string victim_token = sd.Token("victim");
      Channel victim = sd.Tls(victim_token);
      if (!victim) return 1;
      auto measure = [&](const std::string& label) {
        Load load;
        load.turns = turns;
        load.chunks = chunks;
        for (int i = 0; i < sessions; ++i) {
          load.channels.push_back(victim);
          load.sessions.push_back(CreateSession(victim));
          load.principal.push_back(0);
        }
        LoadResult r = RunLoad(fake, load, 1);
        ok &= Complete(r, label.c_str());
        p50[label].push_back(Percentile(r.latency_ms, 0.5));
        p99[label].push_back(Percentile(r.latency_ms, 0.99));
        start50[label].push_back(Percentile(r.turn_start_ms, 0.5));
        start99[label].push_back(Percentile(r.turn_start_ms, 0.99));
        std::printf("shared noisy run %d %-7s: chat latency_ms %s, turn start %s ms", run + 1,
                    label.c_str(), Figures(r.latency_ms).c_str(), Figures(r.turn_start_ms).c_str());
        std::fflush(stdout);
      };
      measure("quiet");
      std::printf("\n");

      // Another user floods cheap requests at ten times its limit (50/s).
      {
        Channel flooder = sd.Tls(sd.Token("flooder"));
        if (!flooder) return 1;
        std::atomic<bool> stop{false};
        std::atomic<uint64_t> admitted{0}, refused{0}, other{0};
        std::vector<std::thread> threads;
        const int64_t t0 = MonotonicNanos();
        for (int k = 0; k < 2; ++k) {
          threads.emplace_back([&, k] {
            auto sessions_stub = pb::Sessions::NewStub(flooder);
            auto kb_stub = pb::Knowledge::NewStub(flooder);
            const int64_t every_ns = 4000000;  // 250/s a thread, 500/s in all
            int64_t due = MonotonicNanos();
            for (uint64_t i = k; !stop; i += 2) {
              grpc::ClientContext ctx;
              grpc::Status st;
              if (i % 2) {
                pb::ListSessionsRequest req;
                pb::ListSessionsResponse resp;
                st = sessions_stub->List(&ctx, req, &resp);
              } else {
                pb::SearchRequest req;
                req.set_query("UART DMA timeout");
                pb::SearchResponse resp;
                st = kb_stub->Search(&ctx, req, &resp);
              }
              if (st.ok()) {
                ++admitted;
              } else if (st.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
                ++refused;
              } else {
                ++other;
              }
              due += every_ns;
              const int64_t wait = due - MonotonicNanos();
              if (wait > 0) std::this_thread::sleep_for(std::chrono::nanoseconds(wait));
            }
          });
        }
        measure("flood");
        stop = true;
        for (auto& t : threads) t.join();
        const double secs = (MonotonicNanos() - t0) / 1e9;
        std::printf(
            " | flooder: %.0f requests/s offered, %.0f/s admitted, %llu refused "
            "(RESOURCE_EXHAUSTED)%s\n",
            (admitted + refused + other) / secs, admitted / secs,
            static_cast<unsigned long long>(refused.load()),
            other ? absl::StrCat(", ", other.load(), " failed otherwise").c_str() : "");
      }

      // A third user adds a corpus to a personal collection with the CLI.
      {
        const std::string token = sd.Token("ingester");
        BackgroundCommand add(
            {std::string(FWAI_BIN_DIR) + "/fwai", "kb", "add", corpus, "--collection", "~corpus"},
            {"FWAI_DAEMON=" + sd.tls_address(), "FWAI_CA_CERT=" + sd.ca(), "FWAI_TOKEN=" + token});
        // Measure once its first documents are in.
        Channel ingester = sd.Tls(token);
        auto docs = [&] {
          grpc::ClientContext ctx;
          pb::ListDocumentsRequest req;
          req.set_collection("~corpus");
          pb::ListDocumentsResponse resp;
          return pb::Knowledge::NewStub(ingester)->ListDocuments(&ctx, req, &resp).ok()
                     ? resp.documents_size()
                     : 0;
        };
        while (docs() < 2 && add.Wait(0) < 0)
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        const int before = docs();
        const int64_t t0 = MonotonicNanos();
        measure("ingest");
        const double secs = (MonotonicNanos() - t0) / 1e9;
        const bool covered = add.Wait(0) < 0;
        const int after = docs();
        ingest_rate.push_back((after - before) / secs);
        std::printf(" | ingester: %d files (%d MB) in %.1f docs/s while the chat ran%s\n",
                    after - before, static_cast<int>((after - before) * kb / 1024),
                    (after - before) / secs,
                    covered ? ", still adding when it ended"
                            : ", FINISHED BEFORE THE CHAT DID (corpus too small)");
        if (!covered) notes.push_back("ingest ended early in run " + std::to_string(run + 1));
        kill(add.pid(), SIGTERM);
        add.Wait(30);
        if (add.err().find("limit") != std::string::npos)
          std::printf("       kb add was refused by a limit: %s\n",
                      add.err().substr(0, 300).c_str());
      }
      sd.d().Stop();
    }
    for (const std::string l : {"quiet", "flood", "ingest"}) {
      std::printf(
          "RESULT shared noisy=%s chat latency_ms p50=%.2f p99=%.2f (%.2fx quiet) turn_start_ms "
          "p50=%.1f p99=%.1f "
          "(%.2fx quiet) target p99<=2x quiet (medians of %d runs; input: one user's %d sessions x "
          "%d turns x %d chunks "
          "at 100/s; flood: 500 requests/s (List, Search) against a limit of 50/s; ingest: fwai kb "
          "add of %d files of "
          "%d KB into ~corpus)\n",
          l.c_str(), Median(p50[l]), Median(p99[l]),
          Median(p99[l]) / std::max(Median(p99["quiet"]), 1e-9), Median(start50[l]),
          Median(start99[l]), Median(start99[l]) / std::max(Median(start99["quiet"]), 1e-9), runs,
          sessions, turns, chunks, files, kb);
      static const std::map<std::string, std::string> kBeside = {
          {"quiet", "nothing"},
          {"flood", "a request flood (500 requests/s of List and Search, limit 50/s)"},
          {"ingest",
           absl::StrCat("a corpus ingest (fwai kb add of ", files, " files of ", kb, " KB)")}};
      auto& r = Report().Add(
          "noisy_" + l, "the chat's added latency beside " + kBeside.at(l),
          absl::StrCat("one user's ", sessions, " sessions x ", turns, " turns x ", chunks,
                       " chunks at 100/s over TLS; medians of ", runs, " runs"),
          Median(p99[l]), "ms");
      r["p50"] = Median(p50[l]);
      r["p99"] = Median(p99[l]);
      r["also"] = {{{"label", "turn start p50"}, {"value", Median(start50[l])}, {"unit", "ms"}},
                   {{"label", "p99"}, {"value", Median(start99[l])}, {"unit", "ms"}}};
      if (l != "quiet") {
        r["target"] = "p99 ≤ 2x quiet";
        Report().SetBaseline(r, "noisy_quiet", "quiet");
      }
    }
    Report().Add(
        "noisy_ingest_rate", "ingest beside the chat",
        absl::StrCat(kb, " KB Markdown files added by fwai kb add while the chat ran; median of ",
                     runs, " runs"),
        Median(ingest_rate), "files/s");
    std::printf(
        "RESULT shared noisy=ingest ingest_docs_per_s=%.1f (median of %d runs; %d KB Markdown "
        "files added by fwai kb add while the chat ran)\n",
        Median(ingest_rate), runs, kb);
    for (const auto& n : notes) std::printf("NOTE %s\n", n.c_str());
    fs::remove_all(corpus);
  }
  fs::remove_all(fs::path(tls_dir).parent_path());
  std::printf("%s\n", ok ? "shared: every turn delivered every chunk; every principal got its share"
                         : "shared: FAILED (see ERROR lines)");
  return ok ? 0 : 1;
}

}  // namespace fwai::testing
