// The board router (server/boards): which host a request reaches, and that
// the flash guard's policy and the evidence record happen once, in the
// router, whichever host flashes. Fake hosts stand for this node's broker
// and the lab's benches.
#include "server/boards/boards.h"

#include <gtest/gtest.h>

#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "tests/integration/daemon_fixture.h"

namespace fwai {
namespace {

// A reader whose lines arrive only when the test says: a bench's stream that
// lags behind the one a watch read. Starts at line 10.
struct FakeLines {
  std::mutex mu;
  std::deque<SerialLine> queue;
};
class FakeSerial final : public BoardSerial {
 public:
  explicit FakeSerial(std::shared_ptr<FakeLines> lines) : lines_(std::move(lines)) {}
  SerialReader::Next Wait(SerialLine& line, int timeout_ms) override {
    std::unique_lock lock(lines_->mu);
    if (lines_->queue.empty()) {
      lock.unlock();  // nothing pushes while a test waits: the wait passes
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min(timeout_ms, 10)));
      lock.lock();
    }
    if (lines_->queue.empty()) return SerialReader::Next::kTimeout;
    line = lines_->queue.front();
    lines_->queue.pop_front();
    return SerialReader::Next::kLine;
  }
  std::string end_reason() const override { return ""; }
  uint64_t dropped() const override { return 0; }
  absl::Status Write(std::string_view) override { return absl::OkStatus(); }
  absl::Status SendLine(std::string_view) override { return absl::OkStatus(); }
  uint64_t next_seq() const override { return 10; }
  void Notice(const std::string& text) override {
    std::lock_guard lock(lines_->mu);
    lines_->queue.push_back(SerialLine{0, 0, text, true});
  }

 private:
  std::shared_ptr<FakeLines> lines_;
};

// A host that records what reached it.
class FakeHost final : public BoardHost {
 public:
  std::vector<std::string> boards;             // hosted here (local)
  std::map<std::string, std::string> leases;   // local board -> holder identity
  std::vector<BoardRef> lab_held;              // lab leases of the caller through this node
  std::map<std::string, std::string> holders;  // lab board -> "NAME through NODE" (another's)
  int flashes = 0, debugs = 0, resets = 0;
  FlashGuardPolicy last_guard;
  bool last_approved = false;
  BoardRef last_board;

  bool Has(const std::string& b) const override {
    return std::find(boards.begin(), boards.end(), b) != boards.end();
  }
  bool HoldsAny(const Caller& c) const override {
    for (const auto& [b, who] : leases) {
      if (who == c.identity) return true;
    }
    return false;
  }
  absl::StatusOr<BoardRef> Pick(const Caller& c, const std::string& wanted) const override {
    if (!wanted.empty()) {
      if (Has(wanted)) return BoardRef{wanted, "", false, ""};
      return absl::NotFoundError("no board '" + wanted + "'");
    }
    for (const auto& [b, who] : leases) {
      if (who == c.identity) return BoardRef{b, "", false, ""};
    }
    if (boards.size() == 1) return BoardRef{boards[0], "", false, ""};
    return absl::NotFoundError("no boards are configured");
  }
  std::vector<BoardRef> Held(const Caller&, const std::string& board,
                             const std::string& lease_id) const override {
    std::vector<BoardRef> out;
    for (const auto& r : lab_held) {
      if ((board.empty() || r.id == board) && (lease_id.empty() || r.lease_id == lease_id))
        out.push_back(r);
    }
    return out;
  }
  std::optional<std::string> HeldByAnother(const Caller&, const std::string& board) const override {
    auto it = holders.find(board);
    if (it == holders.end()) return std::nullopt;
    return it->second;
  }
  absl::StatusOr<FlashResult> Flash(const Caller&, const BoardRef& b, const FlashOrder& order,
                                    bool approved, const FlashGuardPolicy& guard,
                                    const std::function<void(const FlashProgressUpdate&)>& progress,
                                    CancelToken*) override {
    ++flashes;
    last_guard = guard;
    last_approved = approved;
    last_board = b;
    progress({"writing", 0.5, "writing"});
    FlashResult r;
    r.sha256 = std::string(64, 'a');
    r.boot_line = "booted";
    r.record = {{"image_sha256", r.sha256},
                {"boot_line", r.boot_line},
                {"booted", true},
                {"image", order.image}};
    return r;
  }
  absl::StatusOr<std::unique_ptr<BoardSerial>> OpenSerial(const Caller&, const BoardRef&, bool,
                                                          const std::string&) override {
    return std::unique_ptr<BoardSerial>(std::make_unique<FakeSerial>(lines));
  }
  std::shared_ptr<FakeLines> lines = std::make_shared<FakeLines>();
  absl::StatusOr<uint64_t> SerialNextSeq(const Caller&, const BoardRef&,
                                         const std::string&) override {
    return 42;
  }
  absl::StatusOr<std::vector<SerialLine>> SerialHistory(const Caller&, const BoardRef& b, size_t,
                                                        const std::string& stream) override {
    return std::vector<SerialLine>{
        {1, 0, "history of " + b.id + (stream.empty() ? "" : " " + stream)}};
  }
  absl::StatusOr<DebugResult> Debug(const Caller&, const BoardRef& b,
                                    const std::vector<std::string>&, int, CancelToken*) override {
    ++debugs;
    DebugResult r;
    r.outputs = {"debugged " + b.id};
    return r;
  }
  absl::Status Reset(const Caller&, const BoardRef&) override {
    ++resets;
    return absl::OkStatus();
  }
  absl::Status SetHealth(const Caller&, const BoardRef&, const std::string& h,
                         const std::string&) override {
    health = h;
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> SelfTest(const Caller&, const BoardRef& b) override {
    return "self-test of " + b.id;
  }
  absl::Status OtaStage(const Caller&, const BoardRef&, const std::string&, bool) override {
    ++ota;
    return absl::OkStatus();
  }
  absl::StatusOr<OtaBootResult> OtaRestart(const Caller&, const BoardRef&, int) override {
    ++ota;
    return OtaBootResult{};
  }
  absl::Status OtaConfirm(const Caller&, const BoardRef&) override {
    ++ota;
    return absl::OkStatus();
  }
  absl::Status OtaRestorePrevious(const Caller&, const BoardRef&) override {
    ++ota;
    return absl::OkStatus();
  }
  absl::StatusOr<OtaSlotsInfo> OtaSlots(const BoardRef&) override { return OtaSlotsInfo{}; }
  std::string health;
  int ota = 0;
};

class BoardsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    local_.boards = {"l1", "l2"};
    lab_.lab_held = {BoardRef{"r1", "bench1", true, "lab-1"}};
    lab_.holders = {{"r2", "bob (uid 1001) through front2"}};
    alice_.identity = "uid:1000";
    alice_.display = "alice (uid 1000)";
    alice_.session_id = "s1";
    boards_.SetRecorder([this](const nlohmann::json& rec) { records_.push_back(rec); });
  }

  // A project whose policy says `policy_yaml`, and an image in it.
  std::string Project(const std::string& policy_yaml) {
    const std::string dir = testing::MakeTempDir("boards-test-");
    std::filesystem::create_directories(dir + "/.fwai");
    std::ofstream(dir + "/.fwai/project.yaml") << "name: fw\n" << policy_yaml;
    std::ofstream(dir + "/app.elf") << "not really an elf";
    return dir;
  }

  FakeHost local_, lab_;
  Boards boards_{local_, &lab_, "front1"};
  Caller alice_;
  std::vector<nlohmann::json> records_;
};

TEST_F(BoardsTest, ResolvesThisNodesBoardsHereAndTheLabsThroughTheCallersLease) {
  auto l = boards_.Resolve(alice_, "l2");
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_FALSE(l->remote);
  EXPECT_EQ(l->id, "l2");
  auto r = boards_.Resolve(alice_, "r1");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->remote);
  EXPECT_EQ(r->node, "bench1");
  EXPECT_EQ(r->lease_id, "lab-1");
  // "" is the one lab board the caller holds, unless they hold one here.
  auto any = boards_.Resolve(alice_, "");
  ASSERT_TRUE(any.ok()) << any.status();
  EXPECT_EQ(any->id, "r1");
  local_.leases["l1"] = alice_.identity;
  any = boards_.Resolve(alice_, "");
  ASSERT_TRUE(any.ok()) << any.status();
  EXPECT_EQ(any->id, "l1");
  EXPECT_FALSE(any->remote);
  // By the lab lease's id.
  auto by_lease = boards_.Resolve(alice_, "", "lab-1");
  ASSERT_TRUE(by_lease.ok()) << by_lease.status();
  EXPECT_EQ(by_lease->id, "r1");
}

TEST_F(BoardsTest, AnotherHoldersBoardIsRefusedNamingTheHolderAndAnUnknownLeaseRevealsNothing) {
  auto held = boards_.Resolve(alice_, "r2");
  ASSERT_EQ(held.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(held.status().message().find("bob (uid 1001) through front2"), std::string::npos)
      << held.status();
  EXPECT_NE(held.status().message().find("rule: the board's lease holder"), std::string::npos);
  auto free = boards_.Resolve(alice_, "r3");
  ASSERT_EQ(free.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(free.status().message().find("fwai hw lease r3"), std::string::npos) << free.status();
  auto lease = boards_.Resolve(alice_, "", "lab-someone-elses");
  ASSERT_EQ(lease.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(lease.status().message().find("bob"), std::string::npos) << lease.status();
  // Nothing reached either host's work.
  EXPECT_EQ(local_.flashes + lab_.flashes + local_.debugs + lab_.debugs, 0);
}

TEST_F(BoardsTest, OutsideALabEveryBoardIsThisNodes) {
  Boards alone(local_, nullptr, "");
  auto r = alone.Resolve(alice_, "r1");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound) << r.status();
  EXPECT_FALSE(alone.in_lab());
}

TEST_F(BoardsTest, TheGuardRunsOnceAndOneRecordIsWrittenForALocalAndALabFlash) {
  const std::string dir =
      Project("policy:\n  flash:\n    require_fresh: false\n    require_approval: false\n");
  for (const std::string board : {"l1", "r1"}) {
    records_.clear();
    local_.flashes = lab_.flashes = 0;
    auto ref = boards_.Resolve(alice_, board);
    ASSERT_TRUE(ref.ok()) << ref.status();
    FlashOrder order;
    order.image = dir + "/app.elf";
    order.project_root = dir;
    order.via = "api";
    std::vector<std::string> stages;
    auto r = boards_.Flash(
        alice_, *ref, order, [&](const FlashProgressUpdate& u) { stages.push_back(u.stage); },
        nullptr);
    ASSERT_TRUE(r.ok()) << board << ": " << r.status();
    const bool remote = board == "r1";
    EXPECT_EQ(local_.flashes, remote ? 0 : 1) << board;
    EXPECT_EQ(lab_.flashes, remote ? 1 : 0) << board;
    FakeHost& host = remote ? lab_ : local_;
    // The policy was applied here: freshness waived, approval waived.
    EXPECT_FALSE(host.last_guard.check_fresh) << board;
    EXPECT_TRUE(host.last_approved) << board;
    EXPECT_EQ(stages, std::vector<std::string>{"writing"});
    ASSERT_EQ(records_.size(), 1u) << board;
    const auto& rec = records_[0];
    EXPECT_EQ(rec["kind"], "flash");
    EXPECT_EQ(rec["board"], board);
    EXPECT_EQ(rec["node"], remote ? "bench1" : "front1");
    EXPECT_EQ(rec["principal"], "uid:1000");
    EXPECT_EQ(rec["by"], "alice (uid 1000)");
    EXPECT_EQ(rec["session_id"], "s1");
    EXPECT_EQ(rec["via"], "api");
    EXPECT_EQ(rec["image_sha256"], std::string(64, 'a'));
    EXPECT_EQ(rec.contains("lease_id"), remote) << rec.dump();
  }
}

TEST_F(BoardsTest, APolicyRefusalReachesNoHostAndIsRecordedOnce) {
  const std::string dir = Project("policy:\n  flash:\n    allowed_boards: [l2]\n");
  for (const std::string board : {"l1", "r1"}) {
    records_.clear();
    auto ref = boards_.Resolve(alice_, board);
    ASSERT_TRUE(ref.ok()) << ref.status();
    FlashOrder order;
    order.image = dir + "/app.elf";
    order.project_root = dir;
    order.approved = true;
    auto r = boards_.Flash(
        alice_, *ref, order, [](const FlashProgressUpdate&) {}, nullptr);
    ASSERT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied)
        << board << ": " << r.status();
    EXPECT_NE(r.status().message().find("flash.allowed_boards"), std::string::npos) << r.status();
    ASSERT_EQ(records_.size(), 1u);
    EXPECT_EQ(records_[0]["kind"], "policy_refusal");
    EXPECT_EQ(records_[0]["board"], board);
  }
  EXPECT_EQ(local_.flashes + lab_.flashes, 0);
}

TEST_F(BoardsTest, AGuardGivenByTheCallerIsUsedAsItIs) {
  // A skill run (or a bench flashing for a front) has applied the policy.
  auto ref = boards_.Resolve(alice_, "l1");
  ASSERT_TRUE(ref.ok());
  FlashOrder order;
  order.image = "/nonexistent/app.elf";  // no project: no policy file is read
  order.approved = true;
  FlashGuardPolicy g;
  g.check_fresh = false;
  g.flash_max_pct = 80;
  order.guard = g;
  auto r = boards_.Flash(
      alice_, *ref, order, [](const FlashProgressUpdate&) {}, nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(local_.last_guard.flash_max_pct, 80);
  EXPECT_TRUE(local_.last_approved);
  EXPECT_EQ(records_.size(), 1u);
}

TEST_F(BoardsTest, DebugResetAndHistoryGoToTheBoardsHost) {
  auto l = boards_.Resolve(alice_, "l1");
  auto r = boards_.Resolve(alice_, "r1");
  ASSERT_TRUE(l.ok() && r.ok());
  auto d = boards_.Debug(alice_, *r, {"print counter"}, 1000);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->outputs, std::vector<std::string>{"debugged r1"});
  EXPECT_EQ(lab_.debugs, 1);
  EXPECT_EQ(local_.debugs, 0);
  ASSERT_TRUE(boards_.Reset(alice_, *l).ok());
  EXPECT_EQ(local_.resets, 1);
  EXPECT_EQ(lab_.resets, 0);
  auto h = boards_.SerialHistory(alice_, *r, 10);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ((*h)[0].text, "history of r1");
  h = boards_.SerialHistory(alice_, *l, 10, "rtt:1");  // the stream reaches the host
  ASSERT_TRUE(h.ok());
  EXPECT_EQ((*h)[0].text, "history of l1 rtt:1");
  ASSERT_TRUE(boards_.SetHealth(alice_, *l, "bad", "broken").ok());
  EXPECT_EQ(local_.health, "bad");
  EXPECT_EQ(lab_.health, "");
  auto t = boards_.SelfTest(alice_, *r);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t, "self-test of r1");
  ASSERT_TRUE(boards_.OtaStage(alice_, *l, "image", false).ok());
  ASSERT_TRUE(boards_.OtaConfirm(alice_, *l).ok());
  EXPECT_EQ(local_.ota, 2);
  EXPECT_EQ(lab_.ota, 0);
}

// A watch read line 11 through its own stream; this reader's stream (a
// bench's, later) has not brought it yet: the notice waits for the line.
TEST_F(BoardsTest, ANoticeIsShownAfterTheLineItIsAboutHoweverLateThatLineComes) {
  auto r = boards_.Resolve(alice_, "r1");
  ASSERT_TRUE(r.ok()) << r.status();
  auto reader = boards_.OpenSerial(alice_, *r, /*from_history=*/false);
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto push = [&](uint64_t seq) {
    std::lock_guard lock(lab_.lines->mu);
    lab_.lines->queue.push_back(SerialLine{seq, 0, "line " + std::to_string(seq), false});
  };
  auto next = [&] {
    SerialLine l;
    return (*reader)->Wait(l, 0) == SerialReader::Next::kLine
               ? (l.notice ? "notice: " : "") + l.text
               : std::string("(nothing)");
  };
  push(10);
  EXPECT_EQ(boards_.Notice("r1", "fired on 11", "uart", 11), 1);
  EXPECT_EQ(next(), "line 10");
  EXPECT_EQ(next(), "(nothing)");  // held: line 11 has not come
  push(11);
  EXPECT_EQ(next(), "line 11");
  EXPECT_EQ(next(), "notice: fired on 11");
  // About a line before this reader opened, of another stream, or of no line: at once.
  boards_.Notice("r1", "fired on 3", "", 3);
  EXPECT_EQ(next(), "notice: fired on 3");
  boards_.Notice("r1", "fired on rtt", "rtt:0", 99);
  EXPECT_EQ(next(), "notice: fired on rtt");
  boards_.Notice("r1", "fired", "", 0);
  EXPECT_EQ(next(), "notice: fired");
  // A line this reader never gets (lost falling behind): the notice still comes.
  boards_.Notice("r1", "fired on 50", "", 50);
  EXPECT_EQ(next(), "(nothing)");
  SerialLine l;
  ASSERT_EQ((*reader)->Wait(l, 5000), SerialReader::Next::kLine);
  EXPECT_TRUE(l.notice);
  EXPECT_EQ(l.text, "fired on 50");
  // A notice reaches only readers of its board.
  EXPECT_EQ(boards_.Notice("r2", "elsewhere", "", 0), 0);
}

}  // namespace
}  // namespace fwai
