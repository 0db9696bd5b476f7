#include "client/cli/firmware.h"

#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "client/lib/client.h"
#include "fwai/v1/firmware.grpc.pb.h"
#include "server/firmware/check_registers.h"

namespace fwai {

namespace pb = fwai::v1;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// --project, else the nearest directory up from here with a .fwai, else here.
std::string EnclosingProject(const Globals& g) {
  if (!g.project.empty()) return ProjectRoot(g);
  std::error_code ec;
  const fs::path here = fs::absolute(".", ec).lexically_normal();
  for (fs::path p = here; !p.empty(); p = p.parent_path()) {
    if (fs::is_directory(p / ".fwai", ec)) return p.string();
    if (p == p.parent_path()) break;
  }
  return here.string();
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
  check_ = app.add_subcommand("check", "Check the project's code against the device's truth");
  check_->require_subcommand(1);
  registers_ = check_->add_subcommand(
      "registers",
      "Register addresses and bit fields in C/C++ sources checked against the device's CMSIS-SVD "
      "(exit 0 clean, 1 an error found, 2 bad usage)");
  registers_->add_option("paths", paths_, "Files or directories (default: the project's sources)");
  registers_->add_option("--svd", svd_,
                         "The device's SVD file (default: the project's svd: or target:)");
  registers_->add_option(
      "--target", target_,
      "The part, e.g. stm32f100rb (an SVD fwai ships or the knowledge base has)");
  registers_->add_option("--sarif", sarif_, "Also write the findings as SARIF 2.1.0 to this file");
}

std::optional<int> FirmwareCommands::RunIfParsed() {
  if (registers_->parsed()) return CheckRegisters();
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

int FirmwareCommands::CheckRegisters() {
  if (!svd_.empty() && !target_.empty())
    return Fail(g_, kExitUsage, "give --svd or --target, not both");
  auto ch = ConnectChannel(g_);
  if (!ch.ok()) return Fail(g_, kExitUnreachable, std::string(ch.status().message()));
  auto stub = pb::Firmware::NewStub(*ch);
  pb::CheckRegistersRequest req;
  req.set_project_root(EnclosingProject(g_));
  std::error_code ec;
  // Paths are typed relative to here; fwaid reads them relative to the project.
  for (const auto& p : paths_) req.add_paths(fs::absolute(p, ec).lexically_normal().string());
  if (!svd_.empty()) req.set_svd(fs::absolute(svd_, ec).lexically_normal().string());
  req.set_target(target_);
  grpc::ClientContext ctx;
  pb::FirmwareReport resp;
  auto st = stub->CheckRegisters(&ctx, req, &resp);
  if (st.error_code() == grpc::StatusCode::INVALID_ARGUMENT)
    return Fail(g_, kExitUsage, st.error_message());
  if (!st.ok()) return FailGrpc(g_, st);
  const json report = json::parse(resp.json(), nullptr, false);
  if (report.is_discarded()) return Fail(g_, kExitError, "fwaid's register report is not JSON");
  if (!sarif_.empty()) {
    std::ofstream out(sarif_, std::ios::binary);
    out << RegisterFindingsSarif(report).dump(2) << "\n";
    if (!out) return Fail(g_, kExitError, absl::StrCat(sarif_, ": cannot write"));
  }
  if (g_.json) {
    std::cout << report.dump() << std::endl;
  } else {
    std::cout << resp.text();
  }
  if (report["checked"].value("errors", 0) > 0) return kExitError;
  // Every path named was one it could not check: that is no clean result.
  if (report["checked"].value("files", 0) == 0 && !report.value("skipped", json::array()).empty())
    return kExitUsage;
  return kExitOk;
}

}  // namespace fwai
