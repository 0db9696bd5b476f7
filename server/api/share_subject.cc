#include "server/api/share_subject.h"

namespace fwai {

ShareSubject SubjectOf(const Principal& p) {
  ShareSubject who;
  who.ids.push_back(p.id);
  who.ids.insert(who.ids.end(), p.aliases.begin(), p.aliases.end());
  who.role = RoleName(p.role);
  return who;
}

bool HasShareOf(const SessionShares* shares, const Principal& p, const std::string& session_id) {
  if (shares == nullptr || session_id.empty()) return false;
  return shares->RoleFor(session_id, SubjectOf(p)).has_value();
}

}  // namespace fwai
