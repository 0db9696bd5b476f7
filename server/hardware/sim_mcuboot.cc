#include "server/hardware/sim_mcuboot.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/paths.h"

namespace fwai {

namespace fs = std::filesystem;
using mcuboot::Flag;
using mcuboot::Magic;

namespace {

std::string FlagName(Flag f) {
  return f == Flag::kSet ? "set" : f == Flag::kUnset ? "unset" : "bad";
}
std::string MagicName(Magic m) {
  return m == Magic::kGood ? "good" : m == Magic::kUnset ? "unset" : "bad";
}

// bootutil's swap types, as written into swap_info.
constexpr uint8_t kSwapTest = 2, kSwapPerm = 3, kSwapRevert = 4;

}  // namespace

SimMcuboot::SimMcuboot(std::string dir, uint32_t slot_size, std::vector<std::string> keys)
    : dir_(std::move(dir)), slot_size_(slot_size), keys_(std::move(keys)) {}

std::string SimMcuboot::Path(int slot) const { return absl::StrCat(dir_, "/slot", slot, ".bin"); }

uint32_t SimMcuboot::max_image_size() const {
  return slot_size_ > mcuboot::TrailerSize()
             ? slot_size_ - static_cast<uint32_t>(mcuboot::TrailerSize())
             : 0;
}

absl::Status SimMcuboot::Init() {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir_, ": ", ec.message()));
  if (slot_size_ < mcuboot::TrailerSize() + 1024) {
    return absl::InvalidArgumentError(absl::StrCat("slot size ", slot_size_,
                                                   " is too small for an image and its ",
                                                   mcuboot::TrailerSize(), "-byte trailer"));
  }
  for (int slot : {0, 1}) {
    auto size = fs::file_size(Path(slot), ec);
    if (!ec && size == slot_size_) continue;
    if (auto s = Write(slot, std::string(slot_size_, '\xff')); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> SimMcuboot::Read(int slot) const {
  std::ifstream in(Path(slot), std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("slot file ", Path(slot), " cannot be read"));
  std::stringstream ss;
  ss << in.rdbuf();
  std::string bytes = ss.str();
  if (bytes.size() != slot_size_) {
    return absl::DataLossError(
        absl::StrCat("slot file ", Path(slot), " is ", bytes.size(), " bytes, not ", slot_size_));
  }
  return bytes;
}

// Written whole and renamed into place: a daemon that dies mid-write leaves
// the slot as it was (flash writes of a real board are not this kind).
absl::Status SimMcuboot::Write(int slot, const std::string& bytes) const {
  return WriteFileAtomic(Path(slot), bytes);
}

absl::StatusOr<mcuboot::ImageInfo> SimMcuboot::Validate(std::string_view slot) const {
  auto info = mcuboot::Parse(slot.substr(0, max_image_size()));
  if (!info.ok()) return info.status();
  if (!info->hash_ok) return absl::DataLossError("the image's SHA-256 does not match its contents");
  if (!keys_.empty()) {
    absl::Status last = absl::PermissionDeniedError("no key");
    for (const auto& k : keys_) {
      last = mcuboot::VerifySignature(slot, *info, k);
      if (last.ok()) break;
    }
    if (!last.ok())
      return absl::PermissionDeniedError(absl::StrCat("signature check failed: ", last.message()));
  }
  return info;
}

absl::StatusOr<SlotState> SimMcuboot::State(int slot) const {
  auto bytes = Read(slot);
  if (!bytes.ok()) return bytes.status();
  SlotState s;
  mcuboot::Trailer t = mcuboot::ReadTrailer(*bytes);
  s.magic = MagicName(t.magic);
  s.image_ok = FlagName(t.image_ok);
  s.copy_done = FlagName(t.copy_done);
  auto info = mcuboot::Parse(std::string_view(*bytes).substr(0, max_image_size()));
  if (info.ok()) {
    s.has_image = true;
    s.version = info->version.ToString();
    s.hash = info->sha256_hex;
    s.hash_ok = info->hash_ok;
  }
  return s;
}

absl::Status SimMcuboot::Program(std::string_view image) {
  auto info = mcuboot::Parse(image);
  if (!info.ok()) return info.status();
  if (info->end > max_image_size()) {
    return absl::InvalidArgumentError(absl::StrCat("the image (", info->end,
                                                   " bytes) does not fit the slot (",
                                                   max_image_size(), " bytes before the trailer)"));
  }
  std::string slot(slot_size_, '\xff');
  std::memcpy(slot.data(), image.data(), info->end);
  mcuboot::WriteMagic(slot);
  mcuboot::WriteImageOk(slot);
  return Write(0, slot);
}

absl::Status SimMcuboot::Stage(std::string_view image, bool permanent) {
  auto info = mcuboot::Parse(image);
  if (!info.ok()) return info.status();
  if (info->end > max_image_size()) {
    return absl::InvalidArgumentError(absl::StrCat("the image (", info->end,
                                                   " bytes) does not fit the slot (",
                                                   max_image_size(), " bytes before the trailer)"));
  }
  std::string slot(slot_size_, '\xff');
  std::memcpy(slot.data(), image.data(), info->end);
  mcuboot::WriteMagic(slot);
  if (permanent) mcuboot::WriteImageOk(slot);
  return Write(1, slot);
}

absl::Status SimMcuboot::RestorePrevious() {
  auto s = Read(1);
  if (!s.ok()) return s.status();
  if (auto v = Validate(*s); !v.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the secondary slot holds no earlier image to go back to: ", v.status().message()));
  }
  mcuboot::EraseTrailer(*s);
  mcuboot::WriteMagic(*s);
  mcuboot::WriteImageOk(*s);
  return Write(1, *s);
}

absl::Status SimMcuboot::Confirm() {
  auto p = Read(0);
  if (!p.ok()) return p.status();
  mcuboot::WriteImageOk(*p);
  return Write(0, *p);
}

absl::StatusOr<SimBootOutcome> SimMcuboot::Boot() {
  auto p = Read(0);
  if (!p.ok()) return p.status();
  auto s = Read(1);
  if (!s.ok()) return s.status();
  SimBootOutcome out;
  const mcuboot::Trailer tp = mcuboot::ReadTrailer(*p);
  const mcuboot::Trailer ts = mcuboot::ReadTrailer(*s);
  // bootutil's swap table, in its order: the secondary slot first.
  uint8_t swap = 0;
  if (ts.magic == Magic::kGood && ts.image_ok == Flag::kUnset) {
    swap = kSwapTest;
  } else if (ts.magic == Magic::kGood && ts.image_ok == Flag::kSet) {
    swap = kSwapPerm;
  } else if (tp.magic == Magic::kGood && tp.image_ok == Flag::kUnset &&
             tp.copy_done == Flag::kSet) {
    swap = kSwapRevert;
  }
  if (swap == kSwapTest || swap == kSwapPerm) {
    if (auto v = Validate(*s); !v.ok()) {
      // An invalid upgrade is erased; the primary stays (and is not reverted later).
      out.swap = "fail";
      out.detail =
          absl::StrCat("the image in the secondary slot was refused: ", v.status().message());
      *s = std::string(slot_size_, '\xff');
      mcuboot::WriteImageOk(*p);
      if (auto st = Write(1, *s); !st.ok()) return st;
      if (auto st = Write(0, *p); !st.ok()) return st;
      swap = 0;
    }
  }
  if (swap != 0) {
    const size_t area = max_image_size();
    std::swap_ranges(p->begin(), p->begin() + static_cast<std::ptrdiff_t>(area), s->begin());
    mcuboot::EraseTrailer(*p);
    mcuboot::EraseTrailer(*s);
    mcuboot::WriteMagic(*p);
    (*p)[slot_size_ - mcuboot::kMagicSize - 3 * mcuboot::kMaxAlign] =
        static_cast<char>(swap);  // swap_info, image 0
    mcuboot::WriteCopyDone(*p);
    if (swap == kSwapPerm || swap == kSwapRevert) mcuboot::WriteImageOk(*p);
    // The slot that gives up its image is written first: a crash in between
    // leaves both images somewhere.
    if (auto st = Write(1, *s); !st.ok()) return st;
    if (auto st = Write(0, *p); !st.ok()) return st;
    out.swap = swap == kSwapTest ? "test" : swap == kSwapPerm ? "perm" : "revert";
  } else if (out.swap.empty()) {
    out.swap = "none";
  }
  auto st = State(0);
  if (!st.ok()) return st.status();
  out.primary = *st;
  auto info = Validate(*p);
  if (!info.ok()) {
    out.error = absl::StrCat("no bootable image in the primary slot: ", info.status().message());
    return out;
  }
  out.bootable = true;
  out.payload = p->substr(info->header_size, info->image_size);
  return out;
}

}  // namespace fwai
