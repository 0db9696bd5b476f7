// Gate: the door every RPC goes through. It names the caller (one principal
// per connection: a unix peer's uid, or what the TCP listener's
// AuthMetadataProcessor verified), checks the RPC against the one table of
// rules (RpcRules) and the caller's request rate, and records refusals in the
// evidence log. Streams are tracked while open so that a revoked or expired
// token ends them within a second. Internal to server/api; thread-safe.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "server/auth/identities.h"
#include "server/auth/principal.h"
#include "server/auth/quotas.h"

namespace fwai {

class PeerRegistry;

// Who may call an RPC. Ownership of sessions, runs, records and leases is
// checked by the RPC itself (another's is NOT_FOUND).
enum class Need {
  kAnyone,        // any verified principal
  kLocalAccount,  // one whose sessions act as a local account (project files, commands)
  kAdmin,
  kLabNode,  // another node of the lab, by its node certificate (and nothing else)
};

struct RpcRule {
  const char* rpc;  // "Sessions.Create"
  Need need;
};

// What a caller must be to a session: its owner (or an admin), or a user it
// is shared with at least as far as the share role named (watch < answer <
// approve < drive; server/session/shares.h).
enum class SessionNeed { kWatch = 1, kAnswer = 2, kApprove = 3, kDrive = 4, kOwner = 5 };
const char* SessionNeedName(SessionNeed n);

// A session RPC ("Sessions.Get") or a message on a Chat stream
// ("Sessions.Chat.message", by the ClientEvent field's name), and what it
// needs. The sessions service checks it on every call and every message: the
// session is named in the request, not the call.
struct SessionRule {
  const char* action;
  SessionNeed need;
};
const std::vector<SessionRule>& SessionRules();
// The rule for `action`; kOwner for an action the table does not name.
SessionNeed SessionNeedOf(std::string_view action);
// Session RPCs that name a session and ClientEvent kinds the session table
// does not name; fwaid refuses to start while there are any.
std::vector<std::string> SessionActionsWithoutRules();

// The node of a lab a principal is ("" for people): "node:NAME" principals
// come from node certificates.
std::string LabNodeOf(const Principal& p);

// The table: every RPC of every service, once.
const std::vector<RpcRule>& RpcRules();
// RPCs of the API (fwai.v1) that the table does not name; fwaid refuses to
// start while there are any.
std::vector<std::string> RpcsWithoutRules();

class Gate {
 public:
  // `audit` appends a record to the evidence log (may be null).
  Gate(Identities& identities, Quotas& quotas, const PeerRegistry& peers,
       std::function<void(const nlohmann::json&)> audit);
  ~Gate();
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;

  // The caller, if the table lets it call `rpc` now. The status to finish
  // the call with otherwise: UNAUTHENTICATED, PERMISSION_DENIED naming the
  // rule, RESOURCE_EXHAUSTED naming the limit.
  [[nodiscard]] absl::StatusOr<Principal> Admit(grpc::CallbackServerContext* ctx,
                                                std::string_view rpc);
  // The caller without checks (the processor already verified it).
  [[nodiscard]] absl::StatusOr<Principal> Identify(grpc::CallbackServerContext* ctx);

  // While the returned object lives, the stream is ended (`end`, or a
  // cancel) if the token behind `p` stops being valid, or with the status
  // `recheck` returns once that is not OK (a share of the session ended).
  // `recheck` runs on the gate's sweeps, never after the ticket is gone.
  class Ticket;
  std::unique_ptr<Ticket> Track(const Principal& p, grpc::CallbackServerContext* ctx,
                                std::function<void(const grpc::Status&)> end = nullptr,
                                std::function<absl::Status()> recheck = nullptr);

  // Forget cached principals (users or tokens changed).
  void Invalidate();
  // Ends now every tracked stream whose token is no longer valid or whose
  // recheck fails (the gate's own thread does so every 250 ms).
  void Sweep();
  // An evidence record for a refused call (at most one a second per peer and RPC).
  void RecordRefusal(const std::string& rpc, const std::string& who, const std::string& peer,
                     const absl::Status& why);
  // For the server builder: every call that ends PERMISSION_DENIED is
  // recorded (RecordRefusal), whatever refused it — the table here, or a
  // rule an RPC checks itself (a lease's holder, the knowledge writers).
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> RefusalRecorder();
  Identities& identities() { return ids_; }
  Quotas& quotas() { return quotas_; }

 private:
  struct Tracked;

  Identities& ids_;
  Quotas& quotas_;
  const PeerRegistry& peers_;
  const std::function<void(const nlohmann::json&)> audit_;
  const std::map<std::string, Need, std::less<>> rules_;

  Mutex mu_;
  std::map<std::string, Principal> cache_ ABSL_GUARDED_BY(mu_);  // "uid:N" | token id | subject
  std::map<std::string, int64_t> last_refusal_us_ ABSL_GUARDED_BY(mu_);  // "peer rpc"
  std::map<Tracked*, std::shared_ptr<Tracked>> tracked_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> stop_{false};
  std::thread sweeper_;
};

class Gate::Ticket {
 public:
  explicit Ticket(Gate* gate, std::shared_ptr<Tracked> t) : gate_(gate), t_(std::move(t)) {}
  ~Ticket();
  Ticket(const Ticket&) = delete;
  Ticket& operator=(const Ticket&) = delete;

 private:
  Gate* gate_;
  std::shared_ptr<Tracked> t_;
};

// A reactor that finishes at once with `status` (a refused call).
grpc::ServerUnaryReactor* Refuse(grpc::CallbackServerContext* ctx, const absl::Status& status);

}  // namespace fwai
