// Who a session's share is checked against: a verified caller's principal
// id, its aliases (a unix peer's account name, say) and its role. Used by
// every service that lets a sharer see part of a session (Sessions,
// Evidence).
#pragma once

#include <string>

#include "server/auth/principal.h"
#include "server/session/shares.h"

namespace fwai {

ShareSubject SubjectOf(const Principal& p);

// Whether `p` holds an unexpired share, of any role, of `session_id`
// (false when `shares` is null or the id is empty).
bool HasShareOf(const SessionShares* shares, const Principal& p, const std::string& session_id);

}  // namespace fwai
