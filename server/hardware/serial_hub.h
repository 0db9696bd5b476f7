// SerialHub: the daemon's one reader of a serial port. It keeps a ring buffer
// of timestamped lines, fans every line out to any number of readers, waits
// for patterns, and writes on behalf of the lease holder. The port behind a
// hub may be swapped (a simulated board restarting) without dropping readers.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "common/cancel.h"
#include "common/mutex.h"

namespace fwai {

struct SerialSettings {
  int baud = 115200;
  int data_bits = 8;
  std::string parity = "none";
  std::string stop_bits = "1";
  std::string flow_control = "none";
  std::string encoding = "utf-8";  // ascii | utf-8 | hex
  std::vector<std::string> startup_commands;
  std::string line_ending = "\n";
  std::string log_file;
};

struct SerialLine {
  uint64_t seq = 0;
  int64_t time_us = 0;
  std::string text;
  // A notice from fwaid about the board (a watch fired), not the board's
  // output: seq 0, never in the history, never matched as the board's line.
  bool notice = false;
};

// One client's view of a hub: lines queued since it subscribed.
class SerialReader {
 public:
  enum class Next { kLine, kTimeout, kEnded };
  // Waits up to `timeout_ms` for the next line.
  Next Wait(SerialLine& out, int timeout_ms);
  // Ends this reader (its stream is closed with `reason`).
  void End(const std::string& reason);
  bool ended() const;
  std::string end_reason() const;
  // Lines dropped because this reader fell too far behind.
  uint64_t dropped() const;
  // Queues a notice (SerialLine::notice) for this reader alone.
  void PushNotice(std::string text, int64_t time_us);
  // The lease this reader was opened under ("" if none); lease-bound readers
  // end when the lease does. Set before the reader is shared.
  std::string lease_id;

 private:
  friend class SerialHub;
  void Push(const SerialLine& line, size_t max_queue);
  mutable Mutex mu_;
  CondVar cv_;
  std::deque<SerialLine> queue_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  std::string reason_ ABSL_GUARDED_BY(mu_);
  uint64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
};

class SerialHub {
 public:
  SerialHub(std::string name, size_t history_lines);
  ~SerialHub();
  SerialHub(const SerialHub&) = delete;
  SerialHub& operator=(const SerialHub&) = delete;

  // Opens `path` and starts reading. Errors name the port and the cause
  // (missing, permission denied, in use by another program).
  [[nodiscard]] absl::Status Open(const std::string& path, const SerialSettings& settings);
  // A hub without a port: its bytes come from Feed (an RTT poller, a
  // simulator's second channel) and what is written goes to `writer`; with
  // no writer the stream is read-only and a write is refused naming it.
  // `label` is what path() says ("rtt:0"). The settings' encoding and line
  // ending apply; the rest are a port's.
  [[nodiscard]] absl::Status OpenFed(const std::string& label, const SerialSettings& settings,
                                     std::function<absl::Status(std::string_view)> writer);
  // Bytes for a fed hub. Whole lines go out at once; a partial line waits
  // for its end or for FlushFed (the feeder saying nothing more came).
  void Feed(std::string_view bytes);
  void FlushFed();
  // Stops reading. With `end_readers`, every reader is ended with `reason`.
  void Close(const std::string& reason, bool end_readers);
  bool is_open() const;
  std::string path() const;

  // Writes raw bytes to the port.
  [[nodiscard]] absl::Status Write(std::string_view bytes);
  // Writes `command` followed by the configured line ending.
  [[nodiscard]] absl::Status SendLine(std::string_view command);

  // A new reader; with `from_history` it first gets the buffered lines.
  std::shared_ptr<SerialReader> Subscribe(bool from_history);
  void Unsubscribe(const std::shared_ptr<SerialReader>& reader);
  // Ends every reader for which `match` is true.
  void EndReaders(const std::function<bool(const SerialReader&)>& match, const std::string& reason);
  size_t reader_count() const;

  // The last `max_lines` buffered lines (0: all).
  std::vector<SerialLine> History(size_t max_lines) const;
  // Sequence number the next line will get.
  uint64_t next_seq() const;
  // Waits until a line with seq >= since_seq matches `pattern`; nullopt on
  // timeout, cancellation or the port closing (after its failure callback).
  std::optional<SerialLine> WaitFor(const std::regex& pattern, uint64_t since_seq, int timeout_ms,
                                    const CancelToken* cancel = nullptr);

  // Called (on the hub's thread) when the port fails by itself: unplugged,
  // the simulator exited. Not called for Close().
  void SetOnFailure(std::function<void(const std::string& reason)> fn);

  // For tests and benchmarks: feeds bytes as if they came from the port.
  void InjectForTest(std::string_view bytes);

  struct Rep;

 private:
  void Deliver(std::string text) ABSL_LOCKS_EXCLUDED(mu_);
  void OnBytes(std::string_view bytes) ABSL_LOCKS_EXCLUDED(mu_);
  void FlushPartial() ABSL_LOCKS_EXCLUDED(mu_);

  const std::string name_;
  const size_t history_lines_;
  mutable Mutex mu_;
  // Shared with a Write in progress, which may outlive Close (it then
  // finds the port closed).
  std::shared_ptr<Rep> rep_ ABSL_GUARDED_BY(mu_);
  CondVar cv_;  // new lines, for WaitFor
  std::deque<SerialLine> history_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  std::vector<std::shared_ptr<SerialReader>> readers_ ABSL_GUARDED_BY(mu_);
  std::string partial_ ABSL_GUARDED_BY(mu_);
  std::string encoding_ ABSL_GUARDED_BY(mu_) = "utf-8";
  std::string line_ending_ ABSL_GUARDED_BY(mu_) = "\n";
  std::function<void(const std::string&)> on_failure_ ABSL_GUARDED_BY(mu_);
  bool open_ ABSL_GUARDED_BY(mu_) = false;
  // Bumps each time the port closes: by Close, or by failing once the
  // failure callback has run (so a WaitFor that ends with the port finds the
  // board already marked).
  uint64_t closes_ ABSL_GUARDED_BY(mu_) = 0;
  bool fed_ ABSL_GUARDED_BY(mu_) = false;  // opened with OpenFed
  std::function<absl::Status(std::string_view)> writer_ ABSL_GUARDED_BY(mu_);
  std::string path_ ABSL_GUARDED_BY(mu_);
};

// Turns raw bytes into display text for an encoding (ascii escapes
// non-printables as \xNN, utf-8 replaces invalid sequences with U+FFFD).
std::string DecodeSerialText(std::string_view bytes, const std::string& encoding);

}  // namespace fwai
