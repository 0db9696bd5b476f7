// SEGGER RTT, the host's side: find a target's RTT control block in its RAM,
// read what the firmware wrote to its up-channels and write to its
// down-channels, through a TargetMemory that reads and writes the RAM of a
// running target without halting it.
//
// The layout is SEGGER's (so J-Link, OpenOCD and probe-rs read the same
// firmware): a control block of a 16-byte ID ("SEGGER RTT"), the number of
// up- and down-buffers (int32 each), then each up-buffer and each
// down-buffer as six little-endian 32-bit words: name pointer, buffer
// pointer, size, write offset, read offset, flags. Each buffer is a ring
// with one byte always left empty. For an up-buffer the target writes the
// data and the write offset and the host only the read offset; for a
// down-buffer the other way round. RttLink keeps to that: it never writes
// the offset the other side owns.
//
// Not thread-safe: one poller owns an RttLink (and its TargetMemory).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "server/hardware/target_memory.h"

namespace fwai {

// Where to look for the control block: at the image's `_SEGGER_RTT` symbol
// when it has one, else anywhere in RAM on a 4-byte boundary (the first
// valid block wins: one an earlier image left in RAM that was not cleared
// may be taken for the running image's, so give the symbol when there is
// an image).
struct RttSearch {
  std::optional<uint32_t> symbol;
  uint32_t ram_origin = 0;
  uint32_t ram_size = 0;
};

// The symbol firmware gives its control block.
inline constexpr const char* kRttSymbol = "_SEGGER_RTT";
// Most buffers of each kind a control block may declare; more is taken
// for a block not (yet) written.
inline constexpr int kRttMaxBuffers = 16;
// Most bytes of RAM searched for the ID when there is no symbol.
inline constexpr uint32_t kRttMaxScan = 1u << 20;

struct RttBuffer {
  std::string name;     // as the firmware names it ("Terminal"); may be empty
  uint32_t buffer = 0;  // the ring's address
  uint32_t size = 0;    // 0: a buffer the firmware left unused
  uint32_t flags = 0;
};

struct RttControlBlock {
  uint32_t address = 0;
  std::vector<RttBuffer> up;
  std::vector<RttBuffer> down;
};

// Reads and checks the control block at `address`: the ID, buffer counts of
// 1..16 up and 0..16 down, each used buffer (size ≥ 2) inside RAM with both
// offsets below its size, overlapping neither the block nor another buffer. FAILED_PRECONDITION
// says what is not (yet) right, e.g. while the firmware has not initialised RTT.
[[nodiscard]] absl::StatusOr<RttControlBlock> ReadRttControlBlock(TargetMemory& mem,
                                                                  uint32_t address,
                                                                  const RttSearch& ram);

// Finds the control block as `where` says (the symbol, else a scan of RAM)
// and reads it. NOT_FOUND when no RAM holds the ID.
[[nodiscard]] absl::StatusOr<RttControlBlock> FindRttControlBlock(TargetMemory& mem,
                                                                  const RttSearch& where);

// What one poll found.
struct RttPoll {
  bool located = false;                // a valid control block was read
  std::string why_not;                 // if not located: why (for a log, once)
  std::map<unsigned, std::string> up;  // new bytes per up-channel
  // Bytes the target overwrote before the host took them (a target that
  // moves the read offset itself when its ring is full); best effort: a
  // target that laps its ring between two looks is not seen.
  uint64_t lost = 0;
  uint64_t sent = 0;  // queued down bytes written to the target
  // A memory access that failed after the block was read (naming the
  // buffer): what `up` holds was taken from the target before it and is
  // still to be passed on.
  absl::Status error;
};

class RttLink {
 public:
  RttLink(TargetMemory& mem, RttSearch where);

  // Locates the control block if it is not (still) there — the ID is checked
  // on every poll, since a reset clears it until the firmware sets it again —
  // then takes each up-channel's new bytes and writes what fits of each
  // down-channel's queue. An error status is a failed read of the block
  // itself; a later failure is the poll's `error`.
  [[nodiscard]] absl::StatusOr<RttPoll> Poll();

  // Queues `bytes` for down-channel `channel`. RESOURCE_EXHAUSTED when more
  // than kMaxQueued bytes would wait; NOT_FOUND for a channel the block does
  // not have (once located). A block found again with another address or
  // layout (a new image) starts with empty queues; one found again as it
  // was keeps them (a reset seen in time or not: what was queued may reach
  // the firmware after it restarted).
  [[nodiscard]] absl::Status QueueDown(unsigned channel, std::string_view bytes);
  static constexpr size_t kMaxQueued = 4096;

  // The block last located (null before).
  const RttControlBlock* block() const { return located_ ? &block_ : nullptr; }

 private:
  // Reads the block (locating it again when it changed); false with
  // `why_not` set when there is none.
  absl::StatusOr<bool> Snapshot(std::vector<uint8_t>& raw, RttPoll& poll);
  absl::Status ReadUp(unsigned channel, RttPoll& poll);
  absl::Status WriteDown(unsigned channel, RttPoll& poll);
  // A ring's write and read offsets, read until two reads agree (a read of
  // another process's memory is not atomic).
  absl::StatusOr<std::pair<uint32_t, uint32_t>> Offsets(uint32_t descriptor);
  uint32_t Descriptor(bool up, unsigned channel) const;

  TargetMemory& mem_;
  const RttSearch where_;
  bool located_ = false;
  RttControlBlock block_;
  std::map<unsigned, std::string> down_queue_;
};

}  // namespace fwai
