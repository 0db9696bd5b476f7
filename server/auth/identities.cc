#include "server/auth/identities.h"

#include <unistd.h>

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/lab_config.h"

namespace fwai {

LimitsConfig UnlimitedLimits() {
  LimitsConfig l;
  l.sessions = l.running_turns = l.running_runs = l.leases = int64_t{1} << 40;
  l.lease_ttl_max_s = int64_t{365} * 86400;
  l.ingest_mb_per_hour = int64_t{1} << 30;
  l.requests_per_second = 1e9;
  l.burst = int64_t{1} << 40;
  return l;
}

Identities::Identities(SecurityConfig config, TokenStore& tokens, uint32_t daemon_uid)
    : tokens_(tokens), daemon_uid_(daemon_uid), config_(std::move(config)) {}

void Identities::Reload(SecurityConfig config) {
  MutexLock lock(&mu_);
  config_ = std::move(config);
}

const UserConfig* Identities::UserByLocalAccount(const std::string& account) {
  for (const auto& [name, u] : config_.users) {
    if (!u.local_user.empty() && u.local_user == account) return &u;
  }
  return nullptr;
}

void Identities::GrantAccount(const std::string& name, Principal& p) {
  if (name.empty()) {
    p.no_account_reason = absl::StrCat(p.user, " has no local account (users.", p.user,
                                       ".local_user in fwaid.yaml): no project files or commands");
    return;
  }
  auto a = LookupAccount(name);
  if (!a.ok()) {
    p.no_account_reason = std::string(a.status().message());
    return;
  }
  if (a->uid != daemon_uid_ && !CanActAsOtherAccounts()) {
    p.no_account_reason =
        absl::StrCat("fwaid runs as uid ", daemon_uid_, ", not root, so it cannot act as ", name,
                     ": no project files or commands");
    return;
  }
  p.account = *a;
}

absl::StatusOr<Principal> Identities::ForUnixPeer(uint32_t uid, const std::string& peer) {
  Principal p;
  p.id = absl::StrCat("uid:", uid);
  p.peer = peer;
  p.verified_by = absl::StrCat("unix socket peer credentials (uid ", uid, ")");
  auto account = LookupAccount(uid);
  p.user = account.ok() ? account->name : absl::StrCat("uid ", uid);
  if (uid == 0 || uid == daemon_uid_) {
    p.role = Role::kAdmin;
  } else {
    p.role = Role::kUser;
  }
  {
    MutexLock lock(&mu_);
    if (account.ok()) {
      if (const UserConfig* u = UserByLocalAccount(account->name)) {
        if (p.role != Role::kAdmin) ParseRole(u->role, &p.role);
        p.aliases.push_back("user:" + u->name);
      }
    }
  }
  if (account.ok()) {
    GrantAccount(account->name, p);
  } else {
    p.no_account_reason = std::string(account.status().message());
  }
  return p;
}

absl::StatusOr<Principal> Identities::ForToken(const std::string& token, const std::string& peer) {
  auto info = tokens_.Verify(token);
  if (!info.ok()) return info.status();
  return FromToken(*info, peer);
}

absl::StatusOr<Principal> Identities::ForTokenId(const std::string& token_id,
                                                 const std::string& peer) {
  auto info = tokens_.Valid(token_id);
  if (!info.ok()) return info.status();
  return FromToken(*info, peer);
}

Principal Identities::FromToken(const TokenInfo& info, const std::string& peer) {
  Principal p;
  p.id = "user:" + info.user;
  p.user = info.user;
  p.role = info.role;
  p.peer = peer;
  p.token_id = info.id;
  p.token_expires_us = info.expires_us;
  p.verified_by = absl::StrCat("token ", info.id);
  std::string local;
  {
    MutexLock lock(&mu_);
    auto it = config_.users.find(info.user);
    if (it != config_.users.end()) local = it->second.local_user;
  }
  GrantAccount(local, p);
  if (p.account) p.aliases.push_back(absl::StrCat("uid:", p.account->uid));
  return p;
}

bool SubjectIsLabNode(const std::string& subject) {
  // RFC 2253 attributes, split at the ',' and '+' that are not escaped.
  std::string attr;
  auto is_node = [&attr] { return attr == absl::StrCat("OU=", kLabNodeUnit); };
  for (size_t i = 0; i < subject.size(); ++i) {
    const char c = subject[i];
    if (c == '\\' && i + 1 < subject.size()) {
      attr += c;
      attr += subject[++i];
    } else if (c == ',' || c == '+') {
      if (is_node()) return true;
      attr.clear();
    } else {
      attr += c;
    }
  }
  return is_node();
}

absl::StatusOr<Principal> Identities::ForCertificate(const std::string& subject,
                                                     const std::string& common_name,
                                                     const std::string& peer) {
  Principal p;
  std::string local;
  // A node's certificate is a node's only, a person's never a node's: one
  // CA signs both.
  if (SubjectIsLabNode(subject)) {
    if (!accept_lab_nodes_ || common_name.empty()) {
      return absl::UnauthenticatedError(
          absl::StrCat("the client certificate '", subject,
                       "' is a lab node's, and this fwaid is in no lab (lab: in "
                       "fwaid.yaml); a node's certificate never stands for a person"));
    }
    p.id = "node:" + common_name;
    p.user = common_name;
    p.role = Role::kCi;
    p.peer = peer;
    p.verified_by = absl::StrCat("node certificate ", subject);
    p.no_account_reason = "a node certificate acts for no account";
    return p;
  }
  {
    MutexLock lock(&mu_);
    const UserConfig* found = nullptr;
    for (const auto& [name, u] : config_.users) {
      if (u.cert_subject.empty()) continue;
      if (u.cert_subject == subject || u.cert_subject == "CN=" + common_name) {
        found = &u;
        break;
      }
    }
    if (found == nullptr) {
      return absl::UnauthenticatedError(absl::StrCat(
          "the client certificate '", subject,
          "' maps to no user (users.NAME.cert_subject in fwaid.yaml)",
          accept_lab_nodes_.load()
              ? ", and is not a lab node's certificate (fwaid tls issue DIR --node NAME)"
              : ""));
    }
    p.user = found->name;
    ParseRole(found->role, &p.role);
    local = found->local_user;
  }
  p.id = "user:" + p.user;
  p.peer = peer;
  p.verified_by = absl::StrCat("client certificate ", subject);
  GrantAccount(local, p);
  if (p.account) p.aliases.push_back(absl::StrCat("uid:", p.account->uid));
  return p;
}

std::string Identities::OwnerOfNameLocked(const std::string& name) {
  if (config_.users.count(name)) return "user:" + name;
  if (auto a = LookupAccount(name); a.ok()) return absl::StrCat("uid:", a->uid);
  return "user:" + name;
}

absl::StatusOr<std::string> Identities::GranteeOf(const std::string& name) {
  if (absl::StartsWith(name, "role:")) {
    Role r;
    if (ParseRole(name.substr(5), &r)) return name;
    return absl::NotFoundError(
        absl::StrCat("no role '", name.substr(5), "' (roles: admin, user, ci)"));
  }
  {
    MutexLock lock(&mu_);
    if (config_.users.count(name)) return "user:" + name;
  }
  if (auto a = LookupAccount(name); a.ok()) return absl::StrCat("uid:", a->uid);
  for (const auto& t : tokens_.List()) {
    if (t.user == name && tokens_.Valid(t.id).ok()) return "user:" + name;
  }
  return absl::NotFoundError(absl::StrCat(
      "no user '", name, "' known here: not a configured user, a local account or a token's user"));
}

std::string Identities::OwnerOfName(const std::string& name) {
  MutexLock lock(&mu_);
  return OwnerOfNameLocked(name);
}

bool Identities::OwnerOwnsName(const std::string& owner, const std::string& name) {
  MutexLock lock(&mu_);
  const std::string target = OwnerOfNameLocked(name);
  if (target == owner) return true;
  uint32_t uid = 0;
  if (absl::StartsWith(owner, "uid:") && absl::SimpleAtoi(owner.substr(4), &uid)) {
    auto a = LookupAccount(uid);
    const UserConfig* u = a.ok() ? UserByLocalAccount(a->name) : nullptr;
    return u != nullptr && target == "user:" + u->name;
  }
  if (absl::StartsWith(owner, "user:")) {
    auto it = config_.users.find(owner.substr(5));
    if (it == config_.users.end() || it->second.local_user.empty()) return false;
    auto a = LookupAccount(it->second.local_user);
    return a.ok() && target == absl::StrCat("uid:", a->uid);
  }
  return false;
}

LimitsConfig Identities::LimitsOf(const Principal& p) {
  if (p.admin()) return UnlimitedLimits();
  MutexLock lock(&mu_);
  // The configured user the principal is: its own id, or the user whose
  // local account it is (never another user who merely shares a name).
  std::string user;
  if (absl::StartsWith(p.id, "user:")) user = p.id.substr(5);
  for (const auto& a : p.aliases) {
    if (user.empty() && absl::StartsWith(a, "user:")) user = a.substr(5);
  }
  if (auto it = config_.users.find(user); it != config_.users.end() && it->second.limits)
    return *it->second.limits;
  return config_.limits;
}

bool Identities::MayWriteSharedKnowledge(const Principal& p) {
  MutexLock lock(&mu_);
  return std::find(config_.knowledge_writers.begin(), config_.knowledge_writers.end(),
                   RoleName(p.role)) != config_.knowledge_writers.end();
}

}  // namespace fwai
