// minisign signatures and plugin manifests (the install path is tested
// end to end with the minisign program in tests/e2e/plugin_test.cc).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/minisign.h"
#include "server/plugins/plugin_store.h"
#include "tests/integration/daemon_fixture.h"

namespace fwai {
namespace {

namespace fs = std::filesystem;

TEST(MinisignTest, SignsAndVerifiesAndCatchesChanges) {
  auto kp = minisign::GenerateKeyPair();
  ASSERT_TRUE(kp.ok());
  auto sk = minisign::ParseSecretKey(kp->secret_file, nullptr);
  ASSERT_TRUE(sk.ok()) << sk.status();
  auto pk = minisign::ParsePublicKey(kp->public_file);
  ASSERT_TRUE(pk.ok()) << pk.status();
  EXPECT_EQ(pk->KeyIdHex(), kp->public_key.KeyIdHex());
  auto sig = minisign::Sign(*sk, "hello", "timestamp:1\tfile:x");
  ASSERT_TRUE(sig.ok());
  auto v = minisign::Verify(*sig, "hello", *pk);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_TRUE(v->prehashed);
  EXPECT_EQ(v->trusted_comment, "timestamp:1\tfile:x");
  EXPECT_EQ(minisign::Verify(*sig, "hellO", *pk).status().code(),
            absl::StatusCode::kPermissionDenied);
  // A changed trusted comment breaks the global signature.
  std::string forged = *sig;
  forged.replace(forged.find("timestamp:1"), 11, "timestamp:2");
  EXPECT_EQ(minisign::Verify(forged, "hello", *pk).status().code(),
            absl::StatusCode::kPermissionDenied);
  auto other = minisign::GenerateKeyPair();
  EXPECT_FALSE(minisign::Verify(*sig, "hello", other->public_key).ok());
  EXPECT_EQ(minisign::ParsePublicKey("untrusted comment: x\nnot base64!").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PluginManifestTest, FieldsAreCheckedByName) {
  auto bad = [](const std::string& text) {
    return std::string(ParsePluginManifest(text, "m.json").status().message());
  };
  EXPECT_NE(bad(R"({"name":"Bad Name","version":"1","files":{}})").find("name"), std::string::npos);
  EXPECT_NE(bad(R"({"name":"p","files":{}})").find("version: required"), std::string::npos);
  EXPECT_NE(bad(R"({"name":"p","version":"1","files":{"../x":"00"}})").find("not a relative path"),
            std::string::npos);
  EXPECT_NE(bad(R"({"name":"p","version":"1","skills":["s.yaml"],"files":{}})")
                .find("declared but not in files"),
            std::string::npos);
  EXPECT_NE(bad(R"({"name":"p","version":"1","capabilities":{"flash":true},"files":{}})")
                .find("capabilities.boards"),
            std::string::npos);
  EXPECT_NE(bad(R"({"name":"p","version":"1","capabilities":{"root":true},"files":{}})")
                .find("capabilities.root"),
            std::string::npos);
  EXPECT_NE(bad(R"({"name":"p","version":"1","bogus":1,"files":{}})").find("bogus: unknown field"),
            std::string::npos);
  auto ok = ParsePluginManifest(
      R"({"name":"p","version":"1.0","skills":["s.yaml"],"capabilities":{"flash":true,"boards":["sim"]},
          "files":{"s.yaml":"0000000000000000000000000000000000000000000000000000000000000000"}})",
      "m.json");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(ok->capabilities.flash);
  EXPECT_EQ(ok->capabilities.boards, std::vector<std::string>{"sim"});
}

TEST(PluginManifestTest, CheckFindsChangedMissingAndExtraFiles) {
  const std::string dir = testing::MakeTempDir("plugincheck");
  std::ofstream(dir + "/a.txt") << "a";
  std::ofstream(dir + "/b.txt") << "b";
  // sha256("a") and a wrong hash for b; c is missing; extra.txt is not listed.
  auto m = ParsePluginManifest(
      R"({"name":"p","version":"1","files":{
        "a.txt":"ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb",
        "b.txt":"0000000000000000000000000000000000000000000000000000000000000000",
        "c.txt":"0000000000000000000000000000000000000000000000000000000000000000"}})",
      "m.json");
  ASSERT_TRUE(m.ok()) << m.status();
  std::ofstream(dir + "/extra.txt") << "x";
  auto c = CheckPluginDir(dir, *m, {});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->modified, std::vector<std::string>{"b.txt"});
  EXPECT_EQ(c->missing, std::vector<std::string>{"c.txt"});
  EXPECT_EQ(c->extra, std::vector<std::string>{"extra.txt"});
  EXPECT_EQ(c->signature, "unsigned");
  EXPECT_TRUE(c->tampered());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace fwai
