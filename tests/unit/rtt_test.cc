// The host's side of SEGGER RTT against a simulated target: a RAM image
// that a small "firmware" below writes as SEGGER's target code does.
#include "server/hardware/rtt.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "server/firmware/elf_file.h"
#include "server/hardware/qemu.h"
#include "server/hardware/rtt_pump.h"

namespace fwai {
namespace {

constexpr uint32_t kRam = 0x20000000;
constexpr uint32_t kRamSize = 8192;

// RAM at kRam. Reads and writes outside it fail, naming the address. Every
// write's address is kept, and `on_read` runs after each read (a target that
// runs while the host copies).
class FakeMemory : public TargetMemory {
 public:
  std::vector<uint8_t> ram = std::vector<uint8_t>(kRamSize, 0);
  std::vector<std::pair<uint32_t, size_t>> writes;
  std::function<void(uint32_t)> on_read;
  bool fail = false;

  absl::Status Read(uint32_t address, std::span<uint8_t> out) override {
    if (auto bad = Check(address, out.size()); !bad.ok()) return bad;
    std::memcpy(out.data(), ram.data() + (address - kRam), out.size());
    if (on_read) on_read(address);
    return absl::OkStatus();
  }
  absl::Status Write(uint32_t address, std::span<const uint8_t> bytes) override {
    if (auto bad = Check(address, bytes.size()); !bad.ok()) return bad;
    std::memcpy(ram.data() + (address - kRam), bytes.data(), bytes.size());
    writes.emplace_back(address, bytes.size());
    return absl::OkStatus();
  }

  uint32_t Word(uint32_t address) const {
    uint32_t v;
    std::memcpy(&v, ram.data() + (address - kRam), 4);
    return v;
  }
  void SetWord(uint32_t address, uint32_t v) { std::memcpy(ram.data() + (address - kRam), &v, 4); }
  void SetBytes(uint32_t address, std::string_view s) {
    std::memcpy(ram.data() + (address - kRam), s.data(), s.size());
  }

 private:
  absl::Status Check(uint32_t address, size_t n) const {
    if (fail) return absl::UnavailableError("target memory: the simulator is gone");
    if (address < kRam || address + n > kRam + kRamSize)
      return absl::OutOfRangeError(absl::StrCat("target memory: ", address, " is not RAM"));
    return absl::OkStatus();
  }
};

// The target's side, as SEGGER's code does it: a control block at `cb`
// with up-buffers and down-buffers in RAM after it, initialised with the ID
// written last; writes in the three up modes; reads of a down-buffer.
struct Firmware {
  FakeMemory& mem;
  uint32_t cb;
  std::vector<uint32_t> up_sizes, down_sizes;

  uint32_t Desc(bool up, unsigned i) const {
    return cb + 24 + 24 * ((up ? 0 : up_sizes.size()) + i);
  }
  void Init(uint32_t names) {
    uint32_t next = cb + 24 + 24 * static_cast<uint32_t>(up_sizes.size() + down_sizes.size());
    mem.SetBytes(names, std::string("Terminal\0Trace\0", 15));
    mem.SetWord(cb + 16, up_sizes.size());
    mem.SetWord(cb + 20, down_sizes.size());
    for (int up = 1; up >= 0; --up) {
      const auto& sizes = up ? up_sizes : down_sizes;
      for (unsigned i = 0; i < sizes.size(); ++i) {
        const uint32_t d = Desc(up, i);
        mem.SetWord(d, i == 0 ? names : names + 9);
        mem.SetWord(d + 4, sizes[i] ? next : 0);
        mem.SetWord(d + 8, sizes[i]);
        mem.SetWord(d + 12, 0);
        mem.SetWord(d + 16, 0);
        mem.SetWord(d + 20, 0);
        next += sizes[i];
      }
    }
    mem.SetBytes(cb, std::string("SEGGER RTT\0\0\0\0\0\0", 16));
  }
  // SEGGER_RTT_MODE_NO_BLOCK_TRIM (trim) or _SKIP (all or nothing), or
  // overwrite (the target moves RdOff past what it overwrites). Returns the
  // bytes written.
  enum Mode { kSkip, kTrim, kOverwrite };
  size_t Write(unsigned ch, std::string_view s, Mode mode = kTrim) {
    const uint32_t d = Desc(true, ch), buf = mem.Word(d + 4), size = mem.Word(d + 8);
    uint32_t wr = mem.Word(d + 12), rd = mem.Word(d + 16);
    const uint32_t avail = (rd + size - wr - 1) % size;
    size_t n = s.size();
    if (mode == kSkip && n > avail) return 0;
    if (mode == kTrim) n = std::min<size_t>(n, avail);
    for (size_t i = 0; i < n; ++i) {
      if (mode == kOverwrite && (wr + 1) % size == rd) {
        rd = (rd + 1) % size;
        mem.SetWord(d + 16, rd);
      }
      mem.ram[buf - kRam + wr] = static_cast<uint8_t>(s[i]);
      wr = (wr + 1) % size;
    }
    mem.SetWord(d + 12, wr);
    return n;
  }
  std::string Read(unsigned ch) {
    const uint32_t d = Desc(false, ch), buf = mem.Word(d + 4), size = mem.Word(d + 8);
    uint32_t wr = mem.Word(d + 12), rd = mem.Word(d + 16);
    std::string out;
    while (rd != wr) {
      out.push_back(static_cast<char>(mem.ram[buf - kRam + rd]));
      rd = (rd + 1) % size;
    }
    mem.SetWord(d + 16, rd);
    return out;
  }
};

RttSearch Ram(std::optional<uint32_t> symbol = std::nullopt) {
  return RttSearch{symbol, kRam, kRamSize};
}

// A target whose control block is at kRam + 0x100 (the buffers' names at
// kRam + 0x40), initialised, and a link that knows the block's symbol.
struct Target {
  Target(std::vector<uint32_t> up, std::vector<uint32_t> down)
      : fw{mem, kRam + 0x100, std::move(up), std::move(down)} {
    fw.Init(kRam + 0x40);
  }
  FakeMemory mem;
  Firmware fw;
  RttLink link{mem, Ram(kRam + 0x100)};
};

TEST(RttTest, TheSymbolLocatesTheBlockWithItsBuffersAndNames) {
  FakeMemory mem;
  Firmware fw{mem, kRam + 0x100, {64, 32}, {16}};
  fw.Init(kRam + 0x40);
  auto cb = ReadRttControlBlock(mem, kRam + 0x100, Ram());
  ASSERT_TRUE(cb.ok()) << cb.status();
  ASSERT_EQ(cb->up.size(), 2u);
  ASSERT_EQ(cb->down.size(), 1u);
  EXPECT_EQ(cb->up[0].name, "Terminal");
  EXPECT_EQ(cb->up[1].name, "Trace");
  EXPECT_EQ(cb->up[0].size, 64u);
  EXPECT_EQ(cb->down[0].size, 16u);
  EXPECT_EQ(cb->up[0].buffer, kRam + 0x100 + 24 + 24 * 3);
  auto found = FindRttControlBlock(mem, Ram(kRam + 0x100));
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->address, kRam + 0x100);
}

TEST(RttTest, WithoutASymbolRamIsScannedPastADecoyId) {
  FakeMemory mem;
  // A string "SEGGER RTT" in RAM that is not a block (its counts are wrong).
  mem.SetBytes(kRam + 0x20, std::string("SEGGER RTT\0", 11));
  mem.SetWord(kRam + 0x20 + 16, 400);
  Firmware fw{mem, kRam + 0x200, {64}, {16}};
  fw.Init(kRam + 0x40);
  auto cb = FindRttControlBlock(mem, Ram());
  ASSERT_TRUE(cb.ok()) << cb.status();
  EXPECT_EQ(cb->address, kRam + 0x200);
}

TEST(RttTest, FirmwareThatHasNotInitialisedRttIsNotFoundYetAndThenIs) {
  FakeMemory mem;
  auto none = FindRttControlBlock(mem, Ram());
  EXPECT_TRUE(absl::IsNotFound(none.status())) << none.status();
  EXPECT_NE(none.status().message().find("_SEGGER_RTT"), std::string::npos);
  RttLink link(mem, Ram(kRam + 0x100));
  auto poll = link.Poll();
  ASSERT_TRUE(poll.ok()) << poll.status();
  EXPECT_FALSE(poll->located);
  EXPECT_NE(poll->why_not.find("not initialised"), std::string::npos) << poll->why_not;
  EXPECT_TRUE(absl::IsFailedPrecondition(link.QueueDown(0, "ping\n")));

  Firmware fw{mem, kRam + 0x100, {64}, {16}};
  fw.Init(kRam + 0x40);
  fw.Write(0, "booted\n");
  poll = link.Poll();
  ASSERT_TRUE(poll.ok()) << poll.status();
  EXPECT_TRUE(poll->located);
  EXPECT_EQ(poll->up[0], "booted\n");
}

TEST(RttTest, UpBytesArriveInOrderAcrossTheRingsWrap) {
  Target target({16}, {});
  FakeMemory& mem = target.mem;
  Firmware& fw = target.fw;
  RttLink& link = target.link;
  std::string sent, got;
  for (int i = 0; i < 20; ++i) {
    const std::string line = absl::StrCat("line ", i, "\n");
    ASSERT_EQ(fw.Write(0, line), line.size());
    sent += line;
    auto poll = link.Poll();
    ASSERT_TRUE(poll.ok()) << poll.status();
    got += poll->up[0];
  }
  EXPECT_EQ(got, sent);
  // Everything read: the target has the whole ring free again.
  EXPECT_EQ(mem.Word(fw.Desc(true, 0) + 16), mem.Word(fw.Desc(true, 0) + 12));
}

TEST(RttTest, AFullRingInSkipModeLosesOnTheTargetAndTheHostReadsWhatWasWritten) {
  Target target({16}, {});
  Firmware& fw = target.fw;
  RttLink& link = target.link;
  EXPECT_EQ(fw.Write(0, "0123456789", Firmware::kSkip), 10u);
  EXPECT_EQ(fw.Write(0, "abcdefghij", Firmware::kSkip), 0u);  // does not fit: skipped whole
  auto poll = link.Poll();
  ASSERT_TRUE(poll.ok()) << poll.status();
  EXPECT_EQ(poll->up[0], "0123456789");
  EXPECT_EQ(poll->lost, 0u);
  EXPECT_EQ(fw.Write(0, "abcdefghij", Firmware::kSkip), 10u);
  poll = link.Poll();
  EXPECT_EQ(poll->up[0], "abcdefghij");
}

TEST(RttTest, BytesOverwrittenWhileTheHostCopiedThemAreCountedLostNotPassedOn) {
  Target target({16}, {});
  FakeMemory& mem = target.mem;
  Firmware& fw = target.fw;
  RttLink& link = target.link;
  fw.Write(0, "0123456789abcd", Firmware::kOverwrite);
  // While the host copies the ring, the firmware writes on in overwrite
  // mode, moving the read offset past what it overwrote.
  const uint32_t buffer = mem.Word(fw.Desc(true, 0) + 4);
  bool once = false;
  mem.on_read = [&](uint32_t address) {
    if (address == buffer && !once) {
      once = true;
      fw.Write(0, "XYZ", Firmware::kOverwrite);
    }
  };
  auto poll = link.Poll();
  ASSERT_TRUE(poll.ok()) << poll.status();
  EXPECT_EQ(poll->up.count(0), 0u) << poll->up[0];
  EXPECT_EQ(poll->lost, 2u);  // "01": what the three new bytes pushed out
  // The host left the read offset where the target put it, and reads on
  // from there.
  mem.on_read = nullptr;
  poll = link.Poll();
  ASSERT_TRUE(poll.ok()) << poll.status();
  EXPECT_EQ(poll->up[0], "23456789abcdXYZ");
}

TEST(RttTest, DownBytesAreWrittenAsTheTargetMakesRoomAndArriveWhole) {
  Target target({16}, {16});
  Firmware& fw = target.fw;
  RttLink& link = target.link;
  ASSERT_TRUE(link.Poll().ok());
  std::string sent;
  for (int i = 0; i < 6; ++i) sent += absl::StrCat("cmd", i, "\n");
  ASSERT_TRUE(link.QueueDown(0, sent).ok());
  std::string got;
  for (int i = 0; i < 10 && got.size() < sent.size(); ++i) {
    auto poll = link.Poll();
    ASSERT_TRUE(poll.ok()) << poll.status();
    EXPECT_LE(poll->sent, 15u);  // one byte of the ring stays empty
    got += fw.Read(0);
  }
  EXPECT_EQ(got, sent);
}

TEST(RttTest, DownQueueRefusesAnUnknownChannelAndTooMuchWaiting) {
  Target target({16}, {16, 0});
  RttLink& link = target.link;
  ASSERT_TRUE(link.Poll().ok());
  EXPECT_TRUE(absl::IsNotFound(link.QueueDown(1, "x")));  // declared but unused
  EXPECT_TRUE(absl::IsNotFound(link.QueueDown(2, "x")));
  ASSERT_TRUE(link.QueueDown(0, std::string(RttLink::kMaxQueued, 'a')).ok());
  auto more = link.QueueDown(0, "b");
  EXPECT_TRUE(absl::IsResourceExhausted(more)) << more;
  EXPECT_NE(more.message().find("4096"), std::string::npos) << more;
}

TEST(RttTest, AResetClearsTheBlockAndTheLinkFindsItAgainWhereverItIs) {
  FakeMemory mem;
  Firmware fw{mem, kRam + 0x100, {32}, {}};
  fw.Init(kRam + 0x40);
  RttLink link(mem, Ram());
  fw.Write(0, "first boot\n");
  auto poll = link.Poll();
  ASSERT_TRUE(poll.ok() && poll->located);
  EXPECT_EQ(poll->up[0], "first boot\n");
  // The reset clears .bss: no ID until the firmware initialises again.
  std::fill(mem.ram.begin(), mem.ram.end(), 0);
  poll = link.Poll();
  ASSERT_TRUE(poll.ok()) << poll.status();
  EXPECT_FALSE(poll->located);
  // A new image with its block elsewhere.
  Firmware again{mem, kRam + 0x400, {32}, {}};
  again.Init(kRam + 0x40);
  again.Write(0, "second boot\n");
  poll = link.Poll();
  ASSERT_TRUE(poll.ok() && poll->located);
  EXPECT_EQ(poll->up[0], "second boot\n");
  EXPECT_EQ(link.block()->address, kRam + 0x400);
}

TEST(RttTest, ABlockThatIsNotARingIsRefusedNamingWhy) {
  FakeMemory mem;
  Firmware fw{mem, kRam + 0x100, {32}, {}};
  fw.Init(kRam + 0x40);
  mem.SetWord(fw.Desc(true, 0) + 4, 0x08000000);  // the buffer in flash, not RAM
  auto cb = ReadRttControlBlock(mem, kRam + 0x100, Ram());
  ASSERT_TRUE(absl::IsFailedPrecondition(cb.status())) << cb.status();
  EXPECT_NE(cb.status().message().find("up-buffer 0"), std::string::npos) << cb.status();
  EXPECT_NE(cb.status().message().find("0x08000000"), std::string::npos) << cb.status();
  mem.SetWord(kRam + 0x100 + 16, 17);  // more buffers than a block may have
  cb = ReadRttControlBlock(mem, kRam + 0x100, Ram());
  EXPECT_NE(cb.status().message().find("17 up-"), std::string::npos) << cb.status();
  cb = ReadRttControlBlock(mem, 0x10000000, Ram());
  EXPECT_NE(cb.status().message().find("outside RAM"), std::string::npos) << cb.status();
}

TEST(RttTest, ADownRingOverTheControlBlockIsRefused) {
  FakeMemory mem;
  Firmware fw{mem, kRam + 0x100, {32}, {16}};
  fw.Init(kRam + 0x40);
  // The down-ring placed over the block's own descriptors: writing it would
  // write offsets the host does not own.
  mem.SetWord(fw.Desc(false, 0) + 4, kRam + 0x100 + 8);
  auto cb = ReadRttControlBlock(mem, kRam + 0x100, Ram());
  ASSERT_TRUE(absl::IsFailedPrecondition(cb.status())) << cb.status();
  EXPECT_NE(cb.status().message().find("down-buffer 0"), std::string::npos) << cb.status();
  EXPECT_NE(cb.status().message().find("overlaps the control block"), std::string::npos)
      << cb.status();
}

TEST(RttTest, AFailedReadOfOneChannelKeepsWhatEarlierChannelsGave) {
  FakeMemory mem;
  Firmware fw{mem, kRam + 0x100, {32, 32}, {}};
  fw.Init(kRam + 0x40);
  RttLink link(mem, Ram(kRam + 0x100));
  ASSERT_TRUE(link.Poll().ok());
  fw.Write(0, "first\n");
  fw.Write(1, "second\n");
  const uint32_t ring1 = mem.Word(fw.Desc(true, 1) + 4);
  mem.on_read = [&](uint32_t address) {
    if (address == ring1) mem.fail = true;  // the next access fails
  };
  auto poll = link.Poll();
  ASSERT_TRUE(poll.ok()) << poll.status();
  EXPECT_EQ(poll->up[0], "first\n");  // its read offset has moved: not to be lost
  EXPECT_TRUE(absl::IsUnavailable(poll->error)) << poll->error;
  EXPECT_NE(poll->error.message().find("RTT up-buffer 1 of the block at 0x20000100"),
            std::string::npos)
      << poll->error;
  mem.on_read = nullptr;
  mem.fail = false;
  poll = link.Poll();
  ASSERT_TRUE(poll.ok()) << poll.status();
  EXPECT_EQ(poll->up[0], "");
  EXPECT_EQ(poll->up[1], "second\n");
}

TEST(RttTest, TheSameBlockFoundAgainKeepsItsQueueAndANewOneDoesNot) {
  FakeMemory mem;
  Firmware fw{mem, kRam + 0x100, {32}, {4}};
  fw.Init(kRam + 0x40);
  RttLink link(mem, Ram());
  ASSERT_TRUE(link.Poll().ok());
  ASSERT_TRUE(link.QueueDown(0, "ping\n").ok());  // 3 fit now, 2 wait
  ASSERT_TRUE(link.Poll().ok());
  EXPECT_EQ(fw.Read(0), "pin");
  // Cleared and set up again as it was (a reset): the rest still goes out.
  std::fill(mem.ram.begin(), mem.ram.end(), 0);
  ASSERT_FALSE(link.Poll()->located);
  fw.Init(kRam + 0x40);
  ASSERT_TRUE(link.Poll()->located);
  EXPECT_EQ(fw.Read(0), "g\n");
  ASSERT_TRUE(link.QueueDown(0, "version\n").ok());
  // A new image with its block elsewhere: nothing queued reaches it.
  std::fill(mem.ram.begin(), mem.ram.end(), 0);
  ASSERT_FALSE(link.Poll()->located);
  Firmware other{mem, kRam + 0x400, {32}, {4}};
  other.Init(kRam + 0x40);
  ASSERT_TRUE(link.Poll()->located);
  ASSERT_TRUE(link.Poll().ok());
  EXPECT_EQ(other.Read(0), "");
}

TEST(RttTest, AFailedMemoryAccessIsAnErrorNotAnEmptyPoll) {
  Target target({32}, {});
  FakeMemory& mem = target.mem;
  RttLink& link = target.link;
  ASSERT_TRUE(link.Poll().ok());
  mem.fail = true;
  auto poll = link.Poll();
  EXPECT_TRUE(absl::IsUnavailable(poll.status())) << poll.status();
}

TEST(RttTest, TheHostWritesOnlyUpReadOffsetsDownWriteOffsetsAndDownData) {
  Target target({16, 16}, {16});
  FakeMemory& mem = target.mem;
  Firmware& fw = target.fw;
  RttLink& link = target.link;
  ASSERT_TRUE(link.Poll().ok());
  ASSERT_TRUE(link.QueueDown(0, "a command that wraps the ring\n").ok());
  for (int i = 0; i < 8; ++i) {
    fw.Write(i % 2, "some output\n");
    ASSERT_TRUE(link.Poll().ok());
    fw.Read(0);
  }
  const uint32_t down_buf = mem.Word(fw.Desc(false, 0) + 4);
  std::set<uint32_t> allowed = {fw.Desc(true, 0) + 16, fw.Desc(true, 1) + 16,
                                fw.Desc(false, 0) + 12};
  ASSERT_FALSE(mem.writes.empty());
  for (const auto& [address, n] : mem.writes) {
    const bool down_data = address >= down_buf && address + n <= down_buf + 16;
    const bool offset = allowed.count(address) == 1 && n == 4;
    EXPECT_TRUE(offset || down_data) << "wrote " << n << " at " << address;
  }
}

// ---- A running QEMU's memory ----

// Polls `done` (a real simulator runs on its own) until it holds or 30 s
// pass; the simulator's progress is what is waited for, not a time.
bool Eventually(const std::function<bool()>& done) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!done()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// ---- The pump: an RttLink kept flowing on a thread ----

// What a pump handed on; waited for from the test's thread.
class Collected {
 public:
  RttPump::Sink Sink() {
    return [this](unsigned channel, std::string_view bytes, bool idle) {
      MutexLock lock(&mu_);
      (idle ? idle_[channel] : bytes_[channel]) += idle ? std::string("|") : std::string(bytes);
      cv_.SignalAll();
    };
  }
  // Waits (for the pump's thread, up to 30 s) until `done` holds.
  bool WaitFor(const std::function<bool(const std::map<unsigned, std::string>& bytes,
                                        const std::map<unsigned, std::string>& idle)>& done) {
    MutexLock lock(&mu_);
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!done(bytes_, idle_)) {
      if (std::chrono::steady_clock::now() > end) return false;
      cv_.WaitWithTimeout(&mu_, std::chrono::milliseconds(50));
    }
    return true;
  }

 private:
  Mutex mu_;
  CondVar cv_;
  std::map<unsigned, std::string> bytes_ ABSL_GUARDED_BY(mu_);
  std::map<unsigned, std::string> idle_ ABSL_GUARDED_BY(mu_);
};

// Moves `clock` by `us` once the pump has polled `after` times (so the
// pump is asleep on the clock, not reading memory the test may change).
void AdvanceAfterPoll(const RttPump& pump, ManualClock& clock, uint64_t after, int64_t us) {
  ASSERT_TRUE(Eventually([&] { return pump.polls() >= after; })) << "no poll " << after;
  clock.Advance(us);
}

TEST(RttPumpTest, BytesGoOutEachPollAndAQuietChannelIsSaidOnce) {
  Target target({64}, {16});
  ManualClock clock(1'000'000);
  Collected got;
  target.fw.Write(0, "rtt: booted\npart");
  RttPumpOptions o;
  o.idle_polls = 3;
  RttPump pump(target.mem, Ram(kRam + 0x100), o, clock, got.Sink());
  ASSERT_TRUE(
      got.WaitFor([](auto& bytes, auto&) { return bytes.count(0) && bytes.at(0).size() == 16; }));
  // Three polls without bytes: channel 0 is quiet (once, not at every poll).
  for (uint64_t n = 1; n <= 5; ++n) AdvanceAfterPoll(pump, clock, n, o.poll_us);
  ASSERT_TRUE(Eventually([&] { return pump.polls() >= 6; }));
  EXPECT_TRUE(got.WaitFor([](auto&, auto& idle) { return idle.count(0) && idle.at(0) == "|"; }));
  // Bytes written between polls arrive at the next one.
  target.fw.Write(0, "ial\n");
  clock.Advance(o.poll_us);
  EXPECT_TRUE(
      got.WaitFor([](auto& bytes, auto&) { return bytes.at(0) == "rtt: booted\npartial\n"; }));
  EXPECT_EQ(pump.problem(), "");
  ASSERT_TRUE(pump.block().has_value());
  EXPECT_EQ(pump.block()->up[0].name, "Terminal");
}

// A firmware that fills its ring faster than the interval drains it: a ring
// found half full is read again after busy_poll_us, not the interval.
TEST(RttPumpTest, AHalfFullRingIsPolledAgainAtOnce) {
  Target target({64}, {16});
  ManualClock clock(1'000'000);
  Collected got;
  const std::string first(40, 'a');
  target.fw.Write(0, first);
  RttPumpOptions o;
  o.poll_us = 100'000;
  RttPump pump(target.mem, Ram(kRam + 0x100), o, clock, got.Sink());
  ASSERT_TRUE(
      got.WaitFor([&](auto& bytes, auto&) { return bytes.count(0) && bytes.at(0) == first; }));
  target.fw.Write(0, "b\n");
  AdvanceAfterPoll(pump, clock, 1, o.busy_poll_us);
  EXPECT_TRUE(got.WaitFor([&](auto& bytes, auto&) { return bytes.at(0) == first + "b\n"; }));
}

TEST(RttPumpTest, ABlockNotThereYetIsLookedForLessOftenAndFoundWhenItIs) {
  FakeMemory mem;
  ManualClock clock(1'000'000);
  Collected got;
  RttPumpOptions o;
  RttPump pump(mem, Ram(kRam + 0x100), o, clock, got.Sink());
  ASSERT_TRUE(Eventually([&] { return pump.polls() >= 1; }));
  EXPECT_NE(pump.problem().find("not initialised"), std::string::npos) << pump.problem();
  EXPECT_FALSE(pump.block().has_value());
  EXPECT_TRUE(absl::IsFailedPrecondition(pump.Send(0, "ping\n")));
  // The looks back off: 10 ms, 20 ms, 40 ms ... up to a second.
  int64_t waited = 0;
  for (uint64_t n = 1; n <= 4; ++n) {
    AdvanceAfterPoll(pump, clock, n, o.poll_us << (n - 1));
    waited += o.poll_us << (n - 1);
  }
  ASSERT_TRUE(Eventually([&] { return pump.polls() >= 5; }));
  EXPECT_EQ(waited, 150'000);
  // The firmware sets RTT up; the next look finds it, and the pump polls at
  // its interval again.
  Firmware fw{mem, kRam + 0x100, {64}, {16}};
  fw.Init(kRam + 0x40);
  fw.Write(0, "booted\n");
  clock.Advance(o.max_backoff_us);
  ASSERT_TRUE(
      got.WaitFor([](auto& bytes, auto&) { return bytes.count(0) && bytes.at(0) == "booted\n"; }));
  ASSERT_TRUE(pump.Send(0, "ping\n").ok());
  AdvanceAfterPoll(pump, clock, 6, o.poll_us);
  ASSERT_TRUE(Eventually([&] { return pump.polls() >= 7; }));
  EXPECT_EQ(fw.Read(0), "ping\n");
}

class QemuMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(FWAI_BLINKY_ELF)) GTEST_SKIP() << "no example firmware built";
    auto elf = ReadElfFile(FWAI_BLINKY_ELF, /*dwarf=*/false);
    ASSERT_TRUE(elf.ok()) << elf.status();
    for (const auto& sym : elf->symbols) {
      if (sym.name == "counter") counter_ = static_cast<uint32_t>(sym.address);
      if (sym.name == kRttSymbol) rtt_ = static_cast<uint32_t>(sym.address);
    }
    ASSERT_NE(counter_, 0u);
    run_dir_ = ::testing::TempDir() + "/qemu-mem-" + std::to_string(getpid());
    std::filesystem::create_directories(run_dir_);
    QemuOptions o;
    o.machine = "stm32vldiscovery";
    o.image = FWAI_BLINKY_ELF;
    o.run_dir = run_dir_;
    auto q = QemuInstance::Start(o);
    ASSERT_TRUE(q.ok()) << q.status();
    qemu_ = *std::move(q);
    ASSERT_TRUE(qemu_->Continue().ok());
  }
  void TearDown() override {
    if (qemu_) qemu_->Stop();
    std::filesystem::remove_all(run_dir_);
  }
  uint32_t ReadWord(TargetMemory& mem, uint32_t address) {
    uint32_t v = 0;
    EXPECT_TRUE(mem.Read(address, {reinterpret_cast<uint8_t*>(&v), 4}).ok());
    return v;
  }

  std::string run_dir_;
  uint32_t counter_ = 0;
  uint32_t rtt_ = 0;
  std::unique_ptr<QemuInstance> qemu_;
};

TEST_F(QemuMemoryTest, TheGuestsRamIsReadAndWrittenWhileItRuns) {
  auto mem = QemuTargetMemory::Open(*qemu_, {{kRam, kRamSize}});
  ASSERT_TRUE(mem.ok()) << mem.status();
  // The firmware's counter goes on while it is read: the CPU is not stopped.
  const uint32_t first = ReadWord(**mem, counter_);
  EXPECT_TRUE(Eventually([&] { return ReadWord(**mem, counter_) > first + 2; }));
  auto status = qemu_->Hmp("info status");
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_NE(status->find("running"), std::string::npos) << *status;
  // A write is seen by the firmware, which counts on from it.
  // (Written again while not seen: the firmware's own increment, a load and
  // a store, may land on either side of the write and undo it.)
  const uint32_t far = 1000000;
  EXPECT_TRUE(Eventually([&] {
    if (ReadWord(**mem, counter_) > far) return true;
    EXPECT_TRUE((*mem)->Write(counter_, {reinterpret_cast<const uint8_t*>(&far), 4}).ok());
    return false;
  }));
  EXPECT_LT(ReadWord(**mem, counter_), far + 100000);
}

// The example firmware's RTT, read from the running simulator: the boot
// line, a command typed on the down-channel answered, the trace channel.
TEST_F(QemuMemoryTest, TheFirmwaresRttChannelsAreReadAndWrittenWhileItRuns) {
  ASSERT_NE(rtt_, 0u) << "the example firmware has no _SEGGER_RTT";
  constexpr uint32_t kFlash = 0x08000000;
  auto mem = QemuTargetMemory::Open(*qemu_, {{kRam, kRamSize}, {kFlash, 128 * 1024}});
  ASSERT_TRUE(mem.ok()) << mem.status();
  RttLink link(**mem, Ram(rtt_));
  std::map<unsigned, std::string> got;
  auto poll_until = [&](unsigned channel, const std::string& text) {
    return Eventually([&] {
      auto poll = link.Poll();
      EXPECT_TRUE(poll.ok()) << poll.status();
      if (!poll.ok()) return true;
      for (auto& [c, bytes] : poll->up) got[c] += bytes;
      return got[channel].find(text) != std::string::npos;
    });
  };
  ASSERT_TRUE(poll_until(0, "rtt: stm32vl-blinky")) << got[0];
  EXPECT_NE(got[0].find("booted\n"), std::string::npos) << got[0];
  ASSERT_NE(link.block(), nullptr);
  ASSERT_EQ(link.block()->up.size(), 2u);
  EXPECT_EQ(link.block()->up[0].name, "Terminal");
  EXPECT_EQ(link.block()->up[1].name, "Trace");
  ASSERT_TRUE(link.QueueDown(0, "ping\n").ok());
  EXPECT_TRUE(poll_until(0, "pong\n")) << got[0];
  EXPECT_TRUE(poll_until(1, "tick counter=")) << got[1];
  // Without the symbol a scan of RAM finds the same block.
  auto scanned = FindRttControlBlock(**mem, Ram());
  ASSERT_TRUE(scanned.ok()) << scanned.status();
  EXPECT_EQ(scanned->address, rtt_);
  auto status = qemu_->Hmp("info status");
  ASSERT_TRUE(status.ok());
  EXPECT_NE(status->find("running"), std::string::npos) << *status;
}

TEST_F(QemuMemoryTest, MemoryOutsideTheRegionsOrTheGuestIsRefusedNamingIt) {
  auto none = QemuTargetMemory::Open(*qemu_, {{0x60000000, 4096}});
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("no memory at 0x60000000"), std::string::npos)
      << none.status();
  // RAM ends at 8 KiB on this board: a region past it is not one block.
  auto past = QemuTargetMemory::Open(*qemu_, {{kRam, kRamSize * 2}});
  ASSERT_FALSE(past.ok());
  EXPECT_NE(past.status().message().find("no memory at 0x20003fff"), std::string::npos)
      << past.status();
  auto mem = QemuTargetMemory::Open(*qemu_, {{kRam, kRamSize}});
  ASSERT_TRUE(mem.ok()) << mem.status();
  uint8_t byte = 0;
  auto outside = (*mem)->Read(kRam + kRamSize, {&byte, 1});
  EXPECT_TRUE(absl::IsOutOfRange(outside)) << outside;
  EXPECT_NE(outside.message().find("0x20002000"), std::string::npos) << outside;
  // Once the simulator has gone, an access fails instead of reading stale bytes.
  qemu_->Stop();
  auto gone = (*mem)->Read(kRam, {&byte, 1});
  EXPECT_FALSE(gone.ok());
}

// Semihosting gives the firmware the host's files, so QEMU then runs only
// in its sandbox: without bubblewrap it is refused, naming what to install;
// with it, QEMU's run directory holds nothing of the other boards'.
TEST(QemuSandboxTest, SemihostingRunsOnlyInTheSandbox) {
  if (!std::filesystem::exists(FWAI_BLINKY_ELF)) GTEST_SKIP() << "no example firmware built";
  const std::string run_dir = ::testing::TempDir() + "/qemu-sbx-" + std::to_string(getpid());
  std::filesystem::create_directories(run_dir);
  std::ofstream(run_dir + "/other-board.elf") << "another board's image";
  QemuOptions o;
  o.machine = "stm32vldiscovery";
  o.image = FWAI_BLINKY_ELF;
  o.run_dir = run_dir;
  o.semihosting = true;
  o.sandbox = "no-such-sandbox-program";
  auto refused = QemuInstance::Start(o);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.status())) << refused.status();
  EXPECT_NE(refused.status().message().find("install bubblewrap"), std::string::npos)
      << refused.status();
  o.sandbox = "bwrap";
  auto q = QemuInstance::Start(o);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_NE((*q)->semihosting_pty(), "");
  EXPECT_NE((*q)->semihosting_pty(), (*q)->pty());
  // Its root: no /etc, no other board's file, its own directory.
  const std::string root = absl::StrCat("/proc/", (*q)->pid(), "/root");
  EXPECT_FALSE(std::filesystem::exists(root + "/etc/passwd"));
  EXPECT_FALSE(std::filesystem::exists(root + run_dir + "/other-board.elf"));
  EXPECT_TRUE(std::filesystem::exists(root + (*q)->gdb_target())) << (*q)->gdb_target();
  EXPECT_TRUE(std::filesystem::exists(root + FWAI_BLINKY_ELF));
  (*q)->Stop();
  std::filesystem::remove_all(run_dir);
}

// The child between fork and exec only makes system calls; an exec that
// fails still reaches the caller as a clear error naming the program.
TEST(QemuStartTest, AMissingQemuIsNamedWithWhatToInstall) {
  const std::string run_dir = ::testing::TempDir() + "/qemu-missing-" + std::to_string(getpid());
  QemuOptions o;
  o.binary = run_dir + "/no-such-qemu";
  o.machine = "stm32vldiscovery";
  o.image = FWAI_BLINKY_ELF;
  o.run_dir = run_dir;
  for (int i = 0; i < 3; ++i) {
    auto q = QemuInstance::Start(o);
    ASSERT_FALSE(q.ok());
    EXPECT_EQ(q.status().code(), absl::StatusCode::kNotFound) << q.status();
    EXPECT_NE(q.status().message().find(o.binary + ": not found (install qemu-system-arm)"),
              std::string::npos)
        << q.status();
  }
  std::filesystem::remove_all(run_dir);
}

}  // namespace
}  // namespace fwai
