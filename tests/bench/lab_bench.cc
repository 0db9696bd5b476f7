// The lab on etcd, measured: real etcd members on loopback, real fwaids.
//
//   lease        Hardware.Acquire + Hardware.Release of one board: a fwaid
//                without a lab (a local lease) vs a front leasing a bench's
//                board through etcd (3 members)
//   flash        Flash request -> boot banner of the QEMU board: on its own
//                fwaid vs through a front (the image's bytes streamed to the
//                bench over mutual TLS)
//   serial       `ping` sent -> `pong` read on the board's serial port: on its
//                own fwaid vs through a front (both ways relayed)
//   capacity     boards registered in etcd without QEMU (as benches would
//                write them), then `hw ls` through the front and lease
//                operations per second by concurrent clients through one front
//
//   fwai_lab_bench [--quick]
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/strings/str_cat.h"
#include "fwai/v1/hardware.grpc.pb.h"
#include "server/lab/etcd_client.h"
#include "tests/bench/bench_report.h"
#include "tests/bench/bench_util.h"
#include "tests/bench/flash_timing.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/lab/etcd_cluster.h"

namespace fwai::testing {
namespace {

namespace pb = ::fwai::v1;
using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

struct Stats {
  double p50 = 0, p99 = 0;
};
Stats Of(const std::vector<double>& v) { return {Percentile(v, 0.5), Percentile(v, 0.99)}; }

// Records a local figure and the same through the front, compared with it.
void ReportPair(const std::string& id, const std::string& measure, const std::string& input,
                double local50, double local99, double front50, double front99) {
  auto& l = Report().Add(id + "_local", measure + ", local fwaid", input, local50, "ms");
  l["p50"] = local50;
  l["p99"] = local99;
  auto& f = Report().Add(id + "_front", measure + ", through a front (etcd)", input, front50, "ms");
  f["p50"] = front50;
  f["p99"] = front99;
  Report().SetBaseline(f, id + "_local", "local");
}

// Acquire + release of `board` through `d`, `n` times: the two latencies.
bool LeaseCycles(Daemon& d, const std::string& board, int n, std::vector<double>* acquire,
                 std::vector<double>* release) {
  auto hw = pb::Hardware::NewStub(d.channel());
  for (int i = 0; i < n; ++i) {
    pb::AcquireRequest req;
    req.set_device_id(board);
    req.set_ttl_s(30);
    pb::Lease lease;
    auto t0 = Clock::now();
    grpc::ClientContext c1;
    auto st = hw->Acquire(&c1, req, &lease);
    if (!st.ok()) {
      std::fprintf(stderr, "acquire %s: %s\n", board.c_str(), st.error_message().c_str());
      return false;
    }
    acquire->push_back(MsSince(t0));
    pb::ReleaseRequest rel;
    rel.set_lease_id(lease.lease_id());
    pb::ReleaseResponse rr;
    t0 = Clock::now();
    grpc::ClientContext c2;
    st = hw->Release(&c2, rel, &rr);
    if (!st.ok()) {
      std::fprintf(stderr, "release %s: %s\n", board.c_str(), st.error_message().c_str());
      return false;
    }
    release->push_back(MsSince(t0));
  }
  return true;
}

absl::StatusOr<pb::Lease> Lease(Daemon& d, const std::string& board) {
  auto hw = pb::Hardware::NewStub(d.channel());
  grpc::ClientContext ctx;
  pb::AcquireRequest req;
  req.set_device_id(board);
  req.set_ttl_s(600);
  pb::Lease lease;
  auto st = hw->Acquire(&ctx, req, &lease);
  if (!st.ok()) return absl::UnavailableError(st.error_message());
  return lease;
}

// Flash request -> boot banner, `n` times.
bool Flashes(Daemon& d, const pb::Lease& lease, const std::string& elf, int n,
             std::vector<double>* ms) {
  auto hw = pb::Hardware::NewStub(d.channel());
  for (int i = 0; i < n; ++i) {
    pb::FlashRequest req;
    req.set_device_id(lease.device_id());
    req.set_lease_id(lease.lease_id());
    req.set_image_path(elf);
    req.set_approved(true);
    req.set_project_root(std::filesystem::path(elf).parent_path().string());
    auto took = TimedFlash(*hw, req);
    if (!took) return false;
    ms->push_back(*took);
  }
  return true;
}

// `ping` -> `pong` on one serial stream, `n` times.
bool PingPongs(Daemon& d, const pb::Lease& lease, int n, std::vector<double>* ms) {
  auto hw = pb::Hardware::NewStub(d.channel());
  grpc::ClientContext ctx;
  auto stream = hw->Serial(&ctx);
  pb::SerialClientMessage open;
  open.mutable_open()->set_device_id(lease.device_id());
  open.mutable_open()->set_lease_id(lease.lease_id());
  pb::SerialServerMessage m;
  if (!stream->Write(open) || !stream->Read(&m)) {
    std::fprintf(stderr, "serial: %s\n", stream->Finish().error_message().c_str());
    return false;
  }
  for (int i = 0; i < n; ++i) {
    pb::SerialClientMessage ping;
    ping.set_send_line("ping");
    auto t0 = Clock::now();
    if (!stream->Write(ping)) return false;
    bool got = false;
    while (!got && stream->Read(&m)) {
      for (const auto& l : m.lines()) got = got || l.line().rfind("pong", 0) == 0;
      if (m.end_of_stream() || !m.error().empty()) {
        std::fprintf(stderr, "serial: %s%s\n", m.reason().c_str(), m.error().c_str());
        return false;
      }
    }
    if (!got) return false;
    ms->push_back(MsSince(t0));
  }
  ctx.TryCancel();
  stream->Finish();
  return true;
}

int Main(int argc, char** argv) {
  const bool quick = Report().quick();
  const int reps = quick ? 1 : 3;
  const int lease_n = quick ? 50 : 200;
  const int flash_n = quick ? 3 : 5;
  const int ping_n = quick ? 50 : 200;
  const char* commit = std::getenv("FWAI_COMMIT");
  std::printf("fwai_lab_bench (commit %s, %s, %u cores)\n", commit ? commit : "unknown",
              quick ? "quick" : "full", std::thread::hardware_concurrency());
  const std::string elf = FWAI_BLINKY_ELF;
  if (!std::filesystem::exists(elf)) {
    std::fprintf(stderr, "%s not built (scripts/setup, scripts/build)\n", elf.c_str());
    return 1;
  }
  // The bench's own client is the only user: no per-user limit may shape the figures.
  const std::string limits =
      "limits: {leases: 10000, requests_per_second: 1000000, burst: 1000000}\n";
  const std::string board_yaml = limits +
                                 "hardware:\n  boards:\n    - {id: b1, kind: simulated, machine: "
                                 "stm32vldiscovery, boot_pattern: booted, "
                                 "tags: [stm32f1]}\n";

  // The lab: 3 etcd members, a bench with the QEMU board, a front.
  EtcdCluster cluster(3);
  if (!cluster.Start()) {
    std::fprintf(stderr, "etcd did not start: %s\n", cluster.log(0).c_str());
    return 1;
  }
  auto etcd = lab::EtcdClient::Connect(cluster.Options());
  if (!etcd.ok()) return 1;
  const std::string tls = cluster.tls_dir();
  const std::string lab = "lab:\n  ttl_s: 10\n";
  Daemon bench(nullptr,
               lab + cluster.LabEtcdYaml("bench1") +
                   "  node: bench1\n  advertise: tls:127.0.0.1:0\n" + "tls: {cert: " + tls +
                   "/bench1.pem, key: " + tls + "/bench1.key, client_ca: " + tls + "/ca.pem}\n" +
                   board_yaml,
               false);
  bench.AddListen("tls:127.0.0.1:0");
  Daemon front(nullptr,
               lab + cluster.LabEtcdYaml("front1") + "  node: front1\n  cert: " + tls +
                   "/front1.pem\n  key: " + tls + "/front1.key\n  ca: " + tls + "/ca.pem\n" +
                   limits + "hardware:\n  default_simulated_board: false\n",
               false);
  Daemon local(nullptr, board_yaml, false);  // no lab: local leases
  for (Daemon* d : {&bench, &front, &local}) {
    if (!d->Start()) {
      std::fprintf(stderr, "fwaid did not start:\n%s\n", d->log().c_str());
      return 1;
    }
  }
  for (int i = 0; i < 200; ++i) {
    auto n = etcd->get()->Get("/fwai/boards/bench1/b1");
    if (n.ok() && n->has_value()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }

  // Lease acquire + release.
  {
    std::vector<double> la50, la99, lr50, lr99, fa50, fa99, fr50, fr99;
    for (int r = 0; r < reps; ++r) {
      std::vector<double> la, lr, fa, fr;
      if (!LeaseCycles(local, "b1", lease_n, &la, &lr) ||
          !LeaseCycles(front, "b1", lease_n, &fa, &fr))
        return 1;
      la50.push_back(Of(la).p50), la99.push_back(Of(la).p99), lr50.push_back(Of(lr).p50),
          lr99.push_back(Of(lr).p99);
      fa50.push_back(Of(fa).p50), fa99.push_back(Of(fa).p99), fr50.push_back(Of(fr).p50),
          fr99.push_back(Of(fr).p99);
    }
    std::printf(
        "lease, local fwaid:        acquire p50 %.2f ms p99 %.2f ms, release p50 %.2f ms p99 %.2f "
        "ms "
        "(%d cycles, median of %d)\n",
        Median(la50), Median(la99), Median(lr50), Median(lr99), lease_n, reps);
    std::printf(
        "lease, front through etcd: acquire p50 %.2f ms p99 %.2f ms, release p50 %.2f ms p99 %.2f "
        "ms "
        "(%d cycles, 3 etcd members, median of %d)\n",
        Median(fa50), Median(fa99), Median(fr50), Median(fr99), lease_n, reps);
    const std::string input =
        absl::StrCat(lease_n, " acquire + release cycles of one board; median of ", reps, " runs");
    ReportPair("lease_acquire", "lease acquire", input, Median(la50), Median(la99), Median(fa50),
               Median(fa99));
    ReportPair("lease_release", "lease release", input, Median(lr50), Median(lr99), Median(fr50),
               Median(fr99));
  }

  // Flash -> boot banner and serial ping -> pong.
  {
    auto ll = Lease(local, "b1");
    auto fl = Lease(front, "b1");
    if (!ll.ok() || !fl.ok()) {
      std::fprintf(stderr, "lease: %s %s\n", ll.status().ToString().c_str(),
                   fl.status().ToString().c_str());
      return 1;
    }
    std::vector<double> lf, ff;
    for (int r = 0; r < reps; ++r) {
      if (!Flashes(local, *ll, elf, flash_n, &lf) || !Flashes(front, *fl, elf, flash_n, &ff))
        return 1;
    }
    std::printf(
        "flash -> boot banner: local median %.1f ms (min %.1f), through the front median %.1f ms "
        "(min %.1f): "
        "ratio %.2f (%zu flashes each of %s)\n",
        Median(lf), Percentile(lf, 0), Median(ff), Percentile(ff, 0), Median(ff) / Median(lf),
        lf.size(), std::filesystem::path(elf).filename().c_str());
    const std::string finput =
        absl::StrCat("`blinky.elf` on QEMU `stm32vldiscovery`, ", lf.size(), " flashes each");
    auto& fl_local = Report().Add("flash_local", "flash request → boot banner, local fwaid", finput,
                                  Median(lf), "ms");
    fl_local["median"] = Median(lf);
    fl_local["min"] = Percentile(lf, 0);
    auto& fl_front =
        Report().Add("flash_front", "flash request → boot banner, through a front (etcd)", finput,
                     Median(ff), "ms");
    fl_front["median"] = Median(ff);
    fl_front["min"] = Percentile(ff, 0);
    Report().SetBaseline(fl_front, "flash_local", "local");
    std::vector<double> l50, l99, f50, f99;
    for (int r = 0; r < reps; ++r) {
      std::vector<double> l, f;
      if (!PingPongs(local, *ll, ping_n, &l) || !PingPongs(front, *fl, ping_n, &f)) return 1;
      l50.push_back(Of(l).p50), l99.push_back(Of(l).p99), f50.push_back(Of(f).p50),
          f99.push_back(Of(f).p99);
    }
    std::printf(
        "serial ping -> pong: local p50 %.2f ms p99 %.2f ms, through the front p50 %.2f ms p99 "
        "%.2f ms "
        "(%d round trips, median of %d)\n",
        Median(l50), Median(l99), Median(f50), Median(f99), ping_n, reps);
    ReportPair("serial_ping", "serial `ping` → `pong`",
               absl::StrCat(ping_n, " round trips on one stream; median of ", reps, " runs"),
               Median(l50), Median(l99), Median(f50), Median(f99));
  }

  // Capacity: boards registered as benches would (no QEMU), then the
  // front's view of all of them and lease operations by concurrent clients.
  const int nodes = quick ? 10 : 40;
  const int per_node = 25;
  for (int n = 0; n < nodes; ++n) {
    const std::string node = absl::StrCat("sim", n);
    nlohmann::json nj = {
        {"node", node}, {"advertise", ""}, {"pid", 0}, {"version", "bench"}, {"started_us", 0}};
    if (!etcd->get()->Put("/fwai/nodes/" + node, nj.dump()).ok()) return 1;
    for (int b = 0; b < per_node; ++b) {
      nlohmann::json bj = {{"id", absl::StrCat(node, "-b", b)},
                           {"node", node},
                           {"kind", "simulated"},
                           {"name", ""},
                           {"target", "stm32f100rb"},
                           {"tags", {"stm32f1", "load"}},
                           {"health", "good"},
                           {"health_reason", ""}};
      if (!etcd->get()
               ->Put(absl::StrCat("/fwai/boards/", node, "/", node, "-b", b), bj.dump())
               .ok())
        return 1;
    }
  }
  const int boards = nodes * per_node + 1;
  {
    auto hw = pb::Hardware::NewStub(front.channel());
    std::vector<double> ls;
    for (int i = 0; i < (quick ? 5 : 20); ++i) {
      grpc::ClientContext ctx;
      pb::ListDevicesResponse resp;
      auto t0 = Clock::now();
      auto st = hw->ListDevices(&ctx, pb::ListDevicesRequest(), &resp);
      if (!st.ok()) return 1;
      ls.push_back(MsSince(t0));
      if (i == 0)
        std::printf(
            "capacity: %d boards on %d nodes in the lab; hw ls through the front lists %d\n",
            boards, nodes + 1, resp.devices_size());
    }
    std::printf("capacity: hw ls through the front p50 %.1f ms p99 %.1f ms\n", Percentile(ls, 0.5),
                Percentile(ls, 0.99));
    auto& r = Report().Add("hw_ls", "`hw ls` through the front, all boards",
                           absl::StrCat(boards, " boards on ", nodes + 1, " nodes (", nodes,
                                        " written into etcd as benches write them, without QEMU); ",
                                        ls.size(), " listings"),
                           Percentile(ls, 0.5), "ms");
    r["p50"] = Percentile(ls, 0.5);
    r["p99"] = Percentile(ls, 0.99);
  }
  for (int clients : {1, 8}) {
    std::vector<double> rates;
    for (int r = 0; r < reps; ++r) {
      std::atomic<int64_t> ops{0};
      std::atomic<bool> failed{false};
      const auto until = Clock::now() + std::chrono::seconds(quick ? 3 : 5);
      std::vector<std::thread> threads;
      auto t0 = Clock::now();
      for (int c = 0; c < clients; ++c) {
        threads.emplace_back([&, c] {
          // Each client its own board: lease operations, not contention.
          const std::string board = absl::StrCat("sim", c % nodes, "-b", c / nodes);
          auto hw = pb::Hardware::NewStub(front.channel());
          while (Clock::now() < until && !failed) {
            pb::AcquireRequest req;
            req.set_device_id(board);
            req.set_ttl_s(30);
            pb::Lease lease;
            grpc::ClientContext c1;
            if (auto st = hw->Acquire(&c1, req, &lease); !st.ok()) {
              std::fprintf(stderr, "acquire %s: %s\n", board.c_str(), st.error_message().c_str());
              failed = true;
              return;
            }
            pb::ReleaseRequest rel;
            rel.set_lease_id(lease.lease_id());
            pb::ReleaseResponse rr;
            grpc::ClientContext c2;
            if (auto st = hw->Release(&c2, rel, &rr); !st.ok()) {
              std::fprintf(stderr, "release %s: %s\n", board.c_str(), st.error_message().c_str());
              failed = true;
              return;
            }
            ops += 2;
          }
        });
      }
      for (auto& t : threads) t.join();
      if (failed) {
        std::fprintf(stderr, "capacity: a lease operation failed\n");
        return 1;
      }
      rates.push_back(ops / std::chrono::duration<double>(Clock::now() - t0).count());
    }
    std::printf(
        "capacity: %d client%s through one front, %d boards: %.0f lease operations/s (acquire or "
        "release; "
        "median of %d)\n",
        clients, clients == 1 ? "" : "s", boards, Median(rates), reps);
    Report().Add(
        absl::StrCat("lease_ops_", clients),
        absl::StrCat("lease operations through one front, ", clients,
                     clients == 1 ? " client" : " clients"),
        absl::StrCat(
            boards,
            " boards registered, each client on its own board, an acquire or a release each; ",
            quick ? 3 : 5, " s a run, median of ", reps, " runs"),
        Median(rates), "operations/s");
  }
  return 0;
}

}  // namespace
}  // namespace fwai::testing

int main(int argc, char** argv) {
  fwai::testing::Report().Init("fwai_lab_bench", argc, argv);
  const int rc = fwai::testing::Main(argc, argv);
  return rc == 0 && !fwai::testing::Report().Write() ? 1 : rc;
}
