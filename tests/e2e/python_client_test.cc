// examples/python-client/fwai_client.py against a real fwaid and its
// simulated board (QEMU): Debian's python3-grpcio with stubs generated from
// proto/ at build time, nothing of fwai's C++ client.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "fwai/v1/hardware.grpc.pb.h"
#include "tests/integration/daemon_fixture.h"

namespace fwai {
namespace {

using fwai::testing::Daemon;
using fwai::testing::RunCommand;
namespace pb = ::fwai::v1;

constexpr char kPython[] = "/usr/bin/python3";  // Debian's, with python3-grpcio

class PythonClient : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string out, err;
    if (RunCommand({kPython, "-c", "import grpc, google.protobuf"}, &out, &err) != 0) {
      GTEST_SKIP() << "python3-grpcio / python3-protobuf are not installed for " << kPython
                   << " (scripts/setup installs them): " << err;
    }
    ASSERT_TRUE(std::filesystem::exists(FWAI_BLINKY_ELF)) << FWAI_BLINKY_ELF << " not built";
    d_ = std::make_unique<Daemon>(nullptr, "", false);
    ASSERT_TRUE(d_->Start()) << d_->log();
  }

  int Client(const std::vector<std::string>& args, std::string* out, std::string* err) {
    std::vector<std::string> argv = {
        kPython, std::string(FWAI_SOURCE_DIR) + "/examples/python-client/fwai_client.py",
        "--daemon", d_->address(), "--stubs", FWAI_PY_STUBS,
        // The example's build dir is the image's project (not this checkout).
        "--project-root", std::filesystem::path(FWAI_BLINKY_ELF).parent_path().string()};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv, out, err, {}, 120);
  }

  // Who holds the simulated board now ("" : nobody).
  std::string Holder() {
    auto hw = pb::Hardware::NewStub(d_->channel());
    grpc::ClientContext ctx;
    pb::ListDevicesResponse resp;
    auto st = hw->ListDevices(&ctx, pb::ListDevicesRequest(), &resp);
    EXPECT_TRUE(st.ok()) << st.error_message();
    for (const auto& d : resp.devices()) {
      if (d.id() == "sim-stm32vl") return d.holder();
    }
    ADD_FAILURE() << "no sim-stm32vl";
    return "";
  }

  std::unique_ptr<Daemon> d_;
};

TEST_F(PythonClient, LeasesFlashesReadsSerialUntilThePatternAndReleases) {
  std::string out, err;
  int rc = Client({"--board", "sim-stm32vl", "--image", FWAI_BLINKY_ELF, "--until", "booted"}, &out,
                  &err);
  ASSERT_EQ(rc, 0) << out << err << d_->log();
  EXPECT_NE(out.find("leased sim-stm32vl"), std::string::npos) << out;
  EXPECT_NE(out.find("flashed sim-stm32vl: sha256 "), std::string::npos) << out;
  EXPECT_NE(out.find("matched: "), std::string::npos) << out;
  EXPECT_NE(out.find("stm32vl-blinky"), std::string::npos) << "the new image's banner\n" << out;
  EXPECT_NE(out.find("released sim-stm32vl"), std::string::npos) << out;
  EXPECT_EQ(Holder(), "") << "the lease ended with the client";

  // Both ways: a line sent to the board, its answer read back.
  rc = Client(
      {"--tag", "simulated", "--image", FWAI_BLINKY_ELF, "--send", "ping", "--until", "^pong"},
      &out, &err);
  ASSERT_EQ(rc, 0) << out << err << d_->log();
  EXPECT_NE(out.find("> ping"), std::string::npos) << out;
  EXPECT_NE(out.find("matched: pong"), std::string::npos) << out;
  EXPECT_EQ(Holder(), "");
}

TEST_F(PythonClient, APatternNeverSeenExitsOneAndStillReleases) {
  std::string out, err;
  int rc = Client({"--board", "sim-stm32vl", "--image", FWAI_BLINKY_ELF, "--until", "never printed",
                   "--timeout", "2"},
                  &out, &err);
  EXPECT_EQ(rc, 1) << out << err;
  EXPECT_NE(err.find("'never printed' not seen on sim-stm32vl within 2 s"), std::string::npos)
      << err;
  EXPECT_NE(out.find("released sim-stm32vl"), std::string::npos) << out;
  EXPECT_EQ(Holder(), "");
}

TEST_F(PythonClient, NoSuchBoardExitsFour) {
  std::string out, err;
  int rc =
      Client({"--board", "no-such-board", "--image", FWAI_BLINKY_ELF, "--until", "x"}, &out, &err);
  EXPECT_EQ(rc, 4) << out << err;
  EXPECT_NE(err.find("no board: "), std::string::npos) << err;
}

}  // namespace
}  // namespace fwai
