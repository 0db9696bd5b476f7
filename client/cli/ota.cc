#include "client/cli/ota.h"

#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/mcuboot.h"
#include "fwai/v1/ota.grpc.pb.h"

namespace fwai {

namespace pb = fwai::v1;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot be read"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool ParseSize(const std::string& text, uint32_t* out) {
  std::string t = text;
  uint64_t mult = 1;
  if (!t.empty() && (t.back() == 'K' || t.back() == 'k')) {
    mult = 1024;
    t.pop_back();
  }
  uint64_t v = 0;
  try {
    size_t pos = 0;
    v = std::stoull(t, &pos, 0);
    if (pos != t.size()) return false;
  } catch (...) {
    return false;
  }
  v *= mult;
  if (v > 0xffffffffu) return false;
  *out = static_cast<uint32_t>(v);
  return true;
}

std::string FlagName(mcuboot::Flag f) {
  return f == mcuboot::Flag::kSet ? "set" : f == mcuboot::Flag::kUnset ? "unset" : "bad";
}

}  // namespace

OtaCommands::OtaCommands(CLI::App& app, Globals& g) : g_(g) {
  auto* ota = app.add_subcommand(
      "ota", "Over-the-air updates: MCUboot images and staged rollouts that revert themselves");
  ota->require_subcommand(1);
  package_ =
      ota->add_subcommand("package", "Wrap a firmware (ELF or .bin) into a signed MCUboot image");
  package_
      ->add_option("image", image_, "The firmware: an ELF (its loadable segments) or a flat .bin")
      ->required();
  package_->add_option("--version", version_, "MAJOR.MINOR.REVISION[+BUILD]")->required();
  package_->add_option("--key", key_,
                       "Ed25519 private key, PEM (openssl genpkey -algorithm ed25519); without it "
                       "the image carries its hash only");
  package_->add_option("--output,-o", output_, "Output file (default: IMAGE with .signed.bin)");
  package_->add_option("--header-size", header_size_,
                       "Header size in bytes (default 0x200, as imgtool's --header-size)");
  package_->add_option("--slot-size", slot_size_,
                       "Pad to a slot of this size with an MCUboot trailer (e.g. 64K)");
  package_->add_flag("--confirm", confirm_,
                     "With --slot-size: mark the image confirmed (image_ok), as imgtool --confirm");
  package_->add_option("--security-counter", security_counter_,
                       "A protected security counter TLV: a number, or auto (from the version)");
  verify_ = ota->add_subcommand("verify", "Check an MCUboot image: structure, hash, and signature");
  verify_->add_option("image", image_, "The MCUboot image")->required();
  verify_->add_option("--key", key_,
                      "Ed25519 key (public or private PEM) the signature must verify with");
  rollout_ = ota->add_subcommand(
      "rollout", "Roll an MCUboot image out to boards in stages; failing stages revert");
  rollout_->add_option("image", image_, "The MCUboot image (fwai ota package)")->required();
  rollout_
      ->add_option("--boards", boards_,
                   "Board ids, or tags every chosen board carries (comma-separated)")
      ->delimiter(',')
      ->required();
  rollout_
      ->add_option("--stages", stages_, "Cumulative stages, e.g. 1,25%,100% (default: all at once)")
      ->delimiter(',');
  rollout_->add_option(
      "--health", health_,
      "A skill that decides, on each board, confirm or revert (default: the boot line)");
  rollout_->add_option(
      "--max-failure-rate", max_failure_rate_,
      "0..1: a stage failing more stops and reverts (default: fwaid's ota.max_failure_rate, 0)");
  rollout_->add_flag("--force", force_, "Allow a downgrade");
  status_ =
      ota->add_subcommand("status", "What each board runs and its slots; or one rollout's history");
  status_->add_option("rollout", rollout_id_, "A rollout id");
  ls_ = ota->add_subcommand("ls", "Recent rollouts");
  ls_->add_option("--limit,-n", limit_, "How many (default 20)");
}

std::optional<int> OtaCommands::RunIfParsed() {
  if (package_->parsed()) return Package();
  if (verify_->parsed()) return Verify();
  if (rollout_->parsed()) return Rollout();
  if (status_->parsed()) return Status();
  if (ls_->parsed()) return List();
  return std::nullopt;
}

int OtaCommands::Package() {
  auto version = mcuboot::Version::Parse(version_);
  if (!version.ok()) return Fail(g_, kExitUsage, std::string(version.status().message()));
  auto fw = mcuboot::ReadFirmware(image_);
  if (!fw.ok()) return Fail(g_, kExitError, std::string(fw.status().message()));
  mcuboot::PackageOptions o;
  o.version = *version;
  o.header_size = header_size_;
  o.confirm = confirm_;
  if (!slot_size_.empty() && !ParseSize(slot_size_, &o.slot_size)) {
    return Fail(g_, kExitUsage,
                absl::StrCat("--slot-size ", slot_size_, ": expected bytes (65536, 0x10000, 64K)"));
  }
  if (confirm_ && o.slot_size == 0)
    return Fail(g_, kExitUsage,
                "--confirm needs --slot-size (the flag lives in the slot's trailer)");
  if (security_counter_ == "auto") {
    o.security_counter =
        (uint32_t{version->major} << 24) | (uint32_t{version->minor} << 16) | version->revision;
  } else if (!security_counter_.empty()) {
    uint32_t v = 0;
    if (!absl::SimpleAtoi(security_counter_, &v))
      return Fail(g_, kExitUsage, "--security-counter: a number or auto");
    o.security_counter = v;
  }
  if (!key_.empty()) {
    auto pem = ReadFile(key_);
    if (!pem.ok()) return Fail(g_, kExitError, absl::StrCat("--key: ", pem.status().message()));
    o.key_pem = *pem;
  }
  auto image = mcuboot::Package(fw->bytes, o);
  if (!image.ok())
    return Fail(g_, kExitError, absl::StrCat(image_, ": ", image.status().message()));
  std::string out = output_;
  if (out.empty()) out = fs::path(image_).replace_extension(".signed.bin").string();
  std::ofstream f(out, std::ios::binary | std::ios::trunc);
  f.write(image->data(), static_cast<std::streamsize>(image->size()));
  f.close();
  if (!f) return Fail(g_, kExitError, absl::StrCat("cannot write ", out));
  auto info = mcuboot::Parse(*image);
  if (!info.ok()) return Fail(g_, kExitError, std::string(info.status().message()));
  if (g_.json) {
    std::cout << json{{"output", out},
                      {"version", info->version.ToString()},
                      {"bytes", image->size()},
                      {"payload_bytes", info->image_size},
                      {"load_addr", fw->load_addr},
                      {"sha256", info->sha256_hex},
                      {"signed", info->has_signature},
                      {"key_hash", info->key_hash_hex}}
                     .dump()
              << "\n";
  } else {
    std::printf(
        "%s: MCUboot image %s, %zu bytes (payload %u bytes linked at 0x%08llx), sha256 %s%s\n",
        out.c_str(), info->version.ToString().c_str(), image->size(), info->image_size,
        static_cast<unsigned long long>(fw->load_addr), info->sha256_hex.c_str(),
        info->has_signature
            ? absl::StrCat(", signed (key hash ", info->key_hash_hex.substr(0, 16), "…)").c_str()
            : ", unsigned (no --key)");
  }
  return kExitOk;
}

int OtaCommands::Verify() {
  auto bytes = ReadFile(image_);
  if (!bytes.ok()) return Fail(g_, kExitError, std::string(bytes.status().message()));
  auto info = mcuboot::Parse(*bytes);
  if (!info.ok()) return Fail(g_, kExitError, absl::StrCat(image_, ": ", info.status().message()));
  std::string sig = info->has_signature ? "present (not checked: give --key)" : "none";
  bool ok = info->hash_ok;
  if (!key_.empty()) {
    auto pem = ReadFile(key_);
    if (!pem.ok()) return Fail(g_, kExitError, absl::StrCat("--key: ", pem.status().message()));
    auto s = mcuboot::VerifySignature(*bytes, *info, *pem);
    sig = s.ok() ? "valid" : absl::StrCat("INVALID: ", s.message());
    ok = ok && s.ok();
  }
  if (g_.json) {
    json j = {{"ok", ok},
              {"version", info->version.ToString()},
              {"header_size", info->header_size},
              {"image_size", info->image_size},
              {"protected_tlv_size", info->protected_tlv_size},
              {"sha256", info->sha256_hex},
              {"hash_ok", info->hash_ok},
              {"key_hash", info->key_hash_hex},
              {"signature", sig}};
    if (info->security_counter) j["security_counter"] = *info->security_counter;
    json tlvs = json::array();
    for (const auto& t : info->tlvs)
      tlvs.push_back({{"type", t.type}, {"len", t.value.size()}, {"protected", t.is_protected}});
    j["tlvs"] = tlvs;
    if (info->trailer) {
      j["trailer"] = {{"magic", info->trailer->magic == mcuboot::Magic::kGood ? "good" : "bad"},
                      {"image_ok", FlagName(info->trailer->image_ok)}};
    }
    std::cout << j.dump() << "\n";
  } else {
    std::printf(
        "%s: MCUboot image %s\n  header %u bytes, payload %u bytes, protected TLVs %u bytes\n",
        image_.c_str(), info->version.ToString().c_str(), info->header_size, info->image_size,
        info->protected_tlv_size);
    std::printf("  sha256 %s: %s\n", info->sha256_hex.c_str(),
                info->hash_ok ? "matches" : "DOES NOT MATCH the contents");
    if (info->security_counter) std::printf("  security counter %u\n", *info->security_counter);
    if (!info->key_hash_hex.empty()) std::printf("  key hash %s\n", info->key_hash_hex.c_str());
    std::printf("  signature: %s\n", sig.c_str());
    if (info->trailer) {
      std::printf("  trailer: magic %s, image_ok %s\n",
                  info->trailer->magic == mcuboot::Magic::kGood ? "good" : "bad",
                  FlagName(info->trailer->image_ok).c_str());
    }
  }
  return ok ? kExitOk : kExitError;
}

int OtaCommands::Rollout() {
  auto ch = ConnectChannel(g_);
  if (!ch.ok()) return Fail(g_, kExitUnreachable, std::string(ch.status().message()));
  auto stub = pb::Ota::NewStub(*ch);
  pb::RolloutRequest req;
  std::error_code ec;
  req.set_image(fs::absolute(image_, ec).lexically_normal().string());
  for (const auto& b : boards_) req.add_boards(b);
  for (const auto& s : stages_) req.add_stages(s);
  req.set_health_skill(health_);
  req.set_project_root(
      fs::absolute(g_.project.empty() ? "." : g_.project, ec).lexically_normal().string());
  req.set_max_failure_rate(max_failure_rate_);
  req.set_force(force_);
  grpc::ClientContext ctx;
  auto reader = stub->Rollout(&ctx, req);
  pb::RolloutEvent e;
  std::string final_state;
  while (reader->Read(&e)) {
    if (g_.json) {
      json j = json::parse(e.json(), nullptr, false);
      std::cout << json{{"type", e.kind()},   {"rollout_id", e.rollout_id()},
                        {"board", e.board()}, {"state", e.state()},
                        {"text", e.text()},   {"record", j.is_discarded() ? json() : j}}
                       .dump()
                << std::endl;
    } else if (e.kind() == "board") {
      std::printf("  %-16s %-12s %s\n", e.board().c_str(), e.state().c_str(), e.text().c_str());
    } else {
      std::printf("%s\n", e.text().c_str());
    }
    std::fflush(stdout);
    if (e.kind() == "rollout_finished") final_state = e.state();
  }
  auto st = reader->Finish();
  if (!st.ok()) return FailGrpc(g_, st);
  if (final_state == "completed") return kExitOk;
  if (final_state == "refused") return kExitError;
  return 5;  // stopped (reverted) or cancelled
}

int OtaCommands::Status() {
  auto ch = ConnectChannel(g_);
  if (!ch.ok()) return Fail(g_, kExitUnreachable, std::string(ch.status().message()));
  auto stub = pb::Ota::NewStub(*ch);
  grpc::ClientContext ctx;
  if (!rollout_id_.empty()) {
    pb::GetRolloutRequest req;
    req.set_rollout_id(rollout_id_);
    pb::RolloutInfo resp;
    auto st = stub->GetRollout(&ctx, req, &resp);
    if (!st.ok()) return FailGrpc(g_, st);
    json j = json::parse(resp.json(), nullptr, false);
    if (g_.json) {
      std::cout << j.dump() << "\n";
      return kExitOk;
    }
    std::printf("rollout %s: %s, version %s (sha256 %s…), by %s\n", j.value("id", "").c_str(),
                j.value("state", "").c_str(), j.value("version", "").c_str(),
                j.value("image_hash", "").substr(0, 16).c_str(), j.value("by", "").c_str());
    if (j.contains("error")) std::printf("  %s\n", j.value("error", "").c_str());
    for (const auto& ev : j.value("events", json::array())) {
      std::printf("  #%-5s %-16s %-14s %-12s %s\n",
                  ev.contains("evidence_index")
                      ? std::to_string(ev["evidence_index"].get<uint64_t>()).c_str()
                      : "-",
                  ev.value("event", "").c_str(), ev.value("board", "").c_str(),
                  ev.value("state", "").c_str(), ev.value("text", "").c_str());
    }
    return kExitOk;
  }
  pb::OtaBoardsResponse resp;
  auto st = stub->Boards(&ctx, pb::OtaBoardsRequest(), &resp);
  if (!st.ok()) return FailGrpc(g_, st);
  json boards = json::parse(resp.json(), nullptr, false);
  if (g_.json) {
    for (const auto& b : boards) std::cout << b.dump() << "\n";
    return kExitOk;
  }
  std::printf("%-16s %-10s %-10s %-26s %-26s %s\n", "BOARD", "KIND", "RUNNING", "PRIMARY",
              "SECONDARY", "LAST ROLLOUT");
  auto slot = [](const json& s) -> std::string {
    if (!s.is_object() || !s.value("has_image", false)) return "-";
    return absl::StrCat(s.value("version", ""),
                        s.value("image_ok", "") == "set" ? " confirmed" : " unconfirmed");
  };
  for (const auto& b : boards) {
    std::string last = b.contains("last_rollout")
                           ? absl::StrCat(b["last_rollout"].value("id", ""), " ",
                                          b["last_rollout"].value("version", ""), " ",
                                          b["last_rollout"].value("state", ""))
                           : "-";
    std::printf("%-16s %-10s %-10s %-26s %-26s %s\n", b.value("board", "").c_str(),
                b.value("kind", "").c_str(), b.value("running", "-").c_str(),
                slot(b.value("primary", json())).c_str(),
                slot(b.value("secondary", json())).c_str(), last.c_str());
  }
  return kExitOk;
}

int OtaCommands::List() {
  auto ch = ConnectChannel(g_);
  if (!ch.ok()) return Fail(g_, kExitUnreachable, std::string(ch.status().message()));
  auto stub = pb::Ota::NewStub(*ch);
  grpc::ClientContext ctx;
  pb::ListRolloutsRequest req;
  req.set_limit(limit_);
  pb::ListRolloutsResponse resp;
  auto st = stub->ListRollouts(&ctx, req, &resp);
  if (!st.ok()) return FailGrpc(g_, st);
  for (const auto& r : resp.rollouts()) {
    json j = json::parse(r.json(), nullptr, false);
    if (g_.json) {
      std::cout << j.dump() << "\n";
      continue;
    }
    int confirmed = 0, reverted = 0;
    const json boards = j.value("boards", json::object());
    for (const auto& [id, b] : boards.items()) {
      confirmed += b.value("state", "") == "confirmed";
      reverted += b.value("state", "") == "reverted" || b.value("state", "") == "rolled_back";
    }
    std::printf("%-24s %-11s %-10s %zu boards, %d confirmed, %d reverted\n",
                j.value("id", "").c_str(), j.value("state", "").c_str(),
                j.value("version", "").c_str(), boards.size(), confirmed, reverted);
  }
  return kExitOk;
}

}  // namespace fwai
