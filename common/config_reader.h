// Reads config sections from YAML with errors that name the file, line and
// dotted field ("config fwaid.yaml:12: hardware.boards[0].baud: ..."). Only
// for .cc files that parse config: it pulls in yaml-cpp.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace fwai {

// Walks a YAML tree, producing errors with file:line and the dotted field path.
class ConfigReader {
 public:
  explicit ConfigReader(std::string source) : source_(std::move(source)) {}
  const std::string& source() const { return source_; }

  absl::Status Error(const YAML::Node& node, const std::string& field, const std::string& what) {
    int line = node.Mark().line >= 0 ? node.Mark().line + 1 : 0;
    return absl::InvalidArgumentError(
        absl::StrCat("config ", source_, ":", line, ": ", field, ": ", what));
  }

  absl::Status CheckKeys(const YAML::Node& map, const std::string& field,
                         const std::set<std::string>& allowed) {
    if (!map.IsMap()) return Error(map, field, "expected a mapping");
    for (const auto& kv : map) {
      const std::string key = kv.first.as<std::string>();
      if (!allowed.count(key)) {
        return Error(kv.first, field.empty() ? key : field + "." + key,
                     absl::StrCat("unknown key; expected one of: ", absl::StrJoin(allowed, ", ")));
      }
    }
    return absl::OkStatus();
  }

  absl::Status String(const YAML::Node& n, const std::string& field, std::string& out) {
    if (!n.IsScalar()) return Error(n, field, "expected a string");
    out = n.Scalar();
    return absl::OkStatus();
  }

  absl::Status Int(const YAML::Node& n, const std::string& field, int64_t lo, int64_t hi,
                   int64_t& out) {
    if (!n.IsScalar()) return Error(n, field, "expected an integer");
    const std::string& s = n.Scalar();
    char* end = nullptr;
    errno = 0;
    long long v = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0' || errno != 0) {
      return Error(n, field, absl::StrCat("expected an integer, got '", s, "'"));
    }
    if (v < lo || v > hi) {
      return Error(n, field, absl::StrCat("expected an integer in ", lo, "..", hi, ", got ", v));
    }
    out = v;
    return absl::OkStatus();
  }

  absl::Status Int(const YAML::Node& n, const std::string& field, int64_t lo, int64_t hi,
                   int& out) {
    int64_t v = 0;
    absl::Status s = Int(n, field, lo, hi, v);
    if (s.ok()) out = static_cast<int>(v);
    return s;
  }

  absl::Status Double(const YAML::Node& n, const std::string& field, double lo, double hi,
                      double& out) {
    if (!n.IsScalar()) return Error(n, field, "expected a number");
    const std::string& s = n.Scalar();
    char* end = nullptr;
    double v = std::strtod(s.c_str(), &end);
    if (s.empty() || *end != '\0') {
      return Error(n, field, absl::StrCat("expected a number, got '", s, "'"));
    }
    if (v < lo || v > hi) {
      return Error(n, field, absl::StrCat("expected a number in ", lo, "..", hi, ", got ", s));
    }
    out = v;
    return absl::OkStatus();
  }

 private:
  std::string source_;
};

#define CFG_TRY(expr)         \
  do {                        \
    absl::Status s_ = (expr); \
    if (!s_.ok()) return s_;  \
  } while (0)

struct SecurityConfig;

// The top-level `tls`, `unix_socket`, `users`, `limits` and
// `knowledge_writers` keys of `root` into `out`.
absl::Status ParseSecurityConfig(ConfigReader& r, const YAML::Node& root, SecurityConfig& out);

struct LabConfig;

// The `lab:` section `n` into `out`.
absl::Status ParseLabConfig(ConfigReader& r, const YAML::Node& n, LabConfig& out);

}  // namespace fwai
