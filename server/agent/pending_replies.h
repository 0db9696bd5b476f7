// agent: the replies a turn waits for from a person (answers to askQuestion,
// decisions on a submitted plan), at most one per session at a time.
//
// Thread-safe. Expect() registers before the client can see what is asked, so a
// quick reply is never lost; Wait() gives up when the turn is cancelled.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "common/mutex.h"
#include "server/agent/author.h"

namespace fwai {

class CancelToken;

// A person's reply on a Chat stream: an answer to askQuestion, or a decision
// on a submitted plan.
struct Interaction {
  std::string id;  // question_id or plan_id
  std::vector<std::string> selected;
  std::string text;  // free-text answer, or feedback on a plan
  bool is_plan = false;
  bool approve = false;
  std::string edited_plan;
  std::string by;       // who answered, with their client (kept in the session's events)
  std::string by_user;  // who answered, as people name them ("alice")
  Author author;        // who answered, as verified
};

class PendingReplies {
 public:
  struct Pending;

  // Registers that `session_id` now waits for the reply to question or plan
  // `id`. `approval`: the question asks leave to act (an edit's accept), so
  // answering it is approving, not only answering.
  std::shared_ptr<Pending> Expect(const std::string& session_id, const std::string& id,
                                  bool is_plan, bool approval = false);
  // Whether what `session_id` waits for now is a plan or an approval.
  bool AwaitsApproval(const std::string& session_id);
  // Blocks until the reply arrives (then returns it) or `cancel` fires (then
  // nullopt), and unregisters `pending`.
  std::optional<Interaction> Wait(const std::string& session_id,
                                  const std::shared_ptr<Pending>& pending,
                                  const CancelToken& cancel);
  // Delivers a reply. The first answer wins: one for an id answered already
  // is FAILED_PRECONDITION naming who answered; an id nothing waits for is
  // NOT_FOUND.
  [[nodiscard]] absl::Status Reply(const std::string& session_id, Interaction reply);

 private:
  Mutex mu_;
  std::map<std::string, std::shared_ptr<Pending>> pending_ ABSL_GUARDED_BY(mu_);
  // The last questions and plans each session had answered (id, who
  // answered), so a late answer is told it lost rather than taken for a wrong id.
  std::map<std::string, std::deque<std::pair<std::string, std::string>>> answered_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace fwai
