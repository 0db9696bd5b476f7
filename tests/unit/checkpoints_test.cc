// Checkpoints of a project: taken, diffed and restored as the files were;
// an unchanged tree writes nothing; git's ignores apply; a symlink never
// leads a restore outside the root; the oldest checkpoints go past the
// limit; a kept object gone refuses the whole restore.

#include "server/session/checkpoints.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "common/subprocess.h"
#include "server/hardware/firmware_image.h"
#include "server/storage/storage.h"

namespace fwai {
namespace {

namespace fs = std::filesystem;

class CheckpointsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("fwai-checkpoints-" + std::to_string(getpid()));
    fs::remove_all(dir_);
    root_ = (dir_ / "project").string();
    fs::create_directories(root_ + "/src");
    auto db = Storage::Open((dir_ / "db").string());
    ASSERT_TRUE(db.ok()) << db.status();
    db_ = std::move(*db);
    Open(CheckpointLimits{});
  }
  void TearDown() override {
    cp_.reset();
    db_.reset();
    fs::remove_all(dir_);
  }
  void Open(CheckpointLimits limits) {
    cp_ = std::make_unique<Checkpoints>(*db_, (dir_ / "cp").string(), limits);
  }
  void Write(const std::string& rel, const std::string& text) {
    fs::create_directories(fs::path(root_ + "/" + rel).parent_path());
    std::ofstream(root_ + "/" + rel, std::ios::trunc | std::ios::binary) << text;
  }
  std::string Read(const std::string& rel) {
    std::ifstream in(root_ + "/" + rel, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  size_t Objects() {
    size_t n = 0;
    std::error_code ec;
    for (const auto& e : fs::recursive_directory_iterator(dir_ / "cp" / "objects", ec))
      n += e.is_regular_file() ? 1 : 0;
    return n;
  }
  Checkpoint Take(const std::string& turn) {
    auto c = cp_->Take("s1", root_, nullptr, turn, "turn", 2);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *c : Checkpoint{};
  }
  std::string Changes(const Checkpoint& c) {
    auto d = cp_->Diff(c, nullptr);
    EXPECT_TRUE(d.ok()) << d.status();
    std::string out;
    for (const auto& ch : d.ok() ? *d : std::vector<FileChange>{})
      out += ch.action + " " + ch.path + "\n";
    return out;
  }

  fs::path dir_;
  std::string root_;
  std::unique_ptr<Storage> db_;
  std::unique_ptr<Checkpoints> cp_;
};

TEST_F(CheckpointsTest, AProjectIsRestoredAsItWasAndAnUnchangedTreeWritesNothing) {
  Write("src/main.c", "int main(void) { return 0; }\n");
  Write("src/util.h", "#pragma once\n");
  Write("run.sh", "#!/bin/sh\n");
  fs::permissions(root_ + "/run.sh", fs::perms(0755));
  const Checkpoint first = Take("t1");
  EXPECT_EQ(first.seq, 1u);
  EXPECT_EQ(first.files.size(), 3u);
  EXPECT_EQ(first.history_len, 2u);
  EXPECT_EQ(Objects(), 3u);
  // Nothing changed: the same hashes, no object written.
  const Checkpoint second = Take("t2");
  EXPECT_EQ(second.seq, 2u);
  for (const auto& [path, f] : first.files) EXPECT_EQ(second.files.at(path).sha256, f.sha256);
  EXPECT_EQ(Objects(), 3u);
  EXPECT_EQ(Changes(first), "");
  // A turn edits, adds, deletes and changes a mode.
  Write("src/main.c", "int main(void) { return 1; }\n");
  Write("src/new.c", "void f(void) {}\n");
  fs::remove(root_ + "/src/util.h");
  fs::permissions(root_ + "/run.sh", fs::perms(0644));
  EXPECT_EQ(Changes(first), "restore src/main.c\ndelete src/new.c\ncreate src/util.h\n");
  auto d = cp_->Diff(first, nullptr);
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(cp_->Restore(first, *d, nullptr).ok());
  EXPECT_EQ(Read("src/main.c"), "int main(void) { return 0; }\n");
  EXPECT_EQ(Read("src/util.h"), "#pragma once\n");
  EXPECT_FALSE(fs::exists(root_ + "/src/new.c"));
  EXPECT_EQ(Changes(first), "");
  // Found by number, by the turn it precedes, or the latest.
  EXPECT_EQ(cp_->Find("s1", "1")->turn_id, "t1");
  EXPECT_EQ(cp_->Find("s1", "t2")->seq, 2u);
  EXPECT_EQ(cp_->Find("s1", "")->seq, 2u);
  auto none = cp_->Find("s1", "9");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(none.status().message().find("it has 1 to 2 (fwai rewind s1 --list)"),
            std::string::npos)
      << none.status();
  EXPECT_EQ(cp_->Find("other", "").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CheckpointsTest, RestoredFilesGetTheirModeBackAndTheTimeOfTheRestore) {
  Write("run.sh", "#!/bin/sh\n");
  fs::permissions(root_ + "/run.sh", fs::perms(0755));
  const Checkpoint c = Take("t1");
  Write("run.sh", "#!/bin/sh\nexit 1\n");
  fs::permissions(root_ + "/run.sh", fs::perms(0600));
  auto d = cp_->Diff(c, nullptr);
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(cp_->Restore(c, *d, nullptr).ok());
  struct stat st {};
  ASSERT_EQ(stat((root_ + "/run.sh").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0755u);
  const CheckpointFile& then = c.files.at("run.sh");
  EXPECT_GT(int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec, then.mtime_ns)
      << "a restored file is changed now, for builds to see (as git checkout does)";
}

TEST_F(CheckpointsTest, GitsIgnoresApplyAndCapturesAreNeverTouched) {
  ProcessOptions o;
  o.cwd = root_;
  auto init = RunProcess({"git", "init", "-q"}, o);
  ASSERT_TRUE(init.ok() && init->exit_code == 0);
  Write(".gitignore", "build/\n");
  Write("src/main.c", "int x;\n");
  Write("build/main.o", "object");
  Write(".fwai/captures/b1-1.fwcap", "{}");
  const Checkpoint c = Take("t1");
  EXPECT_TRUE(c.files.count(".gitignore"));
  EXPECT_TRUE(c.files.count("src/main.c")) << "untracked files are kept";
  EXPECT_FALSE(c.files.count("build/main.o")) << "ignored files are not";
  EXPECT_FALSE(c.files.count(".fwai/captures/b1-1.fwcap"));
  Write(".fwai/captures/b1-2.fwcap", "{}");
  Write("build/other.o", "object");
  EXPECT_EQ(Changes(c), "") << "a rewind leaves captures and ignored files alone";
}

TEST_F(CheckpointsTest, AFileUnignoredSinceOrWithANameThatIsNotUtf8IsLeftAlone) {
  ProcessOptions o;
  o.cwd = root_;
  auto init = RunProcess({"git", "init", "-q"}, o);
  ASSERT_TRUE(init.ok() && init->exit_code == 0);
  Write(".gitignore", ".env\nbuild/\n");
  Write(".env", "TOKEN=secret\n");
  Write("build/x.o", "object");
  Write(std::string("odd-\xff.c"), "int odd;\n");
  Write("src/main.c", "int x;\n");
  const Checkpoint c = Take("t1");
  EXPECT_EQ(c.files.size(), 2u) << ".gitignore and src/main.c";
  ASSERT_EQ(c.skipped.size(), 1u);
  EXPECT_NE(c.skipped[0].find("odd-\\xff.c: a name that is not UTF-8"), std::string::npos)
      << c.skipped[0];
  // The turn stops ignoring .env and build/: they were there, ignored, and
  // a rewind must not delete them as new.
  Write(".gitignore", "");
  EXPECT_EQ(Changes(c), "restore .gitignore\n");
  auto d = cp_->Diff(c, nullptr);
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(cp_->Restore(c, *d, nullptr).ok());
  EXPECT_EQ(Read(".env"), "TOKEN=secret\n");
  EXPECT_EQ(Read("build/x.o"), "object");
  EXPECT_EQ(Read(std::string("odd-\xff.c")), "int odd;\n");
}

TEST_F(CheckpointsTest,
       ADirectoryTurnedIntoASymlinkRefusesTheRestoreAndAFileComesBackWhereADirWas) {
  Write("src/main.c", "int x;\n");
  Write("lib", "a file\n");
  const Checkpoint c = Take("t1");
  // lib becomes a directory with a file in it: deleted first, then lib written.
  fs::remove(root_ + "/lib");
  Write("lib/inner.c", "int y;\n");
  auto d = cp_->Diff(c, nullptr);
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(cp_->Restore(c, *d, nullptr).ok()) << Changes(c);
  EXPECT_EQ(Read("lib"), "a file\n") << "the directory emptied by the rewind went";
  fs::remove(root_ + "/lib");
  // src becomes a symlink to another directory of the project: refused.
  fs::create_directories(root_ + "/vendor");
  std::ofstream(root_ + "/vendor/main.c") << "vendor's own\n";
  fs::remove_all(root_ + "/src");
  fs::create_directory_symlink(root_ + "/vendor", root_ + "/src");
  d = cp_->Diff(c, nullptr);
  ASSERT_TRUE(d.ok());
  auto s = cp_->Restore(c, *d, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("its directory src is a symlink now"), std::string::npos) << s;
  EXPECT_EQ(Read("vendor/main.c"), "vendor's own\n");
  EXPECT_FALSE(fs::exists(root_ + "/lib")) << "a refused restore wrote something";
}

TEST_F(CheckpointsTest, ASymlinkNeverLeadsARestoreOutsideTheRoot) {
  const std::string outside = (dir_ / "outside.txt").string();
  std::ofstream(outside) << "not the project's";
  Write("src/main.c", "int x;\n");
  fs::create_symlink(outside, root_ + "/link.txt");
  const Checkpoint c = Take("t1");
  EXPECT_FALSE(c.files.count("link.txt")) << "a symlink is not kept";
  // main.c becomes a symlink to the outside file: the restore replaces the
  // link, never writes through it.
  fs::remove(root_ + "/src/main.c");
  fs::create_symlink(outside, root_ + "/src/main.c");
  auto d = cp_->Diff(c, nullptr);
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(cp_->Restore(c, *d, nullptr).ok());
  std::ifstream in(outside);
  std::string text;
  std::getline(in, text);
  EXPECT_EQ(text, "not the project's");
  EXPECT_FALSE(fs::is_symlink(root_ + "/src/main.c"));
  EXPECT_EQ(Read("src/main.c"), "int x;\n");
}

TEST_F(CheckpointsTest, TheOldestGoPastTheLimitAndAnObjectGoneRefusesTheWholeRestore) {
  Open(CheckpointLimits{/*max_bytes=*/250 * 1024, /*max_file_bytes=*/1 << 20});
  for (int i = 0; i < 3; ++i) {
    Write("blob.bin", std::string(100 * 1024, static_cast<char>('a' + i)));
    Take("t" + std::to_string(i + 1));
  }
  // 3 x 100 KiB > 250 KiB: the first went, and its object with it.
  auto all = cp_->List("s1");
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ(all->front().seq, 2u);
  EXPECT_EQ(Objects(), 2u);
  // A file past max_file_bytes is seen, not kept.
  Write("huge.bin", std::string((1 << 20) + 1, 'x'));
  const Checkpoint c = Take("t4");
  EXPECT_FALSE(c.files.count("huge.bin"));
  ASSERT_EQ(c.skipped.size(), 1u);
  EXPECT_NE(c.skipped[0].find("huge.bin: larger than"), std::string::npos) << c.skipped[0];
  // An object gone: nothing is changed.
  const Checkpoint second = (*all)[0];
  fs::remove(dir_ / "cp" / "objects" / second.files.at("blob.bin").sha256.substr(0, 2) /
             second.files.at("blob.bin").sha256);
  Write("extra.c", "int y;\n");
  auto d = cp_->Diff(second, nullptr);
  ASSERT_TRUE(d.ok());
  auto s = cp_->Restore(second, *d, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("cannot restore blob.bin"), std::string::npos) << s;
  EXPECT_TRUE(fs::exists(root_ + "/extra.c")) << "a refused restore deleted a file";
}

// The limit counts what every session's checkpoints of the project name,
// those taken without pruning (in a rewind) too, and after a restart what
// was stored before it.
TEST_F(CheckpointsTest, TheLimitCountsEverySessionAndCheckpointsTakenWithoutPruning) {
  Open(CheckpointLimits{/*max_bytes=*/250 * 1024, /*max_file_bytes=*/1 << 20});
  auto take = [&](const std::string& session, char fill, bool prune) {
    Write("blob.bin", std::string(100 * 1024, fill));
    auto c = cp_->Take(session, root_, nullptr, std::string("t") + fill, "turn", 2, "", prune);
    ASSERT_TRUE(c.ok()) << c.status();
  };
  take("s1", 'a', true);
  take("s2", 'b', false);
  EXPECT_EQ(Objects(), 2u);
  take("s1", 'c', true);  // a + b + c > 250 KiB: s1's first goes
  EXPECT_EQ(Objects(), 2u);
  auto s1 = cp_->List("s1");
  ASSERT_TRUE(s1.ok());
  ASSERT_EQ(s1->size(), 1u);
  EXPECT_EQ(s1->front().seq, 2u);
  Open(CheckpointLimits{/*max_bytes=*/250 * 1024, /*max_file_bytes=*/1 << 20});  // a restart
  take("s3", 'd', true);  // b + c + d: s2's goes
  EXPECT_EQ(Objects(), 2u);
  auto s2 = cp_->List("s2");
  ASSERT_TRUE(s2.ok());
  EXPECT_TRUE(s2->empty());
}

TEST_F(CheckpointsTest, AFlashedImageIsNamedByTheNextCheckpointAndKept) {
  Write("src/main.c", "int x;\n");
  const std::string image = (dir_ / "fw.elf").string();
  std::ofstream(image, std::ios::binary) << "ELF image bytes";
  EXPECT_EQ(cp_->NoteFlash("s1", nullptr, "b1", image, std::string(64, '0')).code(),
            absl::StatusCode::kFailedPrecondition)
      << "an image changed since its flash is not kept as that flash's";
  auto bytes_then = cp_->ReadObject(std::string(64, '0'));
  EXPECT_FALSE(bytes_then.ok());
  ASSERT_TRUE(cp_->NoteFlash("s1", nullptr, "b1", image, BytesSha256Hex("ELF image bytes")).ok());
  const Checkpoint c = Take("t1");
  ASSERT_EQ(c.boards.size(), 1u);
  auto bytes = cp_->ReadObject(c.boards.at("b1"));
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, "ELF image bytes");
  ASSERT_TRUE(cp_->DropSession("s1").ok());
  EXPECT_EQ(cp_->List("s1")->size(), 0u);
  EXPECT_EQ(Objects(), 0u) << "objects only its checkpoints named outlive the session";
}

// A project with no .git anywhere above it is listed without starting git
// (a program per turn, on every turn of such a project); one with .git is
// asked. A `git` first on PATH notes each start.
TEST_F(CheckpointsTest, AProjectOutsideGitIsListedWithoutStartingGit) {
  const fs::path bin = dir_ / "bin";
  fs::create_directories(bin);
  const std::string note = (dir_ / "git-started").string();
  std::ofstream(bin / "git") << "#!/bin/sh\necho \"$@\" >> " << note << "\nexit 1\n";
  fs::permissions(bin / "git", fs::perms::owner_all);
  const std::string path = std::getenv("PATH") ? std::getenv("PATH") : "/usr/bin:/bin";
  setenv("PATH", (bin.string() + ":" + path).c_str(), 1);
  Write("src/a.c", "int a;\n");
  const Checkpoint outside = Take("t1");
  const bool started_outside = fs::exists(note);
  fs::create_directories(root_ + "/.git");
  const Checkpoint inside = Take("t2");
  const bool started_inside = fs::exists(note);
  setenv("PATH", path.c_str(), 1);
  EXPECT_FALSE(started_outside) << "git was started for a project with no .git";
  EXPECT_TRUE(started_inside) << "git was not asked about a project with .git";
  EXPECT_FALSE(outside.git);
  EXPECT_EQ(outside.files.count("src/a.c"), 1u);
  EXPECT_EQ(inside.files.count("src/a.c"), 1u) << "git said no: every file is listed";
}

// Checkpoints of many sessions are taken at once (they do not wait for each
// other's listing and reading); files they share are one object, and each
// session's numbers run 1, 2, 3.
TEST_F(CheckpointsTest, ManySessionsTakeCheckpointsAtOnceAndShareObjects) {
  for (int i = 0; i < 20; ++i) Write("src/f" + std::to_string(i) + ".c", std::to_string(i));
  std::vector<std::thread> threads;
  std::vector<std::string> errors(8);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int turn = 0; turn < 3; ++turn) {
        auto c = cp_->Take("s" + std::to_string(t), root_, nullptr, "turn" + std::to_string(turn),
                           "turn", 2);
        if (!c.ok()) {
          errors[t] = std::string(c.status().message());
        } else if (c->seq != static_cast<uint64_t>(turn + 1) || c->files.size() != 20) {
          errors[t] =
              "seq " + std::to_string(c->seq) + ", " + std::to_string(c->files.size()) + " files";
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 8; ++t) EXPECT_EQ(errors[t], "") << "session s" << t;
  EXPECT_EQ(Objects(), 20u);
  for (int t = 0; t < 8; ++t) {
    auto all = cp_->List("s" + std::to_string(t));
    ASSERT_TRUE(all.ok()) << all.status();
    EXPECT_EQ(all->size(), 3u);
  }
}

}  // namespace
}  // namespace fwai
