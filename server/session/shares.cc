#include "server/session/shares.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/status_macros.h"
#include "server/storage/storage.h"

namespace fwai {
namespace {

// "share/<session>/<grantee>": neither a session id nor a grantee has a '/'.
constexpr char kPrefix[] = "share/";

std::string KeyOf(const std::string& session_id, const std::string& grantee) {
  return absl::StrCat(kPrefix, session_id, "/", grantee);
}

std::string EndOf(std::string prefix) {
  prefix.back() += 1;
  return prefix;
}

nlohmann::json ToJson(const SessionShare& s) {
  return {
      {"session_id", s.session_id},    {"grantee", s.grantee},       {"user", s.user},
      {"role", ShareRoleName(s.role)}, {"created_us", s.created_us}, {"expires_us", s.expires_us},
      {"created_by", s.created_by}};
}

std::optional<SessionShare> FromJson(std::string_view text) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_object()) return std::nullopt;
  SessionShare s;
  s.session_id = j.value("session_id", "");
  s.grantee = j.value("grantee", "");
  s.user = j.value("user", "");
  if (!ParseShareRole(j.value("role", ""), &s.role)) return std::nullopt;
  s.created_us = j.value("created_us", int64_t{0});
  s.expires_us = j.value("expires_us", int64_t{0});
  s.created_by = j.value("created_by", "");
  if (s.session_id.empty() || s.grantee.empty()) return std::nullopt;
  return s;
}

}  // namespace

const char* ShareRoleName(ShareRole r) {
  switch (r) {
    case ShareRole::kWatch:
      return "watch";
    case ShareRole::kAnswer:
      return "answer";
    case ShareRole::kApprove:
      return "approve";
    case ShareRole::kDrive:
      return "drive";
  }
  return "watch";
}

bool ParseShareRole(std::string_view name, ShareRole* out) {
  for (ShareRole r :
       {ShareRole::kWatch, ShareRole::kAnswer, ShareRole::kApprove, ShareRole::kDrive}) {
    if (name == ShareRoleName(r)) {
      *out = r;
      return true;
    }
  }
  return false;
}

absl::StatusOr<std::unique_ptr<SessionShares>> SessionShares::Open(Storage& storage,
                                                                   const Clock* clock) {
  std::unique_ptr<SessionShares> shares(
      new SessionShares(storage, clock != nullptr ? *clock : SystemClock()));
  std::map<std::string, std::map<std::string, SessionShare>> loaded;
  absl::Status bad;
  RETURN_IF_ERROR(
      storage.Scan(Cf::kMeta, kPrefix, EndOf(kPrefix), [&](std::string_view k, std::string_view v) {
        auto s = FromJson(v);
        if (!s) {
          bad = absl::DataLossError(
              absl::StrCat("stored session share ", std::string(k), " is damaged"));
          return false;
        }
        loaded[s->session_id][s->grantee] = *std::move(s);
        return true;
      }));
  RETURN_IF_ERROR(bad);
  {
    MutexLock lock(&shares->mu_);
    shares->by_session_ = std::move(loaded);
  }
  return shares;
}

absl::Status SessionShares::Put(const SessionShare& share) {
  if (share.session_id.empty() || share.session_id.find('/') != std::string::npos) {
    return absl::InvalidArgumentError("share: a session id is needed");
  }
  if (share.grantee.empty() || share.grantee.find('/') != std::string::npos) {
    return absl::InvalidArgumentError("share: a user is needed");
  }
  if (share.expires_us != 0 && share.expires_us <= clock_.NowMicros()) {
    return absl::InvalidArgumentError("share: its expiry is already past");
  }
  MutexLock lock(&mu_);
  RETURN_IF_ERROR(storage_.Put(Cf::kMeta, KeyOf(share.session_id, share.grantee),
                               ToJson(share).dump(), /*sync=*/true));
  by_session_[share.session_id][share.grantee] = share;
  return absl::OkStatus();
}

absl::Status SessionShares::Remove(const std::string& session_id, const std::string& grantee) {
  MutexLock lock(&mu_);
  auto s = by_session_.find(session_id);
  if (s == by_session_.end() || s->second.count(grantee) == 0) {
    return absl::NotFoundError(
        absl::StrCat("session ", session_id, " is not shared with ", grantee));
  }
  RETURN_IF_ERROR(storage_.Delete(Cf::kMeta, KeyOf(session_id, grantee), /*sync=*/true));
  s->second.erase(grantee);
  if (s->second.empty()) by_session_.erase(s);
  return absl::OkStatus();
}

bool SessionShares::Reaches(const SessionShare& s, const ShareSubject& who, int64_t now_us) const {
  if (s.expires_us != 0 && s.expires_us <= now_us) return false;
  if (s.grantee == "role:" + who.role) return true;
  for (const auto& id : who.ids) {
    if (s.grantee == id) return true;
  }
  return false;
}

std::optional<ShareRole> SessionShares::RoleFor(const std::string& session_id,
                                                const ShareSubject& who) const {
  const int64_t now = clock_.NowMicros();
  MutexLock lock(&mu_);
  auto s = by_session_.find(session_id);
  if (s == by_session_.end()) return std::nullopt;
  std::optional<ShareRole> best;
  for (const auto& [grantee, share] : s->second) {
    if (!Reaches(share, who, now)) continue;
    if (!best || share.role > *best) best = share.role;
  }
  return best;
}

std::vector<SessionShare> SessionShares::OfSession(const std::string& session_id) const {
  MutexLock lock(&mu_);
  std::vector<SessionShare> out;
  auto s = by_session_.find(session_id);
  if (s == by_session_.end()) return out;
  for (const auto& [grantee, share] : s->second) out.push_back(share);
  return out;
}

std::vector<SessionShare> SessionShares::SharedWith(const ShareSubject& who) const {
  const int64_t now = clock_.NowMicros();
  MutexLock lock(&mu_);
  std::vector<SessionShare> out;
  for (const auto& [session, shares] : by_session_) {
    for (const auto& [grantee, share] : shares) {
      if (Reaches(share, who, now)) out.push_back(share);
    }
  }
  return out;
}

absl::Status SessionShares::DeleteSession(const std::string& session_id) {
  MutexLock lock(&mu_);
  auto s = by_session_.find(session_id);
  if (s == by_session_.end()) return absl::OkStatus();
  WriteBatch batch;
  const std::string prefix = absl::StrCat(kPrefix, session_id, "/");
  batch.DeleteRange(Cf::kMeta, prefix, EndOf(prefix));
  RETURN_IF_ERROR(storage_.Write(batch, /*sync=*/true));
  by_session_.erase(s);
  return absl::OkStatus();
}

}  // namespace fwai
