// Passages: widening a hit within its section up to the budget, towards the
// text that carries the query, the overlap between chunks never repeated,
// the best sentences marked.
#include "server/knowledge/passage.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "server/knowledge/query_expansion.h"
#include "server/knowledge/tokenizer.h"
#include "server/knowledge/windows.h"

namespace fwai {
namespace {

// A document as a list of chunks; chunk i's overlap with i-1 is computed as
// the knowledge base does.
struct Doc {
  std::vector<PassageChunk> chunks;
  void Add(const std::string& text, int section = 0, int page = 0) {
    PassageChunk c;
    c.index = static_cast<uint32_t>(chunks.size());
    c.text = text;
    c.section = section;
    c.page = page;
    c.start_line = static_cast<int>(chunks.size()) * 10 + 1;
    c.end_line = c.start_line + 9;
    if (!chunks.empty()) c.overlap = OverlapLength(chunks.back().text, text);
    chunks.push_back(c);
  }
  PassageSource Source() const {
    PassageSource s;
    s.chunk = [this](uint32_t i) -> const PassageChunk* {
      return i < chunks.size() ? &chunks[i] : nullptr;
    };
    s.same_section = [](const PassageChunk& a, const PassageChunk& b) { return SameSection(a, b); };
    return s;
  }
};

QueryTermScorer Scorer(const std::string& query) {
  std::vector<std::string> terms;
  Tokenize(query, &terms);
  return QueryTermScorer(WeightedQuery(query, terms), [](const std::string&) { return 1.0; });
}

std::string Sentences(const std::string& word, int n) {
  std::string s;
  for (int i = 0; i < n; ++i)
    s += "The " + word + " line number " + std::to_string(i) + " says nothing new here.\n";
  return s;
}

TEST(PassageTest, OverlapIsTheLongestSuffixThatStartsTheNextChunk) {
  EXPECT_EQ(OverlapLength("first part. The shared sentence runs on.",
                          "The shared sentence runs on.\nNext part."),
            std::string("The shared sentence runs on.").size());
  EXPECT_EQ(OverlapLength("nothing in common here at all", "another text entirely, no overlap"),
            0u);
  EXPECT_EQ(OverlapLength("short", "short"), 0u);  // under the minimum: not an overlap
}

TEST(PassageTest, GrowsWithinTheSectionTowardsTheQueryUpToTheBudget) {
  Doc d;
  d.Add(Sentences("alpha", 6), 1);                                           // 0: another section
  d.Add(Sentences("filler", 6), 2);                                          // 1
  d.Add("The watchdog is fed by writing 0xAAAA to the key register.\n", 2);  // 2: the hit
  d.Add("The prescaler divides the LSI clock before the watchdog counter.\n" +  // 3: carries the
                                                                                // query
            Sentences("tail", 6),
        2);
  d.Add(Sentences("omega", 6), 3);  // 4: the next section
  const auto scorer = Scorer("watchdog prescaler LSI clock");
  Passage p = BuildPassage(d.Source(), 2, 120, scorer);
  EXPECT_NE(p.text.find("0xAAAA"), std::string::npos);             // the hit is whole
  EXPECT_NE(p.text.find("prescaler divides"), std::string::npos);  // grown towards the query
  EXPECT_EQ(p.text.find("alpha"), std::string::npos);              // never into another section
  EXPECT_EQ(p.text.find("omega"), std::string::npos);
  EXPECT_LE(p.tokens, 120);
  EXPECT_GT(p.tokens, 60);  // it used the budget
  EXPECT_NE(std::find(p.chunks.begin(), p.chunks.end(), 2u), p.chunks.end());
  EXPECT_NE(std::find(p.chunks.begin(), p.chunks.end(), 3u), p.chunks.end());
  EXPECT_GT(p.coverage, 0.9);
  // The best sentence is marked.
  ASSERT_FALSE(p.highlights.empty());
  const auto [b, e] = p.highlights[0];
  EXPECT_NE(p.text.substr(b, e - b).find("prescaler divides the LSI clock"), std::string::npos);
  // Budget 0: the chunk alone; a budget past the ceiling is held to it.
  EXPECT_EQ(BuildPassage(d.Source(), 2, 0, scorer).text,
            "The watchdog is fed by writing 0xAAAA to the key register.");
  Doc big;
  for (int i = 0; i < 8; ++i) big.Add(Sentences("same" + std::to_string(i), 10), 1);
  EXPECT_LE(BuildPassage(big.Source(), 4, 5000, scorer).tokens, kMaxPassageTokens);
}

TEST(PassageTest, OverlapBetweenChunksIsNotRepeated) {
  Doc d;
  const std::string shared = "This sentence ends the first chunk and starts the second one.";
  d.Add("Opening words of the section. " + shared, 1);
  d.Add(shared + "\nThen the second chunk says where the PLL lock bit is.", 1);
  Passage p = BuildPassage(d.Source(), 1, 400, Scorer("PLL lock bit"));
  EXPECT_NE(p.text.find("Opening words"), std::string::npos);
  EXPECT_NE(p.text.find("PLL lock bit"), std::string::npos);
  const size_t first = p.text.find(shared);
  ASSERT_NE(first, std::string::npos);
  EXPECT_EQ(p.text.find(shared, first + 1), std::string::npos) << p.text;
  // The same window seen from either chunk: one text, one span.
  Passage q = BuildPassage(d.Source(), 0, 400, Scorer("PLL lock bit"));
  EXPECT_EQ(q.text, p.text);
  EXPECT_TRUE(q.begin == p.begin && q.end == p.end);
}

TEST(PassageTest, ChunksStoredBeforeSectionsWereNumberedUseTitlePaths) {
  PassageChunk a, b, c;
  a.title_path = {"RCC", "Clocks"};
  b.title_path = {"RCC"};
  c.title_path = {"GPIO"};
  EXPECT_TRUE(SameSection(a, b));
  EXPECT_FALSE(SameSection(a, c));
  a.section = 3;
  EXPECT_TRUE(SameSection(a, b));  // one side unnumbered: title paths decide
  b.section = 4;
  EXPECT_FALSE(SameSection(a, b));  // both numbered: the numbers decide
  c.section = 4;
  EXPECT_TRUE(SameSection(b, c));
}

TEST(PassageTest, ALeadInIsAHeadingWithALineOrTextEndingInAColon) {
  PassageChunk c;
  c.text = "Flashing the board\n\nTo write the image into flash:\n";
  EXPECT_TRUE(IsLeadIn(c, 512));
  c.text = "Flashing\nA short note on the tools.";
  EXPECT_TRUE(IsLeadIn(c, 512));   // a quarter of the budget or less
  c.text = Sentences("body", 30);  // a whole body of text, no colon
  EXPECT_FALSE(IsLeadIn(c, 512));
  c.text = Sentences("body", 30) + "Then run these commands:\n";
  EXPECT_TRUE(IsLeadIn(c, 512));
}

// A how-to: the hit is the heading's lead-in; the steps follow in a
// subsection, and the text before it carries more of the query's words.
Doc HowTo() {
  Doc d;
  d.Add(
      "Flashing background: the flash controller and the board flash the image slowly; the "
      "board keeps its flash image across resets.\n" +
          Sentences("background", 8),
      1);
  d.chunks.back().title_path = {"Guide", "Background"};
  d.Add("Flash the board\n\nTo flash the board image:\n", 2);  // the hit: a lead-in
  d.chunks.back().title_path = {"Guide", "Flash the board"};
  d.Add("1. Connect the probe to the SWD header.\n2. Run openocd -f board.cfg -c program.\n", 3);
  d.chunks.back().title_path = {"Guide", "Flash the board", "Steps"};
  d.Add(Sentences("unrelated", 8), 4);
  d.chunks.back().title_path = {"Guide", "Erratum"};
  return d;
}

TEST(PassageTest, AHitOnALeadInGrowsForwardThroughItsSubsections) {
  const Doc d = HowTo();
  const auto scorer = Scorer("how do I flash the board image");
  Passage towards = BuildPassage(d.Source(), 1, 200, scorer, PassageGrowth::kTowardsQuery);
  EXPECT_EQ(towards.text.find("openocd"), std::string::npos) << towards.text;
  Passage forward = BuildPassage(d.Source(), 1, 200, scorer, PassageGrowth::kForwardFromLeadIn);
  EXPECT_NE(forward.text.find("To flash the board image:"), std::string::npos);
  EXPECT_NE(forward.text.find("2. Run openocd"), std::string::npos) << forward.text;
  EXPECT_EQ(forward.text.find("unrelated"), std::string::npos) << "left the heading's subtree";
  EXPECT_EQ(forward.text.find("background"), std::string::npos) << "grew into another section";
  EXPECT_LE(forward.tokens, 200);
}

TEST(PassageTest, AHitThatIsNotALeadInGrowsAsBefore) {
  Doc d = HowTo();
  d.chunks[1].text = "Flash the board\n\n" + Sentences("flash board image", 20);
  const auto scorer = Scorer("how do I flash the board image");
  Passage towards = BuildPassage(d.Source(), 1, 400, scorer, PassageGrowth::kTowardsQuery);
  Passage forward = BuildPassage(d.Source(), 1, 400, scorer, PassageGrowth::kForwardFromLeadIn);
  EXPECT_EQ(forward.text, towards.text);
  EXPECT_EQ(forward.text.find("openocd"), std::string::npos);
}

TEST(PassageTest, WithinDocumentRankingPrefersThePassageThatCoversTheQuestion) {
  // Two passages of one document (stage 1 preferred the one that covers
  // less of the question) and one of another document.
  const double doc_best = 0.9;
  const double a = 0.9, a_cov = 0.2, a_best = 0.2;  // the document's best by stage 1
  const double b = 0.6, b_cov = 0.9, b_best = 0.8;  // same document, covers the question
  const double other = 0.7;
  EXPECT_DOUBLE_EQ(WithinDocScore(b, doc_best, b_cov, b_best, 0), b);  // weight 0: unchanged
  const double sa = WithinDocScore(a, doc_best, a_cov, a_best, 1);
  const double sb = WithinDocScore(b, doc_best, b_cov, b_best, 1);
  const double so = WithinDocScore(other, other, 0.5, 0.5, 1);
  EXPECT_GT(sb, sa);  // within the document, coverage decides
  EXPECT_GT(sb, so);  // the document's signal carries its passages past the other document's
  EXPECT_LT(WithinDocScore(b, doc_best, b_cov, b_best, 0.5), sb);
}

// Index term -> weight x idf for a question, every term at idf 1.
std::unordered_map<std::string, double> WindowTerms(const std::string& query) {
  std::vector<std::string> terms;
  Tokenize(query, &terms);
  std::unordered_map<std::string, double> w;
  for (const auto& t : terms) w[t] = 1.0;
  return w;
}

std::string Filler(int words, const std::string& word = "lorem") {
  std::string s;
  for (int i = 0; i < words; ++i) s += word + (i % 12 == 11 ? ".\n" : " ");
  return s;
}

TEST(PassageTest, WindowsCutADocumentAcrossItsChunksAndTheDensestScoresBest) {
  // 1,000 words over five chunks; the question's words sit together across
  // the cut between chunks 2 and 3, and once alone in chunk 0.
  Doc d;
  // Each chunk's filler is a word of its own, so no chunk repeats the end of
  // the one before (which would count as overlap and shorten its own text).
  d.Add(Filler(100) + "watchdog " + Filler(99));
  d.Add(Filler(200, "ipsum"));
  d.Add(Filler(180, "dolor") + "keep the watchdog fed while erasing " + Filler(14, "dolor"));
  d.Add("the flash erase loop must feed the watchdog " + Filler(192, "amet"));
  d.Add(Filler(200, "sitx"));
  std::vector<const PassageChunk*> chunks;
  for (const auto& c : d.chunks) chunks.push_back(&c);
  const auto windows = ScoreWindows(chunks, WindowTerms("feed the watchdog during a flash erase"));
  ASSERT_GE(windows.size(), 2u);
  // Windows of 300 words every 150 words: those without a question word
  // are left out; the best holds the cluster across the chunk cut.
  for (const auto& w : windows) {
    EXPECT_LE(w.end.chunk - w.begin.chunk, 2u);
    EXPECT_GT(w.score, 0);
  }
  const TextWindow& best = windows[0];
  EXPECT_LE(best.begin.chunk, 2u);
  EXPECT_GE(best.end.chunk, 3u);
  EXPECT_GT(best.score, windows.back().score);
  // Its densest chunk is the one after the cut (four of the question's
  // terms against two).
  EXPECT_EQ(best.best_chunk, 3u);
  // The window that holds only chunk 0's lone word scores least.
  EXPECT_EQ(windows.back().begin.chunk, 0u);
  EXPECT_TRUE(OverlapsWindow(best, DocPos{3, 0}, DocPos{3, 10}));
  EXPECT_FALSE(OverlapsWindow(best, DocPos{0, 0}, DocPos{0, 10}));
  // Nothing to score: no windows.
  EXPECT_TRUE(ScoreWindows(chunks, WindowTerms("bootloader")).empty());
}

TEST(PassageTest, AWindowRepeatedInTheNextChunksOverlapCountsOnce) {
  // The second chunk repeats the first one's last words (the chunker's
  // overlap): they are one occurrence, not two.
  const std::string tail = "the watchdog must be fed during the erase of the flash sector.\n";
  Doc once, twice;
  once.Add(Filler(50) + tail);
  once.Add(tail + Filler(50, "ipsum"));
  ASSERT_GT(once.chunks[1].overlap, 0u);
  twice.Add(Filler(50) + tail);
  twice.Add(Filler(12, "dolor") + tail + Filler(38, "ipsum"));
  auto score = [](const Doc& d) {
    std::vector<const PassageChunk*> chunks;
    for (const auto& c : d.chunks) chunks.push_back(&c);
    const auto w = ScoreWindows(chunks, WindowTerms("watchdog erase"));
    return w.empty() ? 0.0 : w[0].score;
  };
  EXPECT_LT(score(once), score(twice));
}

TEST(PassageTest, WindowEvidenceFusesByWeightedRank) {
  // First in both rankings scores 1; without a window the item keeps its
  // rank's share.
  EXPECT_DOUBLE_EQ(WindowFusedScore(0, 0, 0.8, 10), 1.0);
  EXPECT_DOUBLE_EQ(WindowFusedScore(0, -1, 0.8, 10), (1.0 / 11) / (1.8 / 11));
  // Sixth in the ranking but over the best window passes the first without one.
  EXPECT_GT(WindowFusedScore(5, 0, 0.8, 10), WindowFusedScore(0, -1, 0.8, 10));
  // At weight 0 the order is the ranking's.
  EXPECT_GT(WindowFusedScore(0, -1, 0, 10), WindowFusedScore(1, 0, 0, 10));
}

}  // namespace
}  // namespace fwai
