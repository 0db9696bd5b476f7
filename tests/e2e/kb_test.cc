// fwai kb through the CLI and a real fwaid: mixed files, per-file errors,
// search output, batch search, removal; kill -9 during ingest.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tests/integration/daemon_fixture.h"
#include "tests/support/pdf_writer.h"

namespace fwai::testing {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::vector<json> Lines(const std::string& out) {
  std::vector<json> v;
  std::istringstream in(out);
  std::string l;
  while (std::getline(in, l)) {
    if (!l.empty()) v.push_back(json::parse(l, nullptr, false));
  }
  return v;
}

class KbCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_ = std::make_unique<Daemon>(nullptr);
    ASSERT_TRUE(daemon_->Start()) << daemon_->log();
    docs_ = daemon_->dir() + "/docs";
    fs::create_directories(docs_ + "/sub");
  }
  int Fwai(std::vector<std::string> args, std::string* out, std::string* err = nullptr,
           const std::string& cwd = "") {
    std::vector<std::string> argv = {std::string(FWAI_BIN_DIR) + "/fwai", "--daemon",
                                     daemon_->address()};
    argv.insert(argv.end(), args.begin(), args.end());
    std::string e;
    int rc;
    if (!cwd.empty()) {
      std::string old = fs::current_path().string();
      fs::current_path(cwd);
      rc = RunCommand(argv, out, &e);
      fs::current_path(old);
    } else {
      rc = RunCommand(argv, out, &e);
    }
    if (err) *err = e;
    return rc;
  }
  void Write(const std::string& rel, const std::string& bytes) {
    std::ofstream(docs_ + "/" + rel, std::ios::binary) << bytes;
  }

  std::unique_ptr<Daemon> daemon_;
  std::string docs_;
};

TEST_F(KbCliTest, AddMixedFilesSearchAndRemove) {
  Write("uart.md",
        "# UART\n\n## Baud rate\n\nProgram USART1_BRR with the divider; 0x45 gives 115200 baud at "
        "8 MHz.\n");
  Write("sub/gpio.html",
        "<html><head><title>GPIO</title></head><body><h2>Mode register</h2>"
        "<p>GPIOA_MODER selects input, output, alternate or analog mode for each "
        "pin.</p></body></html>");
  Write("sub/adc.pdf", MakePdf({"ADC", "ADC1_SMPR1 selects the sampling time of each channel."}));
  Write("junk.bin", std::string("\x00\x01\x02\x03garbage\x00\xff", 12));
  Write("blank.pdf", MakePdf({""}));
  Write("empty.txt", "");
  std::string out, err;
  int rc = Fwai({"--json", "kb", "add", ".", "--tag", "vendor=st"}, &out, &err, docs_);
  EXPECT_EQ(rc, 1) << err;  // some files failed, the others went in
  int done = 0;
  std::set<std::string> failed;
  for (const auto& j : Lines(out)) {
    if (j["type"] == "done") ++done;
    if (j["type"] == "error") failed.insert(j["name"].get<std::string>());
  }
  EXPECT_EQ(done, 3);
  EXPECT_EQ(failed, (std::set<std::string>{"junk.bin", "blank.pdf", "empty.txt"}));
  // Relative names, as given.
  ASSERT_EQ(Fwai({"--json", "kb", "ls"}, &out), 0);
  auto ls = json::parse(out);
  ASSERT_EQ(ls.size(), 3u);
  std::set<std::string> names;
  for (const auto& d : ls) names.insert(d["name"]);
  EXPECT_EQ(names, (std::set<std::string>{"uart.md", "sub/gpio.html", "sub/adc.pdf"}));
  // Search JSON shape.
  ASSERT_EQ(Fwai({"--json", "kb", "search", "which", "register", "selects", "the", "ADC1_SMPR1",
                  "sampling", "time"},
                 &out),
            0);
  auto hits = json::parse(out);
  ASSERT_FALSE(hits.empty());
  for (const char* k :
       {"rank", "score", "doc", "title_path", "page", "end_page", "start_line", "end_line",
        "content_type", "text", "tokens", "chunk_id", "chunk_ids", "highlights", "search_id"}) {
    EXPECT_TRUE(hits[0].contains(k)) << k;
  }
  EXPECT_EQ(hits[0]["doc"], "sub/adc.pdf");
  EXPECT_LE(hits[0]["page"], 2);  // a passage may start on the page before its answer
  EXPECT_EQ(hits[0]["end_page"], 2);
  EXPECT_EQ(hits[0]["rank"], 1);
  // Batch search.
  std::ofstream(daemon_->dir() + "/q.jsonl")
      << "{\"query\": \"GPIOA_MODER pin mode\"}\n{\"query\": \"USART1_BRR baud\"}\n";
  ASSERT_EQ(
      Fwai({"kb", "search", "--batch", daemon_->dir() + "/q.jsonl", "--json", "-n", "3"}, &out), 0);
  auto batch = Lines(out);
  ASSERT_EQ(batch.size(), 2u);
  EXPECT_EQ(batch[0]["query"], "GPIOA_MODER pin mode");
  EXPECT_TRUE(batch[0]["took_ms"].is_number());
  EXPECT_EQ(batch[0]["results"][0]["doc"], "sub/gpio.html");
  EXPECT_EQ(batch[1]["results"][0]["doc"], "uart.md");
  // Adding again changes nothing; stats agree with ls.
  ASSERT_EQ(Fwai({"--json", "kb", "add", "uart.md"}, &out, &err, docs_), 0) << err;
  EXPECT_EQ(Lines(out)[Lines(out).size() - 2]["unchanged"], true);
  ASSERT_EQ(Fwai({"--json", "kb", "stats"}, &out), 0);
  auto stats = json::parse(out);
  EXPECT_EQ(stats["documents"], 3);
  int chunks = 0;
  for (const auto& d : ls) chunks += d["chunks"].get<int>();
  EXPECT_EQ(stats["chunks"], chunks);
  // Remove by name.
  ASSERT_EQ(Fwai({"kb", "rm", "uart.md"}, &out), 0);
  ASSERT_EQ(Fwai({"--json", "kb", "search", "USART1_BRR"}, &out), 0);
  for (const auto& h : json::parse(out)) EXPECT_NE(h["doc"], "uart.md");
  EXPECT_EQ(Fwai({"kb", "rm", "uart.md"}, &out, &err), 1);
  EXPECT_NE(err.find("not found"), std::string::npos);
}

TEST_F(KbCliTest, LogFeedbackAndStatsSurviveARestart) {
  Write("f1.md",
        "# Flash\n\n## Latency\n\nFLASH_ACR sets the flash wait states (latency) for the core "
        "clock.\n");
  Write("f2.md",
        "# Flash notes\n\n## Latency\n\nThe flash latency and wait states depend on the supply "
        "voltage.\n");
  std::string out, err;
  ASSERT_EQ(Fwai({"kb", "add", "."}, &out, &err, docs_), 0) << err;
  ASSERT_EQ(Fwai({"--json", "kb", "search", "flash wait states latency"}, &out, &err), 0) << err;
  auto hits = json::parse(out);
  ASSERT_GE(hits.size(), 2u);
  const std::string id = hits[0]["search_id"], first = hits[0]["doc"], second = hits[1]["doc"];
  ASSERT_EQ(id.rfind("q", 0), 0u) << id;
  // The log shows the search, who asked and what came back.
  ASSERT_EQ(Fwai({"--json", "kb", "log", "-n", "1"}, &out, &err), 0) << err;
  auto log = Lines(out);
  ASSERT_EQ(log.size(), 1u);
  EXPECT_EQ(log[0]["id"], id);
  EXPECT_EQ(log[0]["query"], "flash wait states latency");
  EXPECT_EQ(log[0]["source"], "cli");
  EXPECT_EQ(log[0]["results"][0]["doc"], first);
  EXPECT_NE(log[0]["method"].get<std::string>().find("passages(512)"), std::string::npos) << log[0];
  // Marked bad: the same search now puts the other document first.
  ASSERT_EQ(Fwai({"kb", "feedback", id, "1", "--bad", "--note", "not the register"}, &out, &err), 0)
      << err;
  EXPECT_NE(out.find("marked result 1"), std::string::npos) << out;
  ASSERT_EQ(Fwai({"kb", "stats"}, &out, &err), 0) << err;
  EXPECT_NE(out.find("0 good, 1 bad"), std::string::npos) << out;
  // Bad corrections are refused with the reason.
  EXPECT_EQ(Fwai({"kb", "feedback", id, "7", "--bad"}, &out, &err), 1);
  EXPECT_NE(err.find("has no result '7'"), std::string::npos) << err;
  EXPECT_EQ(Fwai({"kb", "feedback", "q99999", "1", "--good"}, &out, &err), 1);
  EXPECT_NE(err.find("not in the retrieval log"), std::string::npos) << err;
  EXPECT_EQ(Fwai({"kb", "feedback", id, "1"}, &out, &err), 2);  // neither --good nor --bad
  // After a restart the correction still holds and the log still has it.
  EXPECT_EQ(daemon_->Stop(), 0) << daemon_->log();
  ASSERT_TRUE(daemon_->Start()) << daemon_->log();
  ASSERT_EQ(Fwai({"--json", "kb", "search", "flash wait states latency"}, &out, &err), 0) << err;
  EXPECT_EQ(json::parse(out)[0]["doc"], second);
  ASSERT_EQ(Fwai({"kb", "log", "-n", "5"}, &out, &err), 0) << err;
  EXPECT_NE(out.find(id + "  "), std::string::npos) << out;
  EXPECT_NE(out.find("[bad]"), std::string::npos) << out;
  ASSERT_EQ(Fwai({"--json", "kb", "stats"}, &out, &err), 0) << err;
  auto stats = json::parse(out);
  EXPECT_EQ(stats["feedback_bad"], 1) << stats;
  EXPECT_GE(stats["searches"].get<int>(), 2);
}

TEST_F(KbCliTest, BadSearchArgumentsAndMissingPaths) {
  Write("a.md", "# A\n\nGPIOB_ODR drives the outputs.\n");
  std::string out, err;
  ASSERT_EQ(Fwai({"kb", "add", docs_ + "/a.md"}, &out, &err), 0) << err;
  EXPECT_EQ(Fwai({"kb", "search", "-n", "0", "GPIOB_ODR"}, &out, &err), 1);
  EXPECT_NE(err.find("max_results"), std::string::npos) << err;
  EXPECT_EQ(Fwai({"kb", "search", "-n", "101", "GPIOB_ODR"}, &out, &err), 1);
  EXPECT_EQ(Fwai({"kb", "search", "--threshold", "1.5", "GPIOB_ODR"}, &out, &err), 1);
  EXPECT_NE(err.find("threshold"), std::string::npos) << err;
  EXPECT_EQ(Fwai({"kb", "search", "--passage-tokens", "600", "GPIOB_ODR"}, &out, &err), 2);
  EXPECT_NE(err.find("passage-tokens"), std::string::npos) << err;
  EXPECT_EQ(Fwai({"kb", "search", std::string(4097, 'q')}, &out, &err), 1);
  EXPECT_NE(err.find("4096"), std::string::npos) << err;
  EXPECT_EQ(Fwai({"kb", "add", docs_ + "/nope.md", docs_ + "/a.md"}, &out, &err), 1);
  EXPECT_NE(err.find("nope.md: no such file"), std::string::npos) << err;
}

TEST_F(KbCliTest, Kill9DuringIngestLeavesNoHalfDocument) {
  const int kDocs = 300;
  for (int i = 0; i < kDocs; ++i) {
    std::string body = "# Block " + std::to_string(i) + "\n\n";
    for (int p = 0; p < 6; ++p) {
      body += "## Part " + std::to_string(p) + "\n\nUNIQ" + std::to_string(i) + "X register part " +
              std::to_string(p) + " controls the block. " + std::string(400, 'w') + "\n\n";
    }
    Write("d" + std::to_string(i) + ".md", body);
  }
  pid_t pid = fork();
  if (pid == 0) {
    int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 1);
    dup2(devnull, 2);
    std::string bin = std::string(FWAI_BIN_DIR) + "/fwai";
    execl(bin.c_str(), bin.c_str(), "--daemon", daemon_->address().c_str(), "kb", "add",
          docs_.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  // Kill the daemon while the documents go in.
  std::string out;
  for (int i = 0; i < 500; ++i) {
    if (Fwai({"--json", "kb", "stats"}, &out) == 0 &&
        json::parse(out)["documents"].get<int>() >= 20)
      break;
    usleep(10000);
  }
  daemon_->Kill9();
  int status;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(daemon_->Start()) << daemon_->log();
  ASSERT_EQ(Fwai({"--json", "kb", "ls"}, &out), 0);
  auto ls = json::parse(out);
  ASSERT_GE(ls.size(), 20u);
  ASSERT_LT(ls.size(), static_cast<size_t>(kDocs)) << "the kill came too late to test anything";
  std::set<std::string> present;
  int chunks = 0;
  for (const auto& d : ls) {
    present.insert(d["name"]);
    EXPECT_EQ(d["chunks"], 6);  // whole documents only
    chunks += d["chunks"].get<int>();
  }
  ASSERT_EQ(Fwai({"--json", "kb", "stats"}, &out), 0);
  EXPECT_EQ(json::parse(out)["chunks"], chunks);
  // Every present document is fully searchable; absent ones are not at all.
  for (int i = 0; i < kDocs; i += 7) {
    const std::string name = (fs::path(docs_) / ("d" + std::to_string(i) + ".md")).string();
    std::string rel = name.substr(name.find("docs/"));
    bool has = false;
    for (const auto& n : present)
      has |= name.size() >= n.size() && name.compare(name.size() - n.size(), n.size(), n) == 0;
    ASSERT_EQ(Fwai({"--json", "kb", "search", "-n", "10", "--mode", "lexical",
                    "UNIQ" + std::to_string(i) + "X"},
                   &out),
              0);
    auto hits = json::parse(out);
    int found = 0;
    for (const auto& h : hits) {
      if (h["text"].get<std::string>().find("UNIQ" + std::to_string(i) + "X") != std::string::npos)
        ++found;
    }
    if (has) {
      EXPECT_EQ(found, 6) << rel;
    } else {
      EXPECT_EQ(found, 0) << rel;
    }
  }
}

// The threads of a fwaid with a name: their ids, scheduling policy (field 41
// of /proc/PID/task/TID/stat) and time on a CPU in ns (schedstat).
struct Worker {
  std::string tid;
  int policy = -1;
  int nice = -100;
  uint64_t cpu_ns = 0;
};

std::vector<Worker> Threads(pid_t pid, const std::string& name) {
  std::vector<Worker> out;
  const std::string task = "/proc/" + std::to_string(pid) + "/task";
  for (const auto& e : fs::directory_iterator(task)) {
    std::string comm;
    std::getline(std::ifstream(e.path() / "comm"), comm);
    if (comm != name) continue;
    Worker w;
    w.tid = e.path().filename().string();
    std::string stat;
    std::getline(std::ifstream(e.path() / "stat"), stat);
    std::istringstream fields(stat.substr(stat.rfind(')') + 2));  // from field 3 (state) on
    std::string f;
    for (int i = 3; i <= 41 && fields >> f; ++i) {
      if (i == 19) w.nice = std::stoi(f);
      if (i == 41) w.policy = std::stoi(f);
    }
    std::ifstream(e.path() / "schedstat") >> w.cpu_ns;
    out.push_back(w);
  }
  return out;
}

// The nice value fwaid started with (its main thread's; field 19 of
// /proc/PID/stat): the tests may run under nice, and fwaid inherits it.
int StartNice(pid_t pid) {
  std::string stat;
  std::getline(std::ifstream("/proc/" + std::to_string(pid) + "/stat"), stat);
  std::istringstream fields(stat.substr(stat.rfind(')') + 2));
  std::string f;
  for (int i = 3; i <= 19 && fields >> f; ++i) {
    if (i == 19) return std::stoi(f);
  }
  return -100;
}

TEST_F(KbCliTest, IngestRunsOnOneWorkerAtIdlePriority) {
  auto before = Threads(daemon_->pid(), "fwaid-ingest");
  ASSERT_EQ(before.size(), 1u) << "fwaid has no thread named fwaid-ingest";
  EXPECT_EQ(before[0].policy, SCHED_IDLE);
  auto commit_before = Threads(daemon_->pid(), "fwaid-kb-commit");
  ASSERT_EQ(commit_before.size(), 1u) << "fwaid has no thread named fwaid-kb-commit";
  auto index_before = Threads(daemon_->pid(), "fwaid-kb-index");
  ASSERT_EQ(index_before.size(), 1u) << "fwaid has no thread named fwaid-kb-index";
  // A document goes in on that thread: its time on a CPU grows.
  std::string body = "# DMA\n\n";
  for (int p = 0; p < 40; ++p)
    body += "## Stream " + std::to_string(p) + "\n\nDMA_S" + std::to_string(p) +
            "CR enables the stream.\n\n";
  Write("dma.md", body);
  std::string out, err;
  ASSERT_EQ(Fwai({"--json", "kb", "add", docs_ + "/dma.md"}, &out, &err), 0) << err;
  auto after = Threads(daemon_->pid(), "fwaid-ingest");
  ASSERT_EQ(after.size(), 1u);
  EXPECT_EQ(after[0].tid, before[0].tid);
  EXPECT_EQ(after[0].policy, SCHED_IDLE);
  EXPECT_GT(after[0].cpu_ns, before[0].cpu_ns)
      << "the document was not ingested on the ingest worker";
  // Its commit (the store's write queue) ran at normal priority.
  auto commit = Threads(daemon_->pid(), "fwaid-kb-commit");
  ASSERT_EQ(commit.size(), 1u);
  EXPECT_EQ(commit[0].policy, SCHED_OTHER);
  EXPECT_EQ(commit[0].nice, StartNice(daemon_->pid()));
  EXPECT_GT(commit[0].cpu_ns, commit_before[0].cpu_ns)
      << "the commit did not run on the commit thread";
  // The in-memory indexes (the index lock) were updated at background
  // priority: SCHED_OTHER at nice 10 (or fwaid's own, when it started nicer).
  auto index = Threads(daemon_->pid(), "fwaid-kb-index");
  ASSERT_EQ(index.size(), 1u);
  EXPECT_EQ(index[0].policy, SCHED_OTHER);
  EXPECT_EQ(index[0].nice, std::max(10, StartNice(daemon_->pid())));
  EXPECT_GT(index[0].cpu_ns, index_before[0].cpu_ns)
      << "the indexes were not updated on the index thread";
}

}  // namespace
}  // namespace fwai::testing
