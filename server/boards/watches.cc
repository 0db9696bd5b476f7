#include "server/boards/watches.h"

#include <re2/re2.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <deque>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "server/boards/board_tools.h"
#include "server/boards/boards.h"
#include "server/hardware/firmware_image.h"

namespace fwai {

using json = nlohmann::json;

struct Watches::Running {
  WatchState state;  // guarded by Watches::mu_
  Caller owner;
  BoardRef ref;
  std::shared_ptr<const re2::RE2> re;
  std::atomic<bool> stop{false};
  std::deque<int64_t> hits;             // the rule's thread only
  std::unique_ptr<BoardSerial> serial;  // opened by Add: it sees every line after Add returns
  std::thread thread;
};

json WatchState::ToJson() const {
  return {{"name", rule.name},
          {"board", rule.board},
          {"stream", rule.stream.empty() ? "uart" : rule.stream},
          {"pattern", rule.pattern},
          {"count", rule.count},
          {"within_s", rule.within_s},
          {"min_interval_s", rule.min_interval_s},
          {"capture", rule.capture},
          {"notify", rule.notify},
          {"wake", rule.wake_session},
          {"source", rule.source},
          {"owner", owner_display},
          {"lines", lines},
          {"fired", fired},
          {"suppressed", suppressed},
          {"last_fired_us", last_fired_us},
          {"last_line", last_line},
          {"last_capture", last_capture},
          {"active", active},
          {"ended", ended}};
}

Watches::Watches(Boards& boards, Hooks hooks, const Clock* clock)
    : boards_(boards), hooks_(std::move(hooks)), clock_(clock) {}

Watches::~Watches() {
  std::map<std::string, std::unique_ptr<Running>> all;
  {
    MutexLock lock(&mu_);
    all.swap(running_);
  }
  for (auto& [key, r] : all) r->stop = true;
  for (auto& [key, r] : all)
    if (r->thread.joinable()) r->thread.join();
}

absl::StatusOr<WatchState> Watches::Add(const Caller& caller, WatchRule rule,
                                        const std::string& project_root) {
  if (rule.source.empty()) rule.source = "fwai watch add";
  if (auto s = CheckWatchRule(rule, rule.source); !s.ok()) return s;
  auto re = CompileWatchPattern(rule.pattern, rule.source + ": pattern");
  if (!re.ok()) return re.status();
  auto ref = boards_.Resolve(caller, rule.board);
  if (!ref.ok()) return ref.status();
  if (auto s = boards_.CheckHeld(caller, *ref); !s.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("a watch on ", ref->id, " needs your lease on it: ", s.message()));
  }
  rule.board = ref->id;
  auto serial = boards_.OpenSerial(caller, *ref, false, rule.stream, /*hears_notices=*/false);
  if (!serial.ok()) return serial.status();
  auto r = std::make_unique<Running>();
  r->serial = *std::move(serial);
  r->owner = caller;
  r->ref = *ref;
  r->re = *re;
  r->state.rule = rule;
  r->state.owner = caller.identity;
  r->state.owner_display = caller.display;
  r->state.project_root = project_root;
  const std::string key = absl::StrCat(ref->id, "/", rule.name);
  std::unique_ptr<Running> finished;  // an ended rule of that name, replaced
  Running* started = r.get();
  WatchState out;
  {
    MutexLock lock(&mu_);
    auto it = running_.find(key);
    if (it != running_.end() && it->second->state.active) {
      return absl::AlreadyExistsError(absl::StrCat("a watch named '", rule.name, "' runs on ",
                                                   ref->id, " (fwai watch rm ", rule.name, ")"));
    }
    if (it != running_.end()) finished = std::move(it->second);
    out = r->state;
    running_[key] = std::move(r);
    started->thread = std::thread([this, started] { Run(started); });
  }
  if (finished && finished->thread.joinable()) finished->thread.join();
  if (hooks_.record) {
    hooks_.record({{"kind", "watch_added"},
                   {"board", rule.board},
                   {"rule", out.ToJson()},
                   {"by", caller.display}});
  }
  return out;
}

std::vector<WatchState> Watches::List(const Caller& caller) const {
  std::vector<WatchState> out;
  MutexLock lock(&mu_);
  for (const auto& [key, r] : running_) {
    if (caller.admin || r->state.owner == caller.identity) out.push_back(r->state);
  }
  return out;
}

absl::Status Watches::Remove(const Caller& caller, const std::string& board,
                             const std::string& name) {
  std::unique_ptr<Running> r;
  {
    MutexLock lock(&mu_);
    for (auto it = running_.begin(); it != running_.end(); ++it) {
      const WatchState& s = it->second->state;
      if (s.rule.name != name || (!board.empty() && s.rule.board != board)) continue;
      if (!caller.admin && s.owner != caller.identity) {
        return absl::PermissionDeniedError(absl::StrCat("the watch '", name, "' on ", s.rule.board,
                                                        " is ", s.owner_display, "'s"));
      }
      r = std::move(it->second);
      running_.erase(it);
      break;
    }
  }
  if (!r) {
    return absl::NotFoundError(
        absl::StrCat("no watch named '", name, "'", board.empty() ? "" : " on " + board));
  }
  r->stop = true;
  if (r->thread.joinable()) r->thread.join();
  if (hooks_.record) {
    hooks_.record({{"kind", "watch_removed"},
                   {"board", r->ref.id},
                   {"name", name},
                   {"fired", r->state.fired},
                   {"by", caller.display}});
  }
  return absl::OkStatus();
}

void Watches::Run(Running* r) {
  const WatchRule& rule = r->state.rule;  // not changed while it runs
  BoardSerial& serial = *r->serial;
  while (!r->stop) {
    SerialLine l;
    const auto n = serial.Wait(l, 200);
    if (n == SerialReader::Next::kEnded) {
      End(r, absl::StrCat("its stream ended: ", serial.end_reason()));
      return;
    }
    if (n != SerialReader::Next::kLine || l.notice) continue;  // a notice is not the board's
    // The line's time is taken before it counts as read: whoever waits for
    // the count (a test stepping the clock) moves time after, not before.
    const int64_t now = clock_->NowMicros();
    {
      MutexLock lock(&mu_);
      ++r->state.lines;
    }
    if (!re2::RE2::PartialMatch(l.text, *r->re)) continue;
    r->hits.push_back(now);
    while (rule.within_s > 0 && now - r->hits.front() > int64_t{rule.within_s} * 1000000)
      r->hits.pop_front();
    if (static_cast<int>(r->hits.size()) < rule.count) continue;
    r->hits.clear();
    Fire(r, l.text, l.seq, now);
  }
}

void Watches::Fire(Running* r, const std::string& line, uint64_t seq, int64_t now_us) {
  const WatchRule& rule = r->state.rule;
  int held_back = 0;
  {
    MutexLock lock(&mu_);
    WatchState& s = r->state;
    if (s.last_fired_us > 0 && now_us - s.last_fired_us < int64_t{rule.min_interval_s} * 1000000) {
      ++s.suppressed;
      return;
    }
    held_back = s.suppressed;
    s.suppressed = 0;
    ++s.fired;
    s.last_fired_us = now_us;
    s.last_line = line;
  }
  json rec = {{"kind", "watch_fired"},
              {"board", rule.board},
              {"rule", rule.name},
              {"source", rule.source},
              {"stream", rule.stream.empty() ? "uart" : rule.stream},
              {"pattern", rule.pattern},
              {"line", line},
              {"seq", seq},
              {"held_back", held_back},
              {"by", r->state.owner_display}};
  std::string decode;
  if (rule.capture) {
    auto d = boards_.Debug(r->owner, r->ref, {"capture", "bt"}, 30000, nullptr);
    if (d.ok() && !d->results.empty() && d->results[0].contains("capture")) {
      const json& capture = d->results[0]["capture"];
      auto saved = SaveCaptureInProject(r->state.project_root,
                                        r->owner.account ? &*r->owner.account : nullptr, rule.board,
                                        capture);
      rec["capture"] = {{"path", saved.ok() ? *saved : ""},
                        {"sha256", BytesSha256Hex(capture.dump())},
                        {"fault", capture["fault"].value("summary", "")}};
      if (!saved.ok()) rec["capture"]["error"] = std::string(saved.status().message());
      decode = absl::StrCat(d->outputs[0], d->outputs.size() > 1 ? "\n" + d->outputs[1] : "");
      MutexLock lock(&mu_);
      r->state.last_capture = saved.ok() ? *saved : "";
    } else {
      rec["capture_error"] = d.ok() ? (d->outputs.empty() ? "none taken" : d->outputs[0])
                                    : std::string(d.status().message());
    }
  }
  const std::string said =
      absl::StrCat("watch '", rule.name, "' fired on ", rule.board, ": ", line,
                   held_back ? absl::StrCat(" (", held_back, " held back)") : "");
  if (!rule.wake_session.empty() && hooks_.wake) {
    auto woke = hooks_.wake(r->owner, rule.wake_session,
                            absl::StrCat(said, decode.empty() ? "" : "\n\n" + decode));
    rec["wake"] = {{"session", rule.wake_session},
                   {"ok", woke.ok()},
                   {"error", woke.ok() ? "" : std::string(woke.message())}};
  }
  if (rule.notify) {
    rec["notified"] = {
        {"readers", boards_.Notice(rule.board, said, rule.stream, seq)},
        {"sessions", hooks_.notify ? hooks_.notify(rule.board, rule.name, said) : 0}};
  }
  if (hooks_.record) hooks_.record(rec);
  spdlog::info("{}", said);
}

void Watches::End(Running* r, const std::string& why) {
  {
    MutexLock lock(&mu_);
    r->state.active = false;
    r->state.ended = why;
  }
  if (hooks_.record) {
    hooks_.record({{"kind", "watch_ended"},
                   {"board", r->state.rule.board},
                   {"name", r->state.rule.name},
                   {"reason", why}});
  }
}

}  // namespace fwai
