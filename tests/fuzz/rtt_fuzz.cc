// SEGGER RTT, the host's side: the input is a target's RAM (what the
// firmware, or a stray pointer, left there) and its changes between polls.
// Whatever RAM holds, finding the control block and polling it return an
// answer or an error: no crash, no access outside RAM, no more bytes from a
// ring than the ring holds, no write outside what the host owns (checked
// for every poll that ends with the block in hand).
#include <cstring>
#include <string>
#include <vector>

#include "server/hardware/rtt.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

constexpr uint32_t kRam = 0x20000000;
constexpr uint32_t kRamSize = 2048;

// RAM at kRam; an access outside it is an error, as a target's would be.
class Ram : public fwai::TargetMemory {
 public:
  std::vector<uint8_t> bytes = std::vector<uint8_t>(kRamSize, 0);
  absl::Status Read(uint32_t address, std::span<uint8_t> out) override {
    if (!Inside(address, out.size())) return absl::OutOfRangeError("outside RAM");
    std::memcpy(out.data(), bytes.data() + (address - kRam), out.size());
    return absl::OkStatus();
  }
  absl::Status Write(uint32_t address, std::span<const uint8_t> in) override {
    if (!Inside(address, in.size())) return absl::OutOfRangeError("outside RAM");
    std::memcpy(bytes.data() + (address - kRam), in.data(), in.size());
    writes.emplace_back(address, in.size());
    return absl::OkStatus();
  }
  std::vector<std::pair<uint32_t, size_t>> writes;

 private:
  static bool Inside(uint32_t address, size_t n) {
    return address >= kRam && uint64_t{address} + n <= uint64_t{kRam} + kRamSize;
  }
};

// What the host may write: an up-buffer's read offset, a down-buffer's
// write offset (4 bytes each) and a down-buffer's ring.
bool HostOwns(const fwai::RttControlBlock& cb, uint32_t address, size_t n) {
  const size_t up = cb.up.size();
  for (size_t i = 0; i < up + cb.down.size(); ++i) {
    const uint32_t desc = cb.address + 24 + 24 * static_cast<uint32_t>(i);
    if (n == 4 && address == desc + (i < up ? 16 : 12)) return true;
    if (i >= up) {
      const fwai::RttBuffer& b = cb.down[i - up];
      if (address >= b.buffer && uint64_t{address} + n <= uint64_t{b.buffer} + b.size) return true;
    }
  }
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fwai;
  if (size < 2) return 0;
  Ram ram;
  // The first byte picks the search: the symbol at an offset, or a scan.
  const bool symbol = data[0] & 1;
  const uint32_t at = kRam + (data[1] % (kRamSize / 4)) * 4;
  data += 2;
  size -= 2;
  const size_t image = std::min<size_t>(size, kRamSize);
  std::memcpy(ram.bytes.data(), data, image);
  RttSearch where{symbol ? std::optional<uint32_t>(at) : std::nullopt, kRam, kRamSize};
  RttLink link(ram, where);
  // The rest of the input changes RAM between polls, a 4-byte word at a time.
  size_t next = image;
  for (int poll = 0; poll < 4; ++poll) {
    ram.writes.clear();
    auto r = link.Poll();
    if (!r.ok()) {
      FUZZ_CHECK(ram.writes.empty());
      continue;
    }
    if (const RttControlBlock* cb = link.block(); cb != nullptr && r->located) {
      for (const auto& [channel, bytes] : r->up) {
        FUZZ_CHECK(channel < cb->up.size());
        FUZZ_CHECK(bytes.size() < cb->up[channel].size);
      }
      for (const auto& [address, n] : ram.writes) FUZZ_CHECK(HostOwns(*cb, address, n));
      (void)link.QueueDown(0, "ping\n");
    }
    for (int w = 0; w < 4 && next + 6 <= size; ++w, next += 6) {
      const uint32_t off = (data[next] | data[next + 1] << 8) % (kRamSize - 3);
      std::memcpy(ram.bytes.data() + off, data + next + 2, 4);
    }
  }
  return 0;
}
