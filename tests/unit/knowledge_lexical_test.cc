#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <random>

#include "server/knowledge/bm25_index.h"
#include "server/knowledge/query_expansion.h"
#include "server/knowledge/tokenizer.h"

namespace fwai {
namespace {

bool Has(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

TEST(PorterStemTest, ClassicExamples) {
  const std::pair<const char*, const char*> cases[] = {
      {"caresses", "caress"},      {"ponies", "poni"},          {"cats", "cat"},
      {"agreed", "agre"},          {"plastered", "plaster"},    {"motoring", "motor"},
      {"hopping", "hop"},          {"falling", "fall"},         {"filing", "file"},
      {"happy", "happi"},          {"relational", "relat"},     {"conditional", "condit"},
      {"generalization", "gener"}, {"electrical", "electr"},    {"adjustable", "adjust"},
      {"controlling", "control"},  {"interrupts", "interrupt"}, {"enabled", "enabl"},
      {"enabling", "enabl"},       {"registers", "regist"},     {"as", "as"}};
  for (const auto& [in, out] : cases) EXPECT_EQ(PorterStem(in), out) << in;
}

TEST(TokenizerTest, IdentifiersStayWholeAndGiveTheirParts) {
  std::vector<std::string> t;
  Tokenize("Set RCC_AHB2ENR bit GPIOAEN to enable the clock of PA5.", &t);
  EXPECT_TRUE(Has(t, "rcc_ahb2enr"));
  EXPECT_TRUE(Has(t, "rcc"));
  EXPECT_TRUE(Has(t, "ahb2enr"));
  EXPECT_TRUE(Has(t, "gpioaen"));  // all caps: not stemmed
  EXPECT_TRUE(Has(t, "pa5"));
  EXPECT_TRUE(Has(t, "enabl"));  // English: stemmed
  EXPECT_TRUE(Has(t, "clock"));
  EXPECT_FALSE(Has(t, "the"));   // stop word
  EXPECT_FALSE(Has(t, "pa5."));  // sentence punctuation is not absorbed
}

TEST(TokenizerTest, CompatibleStringsHexAndProperties) {
  std::vector<std::string> t;
  Tokenize("compatible = \"snps,dw-apb-uart\"; reg = <0x40021000 0x400>; max_hw_heartbeat_ms", &t);
  EXPECT_TRUE(Has(t, "snps,dw-apb-uart"));
  EXPECT_TRUE(Has(t, "snp"));  // parts are stemmed like the query words they must meet
  EXPECT_TRUE(Has(t, "apb"));
  EXPECT_TRUE(Has(t, "uart"));
  EXPECT_TRUE(Has(t, "0x40021000"));
  EXPECT_TRUE(Has(t, "max_hw_heartbeat_ms"));
  EXPECT_TRUE(Has(t, "heartbeat"));
}

TEST(TokenizerTest, CommaSpaceSeparatesWords) {
  std::vector<std::string> t;
  Tokenize("clocks, resets and interrupts", &t);
  EXPECT_TRUE(Has(t, "clock"));
  EXPECT_TRUE(Has(t, "reset"));
  EXPECT_FALSE(Has(t, "clocks,"));
}

TEST(TokenizerTest, FindIdentifiers) {
  auto ids = FindIdentifiers(
      "The USART1_BRR register at 0x40013808 sets the baud; see PA9, PA10 and USART1_BRR.");
  EXPECT_EQ(ids, (std::vector<std::string>{"USART1_BRR", "0x40013808", "PA9", "PA10"}));
}

TEST(Bm25IndexTest, RanksRareTermsAndLengthNormalises) {
  Bm25Index idx;
  auto add = [&](uint32_t id, const std::string& text) {
    std::vector<std::string> t;
    Tokenize(text, &t);
    idx.Add(id, t);
  };
  add(0, "The GPIO port mode register configures each pin of the port.");
  add(1, "GPIOx_MODER: port mode register. MODER5 selects the mode of pin 5.");
  add(2, "The RCC enables peripheral clocks. RCC_AHB2ENR enables the GPIO clocks.");
  add(3, "Watchdog timer. The watchdog resets the chip if not refreshed.");
  std::vector<std::string> q;
  Tokenize("which register enables the GPIO clock RCC_AHB2ENR", &q);
  auto r = idx.Search(q, 10);
  ASSERT_FALSE(r.empty());
  EXPECT_EQ(r[0].first, 2u);
  q.clear();
  Tokenize("watchdog refresh", &q);
  r = idx.Search(q, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].first, 3u);
  // Filters apply before the cut.
  q.clear();
  Tokenize("port mode register", &q);
  r = idx.Search(q, 1, [](uint32_t d) { return d != 1; });
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].first, 0u);
}

TEST(Bm25IndexTest, GroupScoresAreBm25OverWholeDocuments) {
  // Five chunks in three documents, scored by groups in the chunk pass, must
  // equal BM25 over the documents indexed whole.
  const std::vector<std::string> chunks = {
      "The watchdog timer resets the chip.", "Refresh the watchdog before the timeout.",
      "The ADC samples twelve bits per conversion.", "GPIO pins drive LEDs.",
      "A watchdog on GPIO expanders is rare; the timer is the GPIO clock."};
  const std::vector<uint32_t> group_of = {0, 0, 1, 2, 2};
  const float b = 0.4f;
  Bm25Index by_chunk({1.2f, 0.75f}), whole({1.2f, b});
  std::vector<std::vector<std::string>> doc_terms(3);
  for (uint32_t i = 0; i < chunks.size(); ++i) {
    std::vector<std::string> t;
    Tokenize(chunks[i], &t);
    by_chunk.Add(i, t);
    doc_terms[group_of[i]].insert(doc_terms[group_of[i]].end(), t.begin(), t.end());
  }
  std::vector<uint32_t> group_len;
  uint64_t total = 0;
  for (uint32_t g = 0; g < 3; ++g) {
    whole.Add(g, doc_terms[g]);
    group_len.push_back(static_cast<uint32_t>(doc_terms[g].size()));
    total += doc_terms[g].size();
  }
  Bm25Index::Groups groups;
  groups.group_of = &group_of;
  groups.group_len = &group_len;
  groups.present = 3;
  groups.avg_len = static_cast<float>(total) / 3;
  groups.b = b;
  std::vector<std::string> q;
  Tokenize("watchdog timer GPIO", &q);
  std::vector<std::pair<std::string, float>> wq;
  for (const auto& t : q) wq.emplace_back(t, 1.0f);
  by_chunk.Search(wq, 10, nullptr, nullptr, &groups);
  auto expected = whole.Search(q, 10);
  ASSERT_EQ(groups.scores.size(), expected.size());
  std::map<uint32_t, float> got(groups.scores.begin(), groups.scores.end());
  for (const auto& [g, score] : expected) {
    ASSERT_TRUE(got.count(g)) << g;
    EXPECT_NEAR(got[g], score, 1e-4) << "group " << g;
  }
  EXPECT_EQ(by_chunk.Length(1), 4u);  // refresh, watchdog, before, timeout
}

TEST(Bm25IndexTest, RemoveReplaceAndRoundTrip) {
  Bm25Index idx({1.5f, 0.6f});
  idx.Add(5, {"alpha", "beta"});
  idx.Add(2, {"alpha", "gamma", "gamma"});
  idx.Add(9, {"delta"});
  EXPECT_EQ(idx.size(), 3u);
  idx.Remove(9);
  EXPECT_FALSE(idx.Contains(9));
  EXPECT_TRUE(idx.Search({"delta"}, 5).empty());
  idx.Add(5, {"omega"});  // replace
  EXPECT_TRUE(idx.Search({"beta"}, 5).empty());
  EXPECT_EQ(idx.size(), 2u);
  std::string image = idx.Serialize();
  auto back = Bm25Index::Deserialize(image);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->size(), 2u);
  auto a = idx.Search({"alpha", "gamma", "omega"}, 5);
  auto b = back->Search({"alpha", "gamma", "omega"}, 5);
  EXPECT_EQ(a, b);
  back->Remove(2);  // doc terms were rebuilt on load
  EXPECT_TRUE(back->Search({"gamma"}, 5).empty());
  // Damage is detected.
  image[image.size() / 2] ^= 0x5a;
  EXPECT_EQ(Bm25Index::Deserialize(image).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(Bm25Index::Deserialize(image.substr(0, 10)).status().code(),
            absl::StatusCode::kDataLoss);
}

// A saved index of skewed random text (a few words in nearly every chunk, as
// in real manuals), grouped like chunks in documents, with documents removed
// and added after the save: for random weighted queries the pruned search
// must return exactly the exhaustive top k (docs, scores, order), the same
// document-level scores, and ScoreDocs the exhaustive chunk scores.
TEST(Bm25IndexTest, PrunedSearchIsTheExhaustiveTopK) {
  std::mt19937 rng(20);
  std::vector<std::string> words;
  for (int i = 0; i < 3000; ++i) words.push_back("w" + std::to_string(i));
  auto pick = [&] {
    const double u = std::uniform_real_distribution<double>(0, 1)(rng);
    return words[std::min<size_t>(static_cast<size_t>(std::pow(u, 3.0) * words.size()),
                                  words.size() - 1)];
  };
  constexpr uint32_t kPerGroup = 30, kGroups = 300;
  Bm25Index built({1.2f, 0.75f});
  auto add_doc = [&](Bm25Index& idx, uint32_t doc) {
    std::vector<std::string> t;
    const int n = 20 + static_cast<int>(rng() % 120);
    for (int i = 0; i < n; ++i) t.push_back(pick());
    idx.Add(doc, t);
  };
  for (uint32_t d = 0; d < kPerGroup * kGroups; ++d) add_doc(built, d);
  const std::string path = ::testing::TempDir() + "/pruned-" + std::to_string(getpid()) + ".bm25";
  auto key = [&](uint32_t doc) { return doc / kPerGroup * kPerGroup; };
  ASSERT_TRUE(built.Save(path, 1, key).ok());
  auto loaded = Bm25Index::Load(path, 1);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  std::remove(path.c_str());
  Bm25Index& idx = **loaded;
  // Two documents removed from the image, two added to the mutable tier.
  for (uint32_t g : {7u, 150u}) {
    for (uint32_t d = g * kPerGroup; d < (g + 1) * kPerGroup; ++d) idx.Remove(d);
  }
  const uint32_t total_groups = kGroups + 2;
  for (uint32_t d = kPerGroup * kGroups; d < kPerGroup * total_groups; ++d) add_doc(idx, d);
  std::vector<uint32_t> group_of(kPerGroup * total_groups), group_len(total_groups, 0);
  for (uint32_t d = 0; d < group_of.size(); ++d) {
    group_of[d] = idx.Contains(d) ? d / kPerGroup : Bm25Index::kNoGroup;
    if (idx.Contains(d)) group_len[d / kPerGroup] += idx.Length(d);
  }
  uint32_t present = 0;
  uint64_t sum = 0;
  for (uint32_t l : group_len) {
    present += l > 0 ? 1 : 0;
    sum += l;
  }
  auto make_groups = [&] {
    Bm25Index::Groups g;
    g.group_of = &group_of;
    g.group_len = &group_len;
    g.present = present;
    g.avg_len = static_cast<float>(sum) / present;
    g.b = 0.3f;
    g.by_member = true;
    return g;
  };
  int pruned_differs_from_all = 0;
  for (int q = 0; q < 300; ++q) {
    std::vector<std::pair<std::string, float>> wq;
    const int n = 2 + q % 7;
    for (int i = 0; i < n; ++i) wq.emplace_back(pick(), i % 3 == 2 ? 0.5f : 1.0f);
    if (q % 5 == 0) wq.emplace_back("absent-term", 1.0f);
    const size_t k = q % 2 == 0 ? 10 : 100;
    std::function<bool(uint32_t)> accept;
    if (q % 4 == 3) accept = [](uint32_t d) { return d % 3 != 0; };
    std::vector<std::pair<uint32_t, float>> all;
    Bm25Index::Groups ex = make_groups(), pr = make_groups();
    const auto exhaustive = idx.Search(wq, k, accept, &all, &ex);
    const auto pruned = idx.SearchPruned(wq, k, accept, &pr);
    ASSERT_TRUE(pruned.has_value());
    ASSERT_EQ(*pruned, exhaustive) << "query " << q;  // exact: ids, float scores, order
    std::sort(ex.scores.begin(), ex.scores.end());
    std::sort(pr.scores.begin(), pr.scores.end());
    ASSERT_EQ(pr.scores, ex.scores) << "query " << q;
    if (all.size() > exhaustive.size()) ++pruned_differs_from_all;
    // A document's chunk scores, as the exhaustive pass gave them.
    const uint32_t g = static_cast<uint32_t>(rng() % total_groups);
    std::vector<uint32_t> members;
    for (uint32_t d = g * kPerGroup; d < (g + 1) * kPerGroup; ++d) members.push_back(d);
    std::reverse(members.begin(), members.end());
    std::map<uint32_t, float> want;
    for (const auto& [d, s] : all) {
      if (d / kPerGroup == g) want[d] = s;
    }
    const auto got = idx.ScoreDocs(wq, members, accept);
    const std::map<uint32_t, float> got_map(got.begin(), got.end());
    ASSERT_EQ(got_map, want) << "query " << q;
  }
  EXPECT_GT(pruned_differs_from_all, 200);  // the top k is a small part of what matches
  // Without group postings in the image, group scores cannot be pruned.
  Bm25Index::Groups ng = make_groups();
  ng.by_member = false;
  EXPECT_FALSE(idx.SearchPruned({{"w1", 1.0f}}, 10, nullptr, &ng).has_value());
}

}  // namespace
}  // namespace fwai

namespace fwai {
namespace {

TEST(QueryExpansionTest, FamiliesAndSynonymsWeighLessThanTheQuery) {
  std::vector<std::string> terms;
  const std::string q = "Wipe the program memory of an STM32H743 and an nRF52832";
  Tokenize(q, &terms);
  auto ex = ExpandQuery(q, terms);
  std::map<std::string, float> m(ex.begin(), ex.end());
  EXPECT_FLOAT_EQ(m["stm32h7x"], 0.8f);
  EXPECT_FLOAT_EQ(m["stm32h7"], 0.8f);
  EXPECT_FLOAT_EQ(m["nrf52"], 0.8f);
  EXPECT_FLOAT_EQ(m["nrf5x"], 0.8f);
  EXPECT_GT(m.count(PorterStem("erase")), 0u);  // wipe -> erase
  EXPECT_GT(m.count("flash"), 0u);              // program memory -> flash
  EXPECT_LT(m[PorterStem("erase")], 0.5f);
  for (const auto& t : terms) EXPECT_EQ(m.count(t), 0u) << t;  // nothing the query already has
  // Pins and peripherals are not part numbers.
  terms.clear();
  Tokenize("toggle PA5 on UART1", &terms);
  for (const auto& [t, w] : ExpandQuery("toggle PA5 on UART1", terms)) EXPECT_NE(w, 0.8f) << t;
  // Weighted BM25: a term at weight 0.35 ranks a document below one with the query's own term.
  Bm25Index idx;
  idx.Add(1, {"eras", "sector"});
  idx.Add(2, {"wipe", "sector"});
  auto hits =
      idx.Search(std::vector<std::pair<std::string, float>>{{"wipe", 1.0f}, {"eras", 0.35f}}, 2);
  ASSERT_EQ(hits.size(), 2u);
  EXPECT_EQ(hits[0].first, 2u);
  EXPECT_NEAR(hits[1].second / hits[0].second, 0.35f, 0.01f);
}

}  // namespace
}  // namespace fwai
