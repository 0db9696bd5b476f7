// The boot ROM of a simulated board that takes over-the-air updates: two
// image slots as host files and MCUboot's swap-mode decisions over them.
// QEMU's STM32 models cannot write their own flash, so the daemon plays
// MCUboot: at each power-on it reads both slots' trailers, swaps (test,
// permanent, revert) exactly as bootutil's swap table says, validates the
// image (hash, and the Ed25519 signature when keys are configured), and
// hands the primary slot's payload to the simulator.
//
// Not thread-safe: the broker calls it under the board's operation lock.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/mcuboot.h"

namespace fwai {

struct SlotState {
  bool has_image = false;
  std::string version;
  std::string hash;  // the image's SHA-256 TLV (hex), its identity
  bool hash_ok = false;
  std::string magic;     // good | unset | bad
  std::string image_ok;  // set | unset | bad
  std::string copy_done;
};

struct SimBootOutcome {
  std::string swap;  // none | test | perm | revert | fail
  std::string detail;
  bool bootable = false;
  std::string error;    // why the primary slot cannot boot
  std::string payload;  // the primary slot's firmware, as it runs
  SlotState primary;
};

class SimMcuboot {
 public:
  // `dir` holds slot0.bin (primary) and slot1.bin (secondary), each
  // `slot_size` bytes; `keys`: Ed25519 public keys (PEM) an image must be
  // signed with (empty: the hash is enough, as MCUboot without signatures).
  SimMcuboot(std::string dir, uint32_t slot_size, std::vector<std::string> keys);

  // Creates erased slots when they are missing.
  [[nodiscard]] absl::Status Init();
  // The largest image a slot takes.
  uint32_t max_image_size() const;
  [[nodiscard]] absl::StatusOr<SlotState> State(int slot) const;

  // Factory programming: the image into the primary slot, confirmed.
  [[nodiscard]] absl::Status Program(std::string_view image);
  // An upload: the image into the secondary slot, marked pending (test: to
  // run once; permanent: to stay), as boot_set_pending does.
  [[nodiscard]] absl::Status Stage(std::string_view image, bool permanent);
  // Marks the secondary slot's image (the one a swap moved out) pending for
  // good: the next boot brings it back. What reverting a confirmed update is.
  [[nodiscard]] absl::Status RestorePrevious();
  // image_ok on the primary slot, as boot_set_confirmed does.
  [[nodiscard]] absl::Status Confirm();
  // Power-on: the swap bootutil would do, then the primary slot checked.
  [[nodiscard]] absl::StatusOr<SimBootOutcome> Boot();

 private:
  std::string Path(int slot) const;
  absl::StatusOr<std::string> Read(int slot) const;
  absl::Status Write(int slot, const std::string& bytes) const;
  // Parses and checks an image at the start of a slot: hash and signature.
  absl::StatusOr<mcuboot::ImageInfo> Validate(std::string_view slot) const;

  const std::string dir_;
  const uint32_t slot_size_;
  const std::vector<std::string> keys_;
};

}  // namespace fwai
