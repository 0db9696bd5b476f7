#include <fstream>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "client/cli/cli.h"

namespace fwai {

int RunBatch(const Globals& g, const std::string& file,
             const std::function<absl::StatusOr<nlohmann::json>(const std::string& query)>& run) {
  std::ifstream in(file);
  if (!in) return Fail(g, kExitError, absl::StrCat(file, ": cannot open"));
  std::string line;
  int n = 0, rc = kExitOk;
  while (std::getline(in, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object() || !j.contains("query") || !j["query"].is_string()) {
      rc = Fail(g, kExitError,
                absl::StrCat(file, ":", n, ": expected a JSON object with a \"query\" string"));
      continue;
    }
    auto r = run(j["query"].get<std::string>());
    if (!r.ok()) {
      if (absl::IsUnavailable(r.status())) {
        return Fail(g, kExitUnreachable, absl::StrCat("fwaid unavailable: ", r.status().message()));
      }
      std::cout << nlohmann::json(
                       {{"query", j["query"]}, {"error", std::string(r.status().message())}})
                       .dump()
                << std::endl;
      rc = kExitError;
      continue;
    }
    nlohmann::json out = {{"query", j["query"]}};
    if (j.contains("id")) out["id"] = j["id"];
    for (auto& [k, v] : r->items()) out[k] = v;
    std::cout << out.dump() << std::endl;
  }
  return rc;
}

}  // namespace fwai
