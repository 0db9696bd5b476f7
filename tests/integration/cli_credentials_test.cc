// The shared daemon's client credentials through the real fwai binary: an
// admin's token create / ls / revoke on the unix socket, and FWAI_TOKEN,
// --token-file, client certificates and fwai login / logout against a real
// TLS fwaid (material made with fwaid tls).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "client/lib/client.h"
#include "common/clock.h"
#include "fwai/v1/auth.grpc.pb.h"
#include "tests/integration/daemon_fixture.h"

namespace fwai::testing {
namespace {

namespace fs = std::filesystem;
namespace pb = fwai::v1;
using json = nlohmann::json;

struct Result {
  int rc = -1;
  std::string out, err;
};

bool FwaidTls(const std::vector<std::string>& args, std::string* err) {
  std::vector<std::string> argv = {std::string(FWAI_BIN_DIR) + "/fwaid", "tls"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::string out;
  return RunCommand(argv, &out, err) == 0;
}

// The line of `text` that starts with `prefix` ("" if none).
std::string LineStartingWith(const std::string& text, const std::string& prefix) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(prefix, 0) == 0) return line;
  }
  return "";
}

class CliCredentialsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_GT(fake_.Start(), 0);
    tmp_ = MakeTempDir("fwai-cli-cred-");
    home_ = tmp_ + "/home";
    fs::create_directories(home_);
    // The local default socket's directory cannot be made here: a command
    // that falls back to the local daemon fails instead of starting one.
    no_runtime_ = tmp_ + "/not-a-dir";
    std::ofstream(no_runtime_) << "a file\n";
  }
  void TearDown() override {
    d_.reset();
    fs::remove_all(tmp_);
  }

  // The real fwai, with HOME a temp dir and no FWAI_* of the caller's.
  Result Fwai(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
    std::vector<std::string> argv = {std::string(FWAI_BIN_DIR) + "/fwai"};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<std::string> e = {
        "HOME=" + home_, "XDG_CONFIG_HOME=", "XDG_RUNTIME_DIR=" + no_runtime_,
        "FWAI_DAEMON=",  "FWAI_TOKEN=",      "FWAI_CA_CERT="};
    e.insert(e.end(), env.begin(), env.end());
    Result r;
    r.rc = RunCommand(argv, &r.out, &r.err, e, 30);
    return r;
  }

  FakeLlmServer fake_;
  std::unique_ptr<Daemon> d_;
  std::string tmp_, home_, no_runtime_;
};

json Parse(const std::string& text) { return json::parse(text, nullptr, false); }

// A loopback port nothing listens on (bound, read, closed).
int FreeTcpPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  close(fd);
  return port;
}

TEST_F(CliCredentialsTest, TokensCertificatesAndLoginThroughTheRealCli) {
  const std::string tls = tmp_ + "/tls";
  std::string err;
  ASSERT_TRUE(FwaidTls({"init", tls, "--host", "localhost", "--host", "127.0.0.1"}, &err)) << err;
  ASSERT_TRUE(FwaidTls({"issue", tls, "--user", "carol"}, &err)) << err;
  const std::string ca = tls + "/ca.pem";
  d_ = std::make_unique<Daemon>(&fake_, "tls: {cert: " + tls + "/server.pem, key: " + tls +
                                            "/server.key, client_ca: " + ca +
                                            "}\nusers:\n  carol: {cert_subject: \"CN=carol\"}\n");
  d_->AddListen("tcp:127.0.0.1:0");
  ASSERT_TRUE(d_->Start()) << d_->log();
  ASSERT_GT(d_->TcpPort(), 0) << d_->log();
  const std::string lab = "tls:localhost:" + std::to_string(d_->TcpPort());
  const std::string admin = d_->address();  // the unix socket: its root peer is an admin
  const std::vector<std::string> lab_env = {"FWAI_DAEMON=" + lab, "FWAI_CA_CERT=" + ca};
  auto with = [](std::vector<std::string> env, const std::string& more) {
    env.push_back(more);
    return env;
  };

  // 1. An admin makes a token for dave (ci, one hour); it is listed.
  auto made = Fwai({"--daemon", admin, "token", "create", "dave", "--role", "ci", "--expires", "1h",
                    "--note", "cli-test", "--json"});
  ASSERT_EQ(made.rc, 0) << made.err;
  const json mj = Parse(made.out);
  ASSERT_TRUE(mj.is_object()) << made.out;
  const std::string token = mj.value("token", ""), id = mj.value("id", "");
  ASSERT_FALSE(token.empty()) << made.out;
  ASSERT_EQ(id.rfind("tk-", 0), 0u) << made.out;
  EXPECT_EQ(mj.value("user", ""), "dave");
  EXPECT_EQ(mj.value("role", ""), "ci");
  const int64_t now_us = std::chrono::duration_cast<std::chrono::microseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
  const int64_t expires_us = mj.value("expires_us", int64_t{0});
  EXPECT_LT(std::llabs(expires_us - now_us - int64_t{3600} * 1000000), int64_t{120} * 1000000)
      << "--expires 1h: " << made.out;
  {
    auto ls = Fwai({"--daemon", admin, "token", "ls", "--json"});
    ASSERT_EQ(ls.rc, 0) << ls.err;
    const json arr = Parse(ls.out);
    ASSERT_TRUE(arr.is_array()) << ls.out;
    json mine;
    for (const auto& t : arr) {
      if (t.value("id", "") == id) mine = t;
    }
    ASSERT_TRUE(mine.is_object()) << id << " not in " << ls.out;
    EXPECT_EQ(mine.value("user", ""), "dave");
    EXPECT_EQ(mine.value("role", ""), "ci");
    EXPECT_EQ(mine.value("expires_us", int64_t{0}), expires_us);
    EXPECT_EQ(mine.value("revoked_us", int64_t{-1}), 0);
    EXPECT_EQ(mine.value("note", ""), "cli-test");
    auto text = Fwai({"--daemon", admin, "token", "ls"});
    ASSERT_EQ(text.rc, 0) << text.err;
    const std::string line = LineStartingWith(text.out, id);
    ASSERT_FALSE(line.empty()) << text.out;
    EXPECT_NE(line.find(" dave "), std::string::npos) << line;
    EXPECT_NE(line.find(" ci "), std::string::npos) << line;
    EXPECT_NE(line.find(FormatLocalTime(expires_us, "%Y-%m-%d %H:%M")), std::string::npos) << line;
    EXPECT_NE(line.find(" valid "), std::string::npos) << line;
  }
  {
    auto bad = Fwai({"--daemon", admin, "token", "create", "eve", "--expires", "10parsecs"});
    EXPECT_EQ(bad.rc, 2) << bad.out;
    EXPECT_NE(bad.err.find("--expires 10parsecs: expected"), std::string::npos) << bad.err;
    auto ls = Fwai({"--daemon", admin, "token", "ls", "--json"});
    EXPECT_EQ(ls.out.find("\"eve\""), std::string::npos)
        << "a bad --expires made a token anyway: " << ls.out;
  }

  // 2. FWAI_TOKEN over TLS, the daemon checked against FWAI_CA_CERT.
  {
    auto who = Fwai({"whoami", "--json"}, with(lab_env, "FWAI_TOKEN=" + token));
    ASSERT_EQ(who.rc, 0) << who.err;
    const json w = Parse(who.out);
    EXPECT_EQ(w.value("principal", ""), "user:dave") << who.out;
    EXPECT_EQ(w.value("role", ""), "ci") << who.out;
    EXPECT_EQ(w.value("verified_by", ""), "token " + id) << who.out;
    EXPECT_EQ(w.value("token_id", ""), id) << who.out;
    EXPECT_EQ(w.value("token_expires_us", int64_t{0}), expires_us) << who.out;
    auto text = Fwai({"whoami"}, with(lab_env, "FWAI_TOKEN=" + token));
    ASSERT_EQ(text.rc, 0) << text.err;
    EXPECT_NE(text.out.find("you are     user:dave"), std::string::npos) << text.out;
    EXPECT_NE(text.out.find("verified by token " + id), std::string::npos) << text.out;
    // Without the token the daemon says what to give; without the CA the
    // daemon's certificate is not trusted.
    auto none = Fwai({"whoami"}, lab_env);
    EXPECT_EQ(none.rc, 1) << none.out;
    EXPECT_NE(none.err.find("no credentials: give a token"), std::string::npos) << none.err;
    auto no_ca = Fwai({"whoami"}, {"FWAI_DAEMON=" + lab, "FWAI_TOKEN=" + token});
    EXPECT_EQ(no_ca.rc, 3) << no_ca.out;
    EXPECT_NE(no_ca.err.find("cannot reach fwaid at localhost:"), std::string::npos) << no_ca.err;
  }

  // 3. --token-file: the same; it wins over FWAI_TOKEN; its mode is not
  // checked (only read); no token is taken from the command line.
  const std::string token_file = tmp_ + "/dave.token";
  std::ofstream(token_file) << token << "\n";
  fs::permissions(token_file, fs::perms::owner_read | fs::perms::owner_write);
  {
    auto who = Fwai({"--token-file", token_file, "whoami", "--json"}, lab_env);
    ASSERT_EQ(who.rc, 0) << who.err;
    EXPECT_EQ(Parse(who.out).value("principal", ""), "user:dave") << who.out;
    EXPECT_EQ(Parse(who.out).value("verified_by", ""), "token " + id) << who.out;
    // Every credential flag after the command, no environment at all.
    auto flags =
        Fwai({"whoami", "--daemon", lab, "--ca-cert", ca, "--token-file", token_file, "--json"});
    ASSERT_EQ(flags.rc, 0) << flags.err;
    EXPECT_EQ(Parse(flags.out).value("principal", ""), "user:dave") << flags.out;
    // The flag given wins over a stale token in the environment.
    auto over = Fwai({"--token-file", token_file, "whoami", "--json"},
                     with(lab_env, "FWAI_TOKEN=fwai_stalestale_" + std::string(43, 'A')));
    ASSERT_EQ(over.rc, 0) << "--token-file lost to FWAI_TOKEN: " << over.err;
    EXPECT_EQ(Parse(over.out).value("principal", ""), "user:dave") << over.out;
    // Group/world-readable: read all the same (the client documents no mode check).
    fs::permissions(token_file, fs::perms::owner_read | fs::perms::owner_write |
                                    fs::perms::group_read | fs::perms::others_read);
    auto open = Fwai({"--token-file", token_file, "whoami", "--json"}, lab_env);
    EXPECT_EQ(open.rc, 0) << open.err;
    EXPECT_EQ(Parse(open.out).value("principal", ""), "user:dave") << open.out;
    fs::permissions(token_file, fs::perms::owner_read | fs::perms::owner_write);
    // A file that is not there, or empty, is named.
    auto missing = Fwai({"--token-file", tmp_ + "/none.token", "whoami"}, lab_env);
    EXPECT_NE(missing.rc, 0);
    EXPECT_NE(missing.err.find("--token-file " + tmp_ + "/none.token: cannot be read"),
              std::string::npos)
        << missing.err;
    std::ofstream(tmp_ + "/empty.token") << "\n";
    auto empty = Fwai({"--token-file", tmp_ + "/empty.token", "whoami"}, lab_env);
    EXPECT_NE(empty.rc, 0);
    EXPECT_NE(empty.err.find("--token-file " + tmp_ + "/empty.token: empty"), std::string::npos)
        << empty.err;
    // There is no --token flag, before or after the command.
    for (const auto& args : {std::vector<std::string>{"--token", token, "whoami"},
                             std::vector<std::string>{"whoami", "--token", token}}) {
      auto flag = Fwai(args, lab_env);
      EXPECT_EQ(flag.rc, 2) << flag.out;
      EXPECT_NE(flag.err.find("--token"), std::string::npos) << flag.err;
      EXPECT_EQ(flag.out.find("user:dave"), std::string::npos) << flag.out;
    }
  }

  // 4. mTLS: carol's certificate maps to user carol.
  {
    auto who = Fwai({"--client-cert", tls + "/carol.pem", "--client-key", tls + "/carol.key",
                     "whoami", "--json"},
                    lab_env);
    ASSERT_EQ(who.rc, 0) << who.err;
    const json w = Parse(who.out);
    EXPECT_EQ(w.value("principal", ""), "user:carol") << who.out;
    EXPECT_EQ(w.value("verified_by", "").rfind("client certificate ", 0), 0u) << who.out;
    EXPECT_NE(w.value("verified_by", "").find("CN=carol"), std::string::npos) << who.out;
    EXPECT_EQ(w.value("token_id", ""), "") << who.out;
    auto half = Fwai({"--client-cert", tls + "/carol.pem", "whoami"}, lab_env);
    EXPECT_NE(half.rc, 0) << half.out;
    EXPECT_NE(half.err.find("--client-cert and --client-key go together"), std::string::npos)
        << half.err;
  }

  // 5. fwai login stores the daemon and credentials (0600); later commands
  // with no flags and no FWAI_* use them; fwai logout forgets them.
  const std::string profile = home_ + "/.config/fwai/login.json";
  {
    auto nothing = Fwai({"login", lab, "--ca-cert", ca});
    EXPECT_EQ(nothing.rc, 2) << nothing.out;
    EXPECT_NE(nothing.err.find("login needs a token"), std::string::npos) << nothing.err;
    EXPECT_FALSE(fs::exists(profile));

    auto login = Fwai({"login", lab, "--token-file", token_file, "--ca-cert", ca, "--json"});
    ASSERT_EQ(login.rc, 0) << login.err;
    const json l = Parse(login.out);
    EXPECT_EQ(l.value("principal", ""), "user:dave") << login.out;
    EXPECT_EQ(l.value("profile", ""), profile) << login.out;
    struct stat st {};
    ASSERT_EQ(stat(profile.c_str(), &st), 0) << profile;
    EXPECT_EQ(st.st_mode & 0777, 0600u) << "the profile holds a token";
    ASSERT_EQ(stat((home_ + "/.config/fwai").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0077, 0u) << "the profile's directory is its owner's";
    std::ifstream in(profile);
    const json p = json::parse(in, nullptr, false);
    EXPECT_EQ(p.value("daemon", ""), lab);
    EXPECT_EQ(p.value("ca_cert", ""), ca);
    EXPECT_EQ(p.value("token", ""), token);

    auto later = Fwai({"whoami", "--json"});
    ASSERT_EQ(later.rc, 0) << "whoami did not use the login: " << later.err;
    EXPECT_EQ(Parse(later.out).value("principal", ""), "user:dave") << later.out;
    EXPECT_EQ(Parse(later.out).value("verified_by", ""), "token " + id) << later.out;

    auto logout = Fwai({"logout"});
    EXPECT_EQ(logout.rc, 0) << logout.err;
    EXPECT_NE(logout.out.find("logged out"), std::string::npos) << logout.out;
    EXPECT_FALSE(fs::exists(profile)) << "logout left " << profile;
    // Back to the local default socket, which cannot be started here: the
    // lab daemon is not reached and the failure names where it looked.
    auto after = Fwai({"whoami"});
    EXPECT_EQ(after.rc, 3) << after.out;
    EXPECT_EQ(after.out.find("user:dave"), std::string::npos) << after.out;
    EXPECT_NE(after.err.find("fwai: "), std::string::npos) << after.err;
    EXPECT_NE(after.err.find(no_runtime_), std::string::npos) << after.err;
  }

  // 6. Revoked: the lease the token took ends with it, and the next call
  // with the token is refused, saying so.
  {
    const auto as_dave = with(lab_env, "FWAI_TOKEN=" + token);
    auto lease = Fwai({"hw", "lease", "sim-stm32vl", "--ttl", "600"}, as_dave);
    ASSERT_EQ(lease.rc, 0) << lease.err;
    auto held = Fwai({"hw", "who"}, as_dave);
    ASSERT_EQ(held.rc, 0) << held.err;
    EXPECT_NE(LineStartingWith(held.out, "sim-stm32vl").find("token " + id), std::string::npos)
        << held.out;
    EXPECT_NE(held.out.find("ends at once when that token is revoked"), std::string::npos)
        << held.out;
    auto revoke = Fwai({"--daemon", admin, "token", "revoke", id});
    ASSERT_EQ(revoke.rc, 0) << revoke.err;
    EXPECT_NE(revoke.out.find("revoked " + id), std::string::npos) << revoke.out;
    EXPECT_NE(revoke.out.find("on sim-stm32vl held by dave"), std::string::npos) << revoke.out;
    EXPECT_NE(revoke.out.find("ended; the board is free"), std::string::npos) << revoke.out;
    auto after = Fwai({"--daemon", admin, "hw", "who"});
    EXPECT_NE(after.out.find("no leases"), std::string::npos) << after.out;
    for (const auto& how : {std::vector<std::string>{"whoami"},
                            std::vector<std::string>{"--token-file", token_file, "whoami"}}) {
      auto who = Fwai(how, with(lab_env, how.size() == 1 ? "FWAI_TOKEN=" + token : "FWAI_TOKEN="));
      EXPECT_EQ(who.rc, 1) << who.out;
      EXPECT_NE(who.err.find("token " + id + " was revoked"), std::string::npos) << who.err;
      EXPECT_EQ(who.out.find("user:dave"), std::string::npos) << who.out;
    }
    // The status under the CLI's message is UNAUTHENTICATED.
    auto addr = ResolveDaemonAddress(lab);
    ASSERT_TRUE(addr.ok());
    auto ch = ConnectToDaemon(*addr, false, 5000, Credentials{ca, "", "", token});
    ASSERT_TRUE(ch.ok()) << ch.status();
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    pb::WhoAmIResponse r;
    auto st = pb::Auth::NewStub(*ch)->WhoAmI(&ctx, pb::WhoAmIRequest(), &r);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();
    EXPECT_NE(st.error_message().find("was revoked"), std::string::npos) << st.error_message();
    auto ls = Fwai({"--daemon", admin, "token", "ls"});
    EXPECT_NE(LineStartingWith(ls.out, id).find(" revoked "), std::string::npos) << ls.out;
  }
}

// Each way a tls: daemon cannot be reached is said with what to change, and
// gRPC's own log lines stay out of it unless --verbose asks for them.
TEST_F(CliCredentialsTest, ADaemonThatCannotBeReachedIsSaidWithWhatToChange) {
  // fwaid's certificate names localhost only; `wrong` is another lab's CA.
  const std::string tls = tmp_ + "/tls", wrong_ca = tmp_ + "/other/ca.pem";
  std::string err;
  ASSERT_TRUE(FwaidTls({"init", tls, "--host", "localhost"}, &err)) << err;
  ASSERT_TRUE(FwaidTls({"init", tmp_ + "/other", "--host", "localhost"}, &err)) << err;
  const std::string ca = tls + "/ca.pem";
  d_ = std::make_unique<Daemon>(
      &fake_, "tls: {cert: " + tls + "/server.pem, key: " + tls + "/server.key}\n");
  d_->AddListen("tcp:127.0.0.1:0");
  ASSERT_TRUE(d_->Start()) << d_->log();
  const std::string port = std::to_string(d_->TcpPort());
  auto no_grpc_lines = [](const std::string& text) {
    return text.find("ssl_transport_security") == std::string::npos &&
           text.find("Handshake failed") == std::string::npos;
  };

  // Another CA than the one that issued fwaid's certificate.
  auto wrong = Fwai({"whoami", "--daemon", "tls:localhost:" + port, "--ca-cert", wrong_ca});
  EXPECT_EQ(wrong.rc, 3) << wrong.out;
  EXPECT_NE(wrong.err.find("cannot reach fwaid at localhost:" + port +
                           ": fwaid answered at localhost:" + port +
                           ", but its certificate is not trusted by the CA in " + wrong_ca),
            std::string::npos)
      << wrong.err;
  EXPECT_NE(wrong.err.find("with --ca-cert FILE or FWAI_CA_CERT"), std::string::npos) << wrong.err;
  EXPECT_TRUE(no_grpc_lines(wrong.err)) << wrong.err;
  // No CA given: the system's CAs, said as such.
  auto none = Fwai({"whoami", "--daemon", "tls:localhost:" + port});
  EXPECT_EQ(none.rc, 3) << none.out;
  EXPECT_NE(
      none.err.find("not trusted by the system's CAs (no --ca-cert or FWAI_CA_CERT was given)"),
      std::string::npos)
      << none.err;
  // --verbose: gRPC's own account as well.
  auto verbose = Fwai({"--verbose", "whoami", "--daemon", "tls:localhost:" + port});
  EXPECT_EQ(verbose.rc, 3) << verbose.out;
  EXPECT_FALSE(no_grpc_lines(verbose.err)) << "--verbose kept gRPC's lines out:\n" << verbose.err;
  // The right CA, but an address the certificate does not name.
  auto by_ip = Fwai({"whoami", "--daemon", "tls:127.0.0.1:" + port, "--ca-cert", ca});
  EXPECT_EQ(by_ip.rc, 3) << by_ip.out;
  EXPECT_NE(
      by_ip.err.find("fwaid's certificate at 127.0.0.1:" + port + " is not issued for 127.0.0.1"),
      std::string::npos)
      << by_ip.err;
  // Nothing listening.
  const std::string free_port = std::to_string(FreeTcpPort());
  auto nothing = Fwai({"whoami", "--daemon", "tls:127.0.0.1:" + free_port, "--ca-cert", ca});
  EXPECT_EQ(nothing.rc, 3) << nothing.out;
  EXPECT_NE(nothing.err.find("nothing listens at 127.0.0.1:" + free_port + " (connection refused)"),
            std::string::npos)
      << nothing.err;
  // Said within about a second, and said cleanly every time: the process
  // ends while gRPC may still be reconnecting (its exit once crashed there).
  for (int i = 0; i < 10; ++i) {
    auto again = Fwai({"whoami", "--daemon", "tls:127.0.0.1:" + free_port, "--ca-cert", ca});
    ASSERT_EQ(again.rc, 3) << "run " << i << ": " << again.err;
  }
  // The right CA and name: through, and refused only for want of a token.
  auto right = Fwai({"whoami", "--daemon", "tls:localhost:" + port, "--ca-cert", ca});
  EXPECT_EQ(right.rc, 1) << right.err;
  EXPECT_NE(right.err.find("no credentials: give a token"), std::string::npos) << right.err;
}

}  // namespace
}  // namespace fwai::testing
