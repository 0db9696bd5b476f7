#include "server/lab/etcd_client.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/mutex.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"

namespace fwai::lab {
namespace {

namespace epb = ::etcdserverpb;

constexpr char kMembersPayload[] = "type.fwai.dev/etcd-member-answers";

absl::Status FromGrpc(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

// Worth trying another member: this one is unreachable, slow or cut off
// from the leader.
bool TryNext(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAVAILABLE ||
         s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

KeyValue FromProto(const mvccpb::KeyValue& kv) {
  KeyValue out;
  out.key = kv.key();
  out.value = kv.value();
  out.create_revision = kv.create_revision();
  out.mod_revision = kv.mod_revision();
  out.version = kv.version();
  out.lease = kv.lease();
  return out;
}

struct Endpoint {
  std::string name;  // HOST:PORT
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<epb::KV::Stub> kv;
  std::unique_ptr<epb::Lease::Stub> lease;
  std::unique_ptr<epb::Watch::Stub> watch;
};

class Client;

class Watcher final : public EtcdWatch {
 public:
  Watcher(Client* client, std::string prefix, int64_t start_revision,
          std::function<void(const std::vector<WatchEvent>&, int64_t)> on_events,
          std::function<void(const absl::Status&)> on_error)
      : client_(client),
        prefix_(std::move(prefix)),
        next_revision_(start_revision),
        on_events_(std::move(on_events)),
        on_error_(std::move(on_error)) {
    thread_ = std::thread([this] { Run(); });
  }
  ~Watcher() override { Cancel(); }

  void Cancel() override {
    {
      MutexLock lock(&mu_);
      cancelled_ = true;
      if (ctx_) ctx_->TryCancel();
      cv_.SignalAll();
    }
    MutexLock join(&join_mu_);
    if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
  }

 private:
  void Run() ABSL_LOCKS_EXCLUDED(mu_);

  Client* const client_;
  const std::string prefix_;
  int64_t next_revision_;
  std::function<void(const std::vector<WatchEvent>&, int64_t)> on_events_;
  std::function<void(const absl::Status&)> on_error_;
  Mutex mu_, join_mu_;
  CondVar cv_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* ctx_ ABSL_GUARDED_BY(mu_) = nullptr;  // Run's, while it watches
  std::thread thread_ ABSL_GUARDED_BY(join_mu_);
};

class Client final : public EtcdClient {
 public:
  Client(EtcdOptions options, std::shared_ptr<grpc::ChannelCredentials> creds)
      : options_(std::move(options)) {
    grpc::ChannelArguments args;
    // etcd may be down for a while; come back within a second of its return.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 200);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 5000);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 3000);
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    for (const auto& e : options_.endpoints) {
      auto ep = std::make_unique<Endpoint>();
      ep->name = e;
      ep->channel = grpc::CreateCustomChannel(e, creds, args);
      ep->kv = epb::KV::NewStub(ep->channel);
      ep->lease = epb::Lease::NewStub(ep->channel);
      ep->watch = epb::Watch::NewStub(ep->channel);
      endpoints_.push_back(std::move(ep));
    }
  }

  const std::vector<std::string>& endpoints() const override { return options_.endpoints; }

  // Runs `call(endpoint, ctx)` on the current endpoint, then the others.
  // When a member answered that it has no leader (the leader stopped and the
  // others are electing one, typically within a second or two), the round is
  // tried again for up to request_timeout_ms after that answer: a request was not applied by a
  // member that refused it, and losing one member must change nothing a
  // caller sees. With quorum lost the answer stays "no leader" and the call
  // fails when that time is up, naming every member.
  template <typename F>
  absl::Status Call(const char* what, F call) {
    std::optional<std::chrono::steady_clock::time_point> give_up;
    auto backoff = std::chrono::milliseconds(100);
    while (true) {
      std::vector<std::string> errors;
      bool electing = false;
      const size_t n = endpoints_.size();
      const size_t first = current_.load();
      for (size_t i = 0; i < n; ++i) {
        const size_t at = (first + i) % n;
        Endpoint& ep = *endpoints_[at];
        grpc::ClientContext ctx;
        Prepare(ctx, options_.request_timeout_ms);
        grpc::Status s = call(ep, ctx);
        if (s.ok()) {
          current_ = at;
          return absl::OkStatus();
        }
        if (!TryNext(s)) return FromGrpc(s);
        if (absl::StrContains(s.error_message(), "no leader")) electing = true;
        errors.push_back(absl::StrCat(ep.name, ": ", s.error_message()));
      }
      const auto now = std::chrono::steady_clock::now();
      if (electing && !give_up)
        give_up = now + std::chrono::milliseconds(options_.request_timeout_ms);
      if (!electing || now + backoff > *give_up) return NoQuorum(what, errors);
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, std::chrono::milliseconds(400));
    }
  }

  // One line a person can act on (every member named), the detail of each
  // member's answer in the log.
  absl::Status NoQuorum(const char* what, const std::vector<std::string>& errors) const {
    spdlog::warn("etcd {}: no member of the cluster answered ({})", what,
                 absl::StrJoin(errors, "; "));
    size_t answered = 0;  // up, but without a leader
    for (const auto& e : errors) answered += absl::StrContains(e, "no leader");
    const std::string members = absl::StrJoin(options_.endpoints, ", ");
    absl::Status out = absl::UnavailableError(
        answered > 0 ? absl::StrCat("the lab's registry (etcd) has no quorum: ", answered, " of ",
                                    endpoints_.size(), " members answer (", members,
                                    "); leases and lab boards are unavailable until it recovers")
                     : absl::StrCat("the lab's registry (etcd) cannot be reached: none of its ",
                                    endpoints_.size(), " members answers (", members,
                                    "); leases and lab boards are unavailable until it does"));
    out.SetPayload(kMembersPayload, absl::Cord(absl::StrJoin(errors, "\n")));
    return out;
  }

  static void Prepare(grpc::ClientContext& ctx, int timeout_ms) {
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
    // A member cut off from the leader refuses at once instead of timing out.
    ctx.AddMetadata("hasleader", "true");
  }

  absl::StatusOr<int64_t> Put(const std::string& key, const std::string& value,
                              int64_t lease) override {
    epb::PutRequest req;
    req.set_key(key);
    req.set_value(value);
    req.set_lease(lease);
    epb::PutResponse resp;
    auto s = Call("put", [&](Endpoint& ep, grpc::ClientContext& ctx) {
      return ep.kv->Put(&ctx, req, &resp);
    });
    if (!s.ok()) return s;
    return resp.header().revision();
  }

  absl::StatusOr<RangeResult> Range(const std::string& key, const std::string& end) {
    epb::RangeRequest req;
    req.set_key(key);
    if (!end.empty()) req.set_range_end(end);
    epb::RangeResponse resp;
    auto s = Call("range", [&](Endpoint& ep, grpc::ClientContext& ctx) {
      return ep.kv->Range(&ctx, req, &resp);
    });
    if (!s.ok()) return s;
    RangeResult out;
    out.revision = resp.header().revision();
    for (const auto& kv : resp.kvs()) out.kvs.push_back(FromProto(kv));
    return out;
  }

  absl::StatusOr<std::optional<KeyValue>> Get(const std::string& key) override {
    auto r = Range(key, "");
    if (!r.ok()) return r.status();
    if (r->kvs.empty()) return std::optional<KeyValue>();
    return std::optional<KeyValue>(r->kvs.front());
  }

  absl::StatusOr<RangeResult> GetPrefix(const std::string& prefix) override {
    return Range(prefix, PrefixEnd(prefix));
  }

  absl::StatusOr<int64_t> DeleteRange(const std::string& key, const std::string& end) {
    epb::DeleteRangeRequest req;
    req.set_key(key);
    if (!end.empty()) req.set_range_end(end);
    epb::DeleteRangeResponse resp;
    auto s = Call("delete", [&](Endpoint& ep, grpc::ClientContext& ctx) {
      return ep.kv->DeleteRange(&ctx, req, &resp);
    });
    if (!s.ok()) return s;
    return resp.deleted();
  }
  absl::StatusOr<int64_t> Delete(const std::string& key) override { return DeleteRange(key, ""); }
  absl::StatusOr<int64_t> DeletePrefix(const std::string& prefix) override {
    return DeleteRange(prefix, PrefixEnd(prefix));
  }

  absl::StatusOr<CreateResult> CreateIfAbsent(const std::string& key, const std::string& value,
                                              int64_t lease) override {
    GuardedCreate g;
    g.key = key;
    g.value = value;
    g.lease = lease;
    return CreateGuarded(g);
  }

  absl::StatusOr<CreateResult> CreateGuarded(const GuardedCreate& g) override {
    epb::TxnRequest req;
    auto* absent = req.add_compare();
    absent->set_key(g.key);
    absent->set_target(epb::Compare::CREATE);
    absent->set_result(epb::Compare::EQUAL);
    absent->set_create_revision(0);
    if (!g.unchanged_prefix.empty()) {
      // Every key of the range (none is fine) last written at or before the read.
      auto* same = req.add_compare();
      same->set_key(g.unchanged_prefix);
      same->set_range_end(PrefixEnd(g.unchanged_prefix));
      same->set_target(epb::Compare::MOD);
      same->set_result(epb::Compare::LESS);
      same->set_mod_revision(g.unchanged_since + 1);
    }
    if (!g.consume_key.empty()) {
      auto* mine = req.add_compare();
      mine->set_key(g.consume_key);
      mine->set_target(epb::Compare::CREATE);
      mine->set_result(epb::Compare::EQUAL);
      mine->set_create_revision(g.consume_create_revision);
      req.add_success()->mutable_request_delete_range()->set_key(g.consume_key);
    }
    auto* put = req.add_success()->mutable_request_put();
    put->set_key(g.key);
    put->set_value(g.value);
    put->set_lease(g.lease);
    req.add_success()->mutable_request_range()->set_key(g.key);
    req.add_failure()->mutable_request_range()->set_key(g.key);
    epb::TxnResponse resp;
    auto s = Call("txn", [&](Endpoint& ep, grpc::ClientContext& ctx) {
      return ep.kv->Txn(&ctx, req, &resp);
    });
    if (!s.ok()) return s;
    CreateResult out;
    out.created = resp.succeeded();
    for (const auto& r : resp.responses()) {
      if (r.has_response_range() && r.response_range().kvs_size() > 0)
        out.current = FromProto(r.response_range().kvs(0));
    }
    // A retry after a lost answer finds its own write: that is a win too.
    if (!out.created && out.current.value == g.value && out.current.lease == g.lease)
      out.created = true;
    return out;
  }

  absl::StatusOr<bool> DeleteIfValue(const std::string& key, const std::string& value) override {
    epb::TxnRequest req;
    auto* cmp = req.add_compare();
    cmp->set_key(key);
    cmp->set_target(epb::Compare::VALUE);
    cmp->set_result(epb::Compare::EQUAL);
    cmp->set_value(value);
    req.add_success()->mutable_request_delete_range()->set_key(key);
    epb::TxnResponse resp;
    auto s = Call("txn", [&](Endpoint& ep, grpc::ClientContext& ctx) {
      return ep.kv->Txn(&ctx, req, &resp);
    });
    if (!s.ok()) return s;
    return resp.succeeded();
  }

  absl::StatusOr<int64_t> LeaseGrant(int64_t ttl_s) override {
    epb::LeaseGrantRequest req;
    req.set_ttl(ttl_s);
    epb::LeaseGrantResponse resp;
    auto s = Call("lease grant", [&](Endpoint& ep, grpc::ClientContext& ctx) {
      return ep.lease->LeaseGrant(&ctx, req, &resp);
    });
    if (!s.ok()) return s;
    if (!resp.error().empty())
      return absl::InternalError(absl::StrCat("etcd lease grant: ", resp.error()));
    return resp.id();
  }

  absl::StatusOr<int64_t> LeaseKeepAlive(int64_t lease) override {
    epb::LeaseKeepAliveResponse resp;
    auto s = Call("lease keepalive", [&](Endpoint& ep, grpc::ClientContext& ctx) {
      auto stream = ep.lease->LeaseKeepAlive(&ctx);
      epb::LeaseKeepAliveRequest req;
      req.set_id(lease);
      if (!stream->Write(req) || !stream->Read(&resp)) {
        stream->WritesDone();
        grpc::Status st = stream->Finish();
        return st.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "keepalive stream closed")
                       : st;
      }
      stream->WritesDone();
      ctx.TryCancel();  // one answer is all we wanted
      stream->Finish();
      return grpc::Status::OK;
    });
    if (!s.ok()) return s;
    if (resp.ttl() <= 0)
      return absl::NotFoundError(absl::StrCat("etcd lease ", lease, " has expired"));
    return resp.ttl();
  }

  absl::StatusOr<int64_t> LeaseTimeToLive(int64_t lease) override {
    epb::LeaseTimeToLiveRequest req;
    req.set_id(lease);
    epb::LeaseTimeToLiveResponse resp;
    auto s = Call("lease ttl", [&](Endpoint& ep, grpc::ClientContext& ctx) {
      return ep.lease->LeaseTimeToLive(&ctx, req, &resp);
    });
    if (!s.ok()) return s;
    if (resp.ttl() < 0)
      return absl::NotFoundError(absl::StrCat("etcd lease ", lease, " has expired"));
    return resp.ttl();
  }

  absl::Status LeaseRevoke(int64_t lease) override {
    epb::LeaseRevokeRequest req;
    req.set_id(lease);
    epb::LeaseRevokeResponse resp;
    auto s = Call("lease revoke", [&](Endpoint& ep, grpc::ClientContext& ctx) {
      return ep.lease->LeaseRevoke(&ctx, req, &resp);
    });
    if (absl::IsNotFound(s)) return absl::OkStatus();
    return s;
  }

  std::unique_ptr<EtcdWatch> Watch(
      const std::string& prefix, int64_t start_revision,
      std::function<void(const std::vector<WatchEvent>&, int64_t)> on_events,
      std::function<void(const absl::Status&)> on_error) override {
    return std::make_unique<Watcher>(this, prefix, start_revision, std::move(on_events),
                                     std::move(on_error));
  }

  Endpoint& CurrentEndpoint() { return *endpoints_[current_.load() % endpoints_.size()]; }
  void NextEndpoint(size_t from) {
    size_t expected = from;
    current_.compare_exchange_strong(expected, (from + 1) % endpoints_.size());
  }
  size_t current() const { return current_.load(); }

 private:
  const EtcdOptions options_;
  std::vector<std::unique_ptr<Endpoint>> endpoints_;
  std::atomic<size_t> current_{0};
};

void Watcher::Run() {
  bool ended = false;
  while (!ended) {
    const size_t at = client_->current();
    Endpoint& ep = client_->CurrentEndpoint();
    grpc::ClientContext ctx;
    ctx.AddMetadata("hasleader", "true");
    {
      MutexLock lock(&mu_);
      if (cancelled_) return;
      ctx_ = &ctx;
    }
    auto stream = ep.watch->Watch(&ctx);
    epb::WatchRequest req;
    auto* create = req.mutable_create_request();
    create->set_key(prefix_);
    create->set_range_end(PrefixEnd(prefix_));
    create->set_start_revision(next_revision_);
    epb::WatchResponse resp;
    if (stream->Write(req)) {
      while (stream->Read(&resp)) {
        if (resp.compact_revision() > 0) {
          if (on_error_) {
            on_error_(absl::OutOfRangeError(
                absl::StrCat("etcd watch of ", prefix_, ": revision ", next_revision_,
                             " was compacted (oldest kept: ", resp.compact_revision(), ")")));
          }
          ended = true;
          break;
        }
        if (resp.created() && next_revision_ == 0) next_revision_ = resp.header().revision() + 1;
        if (resp.events_size() == 0) continue;
        std::vector<WatchEvent> events;
        for (const auto& e : resp.events()) {
          WatchEvent ev;
          ev.type = e.type() == mvccpb::Event::DELETE ? WatchEvent::kDelete : WatchEvent::kPut;
          ev.kv = FromProto(e.kv());
          next_revision_ = std::max(next_revision_, e.kv().mod_revision() + 1);
          events.push_back(std::move(ev));
        }
        on_events_(events, resp.header().revision());
      }
    }
    ctx.TryCancel();
    stream->Finish();
    MutexLock lock(&mu_);
    ctx_ = nullptr;
    if (cancelled_ || ended) return;
    // This member is gone or cut off: go on from the next one.
    client_->NextEndpoint(at);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
    while (!cancelled_) {
      if (cv_.WaitWithDeadline(&mu_, deadline)) break;
    }
    if (cancelled_) return;
  }
}

}  // namespace

std::vector<std::string> EtcdMemberAnswers(const absl::Status& s) {
  auto detail = s.GetPayload(kMembersPayload);
  if (!detail) return {};
  return absl::StrSplit(std::string(*detail), '\n', absl::SkipEmpty());
}

std::string PrefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Connect(EtcdOptions options) {
  if (options.endpoints.empty()) return absl::InvalidArgumentError("etcd: no endpoints");
  int https_count = 0;
  for (std::string& e : options.endpoints) {
    if (absl::StartsWith(e, "https://")) {
      ++https_count;
      e = e.substr(8);
    } else if (absl::StartsWith(e, "http://")) {
      e = e.substr(7);
    }
    if (e.empty() || e.find(':') == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("etcd endpoint '", e, "': expected HOST:PORT"));
    }
  }
  if (https_count > 0 && https_count != static_cast<int>(options.endpoints.size())) {
    return absl::InvalidArgumentError("etcd endpoints: every one https:// or every one http://");
  }
  if (https_count > 0) options.tls = true;
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (options.tls) {
    grpc::SslCredentialsOptions o;
    for (auto [what, file, out] : {std::tuple<const char*, const std::string*, std::string*>{
                                       "lab.etcd_ca", &options.ca_file, &o.pem_root_certs},
                                   {"lab.etcd_cert", &options.cert_file, &o.pem_cert_chain},
                                   {"lab.etcd_key", &options.key_file, &o.pem_private_key}}) {
      if (file->empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("etcd over https:// needs ", what, " (a PEM file)"));
      }
      std::ifstream in(*file);
      std::stringstream text;
      text << in.rdbuf();
      if (!in || text.str().empty()) {
        return absl::InvalidArgumentError(absl::StrCat(what, " ", *file, ": cannot be read"));
      }
      *out = text.str();
    }
    creds = grpc::SslCredentials(o);
  }
  return std::unique_ptr<EtcdClient>(new Client(std::move(options), std::move(creds)));
}

}  // namespace fwai::lab
