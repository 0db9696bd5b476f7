#include "client/cli/firmware.h"

#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "client/lib/client.h"
#include "fwai/v1/firmware.grpc.pb.h"

namespace fwai {

namespace pb = fwai::v1;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string ProjectRoot(const Globals& g) {
  std::error_code ec;
  return fs::absolute(g.project.empty() ? "." : g.project, ec).lexically_normal().string();
}

// A path the user typed, made absolute against the current directory when it
// names a file there (the daemon resolves other relative paths against the project).
std::string PathArg(const std::string& p) {
  std::error_code ec;
  if (p.empty() || fs::path(p).is_absolute() || !fs::is_regular_file(p, ec)) return p;
  return fs::absolute(p, ec).lexically_normal().string();
}

}  // namespace

FirmwareCommands::FirmwareCommands(CLI::App& app, Globals& g) : g_(g) {
  sbom_ = app.add_subcommand(
      "sbom", "The SBOM of a build or flash run, or of an image (CycloneDX 1.6 or SPDX 2.3 JSON)");
  sbom_->add_option("run_or_image", which_,
                    "A run id or an ELF (default: the project's newest build)");
  sbom_->add_option("--format", format_, "cyclonedx (default) | spdx")
      ->check(CLI::IsMember({"cyclonedx", "spdx"}));
  sbom_->add_option("--output,-o", output_, "File (default: standard output)");
  mem_ = app.add_subcommand("mem",
                            "Memory use of an image: regions, sections, largest symbols, stack, "
                            "change since the previous build");
  mem_->add_option("image", image_, "An ELF (default: the project's newest build)");
  mem_->add_option(
      "--diff", diff_,
      "Compare with this image or run id (default: the previous build of the project)");
}

std::optional<int> FirmwareCommands::RunIfParsed() {
  if (!sbom_->parsed() && !mem_->parsed()) return std::nullopt;
  auto ch = ConnectChannel(g_);
  if (!ch.ok()) return Fail(g_, kExitUnreachable, std::string(ch.status().message()));
  auto stub = pb::Firmware::NewStub(*ch);
  grpc::ClientContext ctx;
  pb::FirmwareReport resp;
  if (sbom_->parsed()) {
    pb::SbomRequest req;
    req.set_project_root(ProjectRoot(g_));
    req.set_run_or_image(PathArg(which_));
    req.set_format(format_);
    auto st = stub->Sbom(&ctx, req, &resp);
    if (!st.ok()) return FailGrpc(g_, st);
    if (output_.empty()) {
      std::cout << resp.json() << std::endl;
    } else {
      std::ofstream out(output_, std::ios::binary);
      out << resp.json() << "\n";
      if (!out) return Fail(g_, kExitError, absl::StrCat(output_, ": cannot write"));
      std::cerr << "wrote the " << format_ << " SBOM to " << output_ << std::endl;
    }
    return kExitOk;
  }
  pb::MemoryRequest req;
  req.set_project_root(ProjectRoot(g_));
  req.set_image(PathArg(image_));
  req.set_diff(PathArg(diff_));
  auto st = stub->Memory(&ctx, req, &resp);
  if (!st.ok()) return FailGrpc(g_, st);
  if (g_.json) {
    std::cout << resp.json() << std::endl;
  } else {
    std::cout << resp.text();
  }
  return kExitOk;
}

}  // namespace fwai
