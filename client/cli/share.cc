#include "client/cli/share.h"

#include <grpcpp/grpcpp.h>

#include <iostream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/cli/auth.h"
#include "client/lib/client.h"
#include "fwai/v1/sessions.grpc.pb.h"

namespace fwai {

namespace pb = fwai::v1;

ShareCommands::ShareCommands(CLI::App& sessions, Globals& g) : g_(g) {
  share_ = sessions.add_subcommand(
      "share", "Let another user watch, answer, approve or drive a session of yours");
  share_->add_option("session", session_, "Session id")->required();
  share_
      ->add_option("user", user_,
                   "A user fwaid knows: a configured user, a local account, a token's user, "
                   "or role:user|ci|admin")
      ->required();
  share_
      ->add_option("--role", role_,
                   "watch (attach, history), answer (+ questions), approve (+ plans and edits), "
                   "drive (+ messages, cancel, mode)")
      ->check(CLI::IsMember({"watch", "answer", "approve", "drive"}));
  share_->add_option("--expires", expires_, "e.g. 8h, 30m, 2d (default: until unshared)");
  unshare_ = sessions.add_subcommand("unshare", "End a share of a session of yours");
  unshare_->add_option("session", session_, "Session id")->required();
  unshare_->add_option("user", user_, "The user it is shared with")->required();
}

std::optional<int> ShareCommands::RunIfParsed() {
  if (share_->parsed()) return Share();
  if (unshare_->parsed()) return Unshare();
  return std::nullopt;
}

int ShareCommands::Share() {
  pb::ShareSessionRequest req;
  req.set_session_id(session_);
  req.set_user(user_);
  req.set_role(role_);
  if (!expires_.empty()) {
    auto s = ParseDuration(expires_);
    if (!s || *s <= 0) {
      return Fail(g_, kExitUsage,
                  absl::StrCat("--expires: '", expires_, "' is not a duration such as 8h or 30m"));
    }
    req.set_expires_in_s(*s);
  }
  auto ch = ConnectChannel(g_);
  if (!ch.ok()) return Fail(g_, kExitUnreachable, std::string(ch.status().message()));
  pb::SessionShare out;
  grpc::ClientContext ctx;
  auto st = pb::Sessions::NewStub(*ch)->Share(&ctx, req, &out);
  if (!st.ok()) return FailGrpc(g_, st);
  if (g_.json) {
    std::cout << ProtoToJson(out).dump() << std::endl;
    return kExitOk;
  }
  std::cout << "session " << out.session_id() << " shared with " << out.user() << " ("
            << out.grantee() << ") to " << out.role();
  if (out.expires_us() != 0) {
    std::cout << " until "
              << absl::FormatTime("%Y-%m-%d %H:%M", absl::FromUnixMicros(out.expires_us()),
                                  absl::LocalTimeZone());
  }
  std::cout << std::endl;
  return kExitOk;
}

int ShareCommands::Unshare() {
  pb::UnshareSessionRequest req;
  req.set_session_id(session_);
  req.set_user(user_);
  auto ch = ConnectChannel(g_);
  if (!ch.ok()) return Fail(g_, kExitUnreachable, std::string(ch.status().message()));
  pb::UnshareSessionResponse out;
  grpc::ClientContext ctx;
  auto st = pb::Sessions::NewStub(*ch)->Unshare(&ctx, req, &out);
  if (!st.ok()) return FailGrpc(g_, st);
  if (!g_.json) std::cout << "session " << session_ << " no longer shared with " << user_ << "\n";
  return kExitOk;
}

}  // namespace fwai
