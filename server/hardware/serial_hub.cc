#include "server/hardware/serial_hub.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <boost/asio/serial_port.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/clock.h"

namespace fwai {

namespace asio = boost::asio;

namespace {
constexpr size_t kReaderQueue = 100000;  // lines a slow reader may lag before dropping
constexpr int kPartialFlushMs = 150;     // a line without newline shows up after this
}  // namespace

// ---- SerialReader ----

SerialReader::Next SerialReader::Wait(SerialLine& out, int timeout_ms) {
  MutexLock lock(&mu_);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!(!queue_.empty() || ended_)) {
    if (cv_.WaitWithDeadline(&mu_, deadline)) break;
  }
  if (!(!queue_.empty() || ended_)) return Next::kTimeout;
  if (!queue_.empty()) {
    out = std::move(queue_.front());
    queue_.pop_front();
    return Next::kLine;
  }
  return Next::kEnded;
}

void SerialReader::End(const std::string& reason) {
  MutexLock lock(&mu_);
  if (ended_) return;
  ended_ = true;
  reason_ = reason;
  cv_.SignalAll();
}

bool SerialReader::ended() const {
  MutexLock lock(&mu_);
  return ended_;
}

std::string SerialReader::end_reason() const {
  MutexLock lock(&mu_);
  return reason_;
}

uint64_t SerialReader::dropped() const {
  MutexLock lock(&mu_);
  return dropped_;
}

void SerialReader::Push(const SerialLine& line, size_t max_queue) {
  MutexLock lock(&mu_);
  if (ended_) return;
  if (queue_.size() >= max_queue) {
    queue_.pop_front();
    ++dropped_;
  }
  queue_.push_back(line);
  cv_.Signal();
}

void SerialReader::PushNotice(std::string text, int64_t time_us) {
  SerialLine l;
  l.time_us = time_us;
  l.text = std::move(text);
  l.notice = true;
  Push(l, SIZE_MAX);  // a notice is never the one dropped to make room
}

// ---- decoding ----

std::string DecodeSerialText(std::string_view bytes, const std::string& encoding) {
  std::string out;
  out.reserve(bytes.size());
  if (encoding == "hex") {
    for (size_t i = 0; i < bytes.size(); ++i) {
      if (i) out += ' ';
      absl::StrAppendFormat(&out, "%02x", static_cast<unsigned char>(bytes[i]));
    }
    return out;
  }
  if (encoding == "ascii") {
    for (unsigned char c : bytes) {
      if (c == '\t' || (c >= 0x20 && c < 0x7f)) {
        out += static_cast<char>(c);
      } else {
        absl::StrAppendFormat(&out, "\\x%02x", c);
      }
    }
    return out;
  }
  // utf-8: keep valid sequences, replace anything else with U+FFFD.
  size_t i = 0;
  while (i < bytes.size()) {
    unsigned char c = static_cast<unsigned char>(bytes[i]);
    int len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    bool ok = len > 0 && i + len <= bytes.size();
    for (int k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(bytes[i + k]) >> 6) == 0x2;
    if (ok && len == 1 && c < 0x20 && c != '\t') ok = false;  // control characters
    if (ok) {
      out.append(bytes.substr(i, len));
      i += len;
    } else {
      if (c < 0x20) {
        absl::StrAppendFormat(&out, "\\x%02x", c);
      } else {
        out += "\xEF\xBF\xBD";
      }
      ++i;
    }
  }
  return out;
}

// ---- SerialHub ----

struct SerialHub::Rep {
  asio::io_context io;
  std::unique_ptr<asio::serial_port> port;
  std::unique_ptr<asio::steady_timer> flush_timer;
  std::thread thread;
  std::array<char, 4096> buf{};
  std::ofstream log;  // written under the hub's mu_ (Deliver)
  Mutex write_mu;     // one Write at a time on the port
  // Set by Close before the port's descriptor is closed: a Write that took
  // this Rep before then must not write to a descriptor number the process
  // may since have reused.
  bool closed ABSL_GUARDED_BY(write_mu) = false;
};

SerialHub::SerialHub(std::string name, size_t history_lines)
    : name_(std::move(name)), history_lines_(std::max<size_t>(history_lines, 1)) {}

SerialHub::~SerialHub() { Close("fwaid is shutting down", true); }

namespace {

absl::Status OpenError(const std::string& path, int err) {
  switch (err) {
    case ENOENT:
    case ENODEV:
    case ENXIO:
      return absl::NotFoundError(
          absl::StrCat("serial port ", path, ": no such device (unplugged?)"));
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(
          absl::StrCat("serial port ", path,
                       ": permission denied (is this user in the port's group, e.g. dialout?)"));
    case EBUSY:
      return absl::FailedPreconditionError(
          absl::StrCat("serial port ", path, ": in use by another program (opened exclusively)"));
    default:
      return absl::UnavailableError(absl::StrCat("serial port ", path, ": ", std::strerror(err)));
  }
}

speed_t BaudConstant(int baud) {
  switch (baud) {
    case 9600:
      return B9600;
    case 19200:
      return B19200;
    case 38400:
      return B38400;
    case 57600:
      return B57600;
    case 115200:
      return B115200;
    case 230400:
      return B230400;
    case 460800:
      return B460800;
    case 921600:
      return B921600;
    case 1000000:
      return B1000000;
    case 2000000:
      return B2000000;
    default:
      return 0;
  }
}

}  // namespace

absl::Status SerialHub::Open(const std::string& path, const SerialSettings& s) {
  Close("reopening", false);
  int fd = ::open(path.c_str(), O_RDWR | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return OpenError(path, errno);
  if (!isatty(fd)) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat("serial port ", path, ": not a terminal device"));
  }
  // Another program holding the port (flock, as pyserial, picocom and
  // friends do) is a clear error, not silently shared input.
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int err = errno;
    ::close(fd);
    if (err == EWOULDBLOCK) {
      return absl::FailedPreconditionError(
          absl::StrCat("serial port ", path, ": in use by another program"));
    }
    return OpenError(path, err);
  }
  ioctl(fd, TIOCEXCL);
  termios tio{};
  if (tcgetattr(fd, &tio) != 0) {
    int err = errno;
    ::close(fd);
    return OpenError(path, err);
  }
  cfmakeraw(&tio);
  tio.c_cflag |= CLOCAL | CREAD;
  tio.c_cflag &= ~CSIZE;
  tio.c_cflag |= s.data_bits == 5 ? CS5 : s.data_bits == 6 ? CS6 : s.data_bits == 7 ? CS7 : CS8;
  tio.c_cflag &= ~(PARENB | PARODD);
  if (s.parity == "even") tio.c_cflag |= PARENB;
  if (s.parity == "odd") tio.c_cflag |= PARENB | PARODD;
  if (s.stop_bits == "2" || s.stop_bits == "1.5") {
    tio.c_cflag |= CSTOPB;
  } else {
    tio.c_cflag &= ~CSTOPB;
  }
  tio.c_cflag &= ~CRTSCTS;
  tio.c_iflag &= ~(IXON | IXOFF | IXANY);
  if (s.flow_control == "hardware") tio.c_cflag |= CRTSCTS;
  if (s.flow_control == "software") tio.c_iflag |= IXON | IXOFF;
  if (speed_t sp = BaudConstant(s.baud)) {
    cfsetispeed(&tio, sp);
    cfsetospeed(&tio, sp);
  } else {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat("serial port ", path, ": unsupported baud rate ", s.baud));
  }
  if (tcsetattr(fd, TCSANOW, &tio) != 0) {
    int err = errno;
    ::close(fd);
    return OpenError(path, err);
  }

  auto rep = std::make_shared<Rep>();
  boost::system::error_code ec;
  rep->port = std::make_unique<asio::serial_port>(rep->io);
  rep->port->assign(fd, ec);
  if (ec) {
    ::close(fd);
    return absl::InternalError(absl::StrCat("serial port ", path, ": ", ec.message()));
  }
  rep->flush_timer = std::make_unique<asio::steady_timer>(rep->io);
  if (!s.log_file.empty()) {
    rep->log.open(s.log_file, std::ios::app);
    if (!rep->log) {
      return absl::FailedPreconditionError(
          absl::StrCat("serial log file ", s.log_file, ": cannot open for appending"));
    }
  }
  {
    MutexLock lock(&mu_);
    encoding_ = s.encoding;
    line_ending_ = s.line_ending;
    open_ = true;
    path_ = path;
    partial_.clear();
  }
  Rep* r = rep.get();
  auto read = std::make_shared<std::function<void()>>();
  *read = [this, r, read] {
    r->port->async_read_some(
        asio::buffer(r->buf), [this, r, read](const boost::system::error_code& e, size_t n) {
          if (!e) {
            OnBytes(std::string_view(r->buf.data(), n));
            r->flush_timer->expires_after(std::chrono::milliseconds(kPartialFlushMs));
            r->flush_timer->async_wait([this](const boost::system::error_code& te) {
              if (!te) FlushPartial();
            });
            (*read)();
            return;
          }
          r->flush_timer->cancel();
          if (e == asio::error::operation_aborted) return;
          FlushPartial();
          std::function<void(const std::string&)> cb;
          std::string reason;
          {
            MutexLock lock(&mu_);
            if (!open_) return;  // closed on purpose
            open_ = false;
            reason = absl::StrCat("serial port ", path_, " closed: ",
                                  e == asio::error::eof ? std::string("end of file") : e.message());
            cb = on_failure_;
          }
          // Health first, so a reader told of the end finds the board marked.
          if (cb) cb(reason);
          {
            MutexLock lock(&mu_);
            ++closes_;
            cv_.SignalAll();  // a WaitFor ends with the port
          }
          EndReaders([](const SerialReader&) { return true; }, reason);
        });
  };
  {
    // Published and started under mu_, so a concurrent Deliver, Write or
    // Close never sees rep_ half set. No handler runs before io.run().
    MutexLock lock(&mu_);
    rep_ = std::move(rep);
    (*read)();
    r->thread = std::thread([r] { r->io.run(); });
  }
  for (const auto& cmd : s.startup_commands) {
    if (auto st = SendLine(cmd); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status SerialHub::OpenFed(const std::string& label, const SerialSettings& settings,
                                std::function<absl::Status(std::string_view)> writer) {
  Close("reopening", false);
  if (settings.encoding != "utf-8" && settings.encoding != "ascii" && settings.encoding != "hex") {
    return absl::InvalidArgumentError(absl::StrCat(
        name_, " ", label, ": encoding '", settings.encoding, "' (use utf-8, ascii or hex)"));
  }
  MutexLock lock(&mu_);
  open_ = true;
  fed_ = true;
  path_ = label;
  encoding_ = settings.encoding;
  line_ending_ = settings.line_ending;
  writer_ = std::move(writer);
  return absl::OkStatus();
}

void SerialHub::Feed(std::string_view bytes) {
  {
    MutexLock lock(&mu_);
    if (!fed_ || !open_) return;
  }
  OnBytes(bytes);
}

void SerialHub::FlushFed() { FlushPartial(); }

void SerialHub::Close(const std::string& reason, bool end_readers) {
  std::shared_ptr<Rep> rep;
  bool was_fed = false;
  {
    MutexLock lock(&mu_);
    open_ = false;
    ++closes_;
    cv_.SignalAll();  // a WaitFor ends with the port
    was_fed = std::exchange(fed_, false);
    writer_ = nullptr;
    rep = std::move(rep_);
  }
  if (was_fed) FlushPartial();
  if (rep) {
    {
      MutexLock wl(&rep->write_mu);  // after a write under way, before the next
      rep->closed = true;
    }
    asio::post(rep->io, [r = rep.get()] {
      boost::system::error_code ec;
      r->flush_timer->cancel();
      r->port->close(ec);
    });
    if (rep->thread.joinable()) rep->thread.join();
    FlushPartial();
  }
  if (end_readers) EndReaders([](const SerialReader&) { return true; }, reason);
}

bool SerialHub::is_open() const {
  MutexLock lock(&mu_);
  return open_;
}

std::string SerialHub::path() const {
  MutexLock lock(&mu_);
  return path_;
}

absl::Status SerialHub::Write(std::string_view bytes) {
  int fd = -1;
  std::string path;
  std::shared_ptr<Rep> r;
  std::function<absl::Status(std::string_view)> writer;
  {
    MutexLock lock(&mu_);
    if (open_ && fed_) {
      if (!writer_) {
        return absl::FailedPreconditionError(
            absl::StrCat(name_, ": ", path_, " is read-only (nothing can be written to it)"));
      }
      writer = writer_;
    } else if (!open_ || !rep_) {
      return absl::FailedPreconditionError(absl::StrCat(name_, ": serial port is not open"));
    } else {
      r = rep_;
      fd = r->port->native_handle();
      path = path_;
    }
  }
  if (writer) return writer(bytes);
  MutexLock wl(&r->write_mu);
  if (r->closed) {
    return absl::FailedPreconditionError(absl::StrCat(name_, ": serial port is not open"));
  }
  size_t done = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      if (std::chrono::steady_clock::now() > deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("serial port ", path, ": write timed out (flow control?)"));
      }
      pollfd p{fd, POLLOUT, 0};
      poll(&p, 1, 100);
      continue;
    }
    return absl::UnavailableError(
        absl::StrCat("serial port ", path, ": write failed: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status SerialHub::SendLine(std::string_view command) {
  std::string ending;
  {
    MutexLock lock(&mu_);
    ending = line_ending_;
  }
  return Write(std::string(command) + ending);
}

std::shared_ptr<SerialReader> SerialHub::Subscribe(bool from_history) {
  auto reader = std::make_shared<SerialReader>();
  MutexLock lock(&mu_);
  if (from_history) {
    for (const auto& l : history_) reader->Push(l, kReaderQueue);
  }
  readers_.push_back(reader);
  return reader;
}

void SerialHub::Unsubscribe(const std::shared_ptr<SerialReader>& reader) {
  MutexLock lock(&mu_);
  std::erase(readers_, reader);
}

void SerialHub::EndReaders(const std::function<bool(const SerialReader&)>& match,
                           const std::string& reason) {
  std::vector<std::shared_ptr<SerialReader>> ended;
  {
    MutexLock lock(&mu_);
    for (auto it = readers_.begin(); it != readers_.end();) {
      if (match(**it)) {
        ended.push_back(*it);
        it = readers_.erase(it);
      } else {
        ++it;
      }
    }
    cv_.SignalAll();
  }
  for (auto& r : ended) r->End(reason);
}

size_t SerialHub::reader_count() const {
  MutexLock lock(&mu_);
  return readers_.size();
}

std::vector<SerialLine> SerialHub::History(size_t max_lines) const {
  MutexLock lock(&mu_);
  size_t n = max_lines == 0 ? history_.size() : std::min(max_lines, history_.size());
  return std::vector<SerialLine>(history_.end() - static_cast<ptrdiff_t>(n), history_.end());
}

uint64_t SerialHub::next_seq() const {
  MutexLock lock(&mu_);
  return next_seq_;
}

std::optional<SerialLine> SerialHub::WaitFor(const std::regex& pattern, uint64_t since_seq,
                                             int timeout_ms, const CancelToken* cancel) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  MutexLock lock(&mu_);
  const uint64_t closes = closes_;
  const bool was_open = open_;
  uint64_t checked = since_seq;
  while (true) {
    for (const auto& l : history_) {
      if (l.seq < checked) continue;
      checked = l.seq + 1;
      if (std::regex_search(l.text, pattern)) return l;
    }
    if (checked < next_seq_) checked = next_seq_;  // lines that fell out of the ring
    if (cancel && cancel->cancelled()) return std::nullopt;
    if (was_open && closes_ != closes) return std::nullopt;
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return std::nullopt;
    cv_.WaitWithTimeout(&mu_, std::min<std::chrono::steady_clock::duration>(
                                  deadline - now, std::chrono::milliseconds(100)));
  }
}

void SerialHub::SetOnFailure(std::function<void(const std::string&)> fn) {
  MutexLock lock(&mu_);
  on_failure_ = std::move(fn);
}

void SerialHub::InjectForTest(std::string_view bytes) {
  OnBytes(bytes);
  FlushPartial();
}

void SerialHub::OnBytes(std::string_view bytes) {
  std::string encoding;
  {
    MutexLock lock(&mu_);
    encoding = encoding_;
  }
  if (encoding == "hex") {
    Deliver(DecodeSerialText(bytes, "hex"));
    return;
  }
  std::vector<std::string> lines;
  {
    MutexLock lock(&mu_);
    partial_.append(bytes);
    size_t start = 0;
    while (true) {
      size_t nl = partial_.find('\n', start);
      if (nl == std::string::npos) break;
      size_t end = nl;
      if (end > start && partial_[end - 1] == '\r') --end;
      lines.push_back(partial_.substr(start, end - start));
      start = nl + 1;
    }
    partial_.erase(0, start);
  }
  for (auto& l : lines) Deliver(DecodeSerialText(l, encoding));
}

void SerialHub::FlushPartial() {
  std::string rest, encoding;
  {
    MutexLock lock(&mu_);
    if (partial_.empty()) return;
    rest.swap(partial_);
    encoding = encoding_;
  }
  while (!rest.empty() && (rest.back() == '\r')) rest.pop_back();
  if (!rest.empty()) Deliver(DecodeSerialText(rest, encoding));
}

void SerialHub::Deliver(std::string text) {
  MutexLock lock(&mu_);
  SerialLine line{next_seq_++, NowMicros(), std::move(text)};
  if (rep_ && rep_->log.is_open()) {
    rep_->log << line.time_us << ' ' << line.text << '\n';
    rep_->log.flush();
  }
  for (auto& r : readers_) r->Push(line, kReaderQueue);
  history_.push_back(std::move(line));
  while (history_.size() > history_lines_) history_.pop_front();
  cv_.SignalAll();
}

}  // namespace fwai
