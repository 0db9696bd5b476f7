#include "client/cli/project.h"

#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "client/lib/client.h"
#include "fwai/v1/projects.grpc.pb.h"

namespace fwai {

namespace pb = fwai::v1;
using json = nlohmann::json;

ProjectCommands::ProjectCommands(CLI::App& app, Globals& g) : g_(g) {
  init_ = app.add_subcommand(
      "init",
      "Detect the project's build, flash, target and serial settings; write .fwai/project.yaml");
  init_->add_option("dir", dir_, "Project directory (default: here)");
  init_->add_flag("--yes,-y", yes_, "Take what was detected; do not ask for the rest");
  init_->add_flag("--force", force_, "Replace an existing .fwai/project.yaml");
  init_->add_flag("--embedder-md", embedder_md_, "Also write EMBEDDER.md");
  init_
      ->add_option("--template", template_,
                   "Start a new project: bare-metal | freertos | zephyr | arduino")
      ->check(CLI::IsMember({"bare-metal", "freertos", "zephyr", "arduino"}));
  init_
      ->add_option("--set", set_,
                   "field=value (name, build_command, flash_command, test_command, image, target, "
                   "board, debug_interface, serial_port, baud, boot_pattern); repeatable")
      ->allow_extra_args(false);
  doctor_ = app.add_subcommand(
      "doctor", "Check toolchains, the daemon, providers, devices and the project config");
  doctor_->add_option("dir", dir_, "Project directory (default: here)");
  auto* policy = app.add_subcommand("policy", "The project's policy");
  policy->require_subcommand(1);
  policy_check_ = policy->add_subcommand(
      "check", "What would happen to a write, a tool call or a command, and why");
  policy_check_->add_option("target", target_, "A path, a tool name, or a command line")
      ->required();
  policy_check_->add_option("--kind", kind_, "write | tool | command (default: guessed)")
      ->check(CLI::IsMember({"write", "tool", "command"}));
}

std::optional<int> ProjectCommands::RunIfParsed() {
  if (init_->parsed()) return Init();
  if (doctor_->parsed()) return Doctor();
  if (policy_check_->parsed()) return PolicyCheck();
  return std::nullopt;
}

int ProjectCommands::PolicyCheck() {
  std::error_code ec;
  const std::string root = std::filesystem::absolute(g_.project.empty() ? "." : g_.project, ec)
                               .lexically_normal()
                               .string();
  std::string kind = kind_;
  if (kind.empty()) {
    kind = target_.find(' ') != std::string::npos ? "command"
           : (target_.find('/') != std::string::npos || target_.find('.') != std::string::npos)
               ? "write"
               : "tool";
  }
  auto ch = ConnectChannel(g_);
  if (!ch.ok()) return Fail(g_, kExitUnreachable, std::string(ch.status().message()));
  auto stub = pb::Projects::NewStub(*ch);
  grpc::ClientContext ctx;
  pb::PolicyCheckRequest req;
  req.set_project_root(root);
  req.set_kind(kind);
  req.set_target(target_);
  pb::PolicyDecision d;
  auto st = stub->PolicyCheck(&ctx, req, &d);
  if (!st.ok()) return FailGrpc(g_, st);
  if (g_.json) {
    std::cout << json{{"kind", kind},
                      {"target", target_},
                      {"allowed", d.allowed()},
                      {"rule", d.rule()},
                      {"reason", d.reason()}}
                     .dump()
              << std::endl;
  } else if (d.allowed()) {
    std::cout << "allowed (" << kind << " " << target_ << "): " << d.reason() << std::endl;
  } else {
    std::cout << "refused (" << kind << " " << target_ << ") by " << d.rule() << ": " << d.reason()
              << std::endl;
  }
  return d.allowed() ? kExitOk : kExitError;
}

int ProjectCommands::Init() {
  std::error_code ec;
  const std::string root =
      std::filesystem::absolute(dir_.empty() ? (g_.project.empty() ? "." : g_.project) : dir_, ec)
          .lexically_normal()
          .string();
  auto ch = ConnectChannel(g_);
  if (!ch.ok()) return Fail(g_, kExitUnreachable, std::string(ch.status().message()));
  auto stub = pb::Projects::NewStub(*ch);
  pb::InitRequest req;
  req.set_project_root(root);
  req.set_force(force_);
  req.set_embedder_md(embedder_md_);
  req.set_template_name(template_);
  for (const auto& kv : set_) {
    auto eq = kv.find('=');
    if (eq == std::string::npos)
      return Fail(g_, kExitUsage, absl::StrCat("--set ", kv, ": expected field=value"));
    (*req.mutable_values())[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  // First what detection finds; then ask for the rest (a template knows it all).
  pb::InitResponse dry;
  if (template_.empty()) {
    grpc::ClientContext ctx;
    pb::InitRequest d = req;
    d.set_dry_run(true);
    auto st = stub->Init(&ctx, d, &dry);
    if (!st.ok()) return FailGrpc(g_, st);
  }
  if (!g_.json && template_.empty())
    std::cerr << "detected: " << dry.build_system() << " project in " << root << "\n";
  if (dry.missing_size() > 0 && !yes_) {
    if (!isatty(0) || g_.json) {
      std::string names;
      for (const auto& m : dry.missing()) absl::StrAppend(&names, names.empty() ? "" : ", ", m);
      return Fail(
          g_, kExitError,
          absl::StrCat("could not detect ", names, "; give them with --set field=value, or --yes"));
    }
    for (const auto& m : dry.missing()) {
      std::cerr << m << "? " << std::flush;
      std::string v;
      std::getline(std::cin, v);
      v = std::string(absl::StripAsciiWhitespace(v));
      if (!v.empty()) (*req.mutable_values())[m] = v;
    }
  }
  req.set_accept_defaults(true);
  grpc::ClientContext ctx;
  pb::InitResponse resp;
  auto st = stub->Init(&ctx, req, &resp);
  if (!st.ok()) return FailGrpc(g_, st);
  if (g_.json) {
    std::cout << ProtoToJson(resp).dump() << std::endl;
  } else {
    for (const auto& f : resp.files_written()) std::cout << "created " << f << "\n";
    std::cout << "wrote " << resp.config_path() << (embedder_md_ ? " and EMBEDDER.md" : "") << "\n"
              << resp.config_yaml();
  }
  return kExitOk;
}

int ProjectCommands::Doctor() {
  std::error_code ec;
  const std::string root =
      std::filesystem::absolute(dir_.empty() ? (g_.project.empty() ? "." : g_.project) : dir_, ec)
          .lexically_normal()
          .string();
  auto ch = ConnectChannel(g_);
  if (!ch.ok()) {
    if (g_.json)
      std::cout << json{{"name", "daemon"},
                        {"ok", false},
                        {"detail", std::string(ch.status().message())}}
                       .dump()
                << std::endl;
    return Fail(
        g_, kExitUnreachable,
        absl::StrCat("daemon: ", ch.status().message(), " — fix: fwai daemon start (see its log)"));
  }
  auto stub = pb::Projects::NewStub(*ch);
  grpc::ClientContext ctx;
  pb::DoctorRequest req;
  req.set_project_root(root);
  pb::DoctorResponse resp;
  auto st = stub->Doctor(&ctx, req, &resp);
  if (!st.ok()) return FailGrpc(g_, st);
  bool all = true;
  for (const auto& c : resp.checks()) {
    all &= c.ok();
    if (g_.json) {
      std::cout << ProtoToJson(c).dump() << "\n";
      continue;
    }
    std::printf("%s %-18s %s\n", c.ok() ? "ok  " : "FAIL", c.name().c_str(), c.detail().c_str());
    if (!c.ok() && !c.fix().empty()) std::printf("     %-18s fix: %s\n", "", c.fix().c_str());
  }
  std::cout.flush();
  return all ? kExitOk : kExitError;
}

}  // namespace fwai
