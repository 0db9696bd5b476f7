#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/local_account.h"
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

// A tool's spec is made once and shared: every offer of the tool hands out
// the same object (no copy of its schema per turn), holding what the tool says.
TEST_F(FileToolsTest, AToolsSpecIsMadeOnceAndShared) {
  Tool* read = registry_.Find("read_file");
  ASSERT_NE(read, nullptr);
  const ToolSpecPtr first = read->spec();
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(read->spec().get(), first.get());
  EXPECT_EQ(first->name, read->name());
  EXPECT_EQ(first->description, read->description());
  EXPECT_EQ(first->input_schema, read->input_schema());
  EXPECT_NE(registry_.Find("grep")->spec().get(), first.get());
}

TEST_F(FileToolsTest, NoEscapeFromProjectRoot) {
  for (const std::string p :
       {"../secret.txt", "/etc/passwd", "escape.txt", "src/../../secret.txt"}) {
    auto r = Run("read_file", {{"path", p}});
    EXPECT_TRUE(r.is_error) << p;
    EXPECT_NE(r.content.find("outside the project root"), std::string::npos)
        << p << ": " << r.content;
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
  ToolResult Run(const std::string& tool, const nlohmann::json& in) {
    return registry_.Find(tool)->Run(in, ctx_);
  }
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

  auto twice =
      Run("edit_file", {{"path", "src/main.c"}, {"old_string", "= 1;"}, {"new_string", "= 3;"}});
  EXPECT_TRUE(twice.is_error);
  EXPECT_NE(twice.content.find("occurs 2 times"), std::string::npos) << twice.content;
  auto missing =
      Run("edit_file", {{"path", "src/main.c"}, {"old_string", "int d"}, {"new_string", "int e"}});
  EXPECT_TRUE(missing.is_error);
  EXPECT_NE(missing.content.find("not found"), std::string::npos);
  auto one =
      Run("edit_file",
          {{"path", "src/main.c"}, {"old_string", "int b = 1;"}, {"new_string", "int b = 5;"}});
  EXPECT_FALSE(one.is_error) << one.content;
  EXPECT_NE(one.content.find("-int b = 1;"), std::string::npos) << one.content;
  EXPECT_NE(one.content.find("+int b = 5;"), std::string::npos) << one.content;
  EXPECT_NE(one.content.find("@@ -2,1 +2,1 @@"), std::string::npos) << one.content;
  EXPECT_EQ(Read(root_ + "/src/main.c"), "int a = 1;\nint b = 5;\nint c = 2;\n");
  auto all = Run("edit_file", {{"path", "src/main.c"},
                               {"old_string", "int"},
                               {"new_string", "long"},
                               {"replace_all", true}});
  EXPECT_FALSE(all.is_error);
  EXPECT_EQ(Read(root_ + "/src/main.c"), "long a = 1;\nlong b = 5;\nlong c = 2;\n");
}

TEST_F(WriteToolsTest, PolicyRefusalsAreToolErrorsWithTheRule) {
  ctx_.policy = [](const PolicyQuery& q) -> absl::Status {
    if (q.kind == "write" && q.target.rfind("src/", 0) == 0)
      return absl::PermissionDeniedError("protected path src/** (project policy)");
    if (q.kind == "command" && q.target.find("rm ") != std::string::npos)
      return absl::PermissionDeniedError("blocked command rm");
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
    auto net = Run(
        "bash", {{"command", "awk -F: 'NR>2{gsub(/ /,\"\",$1); print \"if=\" $1}' /proc/net/dev"}});
    EXPECT_NE(net.content.find("if=lo"), std::string::npos) << net.content;
    EXPECT_EQ(net.content.find("if=", net.content.find("if=lo") + 5), std::string::npos)
        << "interfaces besides lo:\n"
        << net.content;
  } else {
    EXPECT_NE(r.content.find("unsandboxed"), std::string::npos);
  }
}

}  // namespace
}  // namespace fwai

// Path checks on the opened descriptor, attacked with a race: while a thread
// flips `f.txt` between the project's file and a symlink to a secret outside
// the root, and `d/` between the project's directory and a symlink to an
// outside directory (each flip one atomic rename), reads and writes through
// ProjectFs and the read_file/write_file tools run many times. A
// check-then-open implementation loses this race; the kernel-side check on
// the opened descriptor (openat2 RESOLVE_BENEATH) never does.
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <iostream>
#include <set>
#include <thread>

#include "server/tools/project_fs.h"

namespace fwai {
namespace {

class PathRaceTest : public ::testing::Test {
 protected:
  static constexpr int kCalls =
      20000;  // calls per part, at least (unless the deadline comes first)
  static constexpr int kMinFlipsDuring = 1000;  // the flipper must really have raced the calls
  static constexpr auto kDeadline = std::chrono::seconds(3);
  static constexpr const char* kInsideF = "INSIDE-F\n";
  static constexpr const char* kInsideG = "INSIDE-G\n";
  static constexpr const char* kSecretF = "SECRET-F top secret\n";
  static constexpr const char* kSecretG = "SECRET-G top secret\n";

  void SetUp() override {
    std::string t = (fs::temp_directory_path() / "fwai-race-XXXXXX").string();
    base_ = fs::canonical(mkdtemp(t.data())).string();
    root_ = base_ + "/proj";
    fs::create_directories(root_ + "/d");
    fs::create_directories(base_ + "/stage");
    fs::create_directories(base_ + "/outside-dir");
    Write(base_ + "/stage/f.master", kInsideF);  // hard-linked in as the real f.txt
    fs::create_hard_link(base_ + "/stage/f.master", root_ + "/f.txt");
    Write(root_ + "/d/g.txt", kInsideG);
    ResetOutside();
    // Exchanged with proj/d: the other side of the directory flip.
    fs::create_directory_symlink(base_ + "/outside-dir", base_ + "/stage/d-swap");
    root_fd_ = open(root_.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    stage_fd_ = open((base_ + "/stage").c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    ASSERT_GE(root_fd_, 0);
    ASSERT_GE(stage_fd_, 0);
    RegisterFileTools(registry_);
    RegisterWriteTools(registry_);
    limits_.read_file_max_bytes = 1024;
    ctx_.project_root = root_;
    ctx_.account = &me_;
    ctx_.limits = &limits_;
    ctx_.cancel = &cancel_;
  }
  void TearDown() override {
    StopFlipper();
    if (root_fd_ >= 0) close(root_fd_);
    if (stage_fd_ >= 0) close(stage_fd_);
    fs::remove_all(base_);
  }

  // The secrets, as they must stay.
  void ResetOutside() {
    Write(base_ + "/secret.txt", kSecretF);
    for (const auto& e : fs::directory_iterator(base_ + "/outside-dir")) fs::remove_all(e.path());
    Write(base_ + "/outside-dir/g.txt", kSecretG);
  }
  bool OutsideIntact() const {
    std::set<std::string> names;
    for (const auto& e : fs::directory_iterator(base_ + "/outside-dir"))
      names.insert(e.path().filename().string());
    return Slurp(base_ + "/secret.txt") == kSecretF && names == std::set<std::string>{"g.txt"} &&
           Slurp(base_ + "/outside-dir/g.txt") == kSecretG;
  }
  static void Write(const std::string& p, const std::string& s) { std::ofstream(p) << s; }
  static std::string Slurp(const std::string& p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  // As fast as it can, no sleeps: f.txt becomes a symlink to the secret, then
  // a real file again (a prepared entry renamed over it each time), and d is
  // exchanged with stage/d-swap (a real directory <-> a symlink outside).
  void StartFlipper() {
    const std::string secret = base_ + "/secret.txt";
    flipper_ = std::thread([this, secret] {
      while (!stop_.load(std::memory_order_relaxed)) {
        if (symlinkat(secret.c_str(), stage_fd_, "f-link") == 0)
          renameat(stage_fd_, "f-link", root_fd_, "f.txt");
        renameat2(root_fd_, "d", stage_fd_, "d-swap", RENAME_EXCHANGE);
        if (linkat(stage_fd_, "f.master", stage_fd_, "f-real", 0) != 0 && errno == EEXIST) {
          unlinkat(stage_fd_, "f-real", 0);  // left by a rename between two links of one file
          linkat(stage_fd_, "f.master", stage_fd_, "f-real", 0);
        }
        renameat(stage_fd_, "f-real", root_fd_, "f.txt");
        renameat2(root_fd_, "d", stage_fd_, "d-swap", RENAME_EXCHANGE);
        flips_.fetch_add(1, std::memory_order_relaxed);
      }
    });
    // The calls start once the flipper is really running.
    while (flips_.load() < 10) std::this_thread::yield();
  }
  void StopFlipper() {
    stop_ = true;
    if (flipper_.joinable()) flipper_.join();
  }

  // Per target path: how many calls got the inside, how many were refused as
  // leading outside, and anything else (the secret, other errors).
  struct Tally {
    int inside = 0, refused = 0, wrong = 0;
    std::string first_wrong;
    void Wrong(const std::string& what) {
      if (wrong++ == 0) first_wrong = what;
    }
  };
  // Runs `call(i)` until kCalls calls are done and both targets saw both
  // outcomes while the flipper ran kMinFlipsDuring flips, or the deadline.
  template <typename Fn>
  int64_t Race(Tally& f, Tally& d, Fn&& call) {
    StartFlipper();
    const int64_t flips_before = flips_.load();
    const auto deadline = std::chrono::steady_clock::now() + kDeadline;
    auto enough = [&] {
      return f.inside > 0 && f.refused > 0 && d.inside > 0 && d.refused > 0 &&
             flips_.load() - flips_before >= kMinFlipsDuring;
    };
    int i = 0;
    for (; !(i >= kCalls && enough()) && std::chrono::steady_clock::now() < deadline; ++i) call(i);
    const int64_t flips_during = flips_.load() - flips_before;
    StopFlipper();
    calls_ = i;
    return flips_during;
  }

  std::string base_, root_;
  int root_fd_ = -1, stage_fd_ = -1;
  std::thread flipper_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> flips_{0};
  int calls_ = 0;
  ToolRegistry registry_;
  ToolsConfig limits_;
  CancelToken cancel_;
  ToolContext ctx_;
  LocalAccount me_ = *LookupAccount(getuid());
};

TEST_F(PathRaceTest, ReadsNeverReturnTheSecretWhileSymlinksFlip) {
  auto pfs = ProjectFs::Open(root_);
  ASSERT_TRUE(pfs.ok()) << pfs.status();
  Tally f, d;
  const int64_t flips = Race(f, d, [&](int i) {
    const bool on_f = i % 2 == 0;
    Tally& t = on_f ? f : d;
    const std::string path = on_f ? "f.txt" : "d/g.txt";
    const std::string inside = on_f ? kInsideF : kInsideG;
    if (i % 4 < 2) {  // ProjectFs itself
      auto r = pfs->ReadFile(path, 4096);
      if (r.ok() && *r == inside) {
        ++t.inside;
      } else if (!r.ok() && absl::IsPermissionDenied(r.status()) &&
                 r.status().message().find("outside the project root") != std::string::npos) {
        ++t.refused;
      } else {
        t.Wrong("ProjectFs::ReadFile(" + path + "): " + (r.ok() ? *r : r.status().ToString()));
      }
    } else {  // the read_file tool, as a model calls it
      auto r = registry_.Find("read_file")->Run({{"path", path}}, ctx_);
      if (!r.is_error && r.content == "1\t" + inside) {
        ++t.inside;
      } else if (r.is_error && r.content.find("outside the project root") != std::string::npos) {
        ++t.refused;
      } else {
        t.Wrong("read_file " + path + ": " + r.content);
      }
    }
  });
  RecordProperty("calls", calls_);
  RecordProperty("flips", static_cast<int>(flips));
  std::cout << "reads " << calls_ << ", flips during them " << flips
            << "; f.txt inside/refused/wrong " << f.inside << "/" << f.refused << "/" << f.wrong
            << ", d/g.txt " << d.inside << "/" << d.refused << "/" << d.wrong << "\n";
  EXPECT_EQ(f.wrong, 0) << "first: " << f.first_wrong;
  EXPECT_EQ(d.wrong, 0) << "first: " << d.first_wrong;
  // The race was really run: the flipper kept flipping during the reads, and
  // each path was read both as the project's file and as the link outside.
  EXPECT_GE(flips, kMinFlipsDuring);
  EXPECT_GT(f.inside, 0);
  EXPECT_GT(f.refused, 0);
  EXPECT_GT(d.inside, 0);
  EXPECT_GT(d.refused, 0);
  EXPECT_TRUE(OutsideIntact());
}

TEST_F(PathRaceTest, WritesNeverReachOutsideWhileSymlinksFlip) {
  auto pfs = ProjectFs::Open(root_);
  ASSERT_TRUE(pfs.ok()) << pfs.status();
  Tally f, d;
  int outside_changed = 0;
  const int64_t flips = Race(f, d, [&](int i) {
    const bool on_f = i % 2 == 0;
    Tally& t = on_f ? f : d;
    const std::string path = on_f ? "f.txt" : "d/g.txt";
    const std::string content = "INSIDE written " + std::to_string(i) + "\n";
    bool ok = false, refused = false;
    std::string what;
    if (i % 4 < 2) {  // ProjectFs itself
      auto s = pfs->WriteFile(path, content);
      ok = s.ok();
      refused = absl::IsPermissionDenied(s) &&
                s.message().find("outside the project root") != std::string::npos;
      what = "ProjectFs::WriteFile(" + path + "): " + s.ToString();
    } else {  // the write_file tool, as a model calls it
      auto r = registry_.Find("write_file")->Run({{"path", path}, {"content", content}}, ctx_);
      ok = !r.is_error;
      refused = r.is_error && r.content.find("outside the project root") != std::string::npos;
      what = "write_file " + path + ": " + r.content;
    }
    if (!OutsideIntact()) {  // counted, and put back so each call is judged alone
      if (outside_changed++ == 0) t.Wrong("changed the outside: " + what);
      ResetOutside();
    }
    if (ok) {
      ++t.inside;
    } else if (refused) {
      ++t.refused;
    } else {
      t.Wrong(what);
    }
  });
  std::cout << "writes " << calls_ << ", flips during them " << flips << "; outside changed "
            << outside_changed << " times; f.txt ok/refused " << f.inside << "/" << f.refused
            << ", d/g.txt " << d.inside << "/" << d.refused << "\n";
  EXPECT_EQ(outside_changed, 0) << "first: "
                                << (f.first_wrong.empty() ? d.first_wrong : f.first_wrong);
  EXPECT_EQ(f.wrong, 0) << "first: " << f.first_wrong;
  EXPECT_EQ(d.wrong, 0) << "first: " << d.first_wrong;
  EXPECT_GE(flips, kMinFlipsDuring);
  EXPECT_GT(f.inside, 0);
  EXPECT_GT(f.refused, 0);
  EXPECT_GT(d.inside, 0);
  EXPECT_GT(d.refused, 0);
  EXPECT_TRUE(OutsideIntact());
  // What was written landed in the project: g.txt of the real directory
  // (wherever the last exchange left it) holds a written line.
  const std::string g =
      Slurp(fs::is_symlink(root_ + "/d") ? base_ + "/stage/d-swap/g.txt" : root_ + "/d/g.txt");
  EXPECT_TRUE(g == kInsideG || g.rfind("INSIDE written ", 0) == 0) << g;
}

}  // namespace
}  // namespace fwai
