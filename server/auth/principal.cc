#include "server/auth/principal.h"

#include <algorithm>

namespace fwai {

const char* RoleName(Role r) {
  switch (r) {
    case Role::kAdmin:
      return "admin";
    case Role::kUser:
      return "user";
    case Role::kCi:
      return "ci";
  }
  return "user";
}

bool ParseRole(const std::string& name, Role* out) {
  if (name == "admin") {
    *out = Role::kAdmin;
  } else if (name == "user") {
    *out = Role::kUser;
  } else if (name == "ci") {
    *out = Role::kCi;
  } else {
    return false;
  }
  return true;
}

bool Principal::Owns(const std::string& owner) const {
  return !owner.empty() &&
         (owner == id || std::find(aliases.begin(), aliases.end(), owner) != aliases.end());
}

}  // namespace fwai
