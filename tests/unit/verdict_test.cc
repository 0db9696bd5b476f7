// Verdicts: set where the cause is known, carried across gRPC, never guessed;
// a board's `lab` failures in a row quarantine it.

#include "common/verdict.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

#include "common/config.h"
#include "common/grpc_status.h"
#include "server/hardware/broker.h"
#include "server/storage/storage.h"

namespace fwai {
namespace {

namespace fs = std::filesystem;

TEST(VerdictTest, IsSetWhereKnownAndNeverReadFromTheWords) {
  absl::Status lab = WithVerdict(absl::UnavailableError("the simulator died"), kVerdictLab);
  EXPECT_EQ(VerdictOf(lab), "lab");
  EXPECT_EQ(lab.message(), "the simulator died");
  // Words that name a cause do not make a verdict.
  EXPECT_EQ(VerdictOf(absl::UnavailableError("probe gone; flash guard; firmware fault")), "");
  EXPECT_EQ(VerdictOf(WithVerdict(absl::OkStatus(), kVerdictLab)), "");
  EXPECT_EQ(VerdictOf(WithVerdict(absl::InternalError("x"), "hardware")), "")
      << "only the five verdicts are set";
  // A step's class says the verdict where it knows it, else the call's own.
  EXPECT_EQ(VerdictOfClass("build", "lab"), "firmware");
  EXPECT_EQ(VerdictOfClass("verify", ""), "firmware");
  EXPECT_EQ(VerdictOfClass("policy", ""), "config");
  EXPECT_EQ(VerdictOfClass("provider", ""), "infra");
  EXPECT_EQ(VerdictOfClass("hardware", "lab"), "lab");
  EXPECT_EQ(VerdictOfClass("hardware", ""), "unknown");
  EXPECT_EQ(VerdictOfClass("timeout", ""), "unknown");
  EXPECT_EQ(VerdictOfClass("cancelled", "lab"), "");
  EXPECT_EQ(VerdictOfClass("", ""), "");
  EXPECT_EQ(VerdictExitCode("firmware"), 30);
  EXPECT_EQ(VerdictExitCode("lab"), 31);
  EXPECT_EQ(VerdictExitCode("infra"), 32);
  EXPECT_EQ(VerdictExitCode("config"), 33);
  EXPECT_EQ(VerdictExitCode("unknown"), 34);
  EXPECT_EQ(VerdictExitCode("nonsense"), 34);
}

TEST(VerdictTest, TravelsInTheCallsErrorDetails) {
  const absl::Status firmware = WithVerdict(
      absl::DeadlineExceededError("flashed sim, but 'booted' did not appear"), kVerdictFirmware);
  grpc::Status wire = ToGrpc(firmware);
  EXPECT_EQ(wire.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(wire.error_message(), "flashed sim, but 'booted' did not appear");
  EXPECT_FALSE(wire.error_details().empty());
  EXPECT_EQ(VerdictOf(wire), "firmware");
  absl::Status back = FromGrpc(wire);
  EXPECT_EQ(back.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(VerdictOf(back), "firmware");
  // None set: no details; details that are not ours say nothing.
  EXPECT_TRUE(ToGrpc(absl::InternalError("x")).error_details().empty());
  EXPECT_EQ(VerdictOf(grpc::Status(grpc::StatusCode::INTERNAL, "x", "not a status")), "");
  EXPECT_EQ(VerdictOf(grpc::Status(grpc::StatusCode::INTERNAL, "x", std::string("\x0a\x05", 2))),
            "");
  EXPECT_TRUE(ToGrpc(absl::OkStatus()).ok());
}

class QuarantineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("fwai-quarantine-" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    config_.default_simulated_board = false;
    config_.quarantine_after = 3;
    for (const char* id : {"bench-a", "bench-b"}) {
      BoardConfig b;
      b.id = id;
      b.tags = {"f1"};
      config_.boards.push_back(b);
    }
    admin_.identity = "uid:0";
    admin_.display = "root";
    admin_.admin = true;
    user_.identity = "uid:1000";
    user_.display = "alice (uid 1000)";
    user_.uid = 1000;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<HardwareBroker> Open(std::unique_ptr<Storage>& db) {
    auto s = Storage::Open((dir_ / "db").string());
    EXPECT_TRUE(s.ok()) << s.status();
    db = std::move(*s);
    auto b = std::make_unique<HardwareBroker>(config_, *db, (dir_ / "run").string());
    EXPECT_TRUE(b->Start().ok());
    b->SetRunRecorder([this](const nlohmann::json& r) { records_.push_back(r); });
    return b;
  }
  static std::string Health(const HardwareBroker& b, const std::string& id) {
    for (const auto& d : b.List())
      if (d.id == id) return d.health;
    return "";
  }
  static absl::Status Lab(const std::string& why) {
    return WithVerdict(absl::UnavailableError(why), kVerdictLab);
  }

  fs::path dir_;
  HardwareConfig config_;
  Caller admin_, user_;
  std::vector<nlohmann::json> records_;
};

TEST_F(QuarantineTest, ThreeLabFailuresInARowQuarantineTheBoardUntilAnAdminReturnsIt) {
  std::unique_ptr<Storage> db;
  auto broker = Open(db);
  // Two lab failures, then the board runs the firmware (its failure is the
  // firmware's): the count starts again. Other verdicts neither count nor reset.
  broker->CountOutcome("bench-a", Lab("the probe is gone"), "flash");
  broker->CountOutcome("bench-a", Lab("the probe is gone"), "flash");
  broker->CountOutcome("bench-a", WithVerdict(absl::InternalError("assert"), kVerdictFirmware),
                       "skill run hil");
  broker->CountOutcome("bench-a", Lab("the probe is gone"), "flash");
  broker->CountOutcome("bench-a", WithVerdict(absl::InternalError("guard"), kVerdictConfig),
                       "flash");
  broker->CountOutcome("bench-a", absl::UnknownError("no verdict"), "skill run hil");
  broker->CountOutcome("bench-a", Lab("the probe is gone"), "flash");
  EXPECT_EQ(Health(*broker, "bench-a"), "good");
  EXPECT_TRUE(records_.empty());
  broker->CountOutcome("bench-a", Lab("port /dev/ttyACM0 closed"), "skill run hil");
  EXPECT_EQ(Health(*broker, "bench-a"), "quarantined");
  ASSERT_EQ(records_.size(), 1u);
  EXPECT_EQ(records_[0].value("kind", ""), "board_quarantined");
  EXPECT_EQ(records_[0].value("board", ""), "bench-a");
  ASSERT_EQ(records_[0]["failures"].size(), 3u);
  EXPECT_EQ(records_[0]["failures"][2].value("error", ""), "port /dev/ttyACM0 closed");
  // Out of the pool: a lease by tag gets the other board, by id a refusal.
  auto by_tag = broker->Acquire(user_, "", {"f1"}, 60, 0, nullptr);
  ASSERT_TRUE(by_tag.ok()) << by_tag.status();
  EXPECT_EQ(by_tag->device_id, "bench-b");
  auto by_id = broker->Acquire(user_, "bench-a", {}, 60, 0, nullptr);
  ASSERT_FALSE(by_id.ok());
  EXPECT_NE(by_id.status().message().find("bench-a is quarantined"), std::string::npos)
      << by_id.status();
  // A good outcome does not lift it; a self-test refuses; nobody but an admin sets it good.
  broker->CountOutcome("bench-a", absl::OkStatus(), "flash");
  EXPECT_EQ(Health(*broker, "bench-a"), "quarantined");
  EXPECT_EQ(broker->SelfTest(admin_, "bench-a").status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(broker->SetHealth(user_, "bench-a", "good", "").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Health(*broker, "bench-a"), "quarantined");

  // It outlives a restart of fwaid.
  broker.reset();
  db.reset();
  records_.clear();
  broker = Open(db);
  EXPECT_EQ(Health(*broker, "bench-a"), "quarantined");
  ASSERT_TRUE(broker->SetHealth(admin_, "bench-a", "good", "probe replaced").ok());
  EXPECT_EQ(Health(*broker, "bench-a"), "good");
  EXPECT_TRUE(broker->Acquire(user_, "bench-a", {}, 60, 0, nullptr).ok());
  broker.reset();
  db.reset();
  broker = Open(db);
  EXPECT_EQ(Health(*broker, "bench-a"), "good") << "the return is kept too";
}

TEST_F(QuarantineTest, ZeroNeverQuarantines) {
  config_.quarantine_after = 0;
  std::unique_ptr<Storage> db;
  auto broker = Open(db);
  for (int i = 0; i < 10; ++i) broker->CountOutcome("bench-b", Lab("gone"), "flash");
  EXPECT_EQ(Health(*broker, "bench-b"), "good");
  EXPECT_TRUE(records_.empty());
}

}  // namespace
}  // namespace fwai
