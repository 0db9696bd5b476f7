#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

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
