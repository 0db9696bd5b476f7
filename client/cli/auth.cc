#include "client/cli/auth.h"

#include <iostream>
#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/lib/client.h"
#include "common/clock.h"
#include "fwai/v1/auth.grpc.pb.h"

namespace fwai {

namespace pb = ::fwai::v1;
using json = nlohmann::json;

std::optional<int64_t> ParseDuration(const std::string& text) {
  if (text.empty() || text == "never") return 0;
  int64_t unit = 1;
  std::string num = text;
  switch (text.back()) {
    case 's':
      unit = 1;
      break;
    case 'm':
      unit = 60;
      break;
    case 'h':
      unit = 3600;
      break;
    case 'd':
      unit = 86400;
      break;
    case 'w':
      unit = 7 * 86400;
      break;
    default:
      unit = 0;
  }
  if (unit != 0) {
    num = text.substr(0, text.size() - 1);
  } else {
    unit = 1;
  }
  int64_t n = 0;
  if (!absl::SimpleAtoi(num, &n) || n < 0) return std::nullopt;
  return n * unit;
}

AuthCommands::AuthCommands(CLI::App& app, Globals& g) : g_(g) {
  whoami_ =
      app.add_subcommand("whoami", "Who the daemon takes you for, how it knows, and your role");
  auto* token = app.add_subcommand("token", "Bearer tokens of a shared daemon (admins)");
  token->require_subcommand(1);
  create_ = token->add_subcommand("create", "Make a token for USER; it is printed once");
  create_->add_option("user", user_, "Who the token is for")->required();
  create_->add_option("--role", role_, "admin | user | ci (default user)")
      ->check(CLI::IsMember({"admin", "user", "ci"}));
  create_->add_option("--expires", expires_,
                      "Lifetime: 90d, 12h, 30m, 2w, or seconds (default: never)");
  create_->add_option("--note", note_, "What the token is for (shown in token ls)");
  ls_ = token->add_subcommand("ls", "Every token: user, role, expiry, revocation");
  revoke_ = token->add_subcommand("revoke", "Refuse the token from now on (its open streams end)");
  revoke_->add_option("id", id_, "The token's id (tk-...)")->required();
  login_ = app.add_subcommand("login", "Remember a daemon and its credentials for later commands");
  login_->add_option("daemon", login_daemon_, "tls:HOST:PORT (or tcp:127.0.0.1:PORT)")->required();
  logout_ = app.add_subcommand("logout", "Forget what fwai login stored");
}

std::optional<int> AuthCommands::RunIfParsed() {
  if (whoami_->parsed()) return WhoAmI();
  if (create_->parsed()) return TokenCreate();
  if (ls_->parsed()) return TokenList();
  if (revoke_->parsed()) return TokenRevoke();
  if (login_->parsed()) return Login();
  if (logout_->parsed()) return Logout();
  return std::nullopt;
}

int AuthCommands::WhoAmI() {
  auto ch = ConnectChannel(g_);
  if (!ch.ok()) return Fail(g_, kExitUnreachable, std::string(ch.status().message()));
  grpc::ClientContext ctx;
  pb::WhoAmIResponse r;
  auto st = pb::Auth::NewStub(*ch)->WhoAmI(&ctx, pb::WhoAmIRequest(), &r);
  if (!st.ok()) return FailGrpc(g_, st);
  if (g_.json) {
    std::cout << ProtoToJson(r).dump() << std::endl;
    return kExitOk;
  }
  std::printf("you are     %s (%s)\n", r.principal().c_str(), r.user().c_str());
  std::printf("role        %s\n", r.role().c_str());
  std::printf("verified by %s\n", r.verified_by().c_str());
  if (!r.token_id().empty() && r.token_expires_us() > 0) {
    std::printf("token       %s, expires %s\n", r.token_id().c_str(),
                FormatLocalTime(r.token_expires_us()).c_str());
  }
  if (r.file_access()) {
    std::printf("acts as     local account %s (project files and commands)\n",
                r.local_account().c_str());
  } else {
    std::printf("acts as     nobody: no project files or commands (%s)\n",
                r.no_file_access_reason().c_str());
  }
  if (!r.has_limits()) {
    std::printf("limits      none (%s)\n", r.role().c_str());
  } else {
    const auto& l = r.limits();
    std::printf(
        "limits      %lld sessions, %lld running turns, %lld skill runs, %lld leases of at most "
        "%lld s, "
        "%lld MB ingested an hour, %g requests/s (bursts of %lld)\n",
        static_cast<long long>(l.sessions()), static_cast<long long>(l.running_turns()),
        static_cast<long long>(l.running_runs()), static_cast<long long>(l.leases()),
        static_cast<long long>(l.lease_ttl_max_s()), static_cast<long long>(l.ingest_mb_per_hour()),
        l.requests_per_second(), static_cast<long long>(l.burst()));
  }
  return kExitOk;
}

int AuthCommands::TokenCreate() {
  auto ttl = ParseDuration(expires_);
  if (!ttl)
    return Fail(g_, kExitUsage,
                absl::StrCat("--expires ", expires_, ": expected e.g. 90d, 12h, 30m or seconds"));
  auto ch = ConnectChannel(g_);
  if (!ch.ok()) return Fail(g_, kExitUnreachable, std::string(ch.status().message()));
  grpc::ClientContext ctx;
  pb::CreateTokenRequest req;
  req.set_user(user_);
  req.set_role(role_);
  req.set_expires_in_s(*ttl);
  req.set_note(note_);
  pb::CreateTokenResponse r;
  auto st = pb::Auth::NewStub(*ch)->CreateToken(&ctx, req, &r);
  if (!st.ok()) return FailGrpc(g_, st);
  if (g_.json) {
    std::cout << json{{"token", r.token()},
                      {"id", r.info().id()},
                      {"user", r.info().user()},
                      {"role", r.info().role()},
                      {"expires_us", r.info().expires_us()}}
                     .dump()
              << std::endl;
    return kExitOk;
  }
  std::cout << r.token() << std::endl;
  std::cerr << "token " << r.info().id() << " for " << r.info().user() << " (" << r.info().role()
            << ")"
            << (r.info().expires_us() > 0 ? ", expires " + FormatLocalTime(r.info().expires_us())
                                          : ", never expires")
            << ". It is shown this once: keep it in a file (mode 0600) and use FWAI_TOKEN or "
               "--token-file."
            << std::endl;
  return kExitOk;
}

int AuthCommands::TokenList() {
  auto ch = ConnectChannel(g_);
  if (!ch.ok()) return Fail(g_, kExitUnreachable, std::string(ch.status().message()));
  grpc::ClientContext ctx;
  pb::ListTokensResponse r;
  auto st = pb::Auth::NewStub(*ch)->ListTokens(&ctx, pb::ListTokensRequest(), &r);
  if (!st.ok()) return FailGrpc(g_, st);
  if (g_.json) {
    json arr = json::array();
    for (const auto& t : r.tokens()) arr.push_back(ProtoToJson(t));
    std::cout << arr.dump() << std::endl;
    return kExitOk;
  }
  std::printf("%-16s %-14s %-6s %-17s %-17s %s\n", "ID", "USER", "ROLE", "EXPIRES", "STATE",
              "NOTE");
  const int64_t now = NowMicros();
  for (const auto& t : r.tokens()) {
    std::string state = t.revoked_us() > 0
                            ? "revoked " + FormatLocalTime(t.revoked_us(), "%m-%d %H:%M")
                        : t.expires_us() > 0 && t.expires_us() <= now ? std::string("expired")
                                                                      : std::string("valid");
    std::printf(
        "%-16s %-14s %-6s %-17s %-17s %s\n", t.id().c_str(), t.user().c_str(), t.role().c_str(),
        t.expires_us() > 0 ? FormatLocalTime(t.expires_us(), "%Y-%m-%d %H:%M").c_str() : "never",
        state.c_str(), t.note().c_str());
  }
  return kExitOk;
}

int AuthCommands::TokenRevoke() {
  auto ch = ConnectChannel(g_);
  if (!ch.ok()) return Fail(g_, kExitUnreachable, std::string(ch.status().message()));
  grpc::ClientContext ctx;
  pb::RevokeTokenRequest req;
  req.set_id(id_);
  pb::RevokeTokenResponse r;
  auto st = pb::Auth::NewStub(*ch)->RevokeToken(&ctx, req, &r);
  if (!st.ok()) return FailGrpc(g_, st);
  if (g_.json) {
    json ended = json::array();
    for (const auto& l : r.leases_ended()) {
      ended.push_back({{"lease_id", l.lease_id()},
                       {"device_id", l.device_id()},
                       {"holder", l.holder()},
                       {"node", l.node()}});
    }
    std::cout << json{{"revoked", id_}, {"leases_ended", ended}}.dump() << std::endl;
  } else {
    std::cout << "revoked " << id_ << std::endl;
    for (const auto& l : r.leases_ended()) {
      std::cout << "  its lease " << l.lease_id() << " on " << l.device_id()
                << (l.node().empty() ? "" : " (node " + l.node() + ")") << " held by " << l.holder()
                << " ended; the board is free" << std::endl;
    }
  }
  return kExitOk;
}

int AuthCommands::Login() {
  auto addr = ResolveDaemonAddress(login_daemon_);
  if (!addr.ok()) return Fail(g_, kExitUsage, std::string(addr.status().message()));
  if (!addr->unix_path.empty())
    return Fail(g_, kExitUsage,
                "login is for TCP daemons (tls:HOST:PORT); a unix socket knows you by your uid");
  auto creds = ResolveCredentials(*addr, g_.credentials);
  if (!creds.ok()) return Fail(g_, kExitUsage, std::string(creds.status().message()));
  if (creds->token.empty() && creds->client_cert.empty()) {
    return Fail(g_, kExitUsage,
                "login needs a token (--token-file FILE or FWAI_TOKEN) or a client certificate");
  }
  // Absolute paths: later commands run from anywhere.
  for (std::string* p : {&creds->ca_cert, &creds->client_cert, &creds->client_key}) {
    std::error_code ec;
    if (!p->empty()) *p = std::filesystem::absolute(*p, ec).string();
  }
  auto ch = ConnectToDaemon(*addr, false, 5000, *creds);
  if (!ch.ok()) return Fail(g_, kExitUnreachable, std::string(ch.status().message()));
  grpc::ClientContext ctx;
  pb::WhoAmIResponse who;
  auto st = pb::Auth::NewStub(*ch)->WhoAmI(&ctx, pb::WhoAmIRequest(), &who);
  if (!st.ok()) return FailGrpc(g_, st);
  if (auto s = SaveLogin({login_daemon_, *creds}); !s.ok())
    return Fail(g_, kExitError, std::string(s.message()));
  if (g_.json) {
    std::cout << json{{"daemon", login_daemon_},
                      {"principal", who.principal()},
                      {"role", who.role()},
                      {"profile", LoginProfilePath()}}
                     .dump()
              << std::endl;
  } else {
    std::cout << "logged in to " << login_daemon_ << " as " << who.principal() << " (" << who.role()
              << "); stored in " << LoginProfilePath() << " (mode 0600). fwai logout forgets it."
              << std::endl;
  }
  return kExitOk;
}

int AuthCommands::Logout() {
  (void)RemoveLogin();
  if (!g_.json) std::cout << "logged out (" << LoginProfilePath() << " removed)" << std::endl;
  return kExitOk;
}

}  // namespace fwai
