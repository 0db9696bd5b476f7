// Projects: init (detect, then write .fwai/project.yaml), config, doctor.
#include <grpcpp/grpcpp.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/config.h"
#include "common/local_account.h"
#include "common/thread_pool.h"
#include "fwai/v1/projects.grpc.pb.h"
#include "server/agent/turn_manager.h"
#include "server/api/api.h"
#include "server/api/gate.h"
#include "server/api/offload.h"
#include "server/boards/leases.h"
#include "server/llm/provider.h"
#include "server/plugins/plugin_store.h"
#include "server/project/policy.h"
#include "server/project/project.h"
#include "server/project/templates.h"
#include "server/skills/skill.h"

namespace fwai {
namespace {

namespace pb = ::fwai::v1;
namespace fs = std::filesystem;

absl::StatusOr<std::string> Root(const std::string& r) { return CanonicalProjectRoot(r); }

class ProjectsService final : public pb::Projects::CallbackService {
 public:
  explicit ProjectsService(ApiDeps deps) : deps_(std::move(deps)) {}

  // Admits the call, then runs `work` on the pool with the caller's file
  // identity: the project is read and written as its owner, never as fwaid.
  grpc::ServerUnaryReactor* OffloadAs(grpc::CallbackServerContext* ctx, std::string_view rpc,
                                      std::function<absl::Status()> work) {
    auto who = deps_.gate->Admit(ctx, rpc);
    if (!who.ok()) return Refuse(ctx, who.status());
    return OffloadUnary(ctx, deps_.pool, true, "",
                        [account = *who->account, work = std::move(work)] {
                          ScopedFsIdentity as(account);
                          if (!as.status().ok()) return as.status();
                          return work();
                        });
  }

  grpc::ServerUnaryReactor* Init(grpc::CallbackServerContext* ctx, const pb::InitRequest* req,
                                 pb::InitResponse* resp) override {
    // A plugin's template lives in fwaid's data directory: it is read as
    // fwaid, before the work runs as the caller's account.
    using Files = absl::StatusOr<std::vector<std::pair<std::string, std::string>>>;
    auto plugin_files =
        std::make_shared<Files>(absl::UnavailableError("plugins are not available"));
    if (req->template_name().find(':') != std::string::npos && deps_.plugins) {
      *plugin_files = deps_.plugins->TemplateFiles(req->template_name());
    }
    return OffloadAs(ctx, "Projects.Init", [req, resp, plugin_files] {
      std::error_code ec;
      ProjectSettings s;
      std::optional<ProjectTemplate> tmpl;
      std::optional<std::string> plugin_settings;  // a plugin template's own .fwai/project.yaml
      if (!req->template_name().empty()) {
        // A new project from a template: the directory may not exist yet.
        if (req->project_root().empty() || !fs::path(req->project_root()).is_absolute()) {
          return absl::InvalidArgumentError("project_root: an absolute path is required");
        }
        auto it = req->values().find("name");
        const std::string name = it != req->values().end()
                                     ? it->second
                                     : fs::path(req->project_root()).filename().string();
        if (req->template_name().find(':') != std::string::npos) {
          // A plugin's template: its files as they are.
          Files& files = *plugin_files;
          if (!files.ok()) return files.status();
          ProjectTemplate t;
          t.name = req->template_name();
          plugin_settings = "";
          for (auto& [path, content] : *files) {
            if (path == ".fwai/project.yaml") {
              plugin_settings = content;
              continue;
            }
            t.files.push_back({path, std::move(content)});
          }
          tmpl = std::move(t);
        } else {
          auto t = MakeTemplate(req->template_name(), name);
          if (!t.ok()) return t.status();
          tmpl = std::move(*t);
        }
        if (!req->dry_run()) {
          fs::create_directories(req->project_root(), ec);
          if (ec)
            return absl::PermissionDeniedError(
                absl::StrCat("cannot create ", req->project_root(), ": ", ec.message()));
        }
      }
      auto root = tmpl && req->dry_run() ? absl::StatusOr<std::string>(req->project_root())
                                         : Root(req->project_root());
      if (!root.ok()) return root.status();
      const fs::path path = fs::path(*root) / ".fwai" / "project.yaml";
      if (tmpl) {
        if (fs::exists(path, ec) && !req->force()) {
          return absl::AlreadyExistsError(
              absl::StrCat(path.string(), " exists; fwai init --force replaces it"));
        }
        if (!req->dry_run()) {
          if (auto st = WriteTemplate(*tmpl, *root, req->force()); !st.ok()) return st;
        }
        for (const auto& f : tmpl->files) resp->add_files_written(f.path);
        s = tmpl->settings;
        if (plugin_settings && !plugin_settings->empty()) {
          auto ps =
              ParseProjectYaml(*plugin_settings, req->template_name() + ":.fwai/project.yaml");
          if (!ps.ok()) return ps.status();
          s = *ps;
        } else if (plugin_settings) {
          s = DetectProject(*root);
        }
      } else {
        s = DetectProject(*root);
        ApplyEmbedderMd(*root, s);
      }
      for (const auto& [k, v] : req->values()) {
        if (auto st = SetProjectField(s, k, v); !st.ok()) return st;
        std::erase(s.missing, k);
      }
      // Re-init keeps what the person set and the sections init does not manage.
      std::string kept_sections;
      if (!tmpl && fs::exists(path, ec)) {
        std::ifstream in(path);
        std::stringstream ss;
        ss << in.rdbuf();
        auto old = ParseProjectYaml(ss.str(), path.string());
        if (!old.ok()) {
          if (!req->force()) return old.status();
        } else {
          std::set<std::string> given;
          for (const auto& [k, v] : req->values()) given.insert(k);
          KeepExistingSettings(*old, given, s);
          kept_sections = UnmanagedSections(ss.str());
        }
      }
      resp->set_config_path(path.string());
      resp->set_build_system(s.build_system);
      for (const auto& m : s.missing) resp->add_missing(m);
      resp->set_config_yaml(ProjectYaml(s) + kept_sections);
      if (req->dry_run()) return absl::OkStatus();
      if (fs::exists(path, ec) && !req->force()) {
        return absl::AlreadyExistsError(
            absl::StrCat(path.string(), " exists; fwai init --force replaces it"));
      }
      if (!s.missing.empty() && !req->accept_defaults()) {
        return absl::FailedPreconditionError(
            absl::StrCat("could not detect: ", absl::StrJoin(s.missing, ", "),
                         "; give them (fwai init asks) or accept empty ones (--yes)"));
      }
      fs::create_directories(path.parent_path(), ec);
      std::ofstream(path) << resp->config_yaml();
      if (req->embedder_md()) std::ofstream(fs::path(*root) / "EMBEDDER.md") << EmbedderMd(s);
      resp->set_written(true);
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* GetConfig(grpc::CallbackServerContext* ctx,
                                      const pb::GetConfigRequest* req,
                                      pb::ProjectConfig* resp) override {
    return OffloadAs(ctx, "Projects.GetConfig", [req, resp] {
      auto root = Root(req->project_root());
      if (!root.ok()) return root.status();
      const fs::path path = fs::path(*root) / ".fwai" / "project.yaml";
      std::ifstream in(path);
      if (!in)
        return absl::NotFoundError(absl::StrCat(path.string(), " does not exist (fwai init)"));
      std::stringstream ss;
      ss << in.rdbuf();
      auto p = ParseProjectYaml(ss.str(), path.string());
      if (!p.ok()) return p.status();
      resp->set_yaml(ss.str());
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* Doctor(grpc::CallbackServerContext* ctx, const pb::DoctorRequest* req,
                                   pb::DoctorResponse* resp) override {
    return OffloadAs(ctx, "Projects.Doctor", [this, req, resp] {
      auto add = [&](const DoctorCheck& c) {
        auto* o = resp->add_checks();
        o->set_name(c.name);
        o->set_ok(c.ok);
        o->set_detail(c.detail);
        o->set_fix(c.fix);
      };
      add({"daemon", true,
           absl::StrCat("fwaid ", deps_.version, ", data in ", deps_.config->data_dir), ""});
      // Providers.
      DoctorCheck prov{"providers", false, "", ""};
      std::vector<std::string> ready, keyless;
      for (const auto& [name, p] : deps_.providers->providers) {
        const auto& c = p->config();
        (c.kind == "ollama" || !ResolveApiKey(c).empty() ? ready : keyless)
            .push_back(absl::StrCat(name, " (", c.model, ")"));
      }
      prov.ok = !ready.empty();
      prov.detail =
          ready.empty() ? "none with a key" : absl::StrCat("ready: ", absl::StrJoin(ready, ", "));
      if (!keyless.empty())
        absl::StrAppend(&prov.detail, "; without a key: ", absl::StrJoin(keyless, ", "));
      if (!prov.ok)
        prov.fix =
            "export ANTHROPIC_API_KEY (or OPENAI_API_KEY / GEMINI_API_KEY, or an ollama provider), "
            "then fwai daemon stop";
      add(prov);
      // Devices.
      DoctorCheck dev{"devices", false, "", ""};
      if (deps_.hardware && deps_.leases) {
        // Every board this daemon can reach: its own and, in a lab, the benches'.
        int good = 0;
        std::vector<std::string> names;
        for (const auto& b : deps_.leases->List().boards) {
          const DeviceInfo& d = b.device;
          names.push_back(absl::StrCat(d.id, " (", d.kind, ", ", d.health,
                                       d.state == "remote" ? ", on " + b.node : "", ")"));
          good += d.health == "good";
        }
        dev.ok = good > 0;
        dev.detail = names.empty() ? "no boards or devices" : absl::StrJoin(names, ", ");
        if (!dev.ok)
          dev.fix = "plug a board in, or declare one under hardware.boards in fwaid.yaml";
      } else {
        dev.detail = "the hardware broker is not running";
      }
      add(dev);
      std::string root;
      if (!req->project_root().empty()) {
        auto r = Root(req->project_root());
        if (!r.ok()) return r.status();
        root = *r;
      }
      for (const auto& c : DoctorChecks(root)) add(c);
      if (!root.empty()) {
        auto skills = LoadSkills(
            root, deps_.plugins ? deps_.plugins->SkillSets() : std::vector<PluginSkillSet>{});
        DoctorCheck sk{"skills", skills.ok(), "", ""};
        if (skills.ok()) {
          std::vector<std::string> names;
          for (const auto& x : *skills) names.push_back(x.builtin ? x.name : x.name + " (project)");
          sk.detail = absl::StrJoin(names, ", ");
        } else {
          sk.detail = std::string(skills.status().message());
          sk.fix = "fix the skill file named above (fwai skills ls shows the same error)";
        }
        add(sk);
      }
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* PolicyCheck(grpc::CallbackServerContext* ctx,
                                        const pb::PolicyCheckRequest* req,
                                        pb::PolicyDecision* resp) override {
    return OffloadAs(ctx, "Projects.PolicyCheck", [this, req, resp] {
      auto root = Root(req->project_root());
      if (!root.ok()) return root.status();
      if (req->kind() != "write" && req->kind() != "tool" && req->kind() != "command") {
        return absl::InvalidArgumentError("kind: expected write, tool or command");
      }
      auto rules = LoadPolicy(*root, deps_.config->policy_file);
      if (!rules.ok()) return rules.status();
      std::string target = req->target();
      if (req->kind() == "write") {
        // Paths are judged relative to the project root.
        std::error_code ec;
        fs::path p = fs::weakly_canonical(fs::absolute(fs::path(*root) / target), ec);
        std::string s = p.string();
        if (s.rfind(*root + "/", 0) == 0) target = s.substr(root->size() + 1);
      }
      auto d = CheckPolicy(*rules, req->kind(), target);
      resp->set_allowed(d.allowed);
      resp->set_rule(d.rule);
      resp->set_reason(d.reason);
      return absl::OkStatus();
    });
  }

 private:
  const ApiDeps deps_;
};

}  // namespace

std::unique_ptr<grpc::Service> MakeProjectsService(const ApiDeps& deps) {
  return std::make_unique<ProjectsService>(deps);
}

}  // namespace fwai
