// The lab's CI job example against a real lab on this machine: a real etcd,
// a real bench fwaid with a QEMU board, and the job's own front fwaid, which
// the `fwai` CLI auto-starts from the fwaid.yaml the job script writes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "server/lab/etcd_client.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/lab/etcd_cluster.h"

namespace fwai::lab {
namespace {

using fwai::testing::Daemon;
using fwai::testing::EtcdCluster;
using fwai::testing::Eventually;
using fwai::testing::RunCommand;
using json = nlohmann::json;
namespace fs = std::filesystem;

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The JSON summary: the last line of stdout.
json Summary(const std::string& out) {
  std::istringstream in(out);
  std::string line, last;
  while (std::getline(in, line)) {
    if (!line.empty()) last = line;
  }
  return json::parse(last, nullptr, false);
}

class LabExamples : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(cluster_.Start()) << cluster_.log(0);
    etcd_ = *EtcdClient::Connect(cluster_.Options());
    tls_ = cluster_.tls_dir();
    std::string error;
    ASSERT_TRUE(cluster_.AddNode("ci-runner", &error)) << error;
    endpoints_ = cluster_.endpoints_csv();
    bench_ = std::make_unique<Daemon>(
        nullptr,
        "lab:\n" + cluster_.LabEtcdYaml("bench1") +
            "  ttl_s: 3\n  node: bench1\n  advertise: tls:127.0.0.1:0\n" + "tls: {cert: " + tls_ +
            "/bench1.pem, key: " + tls_ + "/bench1.key, client_ca: " + tls_ + "/ca.pem}\n" +
            "hardware:\n  boards:\n    - {id: b1, kind: simulated, machine: stm32vldiscovery, "
            "boot_pattern: booted, tags: [stm32f1]}\n",
        false);
    bench_->AddListen("tls:127.0.0.1:0");
    ASSERT_TRUE(bench_->Start()) << bench_->log();
    ASSERT_TRUE(Eventually(
        [&] {
          auto b = etcd_->Get("/fwai/boards/bench1/b1");
          return b.ok() && b->has_value();
        },
        std::chrono::seconds(10)))
        << bench_->log();
    project_ = cluster_.dir() + "/blinky";
    fs::copy(BLINKY_SRC_DIR, project_, fs::copy_options::recursive);
    fs::remove_all(project_ + "/build");
    fs::remove_all(project_ + "/.fwai/runs");
    job_ = cluster_.dir() + "/job";
  }

  // examples/ci/fwai-ci-job.sh with this lab's settings; `extra`: its arguments.
  int CiJob(const std::vector<std::string>& env, const std::vector<std::string>& extra,
            std::string* out, std::string* err) {
    std::vector<std::string> argv = {std::string(FWAI_SOURCE_DIR) + "/examples/ci/fwai-ci-job.sh"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    std::vector<std::string> e = {"FWAI_BIN=" + std::string(FWAI_BIN_DIR),
                                  "FWAI_LAB_ETCD=" + endpoints_,
                                  "FWAI_NODE=ci-runner",
                                  "FWAI_NODE_CERT=" + tls_ + "/ci-runner.pem",
                                  "FWAI_NODE_KEY=" + tls_ + "/ci-runner.key",
                                  "FWAI_LAB_CA=" + tls_ + "/ca.pem",
                                  "FWAI_PROJECT=" + project_,
                                  "FWAI_JOB_DIR=" + job_};
    e.insert(e.end(), env.begin(), env.end());
    return RunCommand(argv, out, err, e, 300);
  }

  // The job's fwaid (auto-started by the CLI) is gone when the job ends.
  void ExpectFrontStopped() {
    const std::string log = ReadText(job_ + "/run/fwai/fwaid.log");
    EXPECT_NE(log.find("fwaid: ready"), std::string::npos) << "the job's fwaid was started\n"
                                                           << log;
    EXPECT_FALSE(fs::exists(job_ + "/run/fwai/fwaid.sock")) << "the job's fwaid was stopped\n"
                                                            << log;
  }

  // The board is free again in the lab (the run's lease was released).
  void ExpectBoardFree() {
    EXPECT_TRUE(Eventually(
        [&] {
          auto l = etcd_->Get("/fwai/leases/b1");
          return l.ok() && !l->has_value();
        },
        std::chrono::seconds(5)))
        << "the lab lease on b1 is still there";
  }

  EtcdCluster cluster_{1};
  std::unique_ptr<EtcdClient> etcd_;
  std::string tls_, endpoints_, project_, job_;
  std::unique_ptr<Daemon> bench_;
};

TEST_F(LabExamples, CiJobBuildsFlashesALabBoardByTagAndVerifiesItsBootLine) {
  std::string out, err;
  int rc = CiJob({}, {}, &out, &err);
  ASSERT_EQ(rc, 0) << out << err << "\nbench:\n"
                   << bench_->log() << "\nfront:\n"
                   << ReadText(job_ + "/run/fwai/fwaid.log");
  json s = Summary(out);
  ASSERT_TRUE(s.is_object()) << out;
  EXPECT_TRUE(s["ok"].get<bool>()) << s.dump();
  EXPECT_EQ(s["skill"], "build-flash-verify");
  EXPECT_EQ(s["exit_code"], 0);
  EXPECT_EQ(s["board"], "b1");
  ASSERT_EQ(s["steps"].size(), 4u) << s.dump();
  for (const auto& st : s["steps"]) EXPECT_TRUE(st["ok"].get<bool>()) << st.dump();
  // Built here, by the job's own make.
  EXPECT_EQ(s["steps"][0]["command"], "make");
  ASSERT_TRUE(fs::exists(project_ + "/build/blinky.elf"));
  std::string sha, sha_err;
  ASSERT_EQ(RunCommand({"/usr/bin/sha256sum", project_ + "/build/blinky.elf"}, &sha, &sha_err), 0);
  // The bench flashed exactly the image built here, and its board booted it:
  // the verify step saw the boot line on the bench's serial port.
  ASSERT_EQ(s["images"].size(), 1u) << s.dump();
  EXPECT_EQ(s["images"][0]["sha256"], sha.substr(0, 64));
  EXPECT_TRUE(s["boot"]["ok"].get<bool>()) << s.dump();
  EXPECT_NE(s["boot"]["line"].get<std::string>().find("booted"), std::string::npos) << s.dump();
  const std::string dir = s["log_dir"];
  EXPECT_NE(ReadText(dir + "/verify.log").find("booted"), std::string::npos);
  // The bench did the flash, under the front's lab lease.
  EXPECT_NE(bench_->log().find("b1"), std::string::npos);
  EXPECT_NE(err.find("leased b1 on node bench1"), std::string::npos) << err;
  ExpectBoardFree();
  ExpectFrontStopped();
}

TEST_F(LabExamples, CiJobExitsWithTheVerifyCodeWhenTheBootLineIsWrong) {
  std::string out, err;
  int rc = CiJob({},
                 {"--var", "BOOT_PATTERN=this line is never printed", "--var", "BOOT_TIMEOUT=3",
                  "--timeout", "120"},
                 &out, &err);
  EXPECT_EQ(rc, 14) << out << err;
  json s = Summary(out);
  ASSERT_TRUE(s.is_object()) << out;
  EXPECT_FALSE(s["ok"].get<bool>());
  EXPECT_EQ(s["failure_class"], "verify") << s.dump();
  EXPECT_EQ(s["exit_code"], 14);
  // Built and flashed; only the boot line was not seen.
  EXPECT_TRUE(s["steps"][0]["ok"].get<bool>()) << s.dump();
  EXPECT_TRUE(s["steps"][1]["ok"].get<bool>()) << s.dump();
  EXPECT_FALSE(s["steps"][2]["ok"].get<bool>()) << s.dump();
  EXPECT_FALSE(s["boot"]["ok"].get<bool>()) << s.dump();
  ExpectBoardFree();
  ExpectFrontStopped();
}

TEST_F(LabExamples, CiJobExitsWithTheHardwareCodeWhenNoBoardHasTheTag) {
  std::string out, err;
  int rc = CiJob({"FWAI_BOARD_TAG=esp32", "FWAI_BOARD_WAIT=2"}, {}, &out, &err);
  EXPECT_EQ(rc, 18) << out << err;
  json s = Summary(out);
  ASSERT_TRUE(s.is_object()) << out;
  EXPECT_FALSE(s["ok"].get<bool>());
  EXPECT_EQ(s["failure_class"], "hardware");
  EXPECT_EQ(s["exit_code"], 18);
  EXPECT_NE(s["error"].get<std::string>().find("esp32"), std::string::npos) << s.dump();
  // Nothing was built for a board that was never there.
  EXPECT_FALSE(fs::exists(project_ + "/build/blinky.elf"));
  ExpectFrontStopped();
}

}  // namespace
}  // namespace fwai::lab
