#include "server/hardware/rtt.h"

#include <algorithm>
#include <array>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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

std::string Hex(uint64_t address) { return absl::StrFormat("0x%08x", address); }

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
  if (!mem.Read(address, raw).ok()) return "";
  std::string name;
  for (uint8_t c : raw) {
    if (c == 0) break;
    if (c >= 0x20 && c < 0x7f) name.push_back(static_cast<char>(c));
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
        absl::StrCat("RTT ", what, " is not a valid ring (buffer ", Hex(b.buffer), ", size ",
                     b.size, ", write offset ", wr, ", read offset ", rd, ")"));
  }
  b.name = ReadName(mem, Le32(d));
  return b;
}

}  // namespace

absl::StatusOr<RttControlBlock> ReadRttControlBlock(TargetMemory& mem, uint32_t address,
                                                    const RttSearch& ram) {
  if (!InRam(ram, address, kHeaderBytes)) {
    return absl::FailedPreconditionError(
        absl::StrCat("the RTT control block's address ", Hex(address), " is outside RAM (",
                     Hex(ram.ram_origin), "..", Hex(uint64_t{ram.ram_origin} + ram.ram_size), ")"));
  }
  std::array<uint8_t, kHeaderBytes> head{};
  RETURN_IF_ERROR(mem.Read(address, head));
  if (!HasId(head.data())) {
    return absl::FailedPreconditionError(
        absl::StrCat("no RTT control block at ", Hex(address),
                     " yet (its ID is not \"SEGGER RTT\": the firmware has not initialised RTT)"));
  }
  const int32_t up = static_cast<int32_t>(Le32(head.data() + 16));
  const int32_t down = static_cast<int32_t>(Le32(head.data() + 20));
  if (up < 1 || up > kRttMaxBuffers || down < 0 || down > kRttMaxBuffers ||
      !InRam(ram, address, BlockBytes(up, down))) {
    return absl::FailedPreconditionError(absl::StrCat("the RTT control block at ", Hex(address),
                                                      " declares ", up, " up- and ", down,
                                                      " down-buffers, which do not fit"));
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
  return cb;
}

absl::StatusOr<RttControlBlock> FindRttControlBlock(TargetMemory& mem, const RttSearch& where) {
  if (where.symbol) return ReadRttControlBlock(mem, *where.symbol, where);
  const uint32_t n = std::min(where.ram_size, kRttMaxScan);
  std::vector<uint8_t> ram(n);
  RETURN_IF_ERROR(mem.Read(where.ram_origin, ram));
  absl::Status last = absl::NotFoundError(absl::StrCat(
      "no RTT control block in RAM ", Hex(where.ram_origin), "..",
      Hex(uint64_t{where.ram_origin} + n),
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

absl::StatusOr<RttPoll> RttLink::Poll() {
  RttPoll poll;
  std::vector<uint8_t> raw;
  bool same = false;
  // Twice at most: a block that changed since it was located (a reset, the
  // firmware initialising again) is located once more.
  for (int attempt = 0; attempt < 2 && !same; ++attempt) {
    if (!located_) {
      auto cb = FindRttControlBlock(mem_, where_);
      if (!cb.ok()) {
        if (!absl::IsNotFound(cb.status()) && !absl::IsFailedPrecondition(cb.status()))
          return cb.status();
        poll.why_not = std::string(cb.status().message());
        return poll;
      }
      block_ = *std::move(cb);
      located_ = true;
      down_queue_.clear();
    }
    raw.assign(BlockBytes(block_.up.size(), block_.down.size()), 0);
    RETURN_IF_ERROR(mem_.Read(block_.address, raw));
    same = HasId(raw.data()) && Le32(raw.data() + 16) == block_.up.size() &&
           Le32(raw.data() + 20) == block_.down.size();
    for (size_t i = 0; same && i < block_.up.size() + block_.down.size(); ++i) {
      const RttBuffer& b = i < block_.up.size() ? block_.up[i] : block_.down[i - block_.up.size()];
      const uint8_t* d = raw.data() + kHeaderBytes + kBufferBytes * i;
      same = Le32(d + 4) == b.buffer && Le32(d + 8) == b.size;
    }
    if (!same) located_ = false;
  }
  if (!same) {
    poll.why_not = "the RTT control block changed while it was read";
    return poll;
  }
  poll.located = true;
  const uint8_t* descs = raw.data() + kHeaderBytes;
  for (unsigned i = 0; i < block_.up.size() && located_; ++i) {
    RETURN_IF_ERROR(ReadUp(i, descs + kBufferBytes * i, poll));
  }
  for (unsigned i = 0; i < block_.down.size() && located_; ++i) {
    RETURN_IF_ERROR(WriteDown(i, descs + kBufferBytes * (block_.up.size() + i), poll));
  }
  return poll;
}

absl::Status RttLink::ReadUp(unsigned channel, const uint8_t* desc, RttPoll& poll) {
  const RttBuffer& b = block_.up[channel];
  if (b.size == 0) return absl::OkStatus();
  const uint32_t wr = Le32(desc + kWrOff), rd = Le32(desc + kRdOff);
  if (wr >= b.size || rd >= b.size) {
    located_ = false;  // not a ring any more: locate it again
    return absl::OkStatus();
  }
  if (wr == rd) return absl::OkStatus();
  const uint32_t first = wr > rd ? wr - rd : b.size - rd;
  const uint32_t second = wr > rd ? 0 : wr;
  std::string bytes(first + second, '\0');
  auto* out = reinterpret_cast<uint8_t*>(bytes.data());
  RETURN_IF_ERROR(mem_.Read(b.buffer + rd, {out, first}));
  if (second > 0) RETURN_IF_ERROR(mem_.Read(b.buffer, {out + first, second}));
  // In overwrite mode the target moves the read offset itself when the ring
  // is full; what was copied may then be half overwritten.
  const uint32_t rd_address = block_.address + kHeaderBytes + kBufferBytes * channel + kRdOff;
  std::array<uint8_t, 4> now{};
  RETURN_IF_ERROR(mem_.Read(rd_address, now));
  if (Le32(now.data()) != rd) {
    poll.lost += bytes.size();
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(mem_.Write(rd_address, ToLe32(wr)));
  poll.up[channel] += bytes;
  return absl::OkStatus();
}

absl::Status RttLink::WriteDown(unsigned channel, const uint8_t* desc, RttPoll& poll) {
  auto q = down_queue_.find(channel);
  const RttBuffer& b = block_.down[channel];
  if (q == down_queue_.end() || q->second.empty() || b.size == 0) return absl::OkStatus();
  const uint32_t wr = Le32(desc + kWrOff), rd = Le32(desc + kRdOff);
  if (wr >= b.size || rd >= b.size) {
    located_ = false;
    return absl::OkStatus();
  }
  const uint32_t free = (rd + b.size - wr - 1) % b.size;
  const uint32_t n = std::min<uint64_t>(free, q->second.size());
  if (n == 0) return absl::OkStatus();
  const auto* in = reinterpret_cast<const uint8_t*>(q->second.data());
  const uint32_t first = std::min(n, b.size - wr);
  RETURN_IF_ERROR(mem_.Write(b.buffer + wr, {in, first}));
  if (n > first) RETURN_IF_ERROR(mem_.Write(b.buffer, {in + first, n - first}));
  const uint32_t wr_address =
      block_.address + kHeaderBytes + kBufferBytes * (block_.up.size() + channel) + kWrOff;
  RETURN_IF_ERROR(mem_.Write(wr_address, ToLe32((wr + n) % b.size)));
  q->second.erase(0, n);
  poll.sent += n;
  return absl::OkStatus();
}

}  // namespace fwai
