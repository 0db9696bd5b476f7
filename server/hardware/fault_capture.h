// fault_capture: a stopped Cortex-M core saved to a file, and decoded later.
//
// A capture is what a fault left: the core registers, the fault status
// registers (the SCB from 0xE000ED00), RAM (the stack and every variable),
// the serial lines before it, the live decode, and the SHA-256 of the image
// the board ran (the same hash its flash record in the evidence log names).
// It is a JSON file ("format": "fwai-fault-capture", version 1; memory as
// base64), written by the broker through gdb on the board's GDB server.
//
// Decoding needs no board: `fwai fault decode` serves the capture to gdb as
// a halted target over the GDB remote protocol (RspServer, on a pipe gdb
// starts) with the image's ELF for symbols, code and DWARF, so the fault in
// words, the backtrace with file:line and the locals come from gdb itself,
// as they would on the live board. Reads outside the captured memory fail
// as they would on a bus with nothing there.
//
// Thread-safety: free functions and objects without shared state.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace fwai {

class GdbSession;

inline constexpr char kFaultCaptureFormat[] = "fwai-fault-capture";
inline constexpr int kFaultCaptureVersion = 1;
// The System Control Block's words a capture keeps (CPUID .. BFAR, and the
// auxiliary fault status after them).
inline constexpr uint32_t kScbAddress = 0xE000ED00;
inline constexpr uint32_t kScbBytes = 0x40;

// What the broker knows of the board a capture is taken on.
struct CaptureSource {
  std::string board, target, machine;
  std::string image_path, image_sha256;
  uint32_t ram_origin = 0, ram_size = 0;
  std::vector<nlohmann::json> serial_before;  // {seq, text} oldest first
};

// Halts the core (if it runs) and captures it; the result is the capture's
// JSON. The live decode (DecodeFault) is kept in it as "fault".
[[nodiscard]] absl::StatusOr<nlohmann::json> CaptureFault(GdbSession& gdb,
                                                          const CaptureSource& source);

// A capture read back, checked whole: one region of memory.
struct CapturedRegion {
  std::string name;
  uint32_t address = 0;
  std::string bytes;
};
struct FaultCapture {
  nlohmann::json json;  // the file as read
  std::string board, image_sha256, image_path;
  std::vector<std::pair<std::string, uint32_t>> registers;  // r0..r12 sp lr pc xpsr
  std::vector<CapturedRegion> regions;
  // The bytes at [address, address + size) when one region holds them all.
  bool Read(uint32_t address, uint32_t size, std::string* out) const;
};
// Parses a capture file's text; `where` names it in errors (a file cut short
// says where it ends, another kind of file says what it is not).
[[nodiscard]] absl::StatusOr<FaultCapture> ParseFaultCapture(std::string_view text,
                                                             const std::string& where);

// The GDB remote protocol for one client on `in_fd`/`out_fd`, serving
// `capture` as a halted target (registers, memory, the m-profile target
// description) until the client detaches, kills or closes. Returns 0 then.
int ServeCaptureOverRsp(const FaultCapture& capture, int in_fd, int out_fd);

// With gdb attached to a capture (or a live core): the fault, then every
// frame of the backtrace with its locals.
[[nodiscard]] absl::StatusOr<nlohmann::json> DecodeCapturedFault(GdbSession& gdb);

// The capture's decode for a person.
std::string FormatDecodedFault(const nlohmann::json& decoded, const FaultCapture& capture);

}  // namespace fwai
