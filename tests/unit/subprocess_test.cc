// RunProcess: a program's output, exit and errors; the child's state (its
// signals, its account, its directory); many at once from many threads.
#include "common/subprocess.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "common/local_account.h"

namespace fwai {
namespace {

TEST(SubprocessTest, RunsAProgramWithItsInputOutputAndExitCode) {
  ProcessOptions o;
  o.stdin_data = "from stdin\n";
  auto r = RunProcess({"sh", "-c", "cat; echo out; echo err >&2; exit 3"}, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->out, "from stdin\nout\n");
  EXPECT_EQ(r->err, "err\n");
  EXPECT_EQ(r->exit_code, 3);
  EXPECT_FALSE(r->timed_out);
}

TEST(SubprocessTest, AMissingProgramIsNotFoundAndABadDirectoryIs126) {
  auto missing = RunProcess({"fwai-no-such-program-here"});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("fwai-no-such-program-here"), std::string::npos);
  ProcessOptions o;
  o.cwd = "/nonexistent/fwai";
  auto bad_dir = RunProcess({"true"}, o);
  ASSERT_TRUE(bad_dir.ok()) << bad_dir.status();
  EXPECT_EQ(bad_dir->exit_code, 126);
  o.cwd = std::filesystem::temp_directory_path().string();
  auto pwd = RunProcess({"pwd"}, o);
  ASSERT_TRUE(pwd.ok()) << pwd.status();
  EXPECT_EQ(pwd->out, std::filesystem::canonical(o.cwd).string() + "\n");
}

// A signal the caller blocks is not blocked in the child, and the caller's
// own mask is as it was.
TEST(SubprocessTest, TheChildStartsWithNoSignalBlockedAndTheCallersMaskStays) {
  sigset_t term, before, after;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &term, &before), 0);
  auto r = RunProcess({"sh", "-c", "kill -TERM $$; echo survived"});
  pthread_sigmask(SIG_SETMASK, nullptr, &after);
  pthread_sigmask(SIG_SETMASK, &before, nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->signal, SIGTERM) << r->out;
  EXPECT_EQ(r->out, "");
  EXPECT_TRUE(sigismember(&after, SIGTERM));
  EXPECT_FALSE(sigismember(&after, SIGUSR2));
}

TEST(SubprocessTest, ATimeLimitKillsTheProgramAndWhatItStarted) {
  ProcessOptions o;
  o.timeout_ms = 300;
  auto r = RunProcess({"sh", "-c", "sleep 30 & sleep 30; echo never"}, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->timed_out);
  EXPECT_EQ(r->out, "");
}

TEST(SubprocessTest, RunsAsTheAccountItIsGiven) {
  if (getuid() != 0) GTEST_SKIP() << "needs root to change account";
  auto nobody = LookupAccount("nobody");
  ASSERT_TRUE(nobody.ok()) << nobody.status();
  ProcessOptions o;
  o.run_as = &*nobody;
  auto r = RunProcess({"id", "-u"}, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->out, std::to_string(nobody->uid) + "\n");
  EXPECT_EQ(getuid(), 0u);  // the caller is still itself
  EXPECT_EQ(geteuid(), 0u);
}

TEST(SubprocessTest, ManyThreadsRunProgramsAtOnceAndEachGetsItsOwnOutput) {
  std::vector<std::thread> threads;
  std::vector<int> wrong(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t, &wrong] {
      for (int i = 0; i < 25; ++i) {
        const std::string want = std::to_string(t * 100 + i);
        auto r = RunProcess({"sh", "-c", "echo \"$1\"", "sh", want});
        if (!r.ok() || r->out != want + "\n" || r->exit_code != 0) ++wrong[t];
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(wrong[t], 0) << "thread " << t;
}

}  // namespace
}  // namespace fwai
