#include "server/agent/pending_replies.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/cancel.h"
#include "common/mutex.h"

namespace fwai {

struct PendingReplies::Pending {
  std::string id;         // set before Expect() returns, read-only after
  bool is_plan = false;   // likewise
  bool approval = false;  // likewise
  Mutex mu;
  CondVar cv;
  std::optional<Interaction> reply ABSL_GUARDED_BY(mu);
};

namespace {

// "approved by alice", "sent back by bob", "answered by carol": what the
// first reply did, for the one that came second.
std::string Outcome(const Interaction& first) {
  const std::string& who = first.by_user.empty() ? first.by : first.by_user;
  if (!first.is_plan) return "answered by " + who;
  return (first.approve ? "approved by " : "sent back by ") + who;
}

}  // namespace

std::shared_ptr<PendingReplies::Pending> PendingReplies::Expect(const std::string& session_id,
                                                                const std::string& id, bool is_plan,
                                                                bool approval) {
  auto p = std::make_shared<Pending>();
  p->id = id;
  p->is_plan = is_plan;
  p->approval = approval;
  MutexLock lock(&mu_);
  pending_[session_id] = p;
  return p;
}

bool PendingReplies::AwaitsApproval(const std::string& session_id) {
  MutexLock lock(&mu_);
  auto it = pending_.find(session_id);
  return it != pending_.end() && (it->second->is_plan || it->second->approval);
}

std::optional<Interaction> PendingReplies::Wait(const std::string& session_id,
                                                const std::shared_ptr<Pending>& p,
                                                const CancelToken& cancel) {
  std::optional<Interaction> out;
  {
    MutexLock lock(&p->mu);
    while (!p->reply && !cancel.cancelled()) {
      p->cv.WaitWithTimeout(&p->mu, std::chrono::milliseconds(100));
    }
    out = p->reply;
  }
  MutexLock lock(&mu_);
  if (pending_[session_id] == p) pending_.erase(session_id);
  if (out) {
    auto& done = answered_[session_id];
    done.emplace_back(p->id, Outcome(*out));
    if (done.size() > 16) done.pop_front();
  }
  return out;
}

absl::Status PendingReplies::Reply(const std::string& session_id, Interaction reply) {
  std::shared_ptr<Pending> p;
  {
    MutexLock lock(&mu_);
    auto it = pending_.find(session_id);
    if (it != pending_.end()) p = it->second;
    auto done = answered_.find(session_id);
    if (done != answered_.end() && !reply.id.empty() && (!p || p->id != reply.id)) {
      for (const auto& [id, outcome] : done->second) {
        if (id == reply.id) {
          return absl::FailedPreconditionError(
              absl::StrCat(reply.is_plan ? "plan " : "question ", id, ": already ", outcome));
        }
      }
    }
  }
  if (!p || (!reply.id.empty() && reply.id != p->id) || p->is_plan != reply.is_plan) {
    return absl::NotFoundError(absl::StrCat(reply.is_plan ? "plan " : "question ", reply.id,
                                            ": nothing in session ", session_id,
                                            " is waiting for it"));
  }
  MutexLock lock(&p->mu);
  if (p->reply) {
    // The first answer wins; the session's clients see which one it was.
    return absl::FailedPreconditionError(absl::StrCat(reply.is_plan ? "plan " : "question ", p->id,
                                                      ": already ", Outcome(*p->reply)));
  }
  p->reply = std::move(reply);
  p->cv.SignalAll();
  return absl::OkStatus();
}

}  // namespace fwai
