#include "server/lab/lab_boards.h"

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>

#include <chrono>
#include <deque>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/cancel.h"
#include "common/clock.h"
#include "common/config.h"
#include "common/grpc_status.h"
#include "common/local_account.h"
#include "common/verdict.h"
#include "fwai/v1/lab.grpc.pb.h"
#include "server/hardware/firmware_image.h"
#include "server/lab/lab_leases.h"
#include "server/lab/registry.h"

namespace fwai::lab {
namespace {

namespace pb = ::fwai::v1;
namespace fs = std::filesystem;

constexpr size_t kMaxImage = 64 << 20;  // as for local flashes
constexpr size_t kChunk = 64 << 10;

absl::StatusOr<std::string> ReadFile(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::FailedPreconditionError(absl::StrCat(what, " ", path, ": cannot read it"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A status from the bench of `board`, saying so, with the bench's verdict;
// a bench that could not be reached (UNAVAILABLE, no verdict of its own) is
// the lab's network or daemon: infra.
absl::Status FromBench(const grpc::Status& st, const BoardRef& board) {
  absl::Status out(
      static_cast<absl::StatusCode>(st.error_code()),
      absl::StrCat("the bench ", board.node, " of board ", board.id, ": ", st.error_message()));
  std::string verdict = VerdictOf(st);
  if (verdict.empty() && st.error_code() == grpc::StatusCode::UNAVAILABLE)
    verdict = std::string(kVerdictInfra);
  return WithVerdict(std::move(out), verdict);
}

// The image at `path`, read as the caller's account (as a local flash copies it).
absl::StatusOr<std::string> ReadImageAs(const Caller& caller, const std::string& path) {
  if (!caller.account) {
    return absl::PermissionDeniedError(absl::StrCat("flash guard (image): reading ", path,
                                                    " needs a local account; ", caller.display,
                                                    " has none"));
  }
  ScopedFsIdentity as(*caller.account);
  if (!as.status().ok()) return as.status();
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    return absl::FailedPreconditionError(
        absl::StrCat("flash guard (image): ", path,
                     fs::exists(path, ec) ? " is not a regular file" : " does not exist"));
  }
  if (fs::file_size(path, ec) > kMaxImage) {
    return absl::FailedPreconditionError(
        absl::StrCat("flash guard (image): ", path, " is over 64 MB"));
  }
  auto bytes = ReadFile(path, "flash guard (image):");
  if (!bytes.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("flash guard (image): ", path, ": ", caller.account->name, " cannot read it"));
  }
  return bytes;
}

// What the front's part of the flash guard found: the image's build record
// (null when none) for the bench's memory rules, and what the register check
// said (its summary, or the warning a warn-mode flash goes on despite).
struct FrontVerdict {
  nlohmann::json build;
  std::string registers_said, registers_warning;
};

// The front's part of the flash guard: the image as read, its freshness, its
// toolchain and the project's register code — all of which only the front
// can see.
absl::StatusOr<FrontVerdict> CheckAtFront(
    const Caller& caller, const std::string& path, const std::string& bytes,
    const std::string& project_root, const FlashGuardPolicy& guard,
    const std::function<nlohmann::json(const std::string&)>& build_record,
    const RegisterCheckHook& register_check) {
  std::string root = project_root;
  if (root.empty()) {
    ScopedFsIdentity as(*caller.account);  // ReadImageAs made sure there is one
    if (!as.status().ok()) return as.status();
    root = FindProjectRoot(path);
  }
  const bool elf = bytes.size() >= 4 && bytes.compare(0, 4,
                                                      "\x7f"
                                                      "ELF") == 0;
  if (elf && guard.check_fresh) {
    auto img = ParseFirmwareImage(bytes, path);
    if (!img.ok())
      return absl::FailedPreconditionError(
          absl::StrCat("flash guard (image): ", img.status().message()));
    {
      ScopedFsIdentity as(*caller.account);  // ReadImageAs made sure there is one
      if (!as.status().ok()) return as.status();
      struct stat st;
      if (stat(path.c_str(), &st) != 0) {
        return absl::FailedPreconditionError(
            absl::StrCat("flash guard (image): ", path, " is gone"));
      }
      img->mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
    }
    if (auto s = CheckImageFresh(*img, root); !s.ok()) return s;
  }
  const std::string sha = BytesSha256Hex(bytes);
  FrontVerdict v;
  v.build = BuildRecordMadeImage(guard.build, sha) ? guard.build : nlohmann::json();
  if (v.build.is_null() && build_record) v.build = build_record(sha);
  if (guard.require_verified_toolchain) {
    if (auto s = CheckToolchainRecord(v.build, path, sha); !s.ok()) return s;
  }
  if (auto s = GuardRegisters(register_check, caller, root, guard.register_check, &v.registers_said,
                              &v.registers_warning);
      !s.ok()) {
    return s;
  }
  return v;
}

// LabNode.Serial of one board, read by a thread into a queue.
class LabSerial final : public BoardSerial {
 public:
  static absl::StatusOr<std::unique_ptr<LabSerial>> Open(
      const std::shared_ptr<grpc::Channel>& channel, const BoardRef& board, bool from_history,
      const std::string& stream) {
    std::unique_ptr<LabSerial> s(new LabSerial);
    s->stub_ = pb::LabNode::NewStub(channel);
    s->stream_ = s->stub_->Serial(&s->ctx_);
    pb::SerialClientMessage m;
    m.mutable_open()->set_device_id(board.id);
    m.mutable_open()->set_lease_id(board.lease_id);
    m.mutable_open()->set_from_history(from_history);
    m.mutable_open()->set_stream(stream);
    pb::SerialServerMessage first;
    // The bench answers an open with the board and port, or refuses it.
    if (!s->stream_->Write(m) || !s->stream_->Read(&first)) {
      grpc::Status st = s->stream_->Finish();
      if (!st.ok()) return FromBench(st, board);
      return absl::UnavailableError(absl::StrCat("the bench ", board.node, " of board ", board.id,
                                                 ": the serial stream ended at once"));
    }
    // A bench too old for trace streams ignores the field and serves the UART; it says so by
    // not naming the stream it serves.
    const bool trace = !(stream.empty() || stream == "uart");
    if (trace && (first.stream().empty() || first.stream() == "uart")) {
      s->ctx_.TryCancel();
      (void)s->stream_->Finish();
      return absl::UnimplementedError(absl::StrCat("the bench ", board.node, " of board ", board.id,
                                                   " does not serve ", stream,
                                                   ": its fwaid is older than trace streams"));
    }
    s->next_seq_ = first.next_seq();
    s->Take(first);
    s->pump_ = std::thread([p = s.get()] { p->Pump(); });
    return s;
  }

  ~LabSerial() override {
    ctx_.TryCancel();
    if (pump_.joinable()) pump_.join();
  }

  SerialReader::Next Wait(SerialLine& line, int timeout_ms) override {
    MutexLock lock(&mu_);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (!(!lines_.empty() || ended_)) {
      if (cv_.WaitWithDeadline(&mu_, deadline)) break;
    }
    if (!lines_.empty()) {
      line = std::move(lines_.front());
      lines_.pop_front();
      return SerialReader::Next::kLine;
    }
    return ended_ ? SerialReader::Next::kEnded : SerialReader::Next::kTimeout;
  }

  std::string end_reason() const override {
    MutexLock lock(&mu_);
    return reason_;
  }
  uint64_t dropped() const override {
    MutexLock lock(&mu_);
    return dropped_;
  }

  absl::Status Write(std::string_view bytes) override {
    pb::SerialClientMessage m;
    m.set_write(std::string(bytes));
    return Send(m);
  }
  absl::Status SendLine(std::string_view text) override {
    pb::SerialClientMessage m;
    m.set_send_line(std::string(text));
    return Send(m);
  }

  uint64_t next_seq() const override { return next_seq_; }
  std::string TakeRefusal() override {
    MutexLock lock(&mu_);
    if (refused_.empty()) return "";
    std::string r = std::move(refused_.front());
    refused_.pop_front();
    return r;
  }
  bool host_stopping() const override {
    MutexLock lock(&mu_);
    return bench_stopping_;
  }
  void Notice(const std::string& text) override {
    MutexLock lock(&mu_);
    if (ended_) return;
    lines_.push_back(SerialLine{0, NowMicros(), text, true});
    cv_.SignalAll();
  }

 private:
  LabSerial() = default;

  absl::Status Send(const pb::SerialClientMessage& m) {
    MutexLock lock(&write_mu_);
    if (!stream_->Write(m)) return absl::UnavailableError("the bench's serial stream has ended");
    return absl::OkStatus();
  }

  void Take(const pb::SerialServerMessage& m) {
    MutexLock lock(&mu_);
    for (const auto& l : m.lines())
      lines_.push_back(SerialLine{l.seq(), l.time_us(), l.line(), l.notice()});
    dropped_ += m.dropped();
    // A refused write: the stream stays open for reading.
    if (!m.error().empty()) refused_.push_back(m.error());
    if (m.end_of_stream() && !ended_) {
      ended_ = true;
      reason_ = m.reason().empty() ? "the bench ended the stream" : m.reason();
      bench_stopping_ = m.daemon_stopping();
    }
    cv_.SignalAll();
  }

  void Pump() {
    pb::SerialServerMessage m;
    while (stream_->Read(&m)) Take(m);
    grpc::Status st = stream_->Finish();
    MutexLock lock(&mu_);
    if (!ended_) {
      ended_ = true;
      reason_ =
          st.ok() ? "the bench ended the stream" : absl::StrCat("the bench: ", st.error_message());
    }
    cv_.SignalAll();
  }

  grpc::ClientContext ctx_;
  std::unique_ptr<pb::LabNode::Stub> stub_;
  std::unique_ptr<grpc::ClientReaderWriter<pb::SerialClientMessage, pb::SerialServerMessage>>
      stream_;
  std::thread pump_;
  uint64_t next_seq_ = 0;
  Mutex write_mu_;  // one Write on stream_ at a time
  mutable Mutex mu_;
  CondVar cv_;
  std::deque<SerialLine> lines_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  std::string reason_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> refused_ ABSL_GUARDED_BY(mu_);
  bool bench_stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::Channel>> LabLinks::ChannelTo(const std::string& node) {
  auto view = ReadLab(etcd_);
  if (!view.ok()) return view.status();
  std::string address;
  for (const auto& n : view->nodes) {
    if (n.node == node) address = n.advertise;
  }
  if (address.rfind("tls:", 0) != 0) {
    return absl::UnavailableError(
        absl::StrCat("node ", node, " is not in the lab now, or advertises no tls: address"));
  }
  address = address.substr(4);
  MutexLock lock(&mu_);
  if (auto it = channels_.find(node); it != channels_.end() && it->second.first == address)
    return it->second.second;
  const LabConfig& lab = config_.lab;
  const TlsConfig& tls = config_.security.tls;
  const std::string cert = lab.cert.empty() ? tls.cert : lab.cert;
  const std::string key = lab.key.empty() ? tls.key : lab.key;
  const std::string ca = lab.ca.empty() ? tls.client_ca : lab.ca;
  if (cert.empty() || key.empty() || ca.empty()) {
    return absl::FailedPreconditionError(
        "this node has no node certificate for the lab: set lab.cert, lab.key and lab.ca in "
        "fwaid.yaml "
        "(fwaid tls issue DIR --node NODE --host NAME makes one)");
  }
  grpc::SslCredentialsOptions o;
  for (auto [file, out] : {std::pair<const std::string*, std::string*>{&ca, &o.pem_root_certs},
                           {&cert, &o.pem_cert_chain},
                           {&key, &o.pem_private_key}}) {
    auto text = ReadFile(*file, "lab:");
    if (!text.ok()) return text.status();
    *out = *std::move(text);
  }
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  auto channel = grpc::CreateCustomChannel(address, grpc::SslCredentials(o), args);
  channels_[node] = {address, channel};
  return channel;
}

LabBoards::LabBoards(const DaemonConfig& config, EtcdClient& etcd, LabLeases& leases,
                     std::string node,
                     std::function<nlohmann::json(const std::string&)> build_record,
                     RegisterCheckHook register_check)
    : leases_(leases),
      node_(std::move(node)),
      build_record_(std::move(build_record)),
      register_check_(std::move(register_check)),
      links_(config, etcd) {}

std::vector<BoardRef> LabBoards::Held(const Caller& caller, const std::string& board,
                                      const std::string& lease_id) const {
  std::vector<BoardRef> found;
  for (const auto& l : leases_.Mine()) {
    if (!IsLabLeaseId(l.lease_id) || l.identity != caller.identity) continue;
    if (!board.empty() && l.board != board) continue;
    if (!lease_id.empty() && l.lease_id != lease_id) continue;
    found.push_back(BoardRef{l.board, l.node, true, l.lease_id});
  }
  return found;
}

std::optional<std::string> LabBoards::HeldByAnother(const Caller& caller,
                                                    const std::string& board) const {
  auto holder = leases_.Holder(board);
  if (!holder.ok() || !holder->has_value()) return std::nullopt;
  const LabLease& l = **holder;
  if (l.identity == caller.identity && l.via == node_) return std::nullopt;
  return absl::StrCat(l.holder, " through ", l.via);
}

std::optional<std::string> LabBoards::WhyEnded(const Caller& caller,
                                               const std::string& lease_id) const {
  return leases_.Ended(lease_id, caller.identity);
}

absl::StatusOr<FlashResult> LabBoards::Flash(
    const Caller& caller, const BoardRef& board, const FlashOrder& order, bool approved,
    const FlashGuardPolicy& guard, const std::function<void(const FlashProgressUpdate&)>& progress,
    CancelToken* cancel) {
  // The front's guard refusing the request: config.
  auto image = ReadImageAs(caller, order.image);
  if (!image.ok()) return WithVerdict(image.status(), kVerdictConfig);
  auto verdict = CheckAtFront(caller, order.image, *image, order.project_root, guard, build_record_,
                              register_check_);
  if (!verdict.ok()) return WithVerdict(verdict.status(), kVerdictConfig);
  const nlohmann::json* build = &verdict->build;
  if (!verdict->registers_warning.empty())
    progress({"guard", 0.05, absl::StrCat("warning: ", verdict->registers_warning)});
  progress({"guard", 0.05,
            absl::StrCat("the front's guard passed: image (", image->size(), " bytes)",
                         guard.check_fresh ? ", fresh" : ", freshness waived by policy",
                         guard.require_verified_toolchain ? ", toolchain verified" : "",
                         verdict->registers_said, "; the bench checks the rest")});
  auto channel = links_.ChannelTo(board.node);
  if (!channel.ok()) return WithVerdict(channel.status(), kVerdictInfra);
  auto stub = pb::LabNode::NewStub(*channel);
  // Held by the cancel callback too, which may run after this returns.
  auto ctx = std::make_shared<grpc::ClientContext>();
  if (cancel) cancel->OnCancel([ctx] { ctx->TryCancel(); });
  auto stream = stub->Flash(ctx.get());
  pb::LabFlashRequest start;
  auto* s = start.mutable_start();
  s->set_device_id(board.id);
  s->set_lease_id(board.lease_id);
  s->set_file_name(fs::path(order.image).filename().string());
  s->set_size(static_cast<int64_t>(image->size()));
  s->set_approved(approved);
  s->set_holder(caller.display);
  s->set_flash_max_pct(guard.flash_max_pct);
  s->set_ram_max_pct(guard.ram_max_pct);
  s->set_max_growth_bytes(guard.max_growth_bytes);
  if (build->is_object()) s->set_build_record_json(build->dump());
  bool sent = stream->Write(start);
  for (size_t at = 0; sent && at < image->size(); at += kChunk) {
    pb::LabFlashRequest chunk;
    chunk.set_data(image->substr(at, kChunk));
    sent = stream->Write(chunk);
  }
  if (sent) stream->WritesDone();
  FlashResult out;
  pb::FlashProgress p;
  while (stream->Read(&p)) {
    if (p.done()) {
      out.sha256 = p.image_sha256();
      out.boot_line = p.boot_line();
      out.seconds = p.seconds();
      continue;
    }
    progress({p.stage(), p.fraction(), p.message()});
  }
  grpc::Status st = stream->Finish();
  if (!st.ok()) return FromBench(st, board);
  out.record = {{"image", order.image},       {"image_sha256", out.sha256},
                {"bytes", image->size()},     {"approved", approved},
                {"boot_line", out.boot_line}, {"booted", !out.boot_line.empty()},
                {"seconds", out.seconds}};
  if (build->is_object()) out.record["build_run_id"] = build->value("run_id", "");
  return out;
}

absl::StatusOr<std::unique_ptr<BoardSerial>> LabBoards::OpenSerial(const Caller&,
                                                                   const BoardRef& board,
                                                                   bool from_history,
                                                                   const std::string& stream) {
  auto channel = links_.ChannelTo(board.node);
  if (!channel.ok()) return channel.status();
  auto s = LabSerial::Open(*channel, board, from_history, stream);
  if (!s.ok()) return s.status();
  return std::unique_ptr<BoardSerial>(*std::move(s));
}

absl::StatusOr<uint64_t> LabBoards::SerialNextSeq(const Caller&, const BoardRef& board,
                                                  const std::string& stream) {
  auto channel = links_.ChannelTo(board.node);
  if (!channel.ok()) return channel.status();
  auto s = LabSerial::Open(*channel, board, /*from_history=*/false, stream);
  if (!s.ok()) return s.status();
  return (*s)->next_seq();  // as the bench said when the stream opened
}

absl::StatusOr<std::vector<SerialLine>> LabBoards::SerialHistory(const Caller&,
                                                                 const BoardRef& board,
                                                                 size_t max_lines,
                                                                 const std::string& stream) {
  auto channel = links_.ChannelTo(board.node);
  if (!channel.ok()) return channel.status();
  auto s = LabSerial::Open(*channel, board, /*from_history=*/true, stream);
  if (!s.ok()) return s.status();
  // The history is every line numbered before the bench's next line.
  const uint64_t end = (*s)->next_seq();
  std::deque<SerialLine> lines;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (end > 1 && std::chrono::steady_clock::now() < deadline) {
    SerialLine l;
    auto n = (*s)->Wait(l, 200);
    if (n == SerialReader::Next::kEnded) {
      return absl::UnavailableError(
          absl::StrCat("the bench ", board.node, " of board ", board.id,
                       ": the serial history was cut short: ", (*s)->end_reason()));
    }
    if (n == SerialReader::Next::kTimeout) continue;
    if (l.seq >= end) break;
    lines.push_back(std::move(l));
    if (max_lines > 0 && lines.size() > max_lines) lines.pop_front();
    if (lines.back().seq + 1 >= end) break;
  }
  return std::vector<SerialLine>(lines.begin(), lines.end());
}

absl::StatusOr<DebugResult> LabBoards::Debug(const Caller&, const BoardRef& board,
                                             const std::vector<std::string>& commands,
                                             int timeout_ms, CancelToken* cancel) {
  auto channel = links_.ChannelTo(board.node);
  if (!channel.ok()) return channel.status();
  pb::DebugRequest req;
  req.set_device_id(board.id);
  req.set_lease_id(board.lease_id);
  for (const auto& c : commands) req.add_commands(c);
  const int timeout_s = std::max(1, (timeout_ms + 999) / 1000);
  req.set_timeout_s(timeout_s);
  pb::DebugResponse resp;
  auto ctx = std::make_shared<grpc::ClientContext>();
  // The bench's own timeout, and room for it to say so.
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(timeout_s + 30));
  // A cancel ends the call: the bench sees it cancelled and ends its gdb.
  if (cancel) cancel->OnCancel([ctx] { ctx->TryCancel(); });
  grpc::Status st = pb::LabNode::NewStub(*channel)->Debug(ctx.get(), req, &resp);
  if (!st.ok()) return FromBench(st, board);
  DebugResult out;
  out.outputs.assign(resp.outputs().begin(), resp.outputs().end());
  if (!resp.result_json().empty()) {
    out.results = nlohmann::json::parse(resp.result_json(), nullptr, false);
    if (out.results.is_discarded()) out.results = nlohmann::json::array();
  }
  return out;
}

absl::Status LabBoards::Reset(const Caller&, const BoardRef& board) {
  auto channel = links_.ChannelTo(board.node);
  if (!channel.ok()) return channel.status();
  pb::ResetRequest req;
  req.set_device_id(board.id);
  req.set_lease_id(board.lease_id);
  pb::ResetResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  grpc::Status st = pb::LabNode::NewStub(*channel)->Reset(&ctx, req, &resp);
  if (!st.ok()) return FromBench(st, board);
  return absl::OkStatus();
}

// A bench keeps its boards' health itself (its self-test runs there).
absl::Status LabBoards::SetHealth(const Caller&, const BoardRef& board, const std::string&,
                                  const std::string&) {
  return absl::FailedPreconditionError(
      absl::StrCat("board ", board.id, " is on bench ", board.node,
                   ": its health is set there (fwai --daemon BENCH hw health ", board.id, " ...)"));
}

absl::StatusOr<std::string> LabBoards::SelfTest(const Caller&, const BoardRef& board) {
  return absl::FailedPreconditionError(
      absl::StrCat("board ", board.id, " is on bench ", board.node,
                   ": its self-test runs there (fwai --daemon BENCH hw test ", board.id, ")"));
}

namespace {

// Rollouts run on the bench that owns the boards (it holds their slots).
absl::Status OnItsBench(const BoardRef& board, const std::string& what) {
  return absl::FailedPreconditionError(
      absl::StrCat("board ", board.id, " is on bench ", board.node, ": ", what,
                   " on that bench (fwai --daemon BENCH ota ...)"));
}

}  // namespace

absl::Status LabBoards::OtaStage(const Caller&, const BoardRef& board, const std::string&, bool) {
  return OnItsBench(board, "over-the-air updates of it run");
}

absl::StatusOr<OtaBootResult> LabBoards::OtaRestart(const Caller&, const BoardRef& board, int) {
  return OnItsBench(board, "over-the-air updates of it run");
}

absl::Status LabBoards::OtaConfirm(const Caller&, const BoardRef& board) {
  return OnItsBench(board, "over-the-air updates of it run");
}

absl::Status LabBoards::OtaRestorePrevious(const Caller&, const BoardRef& board) {
  return OnItsBench(board, "over-the-air updates of it run");
}

absl::StatusOr<OtaSlotsInfo> LabBoards::OtaSlots(const BoardRef& board) {
  return OnItsBench(board, "its update slots are read");
}

}  // namespace fwai::lab
