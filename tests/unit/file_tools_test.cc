#include <gtest/gtest.h>
#include <unistd.h>

#include "common/local_account.h"

#include <filesystem>
#include <fstream>

#include <sstream>

#include "server/tools/process_runner.h"
#include "server/tools/tool.h"

namespace fwai {
namespace {

namespace fs = std::filesystem;

class FileToolsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string t = (fs::temp_directory_path() / "fwai-tools-XXXXXX").string();
    base_ = mkdtemp(t.data());
    root_ = fs::canonical(base_).string() + "/proj";
    fs::create_directories(root_ + "/src/drivers");
    fs::create_directories(root_ + "/.git");
    Write(root_ + "/src/main.c", "int main(void) {\n  RCC->AHB2ENR |= 1;\n  return 0;\n}\n");
    Write(root_ + "/src/drivers/uart.c", "void uart_init(void) { USART1->BRR = 0x45; }\n");
    Write(root_ + "/README.md", "hello\n");
    Write(root_ + "/.git/config", "RCC secret\n");
    Write(base_ + "/secret.txt", "top secret\n");
    fs::create_symlink(base_ + "/secret.txt", root_ + "/escape.txt");
    RegisterFileTools(registry_);
    limits_.read_file_max_bytes = 1024;
    ctx_.project_root = root_;
    ctx_.account = &me_;
    ctx_.limits = &limits_;
    ctx_.cancel = &cancel_;
  }
  void TearDown() override { fs::remove_all(base_); }
  static void Write(const std::string& p, const std::string& s) { std::ofstream(p) << s; }
  ToolResult Run(const std::string& tool, const nlohmann::json& in) {
    return registry_.Find(tool)->Run(in, ctx_);
  }

  std::string base_, root_;
  ToolRegistry registry_;
  ToolsConfig limits_;
  CancelToken cancel_;
  ToolContext ctx_;
  LocalAccount me_ = *LookupAccount(getuid());
};

TEST_F(FileToolsTest, ReadFileWithRanges) {
  auto r = Run("read_file", {{"path", "src/main.c"}, {"offset", 2}, {"limit", 1}});
  ASSERT_FALSE(r.is_error) << r.content;
  EXPECT_NE(r.content.find("2\t  RCC->AHB2ENR |= 1;"), std::string::npos) << r.content;
  EXPECT_EQ(r.content.find("int main"), std::string::npos);
  EXPECT_NE(r.content.find("offset=3"), std::string::npos);
}

TEST_F(FileToolsTest, NoEscapeFromProjectRoot) {
  for (const std::string p : {"../secret.txt", "/etc/passwd", "escape.txt", "src/../../secret.txt"}) {
    auto r = Run("read_file", {{"path", p}});
    EXPECT_TRUE(r.is_error) << p;
    EXPECT_NE(r.content.find("outside the project root"), std::string::npos) << p << ": " << r.content;
  }
  EXPECT_TRUE(Run("list_dir", {{"path", ".."}}).is_error);
  EXPECT_TRUE(Run("grep", {{"pattern", "secret"}, {"path", "../"}}).is_error);
  auto g = Run("grep", {{"pattern", "secret"}});
  EXPECT_EQ(g.content, "no matches\n");  // neither the link target nor .git
}

TEST_F(FileToolsTest, ReadFileSizeCapTruncates) {
  std::string big;
  for (int i = 0; i < 200; ++i) big += "line of text number " + std::to_string(i) + "\n";
  Write(root_ + "/big.txt", big);
  auto r = Run("read_file", {{"path", "big.txt"}});
  ASSERT_FALSE(r.is_error);
  EXPECT_LE(r.content.size(), 1200u);
  EXPECT_NE(r.content.find("truncated"), std::string::npos);
}

TEST_F(FileToolsTest, GrepRegexPathFilterAndCap) {
  auto r = Run("grep", {{"pattern", "(RCC|USART)[0-9]*->"}, {"include", "**/*.c"}});
  ASSERT_FALSE(r.is_error) << r.content;
  EXPECT_NE(r.content.find("src/main.c:2:"), std::string::npos) << r.content;
  EXPECT_NE(r.content.find("src/drivers/uart.c:1:"), std::string::npos);
  auto capped = Run("grep", {{"pattern", "."}, {"max_results", 1}});
  EXPECT_NE(capped.content.find("more matches"), std::string::npos);
  auto bad = Run("grep", {{"pattern", "(unclosed"}});
  EXPECT_TRUE(bad.is_error);
  EXPECT_NE(bad.content.find("invalid regular expression"), std::string::npos);
}

TEST_F(FileToolsTest, GlobAndListDir) {
  auto g = Run("glob", {{"pattern", "src/**/*.c"}});
  EXPECT_EQ(g.content, "src/drivers/uart.c\nsrc/main.c\n");
  auto top = Run("glob", {{"pattern", "*.md"}});
  EXPECT_EQ(top.content, "README.md\n");
  auto l = Run("list_dir", {});
  EXPECT_NE(l.content.find("src/"), std::string::npos);
  EXPECT_NE(l.content.find("README.md"), std::string::npos);
}

}  // namespace
}  // namespace fwai

namespace fwai {
namespace {

class WriteToolsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string t = (fs::temp_directory_path() / "fwai-wtools-XXXXXX").string();
    base_ = mkdtemp(t.data());
    root_ = fs::canonical(base_).string() + "/proj";
    fs::create_directories(root_ + "/src");
    std::ofstream(root_ + "/src/main.c") << "int a = 1;\nint b = 1;\nint c = 2;\n";
    RegisterWriteTools(registry_);
    ctx_.project_root = root_;
    ctx_.account = &me_;
    ctx_.cancel = &cancel_;
  }
  void TearDown() override { fs::remove_all(base_); }
  ToolResult Run(const std::string& tool, const nlohmann::json& in) { return registry_.Find(tool)->Run(in, ctx_); }
  static std::string Read(const std::string& p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  std::string base_, root_;
  ToolRegistry registry_;
  CancelToken cancel_;
  ToolContext ctx_;
  LocalAccount me_ = *LookupAccount(getuid());
};

TEST_F(WriteToolsTest, WriteAndEditWithExactUniqueMatchesAndDiffs) {
  auto w = Run("write_file", {{"path", "src/new/uart.c"}, {"content", "void uart_init(void);\n"}});
  EXPECT_FALSE(w.is_error) << w.content;
  EXPECT_NE(w.content.find("created src/new/uart.c"), std::string::npos) << w.content;
  EXPECT_EQ(Read(root_ + "/src/new/uart.c"), "void uart_init(void);\n");
  EXPECT_TRUE(Run("write_file", {{"path", "../outside.c"}, {"content", "x"}}).is_error);
  EXPECT_FALSE(fs::exists(base_ + "/outside.c"));

  auto twice = Run("edit_file", {{"path", "src/main.c"}, {"old_string", "= 1;"}, {"new_string", "= 3;"}});
  EXPECT_TRUE(twice.is_error);
  EXPECT_NE(twice.content.find("occurs 2 times"), std::string::npos) << twice.content;
  auto missing = Run("edit_file", {{"path", "src/main.c"}, {"old_string", "int d"}, {"new_string", "int e"}});
  EXPECT_TRUE(missing.is_error);
  EXPECT_NE(missing.content.find("not found"), std::string::npos);
  auto one = Run("edit_file", {{"path", "src/main.c"}, {"old_string", "int b = 1;"}, {"new_string", "int b = 5;"}});
  EXPECT_FALSE(one.is_error) << one.content;
  EXPECT_NE(one.content.find("-int b = 1;"), std::string::npos) << one.content;
  EXPECT_NE(one.content.find("+int b = 5;"), std::string::npos) << one.content;
  EXPECT_NE(one.content.find("@@ -2,1 +2,1 @@"), std::string::npos) << one.content;
  EXPECT_EQ(Read(root_ + "/src/main.c"), "int a = 1;\nint b = 5;\nint c = 2;\n");
  auto all = Run("edit_file", {{"path", "src/main.c"}, {"old_string", "int"}, {"new_string", "long"}, {"replace_all", true}});
  EXPECT_FALSE(all.is_error);
  EXPECT_EQ(Read(root_ + "/src/main.c"), "long a = 1;\nlong b = 5;\nlong c = 2;\n");
}

TEST_F(WriteToolsTest, PolicyRefusalsAreToolErrorsWithTheRule) {
  ctx_.policy = [](const PolicyQuery& q) -> absl::Status {
    if (q.kind == "write" && q.target.rfind("src/", 0) == 0) return absl::PermissionDeniedError("protected path src/** (project policy)");
    if (q.kind == "command" && q.target.find("rm ") != std::string::npos) return absl::PermissionDeniedError("blocked command rm");
    return absl::OkStatus();
  };
  auto w = Run("write_file", {{"path", "src/x.c"}, {"content", "x"}});
  EXPECT_TRUE(w.is_error);
  EXPECT_NE(w.content.find("protected path src/**"), std::string::npos);
  EXPECT_FALSE(fs::exists(root_ + "/src/x.c"));
  auto b = Run("bash", {{"command", "rm -rf src"}});
  EXPECT_TRUE(b.is_error);
  EXPECT_NE(b.content.find("blocked command rm"), std::string::npos);
  EXPECT_TRUE(fs::exists(root_ + "/src/main.c"));
  EXPECT_FALSE(Run("write_file", {{"path", "notes.md"}, {"content", "ok"}}).is_error);
}

TEST_F(WriteToolsTest, BashRunsSandboxedWithLimitsAndStreamsOutput) {
  std::string streamed;
  ctx_.output = [&](std::string_view s) { streamed.append(s); };
  auto r = Run("bash", {{"command", "echo hello; echo made > out.txt; cat out.txt"}});
  EXPECT_FALSE(r.is_error) << r.content;
  EXPECT_NE(r.content.find("exit code 0"), std::string::npos);
  EXPECT_NE(streamed.find("hello"), std::string::npos);
  EXPECT_TRUE(fs::exists(root_ + "/out.txt"));
  auto fail = Run("bash", {{"command", "exit 3"}});
  EXPECT_TRUE(fail.is_error);
  EXPECT_NE(fail.content.find("exit code 3"), std::string::npos);
  auto slow = Run("bash", {{"command", "sleep 30"}, {"timeout_s", 1}});
  EXPECT_TRUE(slow.is_error);
  EXPECT_NE(slow.content.find("timed out after 1 s"), std::string::npos) << slow.content;
  if (!SandboxBinary().empty()) {
    // Outside the project nothing is writable, and there is no network.
    const std::string outside = "/var/tmp/fwai-escape-" + std::to_string(getpid());
    auto ro = Run("bash", {{"command", "touch " + outside + " 2>&1; echo rc=$?"}});
    EXPECT_NE(ro.content.find("Read-only file system"), std::string::npos) << ro.content;
    EXPECT_FALSE(fs::exists(outside));
    // /tmp is private to the command.
    Run("bash", {{"command", "touch /tmp/fwai-private-probe"}});
    EXPECT_FALSE(fs::exists("/tmp/fwai-private-probe"));
    auto net = Run("bash", {{"command", "awk -F: 'NR>2{gsub(/ /,\"\",$1); print \"if=\" $1}' /proc/net/dev"}});
    EXPECT_NE(net.content.find("if=lo"), std::string::npos) << net.content;
    EXPECT_EQ(net.content.find("if=", net.content.find("if=lo") + 5), std::string::npos) << "interfaces besides lo:\n" << net.content;
  } else {
    EXPECT_NE(r.content.find("unsandboxed"), std::string::npos);
  }
}

}  // namespace
}  // namespace fwai
