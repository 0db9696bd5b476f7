#include "client/cli/plugin.h"

#include <openssl/sha.h>
#include <unistd.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/minisign.h"
#include "common/paths.h"
#include "fwai/v1/plugins.grpc.pb.h"

namespace fwai {

namespace pb = fwai::v1;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

constexpr char kManifest[] = "fwai-plugin.json";
constexpr char kSignature[] = "fwai-plugin.json.minisig";

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot be read"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Sha256Hex(std::string_view data) {
  unsigned char out[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), out);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<char*>(out), sizeof out));
}

// A local source is sent as an absolute path (fwaid resolves nothing relative).
std::string Absolute(const std::string& source) {
  if (absl::StartsWith(source, "git+") || absl::StrContains(source, "://")) return source;
  std::error_code ec;
  return fs::absolute(source, ec).lexically_normal().string();
}

void PrintPlugin(const Globals& g, const pb::PluginInfo& p) {
  json j = json::parse(p.json(), nullptr, false);
  if (g.json) {
    std::cout << j.dump() << "\n";
    return;
  }
  const auto caps = j.value("capabilities", json::object());
  std::vector<std::string> c;
  if (caps.value("build", false)) c.push_back("build");
  if (caps.value("flash", false)) c.push_back("flash");
  if (caps.value("network", false)) c.push_back("network");
  if (caps.contains("boards") && !caps["boards"].empty()) {
    c.push_back(absl::StrCat("boards tagged ",
                             absl::StrJoin(caps["boards"].get<std::vector<std::string>>(), "|")));
  }
  const auto inst = j.value("installed", json::object());
  const auto ver = inst.value("verification", json::object());
  std::printf("%-20s %-10s %-10s %s\n", p.name().c_str(), p.version().c_str(),
              ver.value("signature", "?").c_str(),
              c.empty() ? "no capabilities" : absl::StrJoin(c, ", ").c_str());
  auto list = [&](const char* what, const char* key) {
    if (j.contains(key) && !j[key].empty()) {
      std::vector<std::string> items;
      for (const auto& x : j[key]) items.push_back(x.get<std::string>());
      std::printf("  %s: %s\n", what, absl::StrJoin(items, ", ").c_str());
    }
  };
  list("skills", "skills");
  list("agents", "agents");
  list("MCP servers", "mcp_servers");
  list("tools", "tools");
  list("templates", "templates");
}

}  // namespace

PluginCommands::PluginCommands(CLI::App& app, Globals& g) : g_(g) {
  auto* p = app.add_subcommand("plugin",
                               "Signed plugins: skills, agents, MCP servers, tools and templates, "
                               "scoped to what they declare");
  p->require_subcommand(1);
  install_ = p->add_subcommand("install", "Install from a directory, a tarball, or git+URL@COMMIT");
  install_->add_option("source", source_)->required();
  install_->add_flag("--replace", replace_, "Replace an installed plugin of the same name");
  ls_ = p->add_subcommand("ls", "Installed plugins");
  rm_ = p->add_subcommand("rm", "Remove a plugin");
  rm_->add_option("name", name_)->required();
  verify_ = p->add_subcommand("verify", "Re-check an installed plugin's files and signature");
  verify_->add_option("name", name_)->required();
  search_ = p->add_subcommand("search",
                              "Search the marketplaces (plugins.marketplaces, or --marketplace)");
  search_->add_option("query", query_);
  search_->add_option("--marketplace", marketplace_,
                      "An index: https:// URL, a file or a directory with index.json");
  sign_ =
      p->add_subcommand("sign", "Write the manifest's file hashes and sign it with a minisign key");
  sign_->add_option("dir", dir_, "The plugin's directory (holds fwai-plugin.json)")->required();
  sign_
      ->add_option("--key,-s", key_,
                   "minisign secret key (minisign -G; asks for its password if it has one)")
      ->required();
  sign_->add_option("--trusted-comment,-t", comment_, "The signature's trusted comment");
  keygen_ =
      p->add_subcommand("keygen", "Make a minisign key pair (unencrypted; keep the .key private)");
  keygen_->add_option("prefix", out_, "Writes PREFIX.key and PREFIX.pub")->required();
}

std::optional<int> PluginCommands::RunIfParsed() {
  if (sign_->parsed()) return Sign();
  if (keygen_->parsed()) return Keygen();
  if (!install_->parsed() && !ls_->parsed() && !rm_->parsed() && !verify_->parsed() &&
      !search_->parsed()) {
    return std::nullopt;
  }
  auto ch = ConnectChannel(g_);
  if (!ch.ok()) return Fail(g_, kExitUnreachable, std::string(ch.status().message()));
  auto stub = pb::Plugins::NewStub(*ch);
  grpc::ClientContext ctx;
  if (install_->parsed()) {
    pb::InstallPluginRequest req;
    req.set_source(Absolute(source_));
    req.set_replace(replace_);
    pb::PluginInfo resp;
    auto st = stub->Install(&ctx, req, &resp);
    if (!st.ok()) return FailGrpc(g_, st);
    if (!g_.json) std::printf("installed ");
    PrintPlugin(g_, resp);
    return kExitOk;
  }
  if (ls_->parsed()) {
    pb::ListPluginsResponse resp;
    auto st = stub->List(&ctx, pb::ListPluginsRequest(), &resp);
    if (!st.ok()) return FailGrpc(g_, st);
    if (!g_.json && resp.plugins().empty()) std::printf("no plugins installed\n");
    for (const auto& p : resp.plugins()) PrintPlugin(g_, p);
    return kExitOk;
  }
  if (rm_->parsed()) {
    pb::RemovePluginRequest req;
    req.set_name(name_);
    pb::RemovePluginResponse resp;
    auto st = stub->Remove(&ctx, req, &resp);
    if (!st.ok()) return FailGrpc(g_, st);
    if (g_.json) {
      std::cout << resp.json() << "\n";
    } else {
      std::printf("removed %s\n", name_.c_str());
    }
    return kExitOk;
  }
  if (verify_->parsed()) {
    pb::VerifyPluginRequest req;
    req.set_name(name_);
    pb::PluginInfo resp;
    auto st = stub->Verify(&ctx, req, &resp);
    if (!st.ok()) return FailGrpc(g_, st);
    json j = json::parse(resp.json(), nullptr, false);
    if (g_.json) {
      std::cout << j.dump() << "\n";
    } else {
      const auto v = j.value("verification", json::object());
      std::printf("%s %s: %s (signature %s%s)\n", name_.c_str(), j.value("version", "").c_str(),
                  j.value("ok", false) ? "ok" : "NOT OK", v.value("signature", "").c_str(),
                  v.value("key_id", "").empty()
                      ? ""
                      : absl::StrCat(", key ", v.value("key_id", "")).c_str());
      for (const char* k : {"modified", "missing", "extra"}) {
        for (const auto& f : v.value(k, json::array()))
          std::printf("  %s: %s\n", k, f.get<std::string>().c_str());
      }
      if (!v.value("detail", "").empty()) std::printf("  %s\n", v.value("detail", "").c_str());
    }
    return j.value("ok", false) ? kExitOk : kExitError;
  }
  pb::SearchPluginsRequest req;
  req.set_query(query_);
  req.set_marketplace(marketplace_.empty() || absl::StrContains(marketplace_, "://")
                          ? marketplace_
                          : Absolute(marketplace_));
  pb::SearchPluginsResponse resp;
  auto st = stub->Search(&ctx, req, &resp);
  if (!st.ok()) return FailGrpc(g_, st);
  json j = json::parse(resp.json(), nullptr, false);
  if (g_.json) {
    std::cout << j.dump() << "\n";
    return kExitOk;
  }
  for (const auto& r : j.value("results", json::array())) {
    std::printf("%-20s %-10s %s%s\n    %s\n", r.value("name", "").c_str(),
                r.value("version", "").c_str(), r.value("description", "").c_str(),
                r.value("installed", false) ? " (installed)" : "", r.value("source", "").c_str());
  }
  for (const auto& e : j.value("errors", json::array())) {
    std::fprintf(stderr, "fwai: %s: %s\n", e.value("marketplace", "").c_str(),
                 e.value("error", "").c_str());
  }
  return kExitOk;
}

int PluginCommands::Sign() {
  const fs::path dir(dir_);
  auto text = ReadFile((dir / kManifest).string());
  if (!text.ok()) return Fail(g_, kExitError, absl::StrCat(dir_, ": no ", kManifest));
  json m = json::parse(*text, nullptr, false);
  if (m.is_discarded() || !m.is_object())
    return Fail(g_, kExitError, absl::StrCat((dir / kManifest).string(), ": not a JSON object"));
  // Every file but the manifest and its signature, hashed.
  json files = json::object();
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    const std::string rel = fs::relative(it->path(), dir, ec).generic_string();
    if (it->is_directory(ec)) {
      if (it->path().filename() == ".git") it.disable_recursion_pending();
      continue;
    }
    if (it->is_symlink(ec) || !it->is_regular_file(ec)) {
      return Fail(g_, kExitError, absl::StrCat(rel, ": plugins hold regular files only"));
    }
    if (rel == kManifest || rel == kSignature) continue;
    auto bytes = ReadFile(it->path().string());
    if (!bytes.ok()) return Fail(g_, kExitError, std::string(bytes.status().message()));
    files[rel] = Sha256Hex(*bytes);
  }
  m["files"] = files;
  const std::string manifest = m.dump(2) + "\n";
  auto key_text = ReadFile(key_);
  if (!key_text.ok()) return Fail(g_, kExitError, std::string(key_text.status().message()));
  auto key = minisign::ParseSecretKey(*key_text, []() -> absl::StatusOr<std::string> {
    const char* p = getpass("Password: ");
    if (!p) return absl::CancelledError("no password");
    return std::string(p);
  });
  if (!key.ok()) return Fail(g_, kExitError, absl::StrCat(key_, ": ", key.status().message()));
  std::string comment =
      comment_.empty() ? absl::StrCat("timestamp:", time(nullptr), "\tfile:", kManifest, "\thashed")
                       : comment_;
  auto sig = minisign::Sign(*key, manifest, comment, "signature from fwai plugin sign");
  if (!sig.ok()) return Fail(g_, kExitError, std::string(sig.status().message()));
  if (auto s = WriteFileAtomic((dir / kManifest).string(), manifest); !s.ok())
    return Fail(g_, kExitError, std::string(s.message()));
  if (auto s = WriteFileAtomic((dir / kSignature).string(), *sig); !s.ok())
    return Fail(g_, kExitError, std::string(s.message()));
  if (g_.json) {
    std::cout << json{{"manifest", (dir / kManifest).string()},
                      {"signature", (dir / kSignature).string()},
                      {"files", files.size()}}
                     .dump()
              << "\n";
  } else {
    std::printf("signed %s: %zu files hashed into %s, signature in %s\n",
                m.value("name", "?").c_str(), files.size(), kManifest, kSignature);
  }
  return kExitOk;
}

int PluginCommands::Keygen() {
  auto kp = minisign::GenerateKeyPair();
  if (!kp.ok()) return Fail(g_, kExitError, std::string(kp.status().message()));
  std::error_code ec;
  if (fs::exists(out_ + ".key", ec))
    return Fail(g_, kExitError, absl::StrCat(out_, ".key exists; not overwritten"));
  if (auto s = WriteFileAtomic(out_ + ".key", kp->secret_file, 0600); !s.ok())
    return Fail(g_, kExitError, std::string(s.message()));
  if (auto s = WriteFileAtomic(out_ + ".pub", kp->public_file, 0644); !s.ok())
    return Fail(g_, kExitError, std::string(s.message()));
  if (g_.json) {
    std::cout << json{{"key_id", kp->public_key.KeyIdHex()},
                      {"public_key", kp->public_key.Base64()}}
                     .dump()
              << "\n";
  } else {
    std::printf(
        "key %s: %s.key (secret), %s.pub\ntrust it in fwaid.yaml:\n  plugins: {trusted_keys: "
        "[\"%s\"]}\n",
        kp->public_key.KeyIdHex().c_str(), out_.c_str(), out_.c_str(),
        kp->public_key.Base64().c_str());
  }
  return kExitOk;
}

}  // namespace fwai
