// Retrieval as the knowledge base returns it: passages (widened, merged,
// marked), the retrieval log and its corrections (they change later results
// and survive a restart), the model-assisted paths (hypothetical answer and
// rewrites, with the fake provider over real HTTP), and the indexes built
// for a million chunks (the mapped lexical image, IVF vectors). Real
// RocksDB, FAISS, pdftotext.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "common/thread_priority.h"
#include "common/utf8.h"
#include "server/knowledge/bm25_index.h"
#include "server/knowledge/document_search_tool.h"
#include "server/knowledge/embedder.h"
#include "server/knowledge/knowledge_base.h"
#include "server/knowledge/passage.h"
#include "server/knowledge/remote_rerankers.h"
#include "server/knowledge/reranker.h"
#include "server/knowledge/vector_index.h"
#include "server/llm/http_client.h"
#include "server/llm/provider.h"
#include "server/storage/storage.h"
#include "tests/fakes/fake_llm_server.h"

namespace fwai {
namespace {

namespace fs = std::filesystem;

std::string TempDir(const std::string& prefix) {
  std::string t = (fs::temp_directory_path() / (prefix + "XXXXXX")).string();
  return mkdtemp(t.data());
}

class RetrievalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDir("fwai-retrieval-");
    Open();
  }
  void TearDown() override {
    kb_.reset();
    storage_.reset();
    fs::remove_all(dir_);
  }
  void Open(KnowledgeOptions o = {}) {
    kb_.reset();
    storage_.reset();
    auto s = Storage::Open(dir_ + "/db");
    ASSERT_TRUE(s.ok()) << s.status();
    storage_ = *std::move(s);
    auto kb = KnowledgeBase::Open(*storage_, dir_ + "/index", o, *embedder_, *reranker_);
    ASSERT_TRUE(kb.ok()) << kb.status();
    kb_ = *std::move(kb);
  }
  void Add(const std::string& name, const std::string& bytes) {
    IngestRequest r;
    r.name = name;
    r.bytes = bytes;
    auto res = kb_->Ingest(std::move(r));
    ASSERT_TRUE(res.ok()) << res.status();
  }
  std::vector<KbSearchHit> Find(const std::string& q, int n = 5, int passage_tokens = -1,
                                KbSearchInfo* info = nullptr) {
    KbSearchRequest r;
    r.query = q;
    r.max_results = n;
    r.passage_tokens = passage_tokens;
    auto hits = kb_->Search(r, info);
    EXPECT_TRUE(hits.ok()) << hits.status();
    return hits.ok() ? *hits : std::vector<KbSearchHit>{};
  }
  static std::string Filler(const std::string& word, int lines) {
    std::string s;
    for (int i = 0; i < lines; ++i)
      s += "The " + word + " entry " + std::to_string(i) + " holds reserved bits only.\n";
    return s;
  }

  std::string dir_;
  std::unique_ptr<Embedder> embedder_ = MakeBuiltinEmbedder(64);
  std::unique_ptr<Reranker> reranker_ = MakeBuiltinReranker();
  std::unique_ptr<Storage> storage_;
  std::unique_ptr<KnowledgeBase> kb_;
};

TEST_F(RetrievalTest, APassageHoldsTheAnswerNextToTheMatchingChunk) {
  // The question matches the register's name; its reset value is in the
  // text that follows, which the chunker cut into the next chunk.
  std::string md =
      "# Clock controller\n\n## RCC_PLLCFGR\n\nRCC_PLLCFGR configures the main PLL multiplier and "
      "divider.\n";
  md += Filler("padding", 30);
  md += "After reset the PLLCFGR value is 0x24003010.\n";
  md += Filler("trailer", 30);
  md += "\n## Other\n\n" + Filler("other", 10);
  Add("rcc.md", md);
  auto chunks = Find("RCC_PLLCFGR main PLL multiplier divider reset value", 5, 0);
  ASSERT_FALSE(chunks.empty());
  ASSERT_NE(chunks[0].text.find("RCC_PLLCFGR configures"), std::string::npos);
  const bool chunk_has_it = chunks[0].text.find("0x24003010") != std::string::npos;
  auto passages = Find("RCC_PLLCFGR main PLL multiplier divider reset value", 5);
  ASSERT_FALSE(passages.empty());
  const KbSearchHit& p = passages[0];
  EXPECT_NE(p.text.find("RCC_PLLCFGR configures"), std::string::npos);
  EXPECT_TRUE(chunk_has_it || p.text.find("0x24003010") != std::string::npos) << p.text;
  EXPECT_GT(p.text.size(), chunks[0].text.size());
  EXPECT_LE(p.tokens, kMaxPassageTokens);
  EXPECT_GE(p.chunk_ids.size(), 2u);
  EXPECT_EQ(p.text.find("other entry"), std::string::npos) << "grew into the next section";
  ASSERT_FALSE(p.highlights.empty());
  for (const auto& [b, e] : p.highlights) {
    ASSERT_LT(b, e);
    ASSERT_LE(e, static_cast<int>(p.text.size()));
  }
  // A budget is held to; bad budgets are refused with the field's name.
  const int chunk_tokens = Find("RCC_PLLCFGR multiplier", 1, 0)[0].tokens;
  EXPECT_LE(Find("RCC_PLLCFGR multiplier", 1, 150)[0].tokens, std::max(150, chunk_tokens));
  KbSearchRequest bad;
  bad.query = "PLL";
  bad.passage_tokens = 600;
  auto refused = kb_->Search(bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("passage_tokens"), std::string::npos);
}

TEST_F(RetrievalTest, OverlappingHitsMergeAndNoTextIsReturnedTwice) {
  // Every chunk of this section matches the query; their passages overlap.
  std::string md = "# DMA\n\n## Channels\n\n";
  for (int i = 0; i < 12; ++i) {
    md += "DMA channel " + std::to_string(i) +
          " transfers words between memory and the ADC peripheral. " +
          "Its stream priority is set in DMA_SxCR bits PL.\n";
  }
  Add("dma.md", md);
  auto hits = Find("DMA channel ADC stream priority DMA_SxCR", 10);
  ASSERT_GE(hits.size(), 1u);
  std::set<std::string> seen_chunks;
  std::set<std::string> seen_lines;
  for (const auto& h : hits) {
    for (const auto& c : h.chunk_ids)
      EXPECT_TRUE(seen_chunks.insert(c).second) << "chunk " << c << " returned twice";
    std::istringstream in(h.text);
    std::string line;
    while (std::getline(in, line)) {
      if (line.find("DMA channel") != std::string::npos) {
        EXPECT_TRUE(seen_lines.insert(line).second) << "line returned twice: " << line;
      }
    }
  }
  EXPECT_LT(hits.size(), 10u) << "overlapping passages were not merged";
}

// A search says where its time went, stage by stage in the order they ran,
// and the stages account for no more than the whole search.
TEST_F(RetrievalTest, ASearchTimesItsStagesInTheOrderTheyRan) {
  Add("clock.md",
      "# RCC\n\n## Clock enable\n\nRCC_AHB1ENR enables the GPIOA clock.\n\n## Reset\n\n" +
          Filler("reset", 30));
  auto names = [](const KbSearchInfo& info) {
    std::vector<std::string> out;
    for (const auto& [name, ms] : info.stages_ms) {
      EXPECT_GE(ms, 0) << name;
      out.push_back(name);
    }
    return out;
  };
  auto total = [](const KbSearchInfo& info) {
    double sum = 0;
    for (const auto& [name, ms] : info.stages_ms) sum += ms;
    return sum;
  };
  KbSearchInfo passages;
  ASSERT_FALSE(Find("which register enables the GPIOA clock", 5, -1, &passages).empty());
  EXPECT_EQ(names(passages),
            (std::vector<std::string>{"query", "model", "lock", "legs", "document views", "fusion",
                                      "fetch", "rerank", "passages", "rescore", "window evidence",
                                      "merge"}));
  EXPECT_LE(total(passages), passages.took_ms + 1e-6);
  KbSearchInfo chunks;
  ASSERT_FALSE(Find("which register enables the GPIOA clock", 5, 0, &chunks).empty());
  EXPECT_EQ(names(chunks),
            (std::vector<std::string>{"query", "model", "lock", "legs", "document views", "fusion",
                                      "fetch", "rerank", "results"}));
  EXPECT_LE(total(chunks), chunks.took_ms + 1e-6);
  KbSearchRequest lexical;
  lexical.query = "RCC_AHB1ENR";
  lexical.mode = SearchMode::kLexical;
  KbSearchInfo lexical_info;
  ASSERT_TRUE(kb_->Search(lexical, &lexical_info).ok());
  EXPECT_EQ(names(lexical_info).size(), 11u) << "no document views outside hybrid search";
}

TEST_F(RetrievalTest, FeedbackDemotesABadResultForSimilarQueriesAndSurvivesARestart) {
  Add("f1.md",
      "# Flash\n\n## Latency\n\nFLASH_ACR sets the flash wait states (latency) for the core "
      "clock.\n");
  Add("f2.md",
      "# Flash notes\n\n## Latency\n\nThe flash latency and wait states depend on the supply "
      "voltage.\n");
  KbSearchInfo info;
  auto before = Find("flash wait states latency", 5, -1, &info);
  ASSERT_GE(before.size(), 2u);
  ASSERT_FALSE(info.search_id.empty());
  const std::string first = before[0].doc, second = before[1].doc;
  // Marked bad for this query: the top result drops for this query and a
  // similar one, not for an unrelated one.
  auto f = kb_->retrieval_log().AddFeedback(info.search_id, "1", /*good=*/false, "user",
                                            "wrong document");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->rank, 1);
  auto after = Find("flash wait states latency");
  ASSERT_GE(after.size(), 2u);
  EXPECT_EQ(after[0].doc, second);
  EXPECT_EQ(Find("flash latency wait states setting")[0].doc, second);
  auto counts = kb_->Stats("")->log;
  EXPECT_EQ(counts.bad, 1);
  EXPECT_EQ(counts.searches, 3);
  // The correction and the log survive a restart.
  Open();
  EXPECT_EQ(Find("flash wait states latency")[0].doc, second);
  EXPECT_EQ(kb_->Stats("")->log.bad, 1);
  auto logged = kb_->retrieval_log().Get(info.search_id);
  ASSERT_TRUE(logged.ok()) << logged.status();
  EXPECT_EQ(logged->query, "flash wait states latency");
  ASSERT_EQ(logged->feedback.size(), 1u);
  EXPECT_EQ(logged->feedback[0].note, "wrong document");
  EXPECT_EQ(logged->results[0].doc, first);
  auto list = kb_->retrieval_log().List(2);
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  EXPECT_GT(std::stoi((*list)[0].id.substr(1)),
            std::stoi((*list)[1].id.substr(1)));  // newest first
  // Bad corrections name what is wrong.
  EXPECT_EQ(kb_->retrieval_log().AddFeedback(info.search_id, "9", false, "user").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kb_->retrieval_log().AddFeedback("q999999", "1", false, "user").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(kb_->retrieval_log().AddFeedback("x1", "1", false, "user").status().code(),
            absl::StatusCode::kInvalidArgument);
  // A good mark raises a result's score (here the demoted one's).
  auto score_of = [](const std::vector<KbSearchHit>& hits, const std::string& doc) {
    for (const auto& h : hits) {
      if (h.doc == doc) return h.score;
    }
    return -1.0;
  };
  auto again = Find("flash wait states latency", 5, -1, &info);
  ASSERT_EQ(again[1].doc, first);
  ASSERT_TRUE(kb_->retrieval_log().AddFeedback(info.search_id, "2", true, "user").ok());
  EXPECT_GT(score_of(Find("flash wait states latency"), first), score_of(again, first));
}

TEST_F(RetrievalTest, TheAgentCitesAndDiscardsPassagesById) {
  Add("i2c.md", "# I2C\n\n## Timing\n\nI2C_TIMINGR sets the SCL high and low periods.\n");
  Add("spi.md", "# SPI\n\n## Timing\n\nSPI_CR1 BR sets the SCL-like clock of the SPI bus.\n");
  auto search = MakeDocumentSearchTool(*kb_);
  auto feedback = MakeDocumentFeedbackTool(*kb_);
  ToolContext ctx;
  ctx.session_id = "s-1";
  ctx.turn_id = "t-1";
  ctx.call_id = "c-1";
  auto r = search->Run({{"query", "SCL high low periods timing"}}, ctx);
  ASSERT_FALSE(r.is_error) << r.content;
  auto list = kb_->retrieval_log().List(1);
  ASSERT_TRUE(list.ok() && !list->empty());
  const LoggedSearch& s = (*list)[0];
  EXPECT_EQ(s.origin.source, "agent");
  EXPECT_EQ(s.origin.turn_id, "t-1");
  EXPECT_NE(r.content.find("[" + s.id + ".1] source: "), std::string::npos) << r.content;
  // Discarded by the model, cited in its answer.
  auto d = feedback->Run({{"passage", "[" + s.id + ".2]"}, {"reason", "SPI, not I2C"}}, ctx);
  EXPECT_FALSE(d.is_error) << d.content;
  EXPECT_EQ(
      RecordCitations(*kb_, "s-1", "Set I2C_TIMINGR [" + s.id + ".1]; see also [" + s.id + ".1]."),
      1);
  // Another session's passages are not its to judge.
  ToolContext other = ctx;
  other.session_id = "s-2";
  EXPECT_TRUE(feedback->Run({{"passage", s.id + ".1"}}, other).is_error);
  EXPECT_EQ(RecordCitations(*kb_, "s-2", "[" + s.id + ".1]"), 0);
  EXPECT_TRUE(feedback->Run({{"passage", "nonsense"}}, ctx).is_error);
  auto counts = kb_->Stats("")->log;
  EXPECT_EQ(counts.cited, 1);
  EXPECT_EQ(counts.discarded, 1);
  auto logged = kb_->retrieval_log().Get(s.id);
  ASSERT_TRUE(logged.ok());
  ASSERT_EQ(logged->feedback.size(), 2u);
}

TEST_F(RetrievalTest, AnIngestDuringASaveDoesNotWaitForIt) {
  // A save copies what it writes under the index lock and writes the files
  // without it: ingests that come while the save is held mid-write (a new
  // document, and a new version of the one saved) finish before it goes on.
  // The saved lexical image then taken as the base catches up with them.
  bool armed = false, finished_during_save = false;
  std::future<absl::Status> during;
  KnowledgeOptions o;
  o.save_debounce_ms = 3600 * 1000;  // only the saves the test asks for
  o.while_saving_for_test = [&] {
    if (!armed) return;
    armed = false;
    during = std::async(std::launch::async, [this] {
      IngestRequest a;
      a.name = "timer.md";
      a.bytes = "# Timer\n\n## TIM2_ARR\n\nTIM2_ARR holds the quartzfox auto-reload value.\n";
      if (auto r = kb_->Ingest(std::move(a)); !r.ok()) return r.status();
      IngestRequest b;
      b.name = "clock.md";
      b.bytes = "# Clock\n\n## RCC_CR\n\nRCC_CR enables the marblewren oscillator.\n";
      return kb_->Ingest(std::move(b)).status();
    });
    // Bounded, so that a save holding the lock fails here instead of hanging.
    finished_during_save = during.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  };
  Open(o);
  Add("clock.md", "# Clock\n\n## RCC_CR\n\nRCC_CR enables the zebrafinch oscillator.\n");
  armed = true;
  ASSERT_TRUE(kb_->SaveIndexes().ok());
  EXPECT_TRUE(finished_during_save) << "the ingests waited for the save";
  ASSERT_TRUE(during.get().ok());
  auto texts = [this](const std::string& q) {
    std::string all;
    for (const auto& h : Find(q, 10, 0)) all += h.doc + ": " + h.text + "\n";
    return all;
  };
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round == 0 ? "after the save" : "reopened from the indexes saved next");
    EXPECT_NE(texts("quartzfox auto-reload").find("timer.md: "), std::string::npos);
    EXPECT_NE(texts("marblewren oscillator").find("marblewren"), std::string::npos);
    EXPECT_EQ(texts("zebrafinch oscillator").find("zebrafinch"), std::string::npos);
    ASSERT_TRUE(kb_->SaveIndexes().ok());
    Open(o);
    EXPECT_EQ(kb_->open_report(), "loaded");
  }
}

TEST_F(RetrievalTest, AVectorIndexBuildLetsSearchesGoOnAndRunsAtIdlePriority) {
  // A document that makes the collection outgrow exact search, and later a
  // replacement that leaves too many removed vectors, each make a new vector
  // index due. It is built (the lists trained) without the index lock, on a
  // thread of the lowest priority: a search during the build is answered at
  // once, the new version already in; after it, the new index holds every
  // document's current vectors, and is saved.
  // Each document's own made-up word (no digits: no part-number families).
  auto word = [](int i) {
    static const char* const kSyllables[] = {"ba", "ke", "mi", "lo", "pu", "ra", "ti"};
    return std::string(kSyllables[i % 7]) + kSyllables[(i / 7) % 7] + "n";
  };
  int builds = 0, version = 0;
  bool idle_allowed = false;
  std::thread([&] { idle_allowed = SetThisThreadPriority(ThreadPriority::kIdle).ok(); }).join();
  if (!idle_allowed) GTEST_SKIP() << "this host refuses SCHED_IDLE";
  std::vector<std::string> problems;
  // The hook runs on the build's SCHED_IDLE thread; it asks this thread, of
  // the test's own priority, for a search (and in the second build a save)
  // and waits for the answer a bounded time.
  std::mutex asking;
  std::condition_variable asked_cv;
  int asked = 0, answered = 0;
  bool stop = false;
  std::string answer;
  std::thread searcher([&] {
    std::unique_lock<std::mutex> l(asking);
    while (true) {
      asked_cv.wait(l, [&] { return stop || asked > answered; });
      if (asked == answered) return;  // stopping
      const int build = builds;
      l.unlock();
      KbSearchRequest r;
      r.query = "baban register";
      r.max_results = 3;
      auto hits = kb_->Search(r);
      std::string top = !hits.ok()      ? hits.status().ToString()
                        : hits->empty() ? "no hit"
                                        : hits->front().doc + ": " + hits->front().text;
      // The save writes the index as searches see it, before this build.
      if (build == 2 && !kb_->SaveIndexes().ok()) top = "a save during the build failed";
      l.lock();
      answer = top;
      ++answered;
      asked_cv.notify_all();
    }
  });
  KnowledgeOptions o;
  o.exact_below = 40;
  o.vector_index = "ivf";
  o.save_debounce_ms = 3600 * 1000;
  o.while_building_vectors_for_test = [&] {
    ++builds;
    auto priority = ThisThreadPriority();
    if (!priority.ok() || *priority != ThreadPriority::kIdle)
      problems.push_back("not at SCHED_IDLE");
    std::unique_lock<std::mutex> l(asking);
    ++asked;
    asked_cv.notify_all();
    // Bounded, so that a build holding the lock fails here instead of hanging.
    if (!asked_cv.wait_for(l, std::chrono::seconds(30), [&] { return answered == asked; })) {
      problems.push_back("a search waited for the build");
    } else if (answer.rfind("doc0.md: ", 0) != 0 ||
               (version > 0 &&
                answer.find("quill" + std::to_string(version) + " ") == std::string::npos)) {
      problems.push_back("build " + std::to_string(builds) + ": a search during it found " +
                         answer);
    }
  };
  auto stop_searcher = [&] {
    {
      std::lock_guard<std::mutex> l(asking);
      stop = true;
    }
    asked_cv.notify_all();
    if (searcher.joinable()) searcher.join();
  };
  absl::Cleanup stop_on_return = stop_searcher;
  Open(o);
  auto doc = [](int i, const std::string& word) {
    return "# Block " + std::to_string(i) + "\n\nThe " + word + " register of block " +
           std::to_string(i) + " enables its " + word + " clock.\n";
  };
  for (int i = 0; i < 40; ++i) Add("doc" + std::to_string(i) + ".md", doc(i, word(i)));
  EXPECT_EQ(builds, 1);
  auto kinds = kb_->Stats("")->index_kinds;
  ASSERT_EQ(kinds.size(), 2u);
  EXPECT_NE(kinds[1].find("ivf"), std::string::npos) << kinds[1];
  // New versions of doc0 until the removed vectors make a rebuild due.
  while (builds < 2 && version < 40) {
    ++version;
    Add("doc0.md", doc(0, word(0) + " quill" + std::to_string(version)));
  }
  EXPECT_EQ(builds, 2) << "after " << version << " new versions";
  {  // a search that waited has its answer once the build is done
    std::unique_lock<std::mutex> l(asking);
    asked_cv.wait(l, [&] { return answered == asked; });
  }
  stop_searcher();
  for (const auto& p : problems) ADD_FAILURE() << p;
  // Every document's current version is found by its vector; none of doc0's
  // earlier versions is.
  auto vector_hits = [this](const std::string& q) {
    KbSearchRequest r;
    r.query = q;
    r.max_results = 3;
    r.mode = SearchMode::kVector;
    r.rerank = false;
    auto hits = kb_->Search(r);
    EXPECT_TRUE(hits.ok()) << hits.status();
    return hits.ok() ? *hits : std::vector<KbSearchHit>{};
  };
  for (int i = 1; i < 40; i += 13) {
    auto hits = vector_hits(doc(i, word(i)));
    ASSERT_FALSE(hits.empty()) << i;
    EXPECT_EQ(hits[0].doc, "doc" + std::to_string(i) + ".md");
  }
  auto latest = vector_hits(doc(0, word(0) + " quill" + std::to_string(version)));
  ASSERT_FALSE(latest.empty());
  EXPECT_EQ(latest[0].doc, "doc0.md");
  EXPECT_NE(latest[0].text.find("quill" + std::to_string(version) + " "), std::string::npos)
      << latest[0].text;
  for (const auto& h : Find("quill1 register", 10)) {
    EXPECT_EQ(h.text.find("quill1 "), std::string::npos) << "an earlier version: " << h.text;
  }
  // The index built aside is saved, though the update that made it due was
  // saved already: reopened, it has no removed vectors that would make
  // another build due.
  ASSERT_TRUE(kb_->SaveIndexes().ok());
  Open(o);
  EXPECT_EQ(kb_->open_report(), "loaded");
  Add("doc40.md", doc(40, word(40)));
  EXPECT_EQ(builds, 2);
}

// The built-in embedder's vectors in an IVF index whose cap (16 of 128
// lists) cannot reach the recall required: vector search is off, said by
// Stats and by a vector-mode search, hybrid search still finds by the
// lexical legs, and the choice is saved; a setting that requires no recall
// rebuilds the index at open and keeps it.
TEST_F(RetrievalTest, AnApproximateIndexBelowItsRecallIsOffAndSearchesGoLexical) {
  KnowledgeOptions o;
  o.exact_below = 500;
  o.vector_index = "ivf";
  o.ivf_lists = 128;
  o.save_debounce_ms = 3600 * 1000;
  ASSERT_EQ(o.vector_min_recall, 0.9) << "the default with the built-in embedder";
  Open(o);
  std::mt19937 rng(17);
  auto word = [&rng] {
    std::string w;
    for (int i = 0; i < 7; ++i) w += static_cast<char>('a' + rng() % 26);
    return w;
  };
  std::vector<std::string> names;
  for (int i = 0; i < 520; ++i) {
    std::string text = "# Block " + std::to_string(i) + "\n\n";
    for (int j = 0; j < 12; ++j) text += word() + " ";
    names.push_back(word());
    Add("doc" + std::to_string(i) + ".md", text + "\nThe " + names.back() + " register.\n");
  }
  auto stats = kb_->Stats("");
  ASSERT_TRUE(stats.ok()) << stats.status();
  ASSERT_EQ(stats->index_kinds.size(), 2u);
  EXPECT_EQ(
      stats->index_kinds[1].rfind("vector:off (ivf-sq8(lists=128,nprobe=16) reached recall@10 ", 0),
      0u)
      << stats->index_kinds[1];
  EXPECT_NE(stats->index_kinds[1].find("< 0.90 on its sample; the lexical legs alone)"),
            std::string::npos)
      << stats->index_kinds[1];
  auto hits = Find(names[57] + " register", 3);
  ASSERT_FALSE(hits.empty());
  EXPECT_EQ(hits[0].doc, "doc57.md");
  KbSearchRequest vr;
  vr.query = names[57];
  vr.mode = SearchMode::kVector;
  auto refused = kb_->Search(vr);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_NE(refused.status().message().find("vector search is off"), std::string::npos);
  // A searcher learns nothing of the index's size (its lists grow with every
  // collection's chunks, others' included): that is for the logs and stats.
  EXPECT_EQ(refused.status().message().find("lists="), std::string::npos)
      << refused.status().message();
  // Saved and loaded as it is: no build at open.
  ASSERT_TRUE(kb_->SaveIndexes().ok());
  Open(o);
  EXPECT_EQ(kb_->open_report(), "loaded");
  EXPECT_EQ(kb_->Stats("")->index_kinds[1], stats->index_kinds[1]);
  // Documents added while it is off are found (lexically) as well.
  Add("late.md", "# Late\n\nThe zyxwvut register.\n");
  hits = Find("zyxwvut register", 1);
  ASSERT_FALSE(hits.empty());
  EXPECT_EQ(hits[0].doc, "late.md");
  ASSERT_TRUE(kb_->SaveIndexes().ok());
  // A setting that keeps any index (a model embedder's): built again at open.
  o.vector_min_recall = 0;
  Open(o);
  EXPECT_NE(kb_->open_report().find("vector search was off"), std::string::npos)
      << kb_->open_report();
  EXPECT_EQ(kb_->Stats("")->index_kinds[1].rfind("vector:faiss-ivf-sq8(lists=128,nprobe=16)", 0),
            0u)
      << kb_->Stats("")->index_kinds[1];
  vr.query = names[57] + " register";
  auto found = kb_->Search(vr);
  ASSERT_TRUE(found.ok()) << found.status();
}

TEST_F(RetrievalTest, AHypotheticalAnswerFindsTheDocumentAQuestionDoesNotName) {
  // The question shares no word with the document; the model's hypothetical
  // answer does.
  const std::string question = "why does my board restart by itself every few seconds";
  const std::string target =
      "# IWDG\n\n## Key register\n\nWrite 0xAAAA to IWDG_KR to reload the independent "
      "watchdog counter before it reaches zero.\n";
  Add("iwdg.md", target);
  Add("uart.md",
      "# UART\n\n## Baud\n\nEvery few frames the receiver samples the start bit by itself.\n");
  KbSearchInfo plain_info;
  auto plain = Find(question, 1, -1, &plain_info);
  ASSERT_FALSE(plain.empty());
  EXPECT_NE(plain[0].doc, "iwdg.md");
  EXPECT_TRUE(plain_info.rewrites.empty());
  KnowledgeOptions o;
  int calls = 0;
  o.hyde = [&](const std::string& q) {
    ++calls;
    EXPECT_EQ(q, question);
    return std::string(
        "The independent watchdog resets the MCU unless software writes 0xAAAA to IWDG_KR to "
        "reload "
        "the counter.");
  };
  Open(o);
  KbSearchInfo info;
  auto with = Find(question, 1, -1, &info);
  ASSERT_FALSE(with.empty());
  EXPECT_EQ(with[0].doc, "iwdg.md");
  EXPECT_EQ(calls, 1);
  ASSERT_EQ(info.rewrites.size(), 1u);
  EXPECT_EQ(info.rewrites[0].rfind("answer: ", 0), 0u);
  // Logged with the search.
  auto logged = kb_->retrieval_log().Get(info.search_id);
  ASSERT_TRUE(logged.ok());
  EXPECT_EQ(logged->rewrites, info.rewrites);
  // A lookup by register name is not a paraphrase: no model call.
  Find("IWDG_KR reload value", 1);
  EXPECT_EQ(calls, 1);
}

// An Anthropic provider on the fake service, one attempt per request.
std::unique_ptr<Provider> FakeAnthropic(testing::FakeLlmServer& fake, HttpClient& http) {
  ProviderConfig pc;
  pc.name = pc.kind = "anthropic";
  pc.api_key = "k";
  pc.base_url = fake.anthropic_base_url();
  pc.model = "claude-test";
  return MakeProvider(pc, RetryConfig{1, 10, 10}, http);
}

TEST(ModelQueriesTest, HypotheticalAnswerAndRewritesFromTheFakeProvider) {
  testing::FakeLlmServer fake;
  ASSERT_GT(fake.Start(), 0);
  auto http = MakeCurlHttpClient();
  auto provider = FakeAnthropic(fake, *http);
  auto hyde = MakeLlmHypotheticalAnswer(*provider, "");
  testing::FakeReply reply;
  reply.chunks = {"Write 0xAAAA to IWDG_KR ", "to reload the watchdog.\n"};
  fake.Enqueue(reply);
  EXPECT_EQ(hyde("why does my board keep restarting"),
            "Write 0xAAAA to IWDG_KR to reload the watchdog.");
  EXPECT_EQ(hyde("why does my board keep restarting"),
            "Write 0xAAAA to IWDG_KR to reload the watchdog.");
  ASSERT_EQ(fake.request_count(), 1u);  // cached
  const std::string prompt = fake.requests()[0].body.dump();
  EXPECT_NE(prompt.find("why does my board keep restarting"), std::string::npos);
  EXPECT_NE(prompt.find("datasheet"), std::string::npos);
  fake.Stop();
  EXPECT_EQ(hyde("another question"), "");  // failure: nothing extra is searched
}

TEST(ModelQueriesTest, HypotheticalToolFromTheFakeProvider) {
  testing::FakeLlmServer fake;
  ASSERT_GT(fake.Start(), 0);
  auto http = MakeCurlHttpClient();
  auto provider = FakeAnthropic(fake, *http);
  auto tool = MakeLlmHypotheticalTool(*provider, "");
  testing::FakeReply reply;
  reply.chunks = {"openocd: wp ADDRESS 4 w\n", "Sets a data watchpoint.\n\n"};
  fake.Enqueue(reply);
  const std::string request = "halt whenever the firmware writes to this variable";
  EXPECT_EQ(tool(request), "openocd: wp ADDRESS 4 w\nSets a data watchpoint.");
  EXPECT_EQ(tool(request), "openocd: wp ADDRESS 4 w\nSets a data watchpoint.");
  ASSERT_EQ(fake.request_count(), 1u);  // cached
  const std::string prompt = fake.requests()[0].body.dump();
  EXPECT_NE(prompt.find(request), std::string::npos);
  EXPECT_NE(prompt.find("command"), std::string::npos);
  // A request cut at a byte limit inside a character (as the tool offer cuts
  // a long one) still reaches the model, the broken byte sent as U+FFFD.
  testing::FakeReply info;
  info.chunks = {"gdb: info program"};
  fake.Enqueue(info);
  EXPECT_EQ(tool("why is the debuggee stopped, caf\xC3"), "gdb: info program");
  ASSERT_EQ(fake.request_count(), 2u);
  EXPECT_NE(fake.requests()[1].body.dump().find("caf\xEF\xBF\xBD"), std::string::npos);
  fake.Stop();
  EXPECT_EQ(tool("another request"), "");  // failure: nothing extra is searched
}

TEST(Utf8Test, APrefixNeverEndsInsideACharacter) {
  const std::string s = "ab\xC3\xA9\xE2\x82\xAC";  // a b é €
  EXPECT_EQ(Utf8Prefix(s, 100), s);
  EXPECT_EQ(Utf8Prefix(s, 7), s);
  EXPECT_EQ(Utf8Prefix(s, 6), "ab\xC3\xA9");  // inside €
  EXPECT_EQ(Utf8Prefix(s, 5), "ab\xC3\xA9");
  EXPECT_EQ(Utf8Prefix(s, 4), "ab\xC3\xA9");
  EXPECT_EQ(Utf8Prefix(s, 3), "ab");  // inside é
  EXPECT_EQ(Utf8Prefix(s, 0), "");
  EXPECT_TRUE(IsValidUtf8(Utf8Prefix(std::string(4095, 'x') + "\xE2\x82\xAC", 4096)));
}

TEST(Bm25ImageTest, ASavedImageCatchesUpWithWritesMadeAfterItsCopy) {
  // A save writes a copy; the live index takes writes meanwhile (one doc
  // removed from the mapped base, one from the mutable tier, two added).
  // The saved image, loaded and caught up, answers as the live index does
  // and holds only the later docs in memory.
  const std::string dir = TempDir("fwai-bm25-");
  Bm25Index first({1.2f, 0.75f});
  first.Add(0, {"watchdog", "reload", "key"});
  first.Add(1, {"uart", "baud", "divider"});
  ASSERT_TRUE(first.Save(dir + "/lex", 1).ok());
  auto live = Bm25Index::Load(dir + "/lex", 1);
  ASSERT_TRUE(live.ok()) << live.status();
  (*live)->Add(2, {"watchdog", "window", "early", "early"});
  (*live)->Add(3, {"dma", "stream"});
  const Bm25Index copy = **live;
  ASSERT_TRUE(copy.Save(dir + "/lex", 2).ok());
  (*live)->Remove(0);
  (*live)->Remove(3);
  (*live)->Add(4, {"watchdog", "reload", "prescaler"});
  (*live)->Add(5, {});
  auto saved = Bm25Index::Load(dir + "/lex", 2);
  ASSERT_TRUE(saved.ok()) << saved.status();
  ASSERT_TRUE((*saved)->CatchUp(**live));
  EXPECT_EQ((*saved)->size(), (*live)->size());
  for (const std::vector<std::string>& q : {std::vector<std::string>{"watchdog", "reload"},
                                            {"early", "window"},
                                            {"dma"},
                                            {"uart", "prescaler"}}) {
    EXPECT_EQ((*saved)->Search(q, 10), (*live)->Search(q, 10));
  }
  for (uint32_t d = 0; d < 6; ++d) EXPECT_EQ((*saved)->Length(d), (*live)->Length(d)) << d;
  EXPECT_LT((*saved)->mutable_bytes(), (*live)->mutable_bytes());
  // A doc only in the live index's mapped base cannot be brought over.
  Bm25Index empty({1.2f, 0.75f});
  EXPECT_FALSE(empty.CatchUp(**saved));
  fs::remove_all(dir);
}

TEST(Bm25ImageTest, MappedBaseMutableTierAndMergedSave) {
  const std::string dir = TempDir("fwai-bm25-");
  Bm25Index idx({1.2f, 0.75f});
  idx.Add(0, {"watchdog", "reload", "key"});
  idx.Add(1, {"uart", "baud", "divider"});
  idx.Add(2, {"watchdog", "window", "early"});
  ASSERT_TRUE(idx.Save(dir + "/lex", 5).ok());
  EXPECT_EQ(Bm25Index::Load(dir + "/lex", 6).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Bm25Index::Load(dir + "/nope", 5).status().code(), absl::StatusCode::kNotFound);
  auto base = Bm25Index::Load(dir + "/lex", 5);
  ASSERT_TRUE(base.ok()) << base.status();
  Bm25Index& b = **base;
  EXPECT_EQ(b.size(), 3u);
  EXPECT_EQ(b.Search({"watchdog"}, 5), idx.Search({"watchdog"}, 5));
  // Changes land in the mutable tier over the mapped base.
  b.Remove(0);
  b.Add(3, {"watchdog", "reload", "prescaler"});
  b.Add(1, {"uart", "parity"});  // replaces a base doc
  EXPECT_EQ(b.size(), 3u);
  std::set<uint32_t> got;
  for (const auto& [d, s] : b.Search({"watchdog", "baud", "parity"}, 10)) got.insert(d);
  EXPECT_EQ(got, (std::set<uint32_t>{1, 2, 3}));  // 0 hidden, 1's old "baud" gone
  EXPECT_TRUE(b.Search({"baud"}, 5).empty());
  // Saving merges both tiers; the result equals an index built from scratch.
  ASSERT_TRUE(b.Save(dir + "/lex2", 6).ok());
  auto merged = Bm25Index::Load(dir + "/lex2", 6);
  ASSERT_TRUE(merged.ok()) << merged.status();
  Bm25Index fresh({1.2f, 0.75f});
  fresh.Add(1, {"uart", "parity"});
  fresh.Add(2, {"watchdog", "window", "early"});
  fresh.Add(3, {"watchdog", "reload", "prescaler"});
  for (const std::vector<std::string>& q :
       {std::vector<std::string>{"watchdog", "reload"}, {"uart"}, {"early"}}) {
    EXPECT_EQ((*merged)->Search(q, 5), fresh.Search(q, 5));
  }
  EXPECT_EQ((*merged)->DocFreq("watchdog"), 2u);
  EXPECT_EQ((*merged)->DocFreq("key"), 0u);
  // Damage anywhere is found on open.
  for (size_t at :
       {size_t{3}, fs::file_size(dir + "/lex2") / 2, fs::file_size(dir + "/lex2") - 3}) {
    std::string bytes;
    {
      std::ifstream in(dir + "/lex2", std::ios::binary);
      bytes.assign(std::istreambuf_iterator<char>(in), {});
    }
    bytes[at] ^= 0x20;
    std::ofstream(dir + "/bad", std::ios::binary | std::ios::trunc) << bytes;
    EXPECT_EQ(Bm25Index::Load(dir + "/bad", 6).status().code(), absl::StatusCode::kDataLoss) << at;
  }
  fs::remove_all(dir);
}

TEST(VectorIndexIvfTest, RecallAgainstExactRetrainOnGrowthAndSaveLoad) {
  const int dim = 32;
  const size_t n = 4000;
  std::mt19937 rng(5);
  std::normal_distribution<float> g;
  // Clustered vectors, as text embeddings are.
  std::vector<float> centers(40 * dim), vecs(n * dim);
  for (auto& x : centers) x = g(rng);
  for (size_t i = 0; i < n; ++i) {
    double norm = 0;
    for (int d = 0; d < dim; ++d)
      norm += std::pow(vecs[i * dim + d] = centers[(i % 40) * dim + d] + 0.5f * g(rng), 2);
    for (int d = 0; d < dim; ++d) vecs[i * dim + d] /= static_cast<float>(std::sqrt(norm));
  }
  std::vector<uint32_t> ids(n);
  for (uint32_t i = 0; i < n; ++i) ids[i] = 10 + i;
  VectorIndexOptions o;
  o.exact_below = 1000;
  o.approximate = "ivf";
  VectorIndex ivf(dim, o);
  ivf.Build(ids, vecs);
  ASSERT_EQ(ivf.kind(), "ivf-sq8");
  EXPECT_GT(ivf.ef_search(), 0);
  VectorIndex exact(dim, {});
  exact.Add(ids, vecs);
  size_t hits = 0;
  for (size_t q = 0; q < 100; ++q) {
    auto a = exact.Search(&vecs[q * 37 % n * dim], 10);
    auto b = ivf.Search(&vecs[q * 37 % n * dim], 10);
    for (const auto& x : a) {
      for (const auto& y : b) hits += x.first == y.first ? 1 : 0;
    }
  }
  EXPECT_GE(hits, 900u) << "recall@10 well below the 0.95 it was tuned for";
  const std::string dir = TempDir("fwai-ivf-");
  ivf.Remove(15);
  ASSERT_TRUE(ivf.Save(dir + "/v", 3).ok());
  auto loaded = VectorIndex::Load(dir + "/v", 3, dim, o);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)->kind(), "ivf-sq8");
  EXPECT_EQ((*loaded)->Search(&vecs[0], 10), ivf.Search(&vecs[0], 10));
  EXPECT_FALSE((*loaded)->NeedsRebuild());
  // Four times the vectors it was trained on: a retrain is due.
  std::vector<uint32_t> more;
  std::vector<float> more_vecs;
  for (size_t i = 0; i < 3 * n + 10; ++i) {
    more.push_back(100000 + static_cast<uint32_t>(i));
    more_vecs.insert(more_vecs.end(), vecs.begin() + (i % n) * dim,
                     vecs.begin() + (i % n + 1) * dim);
  }
  (*loaded)->Add(more, more_vecs);
  EXPECT_TRUE((*loaded)->NeedsRebuild());
  fs::remove_all(dir);
}

// The lists of an IVF add found beforehand (outside the owner's write lock):
// the index is the one a plain add makes, and lists found by another
// quantizer (the index rebuilt since) are not used.
// The knowledge base's index thread runs at background priority; a matrix
// product it asks of the BLAS (the coarse assignment of a document's chunks,
// the training of the lists) must run on it, not on BLAS workers of their
// own at normal priority.
TEST(VectorIndexBlasTest, AMatrixProductTakesCpuOnlyOnTheThreadThatAsks) {
  using Sgemm = void (*)(const char*, const char*, const int*, const int*, const int*, const float*,
                         const float*, const int*, const float*, const int*, const float*, float*,
                         const int*);
  auto sgemm = reinterpret_cast<Sgemm>(dlsym(RTLD_DEFAULT, "sgemm_"));
  ASSERT_NE(sgemm, nullptr) << "FAISS links a BLAS";
  using GetThreads = int (*)();
  auto threads = reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  if (!threads) GTEST_SKIP() << "the BLAS is not OpenBLAS: it has no threads of its own";
  if (std::thread::hardware_concurrency() < 2)
    GTEST_SKIP() << "one core: OpenBLAS starts no workers";

  VectorIndex index(8, {});  // what every user of FAISS here goes through
  EXPECT_TRUE(RunBlasOnCallingThreads());
  EXPECT_EQ(threads(), 1);
  // The workers OpenBLAS started as it loaded are gone (they would spin in
  // sched_yield for a while first), and the product below starts none.
  auto* server_up = static_cast<const int*>(dlsym(RTLD_DEFAULT, "blas_server_avail"));
  ASSERT_NE(server_up, nullptr) << "OpenBLAS built with its pthreads server";
  EXPECT_EQ(*server_up, 0);

  const int n = 1200;  // 3.5 GFLOP: OpenBLAS would split it across its workers
  std::vector<float> a(static_cast<size_t>(n) * n), b(a.size()), c(a.size());
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto& x : a) x = u(rng);
  for (auto& x : b) x = u(rng);
  // CPU time on a core, in ns: the calling thread's, and the others' from the
  // scheduler's own account (getrusage splits a process's time between user
  // and system by ticks, off by up to a tick, 4 ms, per call).
  auto own_ns = [] {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
  };
  auto thread_ns = [](const std::string& tid) {
    std::ifstream f("/proc/self/task/" + tid + "/schedstat");
    int64_t on_cpu = 0;
    f >> on_cpu;
    return on_cpu;
  };
  auto others_ns = [&thread_ns](const std::string& self) {
    int64_t sum = 0;
    for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
      if (e.path().filename() != self) sum += thread_ns(e.path().filename().string());
    }
    return sum;
  };
  // OpenBLAS's workers spin for a while after they start before they sleep:
  // wait until every other thread of this process sleeps.
  auto others_asleep = [] {
    const std::string self = std::to_string(gettid());
    for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
      if (e.path().filename() == self) continue;
      std::ifstream f(e.path() / "stat");
      std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      const auto close = stat.rfind(')');
      if (close == std::string::npos || close + 2 >= stat.size() || stat[close + 2] == 'R')
        return false;
    }
    return true;
  };
  for (int i = 0; i < 1000 && !others_asleep(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(others_asleep()) << "a thread of the test process kept running for 10 s";
  int64_t on_caller = 0, elsewhere = 0;
  std::thread([&] {
    const std::string self = std::to_string(gettid());
    const int64_t t0 = own_ns(), o0 = others_ns(self);
    const float one = 1, zero = 0;
    sgemm("N", "N", &n, &n, &n, &one, a.data(), &n, b.data(), &n, &zero, c.data(), &n);
    on_caller = own_ns() - t0;
    elsewhere = others_ns(self) - o0;
  }).join();
  // c[0] = row 0 of a times column 0 of b (column-major: a(0,k) = a[k*n]).
  double want = 0;
  for (int k = 0; k < n; ++k) want += static_cast<double>(a[static_cast<size_t>(k) * n]) * b[k];
  EXPECT_NEAR(c[0], want, 1e-2);
  ASSERT_GT(on_caller, 0);
  // Nothing else in this process runs meanwhile (the test's main thread
  // waits in join): with OpenBLAS's workers, about half the product's CPU
  // time was theirs.
  EXPECT_LT(elsewhere, on_caller / 10)
      << "caller " << on_caller / 1000 << " us, other threads " << elsewhere / 1000 << " us";
  EXPECT_EQ(*server_up, 0);
}

TEST(VectorIndexIvfTest, AddWithListsFoundBeforehandIsThePlainAdd) {
  const int dim = 32;
  const size_t n = 4000, extra = 600;
  std::mt19937 rng(9);
  std::normal_distribution<float> g;
  auto make = [&](size_t count) {
    std::vector<float> v(count * dim);
    for (size_t i = 0; i < count; ++i) {
      double norm = 0;
      for (int d = 0; d < dim; ++d) norm += std::pow(v[i * dim + d] = g(rng), 2);
      for (int d = 0; d < dim; ++d) v[i * dim + d] /= static_cast<float>(std::sqrt(norm));
    }
    return v;
  };
  const std::vector<float> vecs = make(n), added = make(extra), other = make(n);
  std::vector<uint32_t> ids(n), new_ids(extra);
  for (uint32_t i = 0; i < n; ++i) ids[i] = i;
  for (uint32_t i = 0; i < extra; ++i) new_ids[i] = 50000 + i;
  VectorIndexOptions o;
  o.exact_below = 1000;
  o.approximate = "ivf";
  o.ivf_lists = 64;
  o.ivf_nprobe = 4;  // few lists probed: a vector in a wrong list is missed
  VectorIndex plain(dim, o), ahead(dim, o), stale(dim, o), elsewhere(dim, o);
  plain.Build(ids, vecs);
  ahead.Build(ids, vecs);
  stale.Build(ids, vecs);
  elsewhere.Build(ids, other);  // another quantizer
  ASSERT_EQ(ahead.kind(), "ivf-sq8");
  const VectorIndex::Assignment lists = ahead.Assign(added);
  ASSERT_EQ(lists.lists.size(), extra);
  plain.Add(new_ids, added);
  ahead.Add(new_ids, added, lists);
  stale.Add(new_ids, added, elsewhere.Assign(added));
  size_t found = 0;
  for (size_t q = 0; q < extra; q += 7) {
    const float* query = &added[q * dim];
    const auto want = plain.Search(query, 10);
    EXPECT_EQ(ahead.Search(query, 10), want) << q;
    EXPECT_EQ(stale.Search(query, 10), want) << q;
    found += !want.empty() && want[0].first == new_ids[q] ? 1 : 0;
  }
  EXPECT_EQ(found, (extra + 6) / 7);  // each added vector is found as itself
  // A flat index has no lists to find.
  VectorIndex flat(dim, {});
  EXPECT_TRUE(flat.Assign(added).lists.empty());
}

TEST(VectorIndexIvfTest, AddsGoToATierOfTheirOwnSearchedWithTheRestAndSavedAsOne) {
  // Vectors added to a loaded IVF index go to lists of their own over the
  // same centroids (the loaded lists are not reallocated); a search probes
  // both; the save writes one index that answers as the two tiers did.
  const int dim = 32;
  const size_t n = 4000, extra = 600;
  std::mt19937 rng(11);
  std::normal_distribution<float> g;
  auto make = [&](size_t count) {
    std::vector<float> v(count * dim);
    for (size_t i = 0; i < count; ++i) {
      double norm = 0;
      for (int d = 0; d < dim; ++d) norm += std::pow(v[i * dim + d] = g(rng), 2);
      for (int d = 0; d < dim; ++d) v[i * dim + d] /= static_cast<float>(std::sqrt(norm));
    }
    return v;
  };
  const std::vector<float> vecs = make(n), added = make(extra);
  std::vector<uint32_t> ids(n), new_ids(extra);
  for (uint32_t i = 0; i < n; ++i) ids[i] = i;
  for (uint32_t i = 0; i < extra; ++i) new_ids[i] = 50000 + i;
  VectorIndexOptions o;
  o.exact_below = 1000;
  o.approximate = "ivf";
  o.ivf_lists = 64;
  o.ivf_nprobe = 4;
  const std::string dir = TempDir("fwai-ivf-");
  VectorIndex built(dim, o);
  built.Build(ids, vecs);
  ASSERT_TRUE(built.Save(dir + "/v", 1).ok());
  auto loaded = VectorIndex::Load(dir + "/v", 1, dim, o);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  VectorIndex& idx = **loaded;
  EXPECT_EQ(idx.added_tier_size(), 0u);
  idx.Add(new_ids, added, idx.Assign(added));
  idx.Add({new_ids[0]}, {added.begin(), added.begin() + dim});  // replaced: the old one is dead
  idx.Remove(7);
  idx.Remove(new_ids[1]);
  EXPECT_EQ(idx.added_tier_size(), extra + 1);
  EXPECT_EQ(idx.size(), n + extra - 2);
  size_t found = 0;
  std::vector<std::vector<std::pair<uint32_t, float>>> before;
  std::vector<const float*> queries;
  for (size_t q = 0; q < extra; q += 7) queries.push_back(&added[q * dim]);
  for (size_t q = 0; q < n; q += 97) queries.push_back(&vecs[q * dim]);
  for (const float* query : queries) before.push_back(idx.Search(query, 10));
  for (size_t q = 2; q < extra; q += 7) {
    const auto hits = idx.Search(&added[q * dim], 10);
    found += !hits.empty() && hits[0].first == new_ids[q] ? 1 : 0;
  }
  EXPECT_EQ(found, (extra - 2 + 6) / 7);  // each added vector is found as itself
  for (const float* query : {&vecs[7 * dim], &added[dim]}) {
    for (const auto& [id, score] : idx.Search(query, 10)) {
      EXPECT_NE(id, 7u);
      EXPECT_NE(id, new_ids[1]);
    }
  }
  ASSERT_TRUE(idx.Save(dir + "/v", 2).ok());
  auto again = VectorIndex::Load(dir + "/v", 2, dim, o);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->added_tier_size(), 0u);
  EXPECT_EQ((*again)->size(), idx.size());
  for (size_t i = 0; i < queries.size(); ++i)
    EXPECT_EQ((*again)->Search(queries[i], 10), before[i]) << i;
  fs::remove_all(dir);
}

// `n` unit vectors of `dim` from a Gaussian: no cluster structure.
std::vector<float> UnstructuredVectors(size_t n, int dim, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g;
  std::vector<float> vecs(n * dim);
  for (size_t i = 0; i < n; ++i) {
    double norm = 0;
    for (int d = 0; d < dim; ++d) norm += std::pow(vecs[i * dim + d] = g(rng), 2);
    for (int d = 0; d < dim; ++d) vecs[i * dim + d] /= static_cast<float>(std::sqrt(norm));
  }
  return vecs;
}

std::vector<uint32_t> Ids(size_t n) {
  std::vector<uint32_t> ids(n);
  for (uint32_t i = 0; i < n; ++i) ids[i] = i;
  return ids;
}

TEST(VectorIndexIvfTest, ChosenBreadthStaysWithinTheProbeShareAlsoWhenLoaded) {
  // Vectors without cluster structure: the recall bar alone would probe most
  // lists; the share caps it (at least 16 lists).
  const int dim = 32;
  const size_t n = 20000;
  const std::vector<float> vecs = UnstructuredVectors(n, dim, 11);
  const std::vector<uint32_t> ids = Ids(n);
  VectorIndexOptions wide;
  wide.exact_below = 1000;
  wide.approximate = "ivf";
  wide.ivf_lists = 256;
  wide.ivf_max_probe_share = 1.0;
  VectorIndex uncapped(dim, wide);
  uncapped.Build(ids, vecs);
  ASSERT_EQ(uncapped.kind(), "ivf-sq8");
  EXPECT_GT(uncapped.ef_search(), 16) << "the recall bar alone stays within the cap here";
  EXPECT_GE(uncapped.tuned_recall(), 0.98);

  VectorIndexOptions capped = wide;
  capped.ivf_max_probe_share = 1.0 / 32;  // 8 of 256 lists: the floor of 16 applies
  VectorIndex ivf(dim, capped);
  ivf.Build(ids, vecs);
  EXPECT_EQ(ivf.ef_search(), 16);
  EXPECT_GT(ivf.tuned_recall(), 0.0);
  EXPECT_LT(ivf.tuned_recall(), 0.98);

  // Saved with the wide breadth, loaded under the cap: searches within it.
  const std::string dir = TempDir("fwai-ivf-cap-");
  ASSERT_TRUE(uncapped.Save(dir + "/v", 1).ok());
  auto loaded = VectorIndex::Load(dir + "/v", 1, dim, capped);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)->ef_search(), 16);
  // A breadth the configuration names is used as it is.
  VectorIndexOptions named = capped;
  named.ivf_nprobe = 64;
  auto given = VectorIndex::Load(dir + "/v", 1, dim, named);
  ASSERT_TRUE(given.ok()) << given.status();
  EXPECT_EQ((*given)->ef_search(), 64);
  fs::remove_all(dir);
}

// Vectors without cluster structure, 16 of 256 lists probed at most: the
// recall stays far below 0.9, and with `min_recall` the index is dropped.
// Off, it finds nothing, keeps only ids, is rebuilt once it has grown by
// the retrain growth, and saves and loads as off with its reason.
TEST(VectorIndexIvfTest, BelowTheRecallRequiredTheIndexIsOff) {
  const int dim = 64;
  const size_t n = 8192;
  const std::vector<float> vecs = UnstructuredVectors(n, dim, 13);
  const std::vector<uint32_t> ids = Ids(n);
  VectorIndexOptions o;
  o.exact_below = 1000;
  o.approximate = "ivf";
  o.ivf_lists = 256;
  VectorIndex kept(dim, o);  // min_recall 0: kept whatever it reaches
  kept.Build(ids, vecs);
  ASSERT_EQ(kept.kind(), "ivf-sq8");
  EXPECT_FALSE(kept.off());
  EXPECT_LT(kept.tuned_recall(), 0.9) << "the data must be the case this test is about";
  EXPECT_FALSE(kept.Search(&vecs[0], 10).empty());

  o.min_recall = 0.9;
  VectorIndex off(dim, o);
  off.Build(ids, vecs);
  EXPECT_EQ(off.kind(), "off");
  EXPECT_TRUE(off.off());
  EXPECT_EQ(off.off_reason().rfind("ivf-sq8(lists=256,nprobe=16) reached recall@10 0.", 0), 0u)
      << off.off_reason();
  EXPECT_EQ(off.describe(), "off(" + off.off_reason() + ")");
  EXPECT_TRUE(off.Search(&vecs[0], 10).empty());
  EXPECT_EQ(off.size(), n);
  EXPECT_LT(off.memory_bytes(), kept.memory_bytes() / 10);
  EXPECT_FALSE(off.NeedsRebuild());

  const std::string dir = TempDir("fwai-ivf-off-");
  off.Remove(3);
  ASSERT_TRUE(off.Save(dir + "/v", 5).ok());
  auto loaded = VectorIndex::Load(dir + "/v", 5, dim, o);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE((*loaded)->off());
  EXPECT_EQ((*loaded)->off_reason(), off.off_reason());
  EXPECT_EQ((*loaded)->size(), n - 1);
  EXPECT_TRUE((*loaded)->Search(&vecs[0], 10).empty());
  // Ids added while off count toward the growth that makes a build due.
  std::vector<uint32_t> more;
  for (size_t i = 0; i < 3 * n; ++i) more.push_back(100000 + static_cast<uint32_t>(i));
  std::vector<float> more_vecs;
  for (size_t i = 0; i < 3; ++i) more_vecs.insert(more_vecs.end(), vecs.begin(), vecs.end());
  (*loaded)->Add(more, more_vecs);
  EXPECT_FALSE((*loaded)->NeedsRebuild()) << "one id short of four times";
  (*loaded)->Add({999999}, std::vector<float>(vecs.begin(), vecs.begin() + dim));
  EXPECT_TRUE((*loaded)->NeedsRebuild());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace fwai
