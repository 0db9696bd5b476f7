#include "client/cli/fault.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/paths.h"
#include "common/strings.h"
#include "server/hardware/fault_capture.h"
#include "server/hardware/firmware_image.h"
#include "server/hardware/gdb_mi.h"

namespace fwai {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

absl::StatusOr<FaultCapture> ReadCapture(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot be read"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseFaultCapture(ss.str(), path);
}

// The ELF the capture's board ran: `given` (checked), else the path the
// capture names, else an ELF under ./build with the capture's SHA-256.
absl::StatusOr<std::string> ImageFor(const FaultCapture& c, const std::string& given) {
  const std::string need =
      absl::StrCat("this capture needs the image with sha256 ",
                   c.image_sha256.empty() ? "(none recorded)" : c.image_sha256, " (the one ",
                   c.board, " ran; its flash record in the evidence log names it)");
  auto matches = [&c](const std::string& path) {
    auto sha = FileSha256(path);
    return sha.ok() && *sha == c.image_sha256;
  };
  if (!given.empty()) {
    auto sha = FileSha256(given);
    if (!sha.ok()) return absl::NotFoundError(absl::StrCat(given, ": ", sha.status().message()));
    if (*sha != c.image_sha256)
      return absl::FailedPreconditionError(absl::StrCat(given, " has sha256 ", *sha, "; ", need));
    return given;
  }
  if (c.image_sha256.empty()) return absl::FailedPreconditionError(need);
  std::error_code ec;
  if (!c.image_path.empty() && fs::is_regular_file(c.image_path, ec) && matches(c.image_path))
    return c.image_path;
  for (fs::recursive_directory_iterator it("build", ec), end; !ec && it != end; it.increment(ec)) {
    if (it.depth() > 3) it.disable_recursion_pending();
    if (it->path().extension() == ".elf" && it->is_regular_file(ec) && matches(it->path()))
      return it->path().string();
  }
  return absl::NotFoundError(absl::StrCat(need, "; give it with --image"));
}

std::string SelfPath() {
  std::error_code ec;
  auto p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("fwai") : p.string();
}

}  // namespace

FaultCommands::FaultCommands(CLI::App& app, Globals& g) : g_(g) {
  auto* fault = app.add_subcommand("fault", "Fault captures (fwai debug BOARD fault --save FILE)");
  fault->require_subcommand(1);
  decode_ = fault->add_subcommand(
      "decode",
      "Decode a capture offline: the fault in words, the backtrace with file:line, locals");
  decode_->add_option("capture", capture_, "The capture file")->required();
  decode_->add_option("--image", image_,
                      "The ELF the board ran (default: the capture's, or one under ./build with "
                      "its sha256)");
  // gdb's side of a decode: the capture as a halted target on stdin/stdout.
  rsp_ = fault->add_subcommand("rsp", "");
  rsp_->group("");
  rsp_->add_option("capture", capture_)->required();
}

std::optional<int> FaultCommands::RunIfParsed() {
  if (decode_->parsed()) return Decode();
  if (rsp_->parsed()) return ServeRsp();
  return std::nullopt;
}

int FaultCommands::ServeRsp() {
  auto c = ReadCapture(capture_);
  if (!c.ok()) {
    std::cerr << "fwai: " << c.status().message() << std::endl;
    return kExitError;
  }
  return ServeCaptureOverRsp(*c, STDIN_FILENO, STDOUT_FILENO);
}

int FaultCommands::Decode() {
  auto c = ReadCapture(capture_);
  if (!c.ok()) return Fail(g_, kExitError, std::string(c.status().message()));
  auto image = ImageFor(*c, image_);
  if (!image.ok()) return Fail(g_, kExitError, std::string(image.status().message()));
  auto gdb = GdbSession::Start(FindGdb(""), *image);
  if (!gdb.ok()) return Fail(g_, kExitError, std::string(gdb.status().message()));
  // Code comes from the image (the capture holds RAM); the capture is the target.
  (void)(*gdb)->Console("set trust-readonly-sections on");
  std::error_code ec;
  const std::string capture = fs::absolute(capture_, ec).string();
  if (auto s = (*gdb)->Connect(
          absl::StrCat("| ", ShellQuote(SelfPath()), " fault rsp ", ShellQuote(capture)));
      !s.ok()) {
    return Fail(g_, kExitError, std::string(s.message()));
  }
  auto decoded = DecodeCapturedFault(**gdb);
  (*gdb)->Detach();
  if (!decoded.ok()) return Fail(g_, kExitError, std::string(decoded.status().message()));
  if (g_.json) {
    json out = *decoded;
    out["board"] = c->board;
    out["image"] = {{"path", *image}, {"sha256", c->image_sha256}};
    out["serial_before"] = c->json.value("serial_before", json::array());
    std::cout << out.dump() << std::endl;
    return kExitOk;
  }
  std::cout << FormatDecodedFault(*decoded, *c) << "\n(image " << *image << ")" << std::endl;
  return kExitOk;
}

int SaveCapture(const Globals& g, const std::string& path, const std::string& capture_json) {
  if (auto s = WriteFileAtomic(path, capture_json, 0600); !s.ok())
    return Fail(g, kExitError, absl::StrCat(path, ": cannot be written (", s.message(), ")"));
  if (!g.json) {
    std::cout << "saved the capture to " << path << " (" << capture_json.size()
              << " bytes); decode it anywhere with: fwai fault decode " << path << std::endl;
  }
  return kExitOk;
}

}  // namespace fwai
