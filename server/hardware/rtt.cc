#include "server/hardware/rtt.h"

#include <algorithm>
#include <array>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace fwai {
namespace {

constexpr uint32_t kHeaderBytes = 24;  // the ID and the two counts
constexpr uint32_t kBufferBytes = 24;  // six words per buffer
constexpr uint32_t kWrOff = 12;
constexpr uint32_t kRdOff = 16;
// The ID with its terminating NUL: what SEGGER's init writes (last).
constexpr char kId[] = "SEGGER RTT";
constexpr size_t kIdBytes = sizeof(kId);  // 11
constexpr size_t kMaxName = 32;

uint32_t Le32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

std::array<uint8_t, 4> ToLe32(uint32_t v) {
  return {static_cast<uint8_t>(v), static_cast<uint8_t>(v >> 8), static_cast<uint8_t>(v >> 16),
          static_cast<uint8_t>(v >> 24)};
}

bool HasId(const uint8_t* p) { return std::memcmp(p, kId, kIdBytes) == 0; }

// [address, address + bytes) lies in RAM.
bool InRam(const RttSearch& ram, uint64_t address, uint64_t bytes) {
  return address >= ram.ram_origin && address + bytes <= uint64_t{ram.ram_origin} + ram.ram_size;
}

uint32_t BlockBytes(uint32_t up, uint32_t down) {
  return kHeaderBytes + kBufferBytes * (up + down);
}

// The firmware's name of a buffer, printable characters only ("" if it
// cannot be read: it may be in memory the link does not reach).
std::string ReadName(TargetMemory& mem, uint32_t address) {
  if (address == 0) return "";
  std::array<uint8_t, kMaxName> raw{};
  size_t n = raw.size();
  if (!mem.Read(address, raw).ok()) {
    // Near the end of what the link reaches: a byte at a time.
    for (n = 0; n < raw.size() && mem.Read(address + n, {&raw[n], 1}).ok() && raw[n] != 0; ++n) {
    }
  }
  std::string name;
  for (size_t i = 0; i < n && raw[i] != 0; ++i) {
    if (raw[i] >= 0x20 && raw[i] < 0x7f) name.push_back(static_cast<char>(raw[i]));
  }
  return name;
}

absl::StatusOr<RttBuffer> ParseBuffer(TargetMemory& mem, const uint8_t* d, const RttSearch& ram,
                                      const std::string& what) {
  RttBuffer b;
  b.buffer = Le32(d + 4);
  b.size = Le32(d + 8);
  b.flags = Le32(d + 20);
  if (b.size == 0) return b;  // unused
  const uint32_t wr = Le32(d + kWrOff), rd = Le32(d + kRdOff);
  if (b.size < 2 || !InRam(ram, b.buffer, b.size) || wr >= b.size || rd >= b.size) {
    return absl::FailedPreconditionError(
        absl::StrCat("RTT ", what, " is not a valid ring (buffer ", AddressHex(b.buffer), ", size ",
                     b.size, ", write offset ", wr, ", read offset ", rd, ")"));
  }
  b.name = ReadName(mem, Le32(d));
  return b;
}

// The same block as before: address and every buffer's place and size.
bool SameLayout(const RttControlBlock& a, const RttControlBlock& b) {
  auto same = [](const std::vector<RttBuffer>& x, const std::vector<RttBuffer>& y) {
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i) {
      if (x[i].buffer != y[i].buffer || x[i].size != y[i].size) return false;
    }
    return true;
  };
  return a.address == b.address && same(a.up, b.up) && same(a.down, b.down);
}

absl::Status Prefixed(const std::string& where, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat(where, s.message()));
}

// No used ring overlaps the control block or another ring: a host writing
// a down-ring must not write a descriptor or another ring.
absl::Status CheckNoOverlap(const RttControlBlock& cb, uint32_t block_bytes) {
  struct Span {
    std::string what;
    uint64_t begin, end;
  };
  std::vector<Span> spans = {{"the control block", cb.address, uint64_t{cb.address} + block_bytes}};
  for (size_t i = 0; i < cb.up.size() + cb.down.size(); ++i) {
    const bool up = i < cb.up.size();
    const RttBuffer& b = up ? cb.up[i] : cb.down[i - cb.up.size()];
    if (b.size == 0) continue;
    spans.push_back({absl::StrCat(up ? "up-buffer " : "down-buffer ", up ? i : i - cb.up.size()),
                     b.buffer, uint64_t{b.buffer} + b.size});
  }
  for (size_t i = 0; i < spans.size(); ++i) {
    for (size_t j = i + 1; j < spans.size(); ++j) {
      if (spans[i].begin < spans[j].end && spans[j].begin < spans[i].end) {
        return absl::FailedPreconditionError(
            absl::StrCat("RTT ", spans[j].what, " (", AddressHex(spans[j].begin), ") overlaps ",
                         spans[i].what, " (", AddressHex(spans[i].begin), ")"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RttControlBlock> ReadRttControlBlock(TargetMemory& mem, uint32_t address,
                                                    const RttSearch& ram) {
  if (!InRam(ram, address, kHeaderBytes)) {
    return absl::FailedPreconditionError(
        absl::StrCat("the RTT control block's address ", AddressHex(address), " is outside RAM (",
                     AddressHex(ram.ram_origin), "..",
                     AddressHex(uint64_t{ram.ram_origin} + ram.ram_size), ")"));
  }
  std::array<uint8_t, kHeaderBytes> head{};
  RETURN_IF_ERROR(mem.Read(address, head));
  if (!HasId(head.data())) {
    return absl::FailedPreconditionError(
        absl::StrCat("no RTT control block at ", AddressHex(address),
                     " yet (its ID is not \"SEGGER RTT\": the firmware has not initialised RTT)"));
  }
  const int32_t up = static_cast<int32_t>(Le32(head.data() + 16));
  const int32_t down = static_cast<int32_t>(Le32(head.data() + 20));
  if (up < 1 || up > kRttMaxBuffers || down < 0 || down > kRttMaxBuffers ||
      !InRam(ram, address, BlockBytes(up, down))) {
    return absl::FailedPreconditionError(
        absl::StrCat("the RTT control block at ", AddressHex(address), " declares ", up,
                     " up- and ", down, " down-buffers, which do not fit"));
  }
  std::vector<uint8_t> raw(BlockBytes(up, down));
  RETURN_IF_ERROR(mem.Read(address, raw));
  RttControlBlock cb;
  cb.address = address;
  for (int32_t i = 0; i < up + down; ++i) {
    const bool is_up = i < up;
    const std::string what =
        absl::StrCat(is_up ? "up-buffer " : "down-buffer ", is_up ? i : i - up);
    ASSIGN_OR_RETURN(auto b,
                     ParseBuffer(mem, raw.data() + kHeaderBytes + kBufferBytes * i, ram, what));
    (is_up ? cb.up : cb.down).push_back(std::move(b));
  }
  RETURN_IF_ERROR(CheckNoOverlap(cb, BlockBytes(up, down)));
  return cb;
}

absl::StatusOr<RttControlBlock> FindRttControlBlock(TargetMemory& mem, const RttSearch& where) {
  if (where.symbol) return ReadRttControlBlock(mem, *where.symbol, where);
  const uint32_t n = std::min(where.ram_size, kRttMaxScan);
  std::vector<uint8_t> ram(n);
  RETURN_IF_ERROR(mem.Read(where.ram_origin, ram));
  absl::Status last = absl::NotFoundError(absl::StrCat(
      "no RTT control block in RAM ", AddressHex(where.ram_origin), "..",
      AddressHex(uint64_t{where.ram_origin} + n),
      " (the image has no _SEGGER_RTT symbol and no RAM holds the ID \"SEGGER RTT\")"));
  for (uint32_t off = 0; off + kHeaderBytes <= n; off += 4) {
    if (!HasId(ram.data() + off)) continue;
    auto cb = ReadRttControlBlock(mem, where.ram_origin + off, where);
    if (cb.ok()) return cb;
    last = cb.status();
  }
  return last;
}

RttLink::RttLink(TargetMemory& mem, RttSearch where) : mem_(mem), where_(where) {}

absl::Status RttLink::QueueDown(unsigned channel, std::string_view bytes) {
  if (!located_) {
    return absl::FailedPreconditionError(
        "the target's RTT control block is not found yet (the firmware has not initialised RTT)");
  }
  if (channel >= block_.down.size() || block_.down[channel].size == 0) {
    return absl::NotFoundError(absl::StrCat("the target has no RTT down-channel ", channel,
                                            " (it has ", block_.down.size(), ")"));
  }
  std::string& q = down_queue_[channel];
  if (q.size() + bytes.size() > kMaxQueued) {
    return absl::ResourceExhaustedError(
        absl::StrCat("RTT down-channel ", channel, " already has ", q.size(),
                     " bytes waiting for the target to read them (at most ", kMaxQueued, ")"));
  }
  q.append(bytes);
  return absl::OkStatus();
}

uint32_t RttLink::Descriptor(bool up, unsigned channel) const {
  return block_.address + kHeaderBytes +
         kBufferBytes * ((up ? 0 : static_cast<uint32_t>(block_.up.size())) + channel);
}

absl::StatusOr<bool> RttLink::Snapshot(std::vector<uint8_t>& raw, RttPoll& poll) {
  // Twice at most: a block that changed since it was located (a reset, the
  // firmware initialising again) is located once more.
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (!located_) {
      auto cb = FindRttControlBlock(mem_, where_);
      if (!cb.ok()) {
        if (!absl::IsNotFound(cb.status()) && !absl::IsFailedPrecondition(cb.status()))
          return cb.status();
        poll.why_not = std::string(cb.status().message());
        return false;
      }
      if (!SameLayout(*cb, block_)) down_queue_.clear();
      block_ = *std::move(cb);
      located_ = true;
    }
    raw.assign(BlockBytes(block_.up.size(), block_.down.size()), 0);
    RETURN_IF_ERROR(mem_.Read(block_.address, raw));
    bool same = HasId(raw.data()) && Le32(raw.data() + 16) == block_.up.size() &&
                Le32(raw.data() + 20) == block_.down.size();
    for (size_t i = 0; same && i < block_.up.size() + block_.down.size(); ++i) {
      const RttBuffer& b = i < block_.up.size() ? block_.up[i] : block_.down[i - block_.up.size()];
      const uint8_t* d = raw.data() + kHeaderBytes + kBufferBytes * i;
      same = Le32(d + 4) == b.buffer && Le32(d + 8) == b.size;
    }
    if (same) return true;
    located_ = false;
  }
  poll.why_not = "the RTT control block changed while it was read";
  return false;
}

absl::StatusOr<RttPoll> RttLink::Poll() {
  RttPoll poll;
  std::vector<uint8_t> raw;
  ASSIGN_OR_RETURN(const bool found, Snapshot(raw, poll));
  if (!found) return poll;
  poll.located = true;
  for (unsigned i = 0; i < block_.up.size() && located_ && poll.error.ok(); ++i) {
    poll.error = ReadUp(i, poll);
  }
  for (unsigned i = 0; i < block_.down.size() && located_ && poll.error.ok(); ++i) {
    poll.error = WriteDown(i, poll);
  }
  return poll;
}

absl::StatusOr<std::pair<uint32_t, uint32_t>> RttLink::Offsets(uint32_t descriptor) {
  std::array<uint8_t, 8> a{}, b{};
  RETURN_IF_ERROR(mem_.Read(descriptor + kWrOff, a));
  for (int i = 0; i < 3; ++i) {
    RETURN_IF_ERROR(mem_.Read(descriptor + kWrOff, b));
    if (a == b) break;
    a = b;
  }
  return std::make_pair(Le32(a.data()), Le32(a.data() + 4));
}

absl::Status RttLink::ReadUp(unsigned channel, RttPoll& poll) {
  const RttBuffer& b = block_.up[channel];
  if (b.size == 0) return absl::OkStatus();
  const uint32_t desc = Descriptor(true, channel);
  const std::string where = absl::StrCat("RTT up-buffer ", channel, " of the block at ",
                                         AddressHex(block_.address), ": ");
  auto offsets = Offsets(desc);
  if (!offsets.ok()) return Prefixed(where, offsets.status());
  const auto [wr, rd] = *offsets;
  if (wr >= b.size || rd >= b.size) {
    located_ = false;  // not a ring any more: locate it again
    return absl::OkStatus();
  }
  if (wr == rd) return absl::OkStatus();
  const uint32_t first = wr > rd ? wr - rd : b.size - rd;
  const uint32_t second = wr > rd ? 0 : wr;
  std::string bytes(first + second, '\0');
  auto* out = reinterpret_cast<uint8_t*>(bytes.data());
  absl::Status read = mem_.Read(b.buffer + rd, {out, first});
  if (read.ok() && second > 0) read = mem_.Read(b.buffer, {out + first, second});
  if (!read.ok()) return Prefixed(where, read);
  // A target that moves the read offset itself when its ring is full has
  // overwritten [rd, its new read offset) meanwhile; the rest is read again
  // at the next poll from where it now starts.
  std::array<uint8_t, 4> now{};
  if (auto s = mem_.Read(desc + kRdOff, now); !s.ok()) return Prefixed(where, s);
  if (const uint32_t moved = Le32(now.data()); moved != rd) {
    poll.lost += (moved + b.size - rd) % b.size;
    return absl::OkStatus();
  }
  if (auto s = mem_.Write(desc + kRdOff, ToLe32(wr)); !s.ok()) return Prefixed(where, s);
  poll.up[channel] += bytes;
  return absl::OkStatus();
}

absl::Status RttLink::WriteDown(unsigned channel, RttPoll& poll) {
  auto q = down_queue_.find(channel);
  const RttBuffer& b = block_.down[channel];
  if (q == down_queue_.end() || q->second.empty() || b.size == 0) return absl::OkStatus();
  const uint32_t desc = Descriptor(false, channel);
  const std::string where = absl::StrCat("RTT down-buffer ", channel, " of the block at ",
                                         AddressHex(block_.address), ": ");
  auto offsets = Offsets(desc);
  if (!offsets.ok()) return Prefixed(where, offsets.status());
  const auto [wr, rd] = *offsets;
  if (wr >= b.size || rd >= b.size) {
    located_ = false;
    return absl::OkStatus();
  }
  const uint32_t free = (rd + b.size - wr - 1) % b.size;
  const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(free, q->second.size()));
  if (n == 0) return absl::OkStatus();
  const auto* in = reinterpret_cast<const uint8_t*>(q->second.data());
  const uint32_t first = std::min(n, b.size - wr);
  absl::Status s = mem_.Write(b.buffer + wr, {in, first});
  if (s.ok() && n > first) s = mem_.Write(b.buffer, {in + first, n - first});
  if (s.ok()) s = mem_.Write(desc + kWrOff, ToLe32((wr + n) % b.size));
  if (!s.ok()) return Prefixed(where, s);
  q->second.erase(0, n);
  poll.sent += n;
  return absl::OkStatus();
}

}  // namespace fwai
