// GDB in MI mode, driven over pipes: connect to a gdb server, run commands,
// parse MI records into JSON, and decode Cortex-M faults.
#pragma once

#include <sys/types.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace fwai {

// Parses an MI result list ("a=\"1\",b={c=\"2\"},d=[...]") into JSON.
[[nodiscard]] absl::StatusOr<nlohmann::json> ParseMiResults(std::string_view text);

// A string member of an MI tuple, else `fallback`. MI values are strings,
// tuples or lists, and what gdb prints is outside input: read them by type.
std::string MiString(const nlohmann::json& tuple, const char* key,
                     const std::string& fallback = "");

struct MiResponse {
  std::string result_class;  // done | running | connected | error | exit
  nlohmann::json results = nlohmann::json::object();
  std::string console;  // console stream output (~"...") of the command
  std::string error;    // msg of ^error
};

class GdbSession {
 public:
  // Starts `gdb` (--interpreter=mi3) with `elf` for symbols (may be empty).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<GdbSession>> Start(const std::string& gdb,
                                                                         const std::string& elf);
  // Speaks MI over descriptors to a gdb that is already running (or to a
  // recorded transcript): commands go to `to_gdb`, output comes from
  // `from_gdb`. Takes both descriptors over; there is no process to stop.
  static std::unique_ptr<GdbSession> Attach(int to_gdb, int from_gdb);
  ~GdbSession();

  // Runs one MI command (without token) and waits for its result record.
  [[nodiscard]] absl::StatusOr<MiResponse> Mi(const std::string& command, int timeout_ms = 10000);
  // Runs a CLI command through -interpreter-exec console.
  [[nodiscard]] absl::StatusOr<MiResponse> Console(const std::string& command,
                                                   int timeout_ms = 10000);
  // After ^running, waits for *stopped (interrupting the target on timeout).
  [[nodiscard]] absl::StatusOr<nlohmann::json> WaitStopped(int timeout_ms);
  [[nodiscard]] absl::Status Connect(const std::string& host_port);
  void Detach();
  // gdb's process id (-1 once it was reaped, or for an attached session).
  pid_t pid() const { return pid_; }

 private:
  GdbSession() = default;
  // False on timeout, or when gdb closed its output (`closed_` says which).
  bool ReadLine(std::string& line, int timeout_ms);
  pid_t pid_ = -1;
  int in_fd_ = -1;
  int out_fd_ = -1;
  int token_ = 1;
  std::string buf_;
  bool closed_ = false;  // gdb's output has ended: nothing more will come
  std::vector<nlohmann::json> pending_async_;
};

// What a stopped Cortex-M core says about a fault: the fault registers, the
// stacked frame and the faulting location, and a plain-words explanation.
struct FaultReport {
  bool in_fault = false;
  std::string exception;  // HardFault, MemManage, BusFault, UsageFault
  uint32_t cfsr = 0, hfsr = 0, mmfar = 0, bfar = 0;
  nlohmann::json frame = nlohmann::json::object();  // r0..r3 r12 lr pc xpsr
  std::string location;  // function and file:line of the faulting instruction
  std::vector<std::string> causes;
  std::string summary;
  nlohmann::json ToJson() const;
};

// Decodes CFSR/HFSR bits into plain words.
std::vector<std::string> DecodeFaultBits(uint32_t cfsr, uint32_t hfsr, uint32_t mmfar,
                                         uint32_t bfar);
[[nodiscard]] absl::StatusOr<FaultReport> DecodeFault(GdbSession& gdb);

// The first usable of `preferred`, gdb-multiarch, arm-none-eabi-gdb.
std::string FindGdb(const std::string& preferred);

}  // namespace fwai
