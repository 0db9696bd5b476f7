// A running target's memory, read and written without halting it: the
// seam between what fwai reads from a target (RTT) and how it reaches it
// (a simulator's process memory, a probe).
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace fwai {

// A target address as errors show it: "0x20000100".
inline std::string AddressHex(uint64_t address) { return absl::StrFormat("0x%08x", address); }

// Errors name the target address and the cause. Implementations say
// whether they may be used from more than one thread.
class TargetMemory {
 public:
  virtual ~TargetMemory() = default;
  [[nodiscard]] virtual absl::Status Read(uint32_t address, std::span<uint8_t> out) = 0;
  [[nodiscard]] virtual absl::Status Write(uint32_t address, std::span<const uint8_t> bytes) = 0;
};

}  // namespace fwai
