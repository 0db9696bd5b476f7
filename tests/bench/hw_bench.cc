// fwai_hw_bench: the hardware broker with a real fwaid and real gRPC.
//
//   serial      lines/s and MB/s from a port (a pty the bench drives) to 1 and
//               10 readers on Hardware.Serial, and the line latency (port
//               write -> client read, p50/p99)
//   flash       time from a Flash request to the boot banner on the simulated
//               STM32VLDISCOVERY (QEMU), median of several flashes
//   rtt         the example firmware's RTT on that board, polled by fwaid at
//               its default interval: bytes/s of a burst the firmware writes
//               as fast as fwaid drains its ring, and the latency from a
//               UART command to its RTT log line at a reader, beside the same
//               command's UART answer (the baseline) in the same run
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <pty.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "fwai/v1/hardware.grpc.pb.h"
#include "tests/bench/bench_report.h"
#include "tests/bench/bench_util.h"
#include "tests/bench/flash_timing.h"
#include "tests/integration/daemon_fixture.h"

namespace fwai::testing {
namespace {

namespace pb = fwai::v1;

struct SerialRun {
  double lines_per_s = 0;
  double mb_per_s = 0;
  double p50_ms = 0, p99_ms = 0;
  double added_p50_ms = 0, added_p99_ms = 0;
  uint64_t lost = 0;
};

// Writes `lines` timestamped lines into the pty; `readers` streams read them.
SerialRun RunSerial(Daemon& d, int master, int readers, int lines, int pace_us) {
  auto stub = pb::Hardware::NewStub(d.channel());
  struct Reader {
    std::unique_ptr<grpc::ClientContext> ctx;
    std::unique_ptr<grpc::ClientReaderWriter<pb::SerialClientMessage, pb::SerialServerMessage>>
        stream;
    std::vector<double> latency_ms;  // pty write -> client read
    std::vector<double> added_ms;    // fwaid read the port -> client read
    uint64_t got = 0;
    std::thread thread;
  };
  std::vector<std::unique_ptr<Reader>> rs;
  std::atomic<int> opened{0};
  const std::string tag = "bench" + std::to_string(NowMicros());
  for (int i = 0; i < readers; ++i) {
    auto r = std::make_unique<Reader>();
    r->ctx = std::make_unique<grpc::ClientContext>();
    r->stream = stub->Serial(r->ctx.get());
    pb::SerialClientMessage open;
    open.mutable_open()->set_device_id("bench-port");
    r->stream->Write(open);
    Reader* raw = r.get();
    r->thread = std::thread([raw, lines, &opened, tag] {
      pb::SerialServerMessage m;
      while (raw->stream->Read(&m)) {
        if (!m.opened().empty()) {
          opened++;
          continue;
        }
        bool last = false;
        for (const auto& line : m.lines()) {
          const std::string& l = line.line();
          if (l.compare(0, tag.size(), tag) != 0) continue;
          // "<tag> <seq> <mono_ns> padding"
          unsigned long long seq = 0, ns = 0, wall = 0;
          if (std::sscanf(l.c_str() + tag.size(), " %llu %llu %llu", &seq, &ns, &wall) == 3) {
            raw->latency_ms.push_back((MonotonicNanos() - static_cast<int64_t>(ns)) / 1e6);
            raw->added_ms.push_back((NowMicros() - line.time_us()) / 1e3);
            raw->got++;
            last |= static_cast<int>(seq) == lines - 1;
          }
        }
        if (last) break;
      }
      raw->ctx->TryCancel();
    });
    rs.push_back(std::move(r));
  }
  while (opened < readers) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const auto t0 = std::chrono::steady_clock::now();
  uint64_t bytes = 0;
  for (int i = 0; i < lines; ++i) {
    char buf[128];
    int n = std::snprintf(buf, sizeof buf, "%s %d %lld %lld ...\r\n", tag.c_str(), i,
                          static_cast<long long>(MonotonicNanos()),
                          static_cast<long long>(NowMicros()));
    size_t off = 0;
    while (off < static_cast<size_t>(n)) {
      ssize_t w = write(master, buf + off, static_cast<size_t>(n) - off);
      if (w > 0) off += static_cast<size_t>(w);
    }
    bytes += static_cast<uint64_t>(n);
    if (pace_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(pace_us));
  }
  SerialRun out;
  std::vector<double> all, added;
  for (auto& r : rs) {
    r->thread.join();
    r->stream->Finish();
    all.insert(all.end(), r->latency_ms.begin(), r->latency_ms.end());
    added.insert(added.end(), r->added_ms.begin(), r->added_ms.end());
    out.lost += static_cast<uint64_t>(lines) - r->got;
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  out.lines_per_s = lines / s;
  out.mb_per_s = bytes / s / 1e6;
  out.p50_ms = Percentile(all, 0.5);
  out.p99_ms = Percentile(all, 0.99);
  out.added_p50_ms = Percentile(added, 0.5);
  out.added_p99_ms = Percentile(added, 0.99);
  return out;
}

// One Hardware.Serial stream of the simulated board, read by a thread that
// stamps each line as it arrives.
class StampedStream {
 public:
  StampedStream(pb::Hardware::Stub& stub, const std::string& lease_id, const std::string& stream) {
    rw_ = stub.Serial(&ctx_);
    pb::SerialClientMessage open;
    open.mutable_open()->set_device_id("sim");
    open.mutable_open()->set_lease_id(lease_id);
    open.mutable_open()->set_stream(stream);
    pb::SerialServerMessage first;
    ok_ = rw_->Write(open) && rw_->Read(&first) && !first.opened().empty();
    if (ok_) thread_ = std::thread([this] { Read(); });
  }
  ~StampedStream() {
    ctx_.TryCancel();
    if (thread_.joinable()) thread_.join();
  }
  bool ok() const { return ok_; }
  bool SendLine(const std::string& text) {
    pb::SerialClientMessage m;
    m.set_send_line(text);
    std::lock_guard<std::mutex> lock(write_mu_);
    return rw_->Write(m);
  }
  // The monotonic time (ns) the first line starting with `prefix` arrived,
  // waiting up to `timeout_s`; 0 if none did.
  int64_t WaitFor(const std::string& prefix, double timeout_s) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      for (const auto& [at, text] : lines_) {
        if (text.compare(0, prefix.size(), prefix) == 0) return at;
      }
      if (cv_.wait_until(lock, end) == std::cv_status::timeout) return 0;
    }
  }
  std::vector<std::pair<int64_t, std::string>> Take() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(lines_, {});
  }

 private:
  void Read() {
    pb::SerialServerMessage m;
    while (rw_->Read(&m)) {
      const int64_t at = MonotonicNanos();
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& l : m.lines()) lines_.emplace_back(at, l.line());
      cv_.notify_all();
    }
    (void)rw_->Finish();
  }

  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<pb::SerialClientMessage, pb::SerialServerMessage>> rw_;
  bool ok_ = false;
  std::mutex write_mu_, mu_;
  std::condition_variable cv_;
  std::vector<std::pair<int64_t, std::string>> lines_;
  std::thread thread_;
};

// RTT on the booted simulated board: a burst's bytes/s and the latency of a
// command's RTT log line beside its UART answer. Returns false on a failure.
bool RunRtt(pb::Hardware::Stub& stub, const std::string& lease_id, bool quick) {
  StampedStream uart(stub, lease_id, "uart"), log(stub, lease_id, "rtt:0"),
      trace(stub, lease_id, "rtt:1");
  if (!uart.ok() || !log.ok() || !trace.ok()) {
    std::fprintf(stderr, "rtt: a stream did not open\n");
    return false;
  }
  // Latency: each command's RTT log line ("uart cmd: markI") and its UART
  // answer ("unknown command: markI"), both from the moment it was sent.
  std::vector<double> rtt_ms, uart_ms;
  const int marks = quick ? 20 : 100;
  std::mt19937 rng(1);
  std::uniform_int_distribution<int> gap(1'000, 23'000);
  for (int i = -3; i < marks; ++i) {  // three first, not counted: the console's first lines
    const std::string mark = absl::StrCat("mark", i);
    const int64_t sent = MonotonicNanos();
    if (!uart.SendLine(mark)) return false;
    const int64_t on_rtt = log.WaitFor("uart cmd: " + mark, 10);
    const int64_t on_uart = uart.WaitFor("unknown command: " + mark, 10);
    if (on_rtt == 0 || on_uart == 0) {
      std::fprintf(stderr, "rtt: %s not seen (rtt %d, uart %d)\n", mark.c_str(), on_rtt != 0,
                   on_uart != 0);
      return false;
    }
    if (i >= 0) {
      rtt_ms.push_back((on_rtt - sent) / 1e6);
      uart_ms.push_back((on_uart - sent) / 1e6);
    }
    log.Take();
    uart.Take();
    // Spaced irregularly, so the commands fall at every phase of fwaid's polls.
    std::this_thread::sleep_for(std::chrono::microseconds(gap(rng)));
  }
  // Throughput: a burst of 64-byte lines on the trace channel.
  const int lines = quick ? 2000 : 10000;
  trace.Take();
  if (!uart.SendLine(absl::StrCat("burst ", lines))) return false;
  if (uart.WaitFor("burst done", 120) == 0) {
    std::fprintf(stderr, "rtt: the burst did not finish\n");
    return false;
  }
  const int64_t last = trace.WaitFor(absl::StrCat("burst ", lines - 1, " "), 30);
  int64_t first = 0;
  int got = 0;
  for (const auto& [at, text] : trace.Take()) {
    if (text.rfind("burst ", 0) != 0) continue;
    if (first == 0) first = at;
    ++got;
  }
  if (last == 0 || got < 2) {
    std::fprintf(stderr, "rtt: %d of %d burst lines read\n", got, lines);
    return false;
  }
  const double seconds = (last - first) / 1e9;
  const double bytes_per_s = (got - 1) * 64.0 / seconds;
  std::printf(
      "rtt: burst of %d lines of 64 B on rtt:1: %.0f KB/s (%d lines read, %d lost); UART command "
      "-> its RTT log line at a reader p50 %.2f ms p99 %.2f ms, -> its UART answer p50 %.2f ms "
      "p99 %.2f ms (%d commands)\n",
      lines, bytes_per_s / 1e3, got, lines - got, Percentile(rtt_ms, 0.5), Percentile(rtt_ms, 0.99),
      Percentile(uart_ms, 0.5), Percentile(uart_ms, 0.99), marks);
  auto& t = Report().Add("rtt_throughput", "RTT throughput, firmware → reader",
                         absl::StrCat("a burst of ", lines,
                                      " lines of 64 B on up-channel 1 (a 512 B ring), fwaid "
                                      "polling every 10 ms, at once while a ring is half full"),
                         bytes_per_s / 1e3, "KB/s");
  t["also"] = {{{"label", "lines lost"}, {"value", lines - got}, {"unit", ""}}};
  auto& l = Report().Add(
      "rtt_latency", "RTT line latency, UART command → its RTT log line at a reader",
      absl::StrCat(
          marks,
          " commands 1 to 23 ms apart (seeded); the same command's UART answer is the baseline"),
      Percentile(rtt_ms, 0.99), "ms");
  l["p50"] = Percentile(rtt_ms, 0.5);
  l["p99"] = Percentile(rtt_ms, 0.99);
  l["also"] = {{{"label", "baseline: its UART answer p50"},
                {"value", Percentile(uart_ms, 0.5)},
                {"unit", "ms"}},
               {{"label", "p99"}, {"value", Percentile(uart_ms, 0.99)}, {"unit", "ms"}}};
  return true;
}

int Main(int argc, char** argv) {
  const bool quick = Report().quick();
  const int reps = quick ? 1 : 3;
  const char* commit = std::getenv("FWAI_COMMIT");
  std::printf("fwai_hw_bench (commit %s, %s)\n", commit ? commit : "unknown",
              quick ? "quick" : "full");

  int master = -1, slave = -1;
  char name[128];
  termios raw{};
  cfmakeraw(&raw);
  if (openpty(&master, &slave, name, &raw, nullptr) != 0) {
    std::perror("openpty");
    return 1;
  }
  fcntl(master, F_SETFD, FD_CLOEXEC);
  fcntl(slave, F_SETFD, FD_CLOEXEC);
  Daemon d(
      nullptr,
      std::string("hardware:\n  history_lines: 1000\n  boards:\n") +
          "    - {id: bench-port, serial: " + name + "}\n" +
          "    - {id: sim, kind: simulated, machine: stm32vldiscovery, boot_pattern: booted}\n");
  if (!d.Start()) {
    std::fprintf(stderr, "fwaid did not start:\n%s\n", d.log().c_str());
    return 1;
  }
  // Drain what the hub writes back (nothing) and keep the slave open.
  const int lines = quick ? 5000 : 20000;
  for (int readers : {1, 10}) {
    std::vector<double> lps, mbps, p50, p99, a50, a99;
    uint64_t lost = 0;
    for (int rep = 0; rep < reps; ++rep) {
      auto r = RunSerial(d, master, readers, lines, 0);
      lps.push_back(r.lines_per_s);
      mbps.push_back(r.mb_per_s);
      lost += r.lost;
    }
    // Latency with the port paced like a 115200-baud console printing
    // without pause (64-byte lines, 8N1: 5.6 ms a line).
    for (int rep = 0; rep < reps; ++rep) {
      auto r = RunSerial(d, master, readers, quick ? 200 : 600, 5556);
      p50.push_back(r.p50_ms);
      p99.push_back(r.p99_ms);
      a50.push_back(r.added_p50_ms);
      a99.push_back(r.added_p99_ms);
    }
    std::printf(
        "serial -> %2d reader%s: %8.0f lines/s (%.2f MB/s), %d lines of 64 B, lost %llu; "
        "at 115200 baud: port write -> client p50 %.3f ms p99 %.3f ms, of which fwaid (port read "
        "-> client) "
        "p50 %.3f ms p99 %.3f ms (median of %d)\n",
        readers, readers == 1 ? " " : "s", Median(lps), Median(mbps), lines,
        static_cast<unsigned long long>(lost), Median(p50), Median(p99), Median(a50), Median(a99),
        reps);
    const std::string to = absl::StrCat(readers, readers == 1 ? " reader" : " readers");
    auto& t = Report().Add(
        absl::StrCat("serial_throughput_", readers), "serial throughput to " + to,
        absl::StrCat(lines, " lines of 64 B written as fast as possible",
                     readers > 1 ? ", each reader gets every line" : "", "; median of ", reps),
        Median(lps), readers == 1 ? "lines/s" : "lines/s each");
    t["also"] = {{{"label", "MB/s"}, {"value", Median(mbps)}, {"unit", ""}},
                 {{"label", "lines lost"}, {"value", lost}, {"unit", ""}}};
    auto& l = Report().Add(
        absl::StrCat("serial_latency_", readers), "line latency, port write → client, " + to,
        absl::StrCat(quick ? 200 : 600, " lines paced at 115200 baud; median of ", reps),
        Median(p99), "ms");
    l["p50"] = Median(p50);
    l["p99"] = Median(p99);
    l["also"] = {{{"label", "fwaid's part (port read → client) p50"},
                  {"value", Median(a50)},
                  {"unit", "ms"}},
                 {{"label", "p99"}, {"value", Median(a99)}, {"unit", "ms"}}};
  }

  // Flash request -> boot banner on the simulated board.
  const std::string elf = std::string(FWAI_BLINKY_ELF);
  if (!std::filesystem::exists(elf)) {
    std::printf("flash: skipped (%s not built; run scripts/setup)\n", elf.c_str());
    return 0;
  }
  auto stub = pb::Hardware::NewStub(d.channel());
  pb::Lease lease;
  {
    grpc::ClientContext ctx;
    pb::AcquireRequest req;
    req.set_device_id("sim");
    auto st = stub->Acquire(&ctx, req, &lease);
    if (!st.ok()) {
      std::fprintf(stderr, "lease: %s\n", st.error_message().c_str());
      return 1;
    }
  }
  std::vector<double> flash_ms;
  const int flashes = quick ? 3 : 9;
  for (int i = 0; i < flashes; ++i) {
    pb::FlashRequest req;
    req.set_device_id("sim");
    req.set_image_path(elf);
    req.set_approved(true);
    req.set_project_root(std::filesystem::path(elf).parent_path().string());
    auto took = TimedFlash(*stub, req);
    if (!took) return 1;
    flash_ms.push_back(*took);
  }
  std::printf(
      "flash -> boot banner (QEMU stm32vldiscovery, %s): median %.1f ms, min %.1f, max %.1f over "
      "%d flashes\n",
      std::filesystem::path(elf).filename().c_str(), Median(flash_ms),
      *std::min_element(flash_ms.begin(), flash_ms.end()),
      *std::max_element(flash_ms.begin(), flash_ms.end()), flashes);
  auto& f = Report().Add("flash_to_banner", "flash request → boot banner",
                         absl::StrCat("`blinky.elf` on QEMU `stm32vldiscovery`, ", flashes,
                                      " flashes (the first after fwaid starts included)"),
                         Median(flash_ms), "ms");
  f["median"] = Median(flash_ms);
  f["min"] = *std::min_element(flash_ms.begin(), flash_ms.end());
  f["max"] = *std::max_element(flash_ms.begin(), flash_ms.end());
  if (!RunRtt(*stub, lease.lease_id(), quick)) return 1;
  close(slave);
  close(master);
  return 0;
}

}  // namespace
}  // namespace fwai::testing

int main(int argc, char** argv) {
  fwai::testing::Report().Init("fwai_hw_bench", argc, argv);
  const int rc = fwai::testing::Main(argc, argv);
  return rc == 0 && !fwai::testing::Report().Write() ? 1 : rc;
}
