// The agent on a lab's boards: a session on a front whose tools (serial
// send, history, monitor, gdb) work on a bench's board under the lease its
// owner took through that front with the CLI — the same results and events
// as on a board of the node itself — are refused on a board someone else
// holds, and end with a clear error when the bench dies mid-turn. Real etcd,
// real fwaids (a bench and two fronts), a real QEMU board, a scripted model.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "fwai/v1/hardware.grpc.pb.h"
#include "fwai/v1/sessions.grpc.pb.h"
#include "server/lab/etcd_client.h"
#include "tests/fakes/fake_llm_server.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/lab/etcd_cluster.h"
#include "tests/lab/lab_support.h"

namespace fwai::lab {
namespace {

using fwai::testing::Daemon;
using fwai::testing::EtcdCluster;
using fwai::testing::Eventually;
using fwai::testing::FakeLlmServer;
using fwai::testing::FakeReply;
using fwai::testing::FwaidTls;
using fwai::testing::ReadText;
using fwai::testing::RunChat;
using fwai::testing::RunCommand;
namespace pb = ::fwai::v1;

using Results = std::map<std::string, pb::ToolCallFinished>;

class LabAgent : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(FWAI_BLINKY_ELF)) << FWAI_BLINKY_ELF << " not built";
    fake_.Start();
    ASSERT_TRUE(cluster_.Start()) << cluster_.log(0);
    etcd_ = *EtcdClient::Connect(cluster_.Options());
    tls_ = cluster_.tls_dir();
    const std::string lab = "lab:\n  ttl_s: 3\n";
    bench_ = std::make_unique<Daemon>(
        &fake_,
        lab + cluster_.LabEtcdYaml("bench1") +
            "  node: bench1\n  advertise: tls:127.0.0.1:0\ntls: {cert: " + tls_ +
            "/bench1.pem, key: " + tls_ + "/bench1.key, client_ca: " + tls_ + "/ca.pem}\n" +
            "hardware:\n  boards:\n    - {id: b1, kind: simulated, machine: stm32vldiscovery, "
            "boot_pattern: booted, tags: [stm32f1]}\n");
    bench_->AddListen("tls:127.0.0.1:0");
    for (const char* node : {"front1", "front2"}) {
      fronts_.push_back(std::make_unique<Daemon>(
          &fake_, lab + cluster_.LabEtcdYaml(node) + "  node: " + node + "\n  cert: " + tls_ + "/" +
                      node + ".pem\n  key: " + tls_ + "/" + node + ".key\n  ca: " + tls_ +
                      "/ca.pem\nhardware:\n  default_simulated_board: false\n"));
    }
    for (Daemon* d : {bench_.get(), fronts_[0].get(), fronts_[1].get()})
      ASSERT_TRUE(d->Start()) << d->log();
    ASSERT_TRUE(Eventually(
        [&] {
          auto node = etcd_->Get("/fwai/nodes/bench1");
          return node.ok() && node->has_value() &&
                 (*node)->value.find(":" + std::to_string(bench_->TcpPort()) + "\"") !=
                     std::string::npos;
        },
        std::chrono::seconds(10)))
        << bench_->log();
  }

  Daemon& front1() { return *fronts_[0]; }
  Daemon& front2() { return *fronts_[1]; }

  int Fwai(Daemon& d, std::vector<std::string> args, std::string* out, std::string* err) {
    std::vector<std::string> argv = {std::string(FWAI_BIN_DIR) + "/fwai", "--daemon", d.address()};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv, out, err, {}, 120);
  }

  // Leases b1 and flashes the example through `d`, as a person does with the CLI.
  void LeaseAndFlash(Daemon& d) {
    std::string out, err;
    // --wait: a bench lets a board go once the lease through a front is gone
    // from etcd (within a second), and a front's lease waits in the lab's queue.
    ASSERT_EQ(Fwai(d, {"hw", "lease", "b1", "--wait", "30"}, &out, &err), 0)
        << out << err << d.log();
    ASSERT_EQ(Fwai(d,
                   {"flash", "b1", FWAI_BLINKY_ELF, "--yes", "--project-root",
                    std::filesystem::path(FWAI_BLINKY_ELF).parent_path().string()},
                   &out, &err),
              0)
        << out << err << d.log();
  }

  // The scripted turn: ping/pong over serial, the history, a variable by GDB;
  // then the same on the firmware's RTT channel 0, and a channel it lacks.
  void EnqueueCheckTurn() {
    FakeReply calls;
    calls.tool_calls = {
        {"c1", "serialSendCommand", {{"board", "b1"}, {"command", "ping"}, {"wait_for", "^pong"}}},
        {"c2", "gdb", {{"commands", {"print counter"}}}},
        {"c3", "serialReadHistory", {{"lines", 200}, {"filter", "booted"}}},
        {"c4",
         "serialSendCommand",
         {{"command", "ping"}, {"wait_for", "^pong"}, {"stream", "rtt:0"}, {"timeout", 20}}},
        {"c5", "serialReadHistory", {{"filter", "^rtt: .*booted"}, {"stream", "rtt:0"}}},
        {"c6", "serialMonitor", {{"seconds", 1}, {"stream", "rtt:7"}}},
        {"c7", "faultCapture", nlohmann::json::object()}};
    fake_.Enqueue(calls);
    FakeReply done;
    done.chunks = {"all good"};
    fake_.Enqueue(done);
  }

  // The flash records of `d`'s evidence log, oldest first.
  std::vector<nlohmann::json> FlashRecords(Daemon& d) {
    std::string out, err;
    EXPECT_EQ(Fwai(d, {"--json", "evidence", "ls", "-n", "0"}, &out, &err), 0) << err;
    std::vector<nlohmann::json> found;
    std::istringstream lines(out);
    for (std::string line; std::getline(lines, line);) {
      auto rec = nlohmann::json::parse(line)["record"];
      if (rec["kind"] == "flash") found.push_back(rec);
    }
    return found;
  }

  static Results ResultsOf(const fwai::testing::TurnOutcome& turn) {
    Results r;
    for (const auto& ev : turn.events) {
      if (ev.has_tool_call_finished())
        r[ev.tool_call_finished().call_id()] = ev.tool_call_finished();
    }
    return r;
  }
  // The kinds of event a turn had, in order, without repeats of one kind.
  static std::vector<int> KindsOf(const fwai::testing::TurnOutcome& turn) {
    std::vector<int> kinds;
    for (const auto& ev : turn.events) {
      if (kinds.empty() || kinds.back() != ev.payload_case()) kinds.push_back(ev.payload_case());
    }
    return kinds;
  }

  FakeLlmServer fake_;
  EtcdCluster cluster_{1};
  std::unique_ptr<EtcdClient> etcd_;
  std::string tls_;
  std::unique_ptr<Daemon> bench_;
  std::vector<std::unique_ptr<Daemon>> fronts_;
};

TEST_F(LabAgent, TheAgentWorksOnABenchsBoardAsOnItsOwn) {
  // Through the front: leased and flashed with the CLI, then the agent.
  LeaseAndFlash(front1());
  EnqueueCheckTurn();
  auto session = front1().CreateSession();
  auto lab_turn = RunChat(*front1().sessions(), session.id(), "check the board", 90);
  ASSERT_TRUE(lab_turn.finished) << front1().log();
  Results lab = ResultsOf(lab_turn);
  ASSERT_EQ(lab.size(), 7u);
  EXPECT_FALSE(lab["c1"].is_error()) << lab["c1"].output();
  EXPECT_NE(lab["c1"].output().find("pong"), std::string::npos) << lab["c1"].output();
  EXPECT_FALSE(lab["c2"].is_error()) << lab["c2"].output();
  EXPECT_NE(lab["c2"].output().find("counter = "), std::string::npos) << lab["c2"].output();
  EXPECT_FALSE(lab["c3"].is_error()) << lab["c3"].output();
  EXPECT_NE(lab["c3"].output().find("stm32vl-blinky 1.0.0 booted"), std::string::npos)
      << lab["c3"].output();
  EXPECT_FALSE(lab["c4"].is_error()) << lab["c4"].output();
  EXPECT_NE(lab["c4"].output().find("pong"), std::string::npos) << lab["c4"].output();
  EXPECT_FALSE(lab["c5"].is_error()) << lab["c5"].output();
  EXPECT_NE(lab["c5"].output().find("rtt: stm32vl-blinky 1.0.0 booted"), std::string::npos)
      << lab["c5"].output();
  EXPECT_TRUE(lab["c6"].is_error()) << lab["c6"].output();
  EXPECT_NE(lab["c6"].output().find("RTT up-channels 0 to 1, not rtt:7"), std::string::npos)
      << lab["c6"].output();
  // A capture of the bench's board, kept in the front's project, decodes there offline.
  EXPECT_FALSE(lab["c7"].is_error()) << lab["c7"].output();
  // Halted where it ran: in thread mode or in an interrupt handler, not in a fault.
  EXPECT_TRUE(std::regex_search(lab["c7"].output(), std::regex("not (in )?a fault handler")))
      << lab["c7"].output();
  const std::string saved_at = "capture saved to ";
  const auto at = lab["c7"].output().find(saved_at);
  ASSERT_NE(at, std::string::npos) << lab["c7"].output();
  const std::string rel = lab["c7"].output().substr(
      at + saved_at.size(),
      lab["c7"].output().find(' ', at + saved_at.size()) - at - saved_at.size());
  EXPECT_EQ(rel.rfind(".fwai/captures/b1-", 0), 0u) << rel;
  std::string decoded, derr;
  ASSERT_EQ(
      Fwai(front1(),
           {"fault", "decode", front1().project_dir() + "/" + rel, "--image", FWAI_BLINKY_ELF},
           &decoded, &derr),
      0)
      << derr;
  EXPECT_TRUE(std::regex_search(decoded, std::regex("not (in )?a fault handler"))) << decoded;
  EXPECT_NE(decoded.find(" main at "), std::string::npos) << decoded;
  EXPECT_EQ(lab_turn.text, "all good");
  // The flash through the front is one record there, naming the bench.
  std::string out, err;
  std::vector<nlohmann::json> front_flashes = FlashRecords(front1());
  ASSERT_EQ(front_flashes.size(), 1u);
  EXPECT_EQ(front_flashes[0]["node"], "bench1") << front_flashes[0].dump();
  EXPECT_EQ(front_flashes[0]["board"], "b1");
  EXPECT_EQ(front_flashes[0]["image_sha256"].get<std::string>().size(), 64u);

  // The same turn on the bench, whose board it is: the same kinds of event
  // and the same answers.
  ASSERT_EQ(Fwai(front1(), {"hw", "release", "b1"}, &out, &err), 0) << err;
  LeaseAndFlash(*bench_);
  EnqueueCheckTurn();
  auto local_session = bench_->CreateSession();
  auto local_turn = RunChat(*bench_->sessions(), local_session.id(), "check the board", 90);
  ASSERT_TRUE(local_turn.finished) << bench_->log();
  Results local = ResultsOf(local_turn);
  ASSERT_EQ(local.size(), 7u);
  for (const char* id : {"c1", "c2", "c3", "c4", "c5", "c6", "c7"})
    EXPECT_EQ(local[id].is_error(), lab[id].is_error()) << id;
  EXPECT_NE(local["c1"].output().find("pong"), std::string::npos) << local["c1"].output();
  EXPECT_NE(local["c2"].output().find("counter = "), std::string::npos) << local["c2"].output();
  EXPECT_NE(local["c3"].output().find("stm32vl-blinky 1.0.0 booted"), std::string::npos);
  EXPECT_NE(local["c4"].output().find("pong"), std::string::npos) << local["c4"].output();
  EXPECT_NE(local["c5"].output().find("rtt: stm32vl-blinky 1.0.0 booted"), std::string::npos)
      << local["c5"].output();
  EXPECT_NE(local["c6"].output().find("RTT up-channels 0 to 1, not rtt:7"), std::string::npos)
      << local["c6"].output();
  EXPECT_EQ(KindsOf(local_turn), KindsOf(lab_turn));
  // The bench's own flash records (the one it did for the front, and its
  // own user's) have the same shape, and name its node.
  std::vector<nlohmann::json> bench_flashes = FlashRecords(*bench_);
  ASSERT_EQ(bench_flashes.size(), 2u);
  for (const auto& rec : bench_flashes) {
    for (const char* key : {"kind", "board", "node", "image", "image_sha256", "principal", "by",
                            "approved", "boot_line", "booted", "seconds", "via"}) {
      EXPECT_TRUE(rec.contains(key)) << key << ": " << rec.dump();
      EXPECT_TRUE(front_flashes[0].contains(key)) << key << ": " << front_flashes[0].dump();
    }
    EXPECT_EQ(rec["node"], "bench1");
    EXPECT_EQ(rec["image_sha256"], front_flashes[0]["image_sha256"]);
  }
}

TEST_F(LabAgent, ABoardHeldThroughAnotherFrontIsRefusedToTheAgentNamingTheHolder) {
  LeaseAndFlash(front1());
  FakeReply calls;
  calls.tool_calls = {{"c1", "serialSendCommand", {{"board", "b1"}, {"command", "led on"}}},
                      {"c2", "gdb", {{"board", "b1"}, {"commands", {"print counter"}}}}};
  fake_.Enqueue(calls);
  FakeReply done;
  done.chunks = {"refused"};
  fake_.Enqueue(done);
  auto session = front2().CreateSession();
  auto turn = RunChat(*front2().sessions(), session.id(), "turn the led on", 60);
  ASSERT_TRUE(turn.finished) << front2().log();
  Results r = ResultsOf(turn);
  ASSERT_EQ(r.size(), 2u);
  for (const char* id : {"c1", "c2"}) {
    EXPECT_TRUE(r[id].is_error()) << id;
    EXPECT_NE(r[id].output().find("is held by"), std::string::npos) << r[id].output();
    EXPECT_NE(r[id].output().find("through front1"), std::string::npos) << r[id].output();
  }
  // Nothing reached the board: no command was seen on its serial port.
  std::string out, err;
  ASSERT_EQ(Fwai(front1(), {"monitor", "b1", "--history", "--timeout", "1"}, &out, &err), 0) << err;
  EXPECT_EQ(out.find("led on"), std::string::npos) << out;
}

// A session on a front rewound: its project's files and the bench's board's
// image (read back from the bench) as before its turn. While the board is
// held through another front, the rewind is refused and changes nothing.
TEST_F(LabAgent, ARewindOnAFrontFlashesTheBenchsBoardBackAndNeedsItsLease) {
  namespace fs = std::filesystem;
  const std::string project = cluster_.dir() + "/rewound";
  fs::create_directories(project + "/src");
  std::ofstream(project + "/src/main.c") << "int version = 1;\n";
  const std::string image_a = project + "/a.elf", image_b = project + "/b.elf";
  fs::copy_file(FWAI_BLINKY_ELF, image_a);
  // b.elf: the same firmware under another version (it still says "booted").
  std::string bytes = ReadText(FWAI_BLINKY_ELF);
  size_t changed = 0;
  for (size_t at = bytes.find("1.0.0"); at != std::string::npos; at = bytes.find("1.0.0", at)) {
    bytes.replace(at, 5, "1.0.9");
    ++changed;
  }
  ASSERT_GT(changed, 0u);
  pb::Session session;
  {
    grpc::ClientContext ctx;
    pb::CreateSessionRequest req;
    req.set_project_root(project);
    ASSERT_TRUE(front1().sessions()->Create(&ctx, req, &session).ok());
  }
  const std::string id = session.id();
  auto running = [&] {  // the image the bench's board runs, as the bench says
    grpc::ClientContext ctx;
    pb::ListDevicesResponse r;
    EXPECT_TRUE(pb::Hardware::NewStub(bench_->channel())->ListDevices(&ctx, {}, &r).ok());
    for (const auto& d : r.devices())
      if (d.id() == "b1") return d.image_sha256();
    return std::string();
  };
  std::string out, err;
  ASSERT_EQ(Fwai(front1(), {"hw", "lease", "b1", "--wait", "30", "--session", id}, &out, &err), 0)
      << err;
  ASSERT_EQ(
      Fwai(front1(), {"flash", "b1", image_a, "--yes", "--project-root", project}, &out, &err), 0)
      << err;
  const std::string sha_a = running();
  ASSERT_EQ(sha_a.size(), 64u);
  FakeReply hello;
  hello.chunks = {"hello"};
  fake_.Enqueue(hello);
  ASSERT_TRUE(RunChat(*front1().sessions(), id, "hello", 60).finished) << front1().log();
  std::ofstream(project + "/src/main.c", std::ios::trunc) << "int version = 2;\n";
  std::ofstream(image_b, std::ios::binary | std::ios::trunc) << bytes;  // built after the change
  ASSERT_EQ(
      Fwai(front1(), {"flash", "b1", image_b, "--yes", "--project-root", project}, &out, &err), 0)
      << err;
  ASSERT_NE(running(), sha_a);
  // Held through front2: refused, nothing changed.
  ASSERT_EQ(Fwai(front1(), {"hw", "release"}, &out, &err), 0) << err;
  ASSERT_EQ(Fwai(front2(), {"hw", "lease", "b1", "--wait", "30"}, &out, &err), 0) << err;
  EXPECT_EQ(Fwai(front1(), {"rewind", id, "--to", "1", "--yes"}, &out, &err), 1);
  EXPECT_NE(err.find("board b1: "), std::string::npos) << err;
  EXPECT_NE(err.find("nothing was changed"), std::string::npos) << err;
  EXPECT_EQ(ReadText(project + "/src/main.c"), "int version = 2;\n");
  // Held again through front1: rewound, the bench's board flashed back.
  ASSERT_EQ(Fwai(front2(), {"hw", "release"}, &out, &err), 0) << err;
  ASSERT_EQ(Fwai(front1(), {"hw", "lease", "b1", "--wait", "30", "--session", id}, &out, &err), 0)
      << err;
  ASSERT_EQ(Fwai(front1(), {"rewind", id, "--to", "1", "--yes"}, &out, &err), 0)
      << err << front1().log();
  EXPECT_EQ(ReadText(project + "/src/main.c"), "int version = 1;\n");
  EXPECT_EQ(running(), sha_a);
}

TEST_F(LabAgent, TheBenchKilledMidTurnEndsTheToolCallWithAClearErrorAndTheTurnGoesOn) {
  LeaseAndFlash(front1());
  FakeReply calls;
  calls.tool_calls = {{"c1", "serialMonitor", {{"board", "b1"}, {"seconds", 60}}}};
  fake_.Enqueue(calls);
  FakeReply after;
  after.tool_calls = {{"c2", "gdb", {{"board", "b1"}, {"commands", {"print counter"}}}}};
  fake_.Enqueue(after);
  FakeReply done;
  done.chunks = {"the bench went away"};
  fake_.Enqueue(done);
  auto session = front1().CreateSession();
  auto stub = front1().sessions();
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(90));
  auto stream = fwai::testing::OpenChat(*stub, &ctx, session.id(), "watch the board");
  pb::ServerEvent ev;
  Results results;
  bool finished = false;
  std::string text;
  const auto start = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point killed;
  while (!finished && stream->Read(&ev)) {
    // The monitor says when it watches; the bench dies then, mid-call.
    if (ev.has_tool_call_output_delta() && ev.tool_call_output_delta().call_id() == "c1" &&
        killed == std::chrono::steady_clock::time_point()) {
      EXPECT_NE(ev.tool_call_output_delta().text().find("watching b1 on bench1"),
                std::string::npos);
      bench_->Kill9();
      killed = std::chrono::steady_clock::now();
    }
    if (ev.has_tool_call_finished())
      results[ev.tool_call_finished().call_id()] = ev.tool_call_finished();
    if (ev.has_text_delta()) text += ev.text_delta().text();
    finished = ev.has_turn_finished();
  }
  ASSERT_TRUE(finished) << front1().log();
  ASSERT_EQ(results.size(), 2u);
  // The monitor ends with the bench, well before its 60 s.
  EXPECT_TRUE(results["c1"].is_error()) << results["c1"].output();
  EXPECT_NE(results["c1"].output().find("serial stream ended"), std::string::npos)
      << results["c1"].output();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(45));
  EXPECT_NE(killed, std::chrono::steady_clock::time_point());
  // Debugging a board whose bench is gone is refused in words.
  EXPECT_TRUE(results["c2"].is_error()) << results["c2"].output();
  EXPECT_FALSE(results["c2"].output().empty());
  EXPECT_EQ(text, "the bench went away");
  // The front lives on.
  std::string out, err;
  EXPECT_EQ(Fwai(front1(), {"hw", "ls"}, &out, &err), 0) << err;
}

}  // namespace
}  // namespace fwai::lab
