// Extraction, chunking, the vector index and the knowledge base, with real
// pdftotext, FAISS and RocksDB.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "common/subprocess.h"
#include "server/knowledge/chunker.h"
#include "server/knowledge/document_search_tool.h"
#include "server/knowledge/embedder.h"
#include "server/knowledge/extract.h"
#include "server/knowledge/knowledge_base.h"
#include "server/knowledge/reranker.h"
#include "server/knowledge/vector_index.h"
#include "server/llm/http_client.h"
#include "server/storage/storage.h"
#include "tests/fakes/fake_llm_server.h"
#include "tests/support/pdf_writer.h"

namespace fwai {
namespace {

namespace fs = std::filesystem;
using testing::MakePdf;

std::string TempDir(const std::string& prefix) {
  std::string t = (fs::temp_directory_path() / (prefix + "XXXXXX")).string();
  return mkdtemp(t.data());
}

// ---------------------------------------------------------------- extraction

TEST(ExtractTest, PdfPagesKeepTheirNumbers) {
  auto doc = ExtractDocument(
      "rm.pdf",
      MakePdf({"8.4.1 GPIO port mode register\nMODER5 selects pin 5", "", "Page three text"}));
  ASSERT_TRUE(doc.ok()) << doc.status();
  EXPECT_EQ(doc->format, DocFormat::kPdf);
  ASSERT_EQ(doc->pages.size(), 3u);
  EXPECT_EQ(doc->pages[0].number, 1);
  EXPECT_NE(doc->pages[0].text.find("MODER5 selects pin 5"), std::string::npos);
  EXPECT_EQ(doc->pages[2].number, 3);
  EXPECT_NE(doc->pages[2].text.find("Page three"), std::string::npos);
}

TEST(ExtractTest, BadPdfsGiveReasons) {
  auto empty = ExtractDocument("blank.pdf", MakePdf({"", ""}));
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("no text"), std::string::npos) << empty.status();
  auto corrupt = ExtractDocument("broken.pdf", "%PDF-1.4\nthis is not a pdf at all\n");
  ASSERT_FALSE(corrupt.ok());
  EXPECT_NE(corrupt.status().message().find("broken.pdf"), std::string::npos);
  auto fake = ExtractDocument("fake.pdf", "hello");
  ASSERT_FALSE(fake.ok());
  EXPECT_NE(fake.status().message().find("not a PDF"), std::string::npos);
  // A real encrypted PDF, made by qpdf.
  std::string dir = TempDir("fwai-pdf-");
  std::ofstream(dir + "/in.pdf") << MakePdf({"secret text"});
  auto r = RunProcess(
      {"qpdf", "--encrypt", "user", "owner", "256", "--", dir + "/in.pdf", dir + "/enc.pdf"});
  ASSERT_TRUE(r.ok() && r->exit_code == 0) << "qpdf is needed for this test";
  std::ifstream f(dir + "/enc.pdf", std::ios::binary);
  std::string enc((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  auto e = ExtractDocument("locked.pdf", enc);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("encrypted"), std::string::npos) << e.status();
  fs::remove_all(dir);
}

TEST(ExtractTest, BinaryAndEmptyAreRefused) {
  std::string junk(4096, '\0');
  for (size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<char>(i * 7919 % 256);
  auto b = ExtractDocument("firmware.bin", junk);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("binary"), std::string::npos);
  EXPECT_FALSE(ExtractDocument("empty.md", "").ok());
  EXPECT_FALSE(ExtractDocument("blank.txt", "  \n\n ").ok());
}

// What the knowledge base stores of a document (JSON: its title, headings,
// text) must be well-formed UTF-8, or storing it throws.
void ExpectStorable(const ExtractedDoc& doc) {
  EXPECT_NO_THROW((void)nlohmann::json(doc.title).dump()) << doc.title;
  for (const auto& c : ChunkDocument(doc, {})) {
    EXPECT_NO_THROW((void)nlohmann::json({{"title_path", c.title_path}, {"text", c.text}}).dump())
        << c.text;
  }
}

TEST(ExtractTest, IllFormedUtf8IsNotTakenForUtf8) {
  // Overlong forms, surrogates and code points above U+10FFFF passed the
  // UTF-8 check and reached the store, where they threw.
  for (const std::string bad :
       {"\xC1\xA3", "\xE0\x80\xAF", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xF5\x80\x80\x80"}) {
    auto doc =
        ExtractDocument("notes.md", "# Title " + bad + "\n\nSome text " + bad + " around it.\n");
    ASSERT_TRUE(doc.ok()) << doc.status();
    EXPECT_NE(doc->pages[0].text.find("Some text"), std::string::npos);
    ExpectStorable(*doc);
  }
  // A character reference to a surrogate is no character either.
  auto html = ExtractDocument("page.html", "<h1>A &#xD800; B</h1><p>x &#55296; y</p>");
  ASSERT_TRUE(html.ok()) << html.status();
  ExpectStorable(*html);
  // Well-formed UTF-8 stays as it is.
  auto good = ExtractDocument("ok.md", "# Grüße 中文 \xF0\x9F\x98\x80\n\ntext\n");
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_NE(good->pages[0].text.find("Grüße 中文 \xF0\x9F\x98\x80"), std::string::npos);
}

TEST(ExtractTest, ASourcesTitleCommentMayBeItsLastLine) {
  // The title of a source file is its first descriptive comment, which may
  // be completed by the line after it; here there is no line after it.
  auto last = ExtractDocument("io.h", "/* avr/io.h - definitions for ATmega328P");
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(last->title, "avr/io.h - definitions for ATmega328P");
  auto completed =
      ExtractDocument("io.h", "/* avr/io.h - definitions for the\n * ATmega328P devices.\n */\n");
  ASSERT_TRUE(completed.ok()) << completed.status();
  EXPECT_EQ(completed->title, "avr/io.h - definitions for the ATmega328P devices.");
}

TEST(ExtractTest, HtmlKeepsHeadingsAndDropsScripts) {
  std::string title;
  std::string text = HtmlToText(
      "<html><head><title>UART &amp; DMA</title><style>p{color:red}</style></head><body>"
      "<h2>4.1 Baud&nbsp;rate</h2><p>Set <code>USART_BRR</code> to "
      "0x45.</p><script>alert(1)</script>"
      "<ul><li>one</li><li>two</li></ul><pre>int x = 1;\nint y = 2;</pre></body></html>",
      &title);
  EXPECT_EQ(title, "UART & DMA");
  EXPECT_NE(text.find("## 4.1 Baud rate"), std::string::npos) << text;
  EXPECT_NE(text.find("Set USART_BRR to 0x45."), std::string::npos) << text;
  EXPECT_EQ(text.find("alert"), std::string::npos);
  EXPECT_EQ(text.find("color"), std::string::npos);
  EXPECT_NE(text.find("- one"), std::string::npos);
  EXPECT_NE(text.find("```\nint x = 1;\nint y = 2;\n```"), std::string::npos) << text;
}

const char kSvd[] = R"(<?xml version="1.0" encoding="utf-8"?>
<device schemaVersion="1.1">
  <name>STM32F100</name>
  <description>STM32F100 value line</description>
  <size>32</size>
  <resetValue>0x00000000</resetValue>
  <peripherals>
    <peripheral>
      <name>GPIOA</name>
      <description>General purpose I/O</description>
      <groupName>GPIO</groupName>
      <baseAddress>0x40010800</baseAddress>
      <interrupt><name>EXTI0</name><description>EXTI Line0 interrupt</description><value>6</value></interrupt>
      <registers>
        <register>
          <name>CRL</name>
          <description>Port configuration register low</description>
          <addressOffset>0x0</addressOffset>
          <access>read-write</access>
          <resetValue>0x44444444</resetValue>
          <fields>
            <field><name>MODE0</name><description>Port n.0 mode bits</description><bitOffset>0</bitOffset><bitWidth>2</bitWidth>
              <enumeratedValues>
                <enumeratedValue><name>Input</name><description>Input mode</description><value>0</value></enumeratedValue>
                <enumeratedValue><name>Output10</name><description>Output mode, max speed 10 MHz</description><value>1</value></enumeratedValue>
              </enumeratedValues>
            </field>
            <field><name>CNF0</name><description>Port n.0 configuration bits</description><bitRange>[3:2]</bitRange></field>
          </fields>
        </register>
        <register>
          <name>IDR</name>
          <description>Port input data register</description>
          <addressOffset>0x08</addressOffset>
          <access>read-only</access>
        </register>
        <cluster>
          <name>LCK</name>
          <addressOffset>0x18</addressOffset>
          <register><name>LCKR</name><description>Port configuration lock register</description><addressOffset>0x0</addressOffset></register>
        </cluster>
      </registers>
    </peripheral>
    <peripheral derivedFrom="GPIOA">
      <name>GPIOB</name>
      <baseAddress>0x40010C00</baseAddress>
    </peripheral>
  </peripherals>
</device>
)";

TEST(SvdTest, OneChunkPerPeripheralAndRegister) {
  auto doc = ExtractDocument("STM32F100.svd", kSvd);
  ASSERT_TRUE(doc.ok()) << doc.status();
  auto chunks = ChunkDocument(*doc, {});
  // GPIOA: peripheral + CRL + IDR + LCK_LCKR; GPIOB (derived): the same four.
  ASSERT_EQ(chunks.size(), 8u);
  const ChunkDraft* crl_b = nullptr;
  for (const auto& c : chunks) {
    EXPECT_EQ(c.content_type, "register");
    if (c.title_path == std::vector<std::string>{"STM32F100", "GPIOB", "CRL"}) crl_b = &c;
  }
  ASSERT_NE(crl_b, nullptr);
  EXPECT_NE(crl_b->text.find("Address: 0x40010C00"), std::string::npos) << crl_b->text;
  EXPECT_NE(crl_b->text.find("reset value: 0x44444444"), std::string::npos) << crl_b->text;
  EXPECT_NE(crl_b->text.find("MODE0 [1:0]"), std::string::npos);
  EXPECT_NE(crl_b->text.find("CNF0 [3:2]"), std::string::npos);
  EXPECT_NE(crl_b->text.find("1 = Output10: Output mode, max speed 10 MHz"), std::string::npos);
  EXPECT_NE(chunks[0].text.find("Interrupt: EXTI0 (IRQ 6)"), std::string::npos) << chunks[0].text;
  EXPECT_NE(chunks[0].text.find("LCK_LCKR @ 0x40010818"), std::string::npos) << chunks[0].text;
  auto bad = ExtractDocument("broken.svd", "<device>\n<name>X</name>\n<peripherals>\n</device>");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("broken.svd:4"), std::string::npos) << bad.status();
}

// ---------------------------------------------------------------- chunking

TEST(ChunkerTest, H2IsAHardBoundaryAndTitlePathsFollowHeadings) {
  std::string md =
      "# RM0090\n\n## 8 GPIO\n\nGPIO text.\n\n### 8.4.1 MODER\n\nMODER bits.\n\n## 9 DMA\n\nDMA "
      "text.\n";
  ExtractedDoc doc{DocFormat::kMarkdown, "", {{0, md}}, {}};
  auto chunks = ChunkDocument(doc, {});
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_NE(chunks[0].text.find("MODER bits"), std::string::npos);
  EXPECT_EQ(chunks[0].text.find("DMA"), std::string::npos);
  EXPECT_EQ(chunks[0].title_path, (std::vector<std::string>{"RM0090", "8 GPIO"}));
  EXPECT_EQ(chunks[1].title_path, (std::vector<std::string>{"RM0090", "9 DMA"}));
  EXPECT_EQ(chunks[1].start_line, 11);
}

TEST(ChunkerTest, SizesOverlapAndWholeCodeBlocks) {
  std::string md = "## Long section\n\n";
  for (int i = 0; i < 60; ++i)
    md += "Sentence number " + std::to_string(i) + " says something about clocks. ";
  md += "\n\n```c\n";
  for (int i = 0; i < 20; ++i) md += "REG" + std::to_string(i) + " = 0;\n";
  md += "```\n";
  ExtractedDoc doc{DocFormat::kMarkdown, "", {{0, md}}, {}};
  ChunkOptions o;
  o.min_tokens = 20;
  o.target_tokens = 120;
  o.max_tokens = 200;
  o.overlap_tokens = 20;
  auto chunks = ChunkDocument(doc, o);
  ASSERT_GE(chunks.size(), 3u);
  for (const auto& c : chunks) EXPECT_LE(c.tokens, o.max_tokens + 5) << c.text;
  // Consecutive prose chunks overlap.
  bool overlap = false;
  for (size_t i = 1; i < chunks.size(); ++i) {
    std::string tail = chunks[i - 1].text.substr(chunks[i - 1].text.size() - 30);
    if (chunks[i].text.find(tail.substr(tail.find(' ') + 1)) != std::string::npos) overlap = true;
  }
  EXPECT_TRUE(overlap);
  // The code block is in one chunk, whole.
  int with_code = 0;
  for (const auto& c : chunks) {
    if (c.text.find("REG0 = 0;") != std::string::npos) {
      ++with_code;
      EXPECT_NE(c.text.find("REG19 = 0;"), std::string::npos);
    }
  }
  EXPECT_EQ(with_code, 1);
}

TEST(ChunkerTest, BigTableSplitsByRowsWithItsHeader) {
  std::string md = "## Registers\n\n| Register | Offset | Reset |\n|---|---|---|\n";
  for (int i = 0; i < 80; ++i)
    md += "| REG_" + std::to_string(i) + " | 0x" + std::to_string(i * 4) + " | 0x0000 |\n";
  ExtractedDoc doc{DocFormat::kMarkdown, "", {{0, md}}, {}};
  auto chunks = ChunkDocument(doc, {});
  ASSERT_GE(chunks.size(), 2u);
  for (const auto& c : chunks) {
    EXPECT_NE(c.text.find("| Register | Offset | Reset |"), std::string::npos);
    EXPECT_EQ(c.content_type, "table");
  }
}

TEST(ChunkerTest, SentencesEnglishAndChinese) {
  auto s = SplitSentences("First one. Second one? Third! 时钟使能。复位完成！");
  ASSERT_EQ(s.size(), 5u);
  EXPECT_EQ(s[0], "First one.");
  EXPECT_EQ(s[3], "时钟使能。");
  auto keep = SplitSentences("Use 0x1.5 or e.g. values");
  EXPECT_EQ(keep.size(), 1u);
}

// ---------------------------------------------------------------- vectors

std::vector<float> RandomUnitVectors(size_t n, int dim, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g;
  std::vector<float> v(n * dim);
  for (size_t i = 0; i < n; ++i) {
    double norm = 0;
    for (int d = 0; d < dim; ++d) norm += (v[i * dim + d] = g(rng)) * v[i * dim + d];
    for (int d = 0; d < dim; ++d) v[i * dim + d] /= std::sqrt(norm);
  }
  return v;
}

TEST(VectorIndexTest, FlatIsExactAndTombstonesHide) {
  const int dim = 16;
  auto vecs = RandomUnitVectors(100, dim, 1);
  std::vector<uint32_t> ids;
  for (uint32_t i = 0; i < 100; ++i) ids.push_back(1000 + i);
  VectorIndex idx(dim, {});
  idx.Add(ids, vecs);
  auto r = idx.Search(&vecs[7 * dim], 3);
  ASSERT_FALSE(r.empty());
  EXPECT_EQ(r[0].first, 1007u);
  EXPECT_NEAR(r[0].second, 1.0, 1e-4);
  idx.Remove(1007);
  r = idx.Search(&vecs[7 * dim], 3);
  EXPECT_NE(r[0].first, 1007u);
  EXPECT_EQ(idx.size(), 99u);
  r = idx.Search(&vecs[7 * dim], 5, [](uint32_t id) { return id % 2 == 0; });
  for (const auto& [id, s] : r) EXPECT_EQ(id % 2, 0u);
  EXPECT_EQ(idx.kind(), "flat");
}

TEST(VectorIndexTest, HnswRecallAgainstExactAndSaveLoad) {
  const int dim = 32;
  const size_t n = 3000;
  auto vecs = RandomUnitVectors(n, dim, 2);
  std::vector<uint32_t> ids(n);
  for (uint32_t i = 0; i < n; ++i) ids[i] = i;
  VectorIndexOptions o;
  o.exact_below = 1000;
  o.build_threads = 1;  // one graph, whatever the machine's load: the recall below is reproducible
  VectorIndex hnsw(dim, o);
  hnsw.Build(ids, vecs);
  ASSERT_EQ(hnsw.kind(), "hnsw");
  EXPECT_GT(hnsw.ef_search(), 0);
  VectorIndex exact(dim, {});
  exact.Add(ids, vecs);
  // Queries near the data (mixtures of two stored vectors), as text queries are.
  std::vector<float> queries(100 * dim);
  std::mt19937 rng(3);
  for (size_t q = 0; q < 100; ++q) {
    size_t a = rng() % n, b = rng() % n;
    double norm = 0;
    for (int d = 0; d < dim; ++d)
      norm += std::pow(queries[q * dim + d] = vecs[a * dim + d] + vecs[b * dim + d], 2);
    for (int d = 0; d < dim; ++d) queries[q * dim + d] /= std::sqrt(norm);
  }
  size_t hits = 0;
  for (size_t q = 0; q < 100; ++q) {
    auto a = exact.Search(&queries[q * dim], 10);
    auto b = hnsw.Search(&queries[q * dim], 10);
    for (const auto& x : a) {
      for (const auto& y : b) hits += x.first == y.first ? 1 : 0;
    }
  }
  // Queries unlike the tuning sample (another seed, mixtures only): the
  // promise holds on queries efSearch was not chosen on.
  EXPECT_GE(hits, 950u) << "recall@10 below 0.95 at efSearch " << hnsw.ef_search();
  RecordProperty("recall_hits", static_cast<int>(hits));
  std::string dir = TempDir("fwai-vec-");
  hnsw.Remove(5);
  ASSERT_TRUE(hnsw.Save(dir + "/v", 7).ok());
  auto loaded = VectorIndex::Load(dir + "/v", 7, dim, o);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)->size(), n - 1);
  EXPECT_EQ((*loaded)->Search(&queries[0], 10), hnsw.Search(&queries[0], 10));
  EXPECT_EQ(VectorIndex::Load(dir + "/v", 8, dim, o).status().code(),
            absl::StatusCode::kFailedPrecondition);
  { std::ofstream(dir + "/v.faiss", std::ios::app) << "garbage"; }
  EXPECT_EQ(VectorIndex::Load(dir + "/v", 7, dim, o).status().code(), absl::StatusCode::kDataLoss);
  fs::remove_all(dir);
}

// ---------------------------------------------------------------- knowledge base

class KnowledgeBaseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDir("fwai-kb-");
    Open();
  }
  void TearDown() override {
    kb_.reset();
    storage_.reset();
    fs::remove_all(dir_);
  }
  void Open() {
    kb_.reset();
    storage_.reset();
    auto s = Storage::Open(dir_ + "/db");
    ASSERT_TRUE(s.ok());
    storage_ = *std::move(s);
    auto kb = KnowledgeBase::Open(*storage_, dir_ + "/index", {}, *embedder_, *reranker_);
    ASSERT_TRUE(kb.ok()) << kb.status();
    kb_ = *std::move(kb);
  }
  IngestResult Add(const std::string& name, const std::string& bytes,
                   const std::string& collection = "") {
    IngestRequest r;
    r.name = name;
    r.bytes = bytes;
    r.collection = collection;
    auto res = kb_->Ingest(std::move(r));
    EXPECT_TRUE(res.ok()) << res.status();
    return res.ok() ? *res : IngestResult{};
  }
  std::vector<KbSearchHit> Find(const std::string& q, int n = 5) {
    KbSearchRequest r;
    r.query = q;
    r.max_results = n;
    auto hits = kb_->Search(r);
    EXPECT_TRUE(hits.ok()) << hits.status();
    return hits.ok() ? *hits : std::vector<KbSearchHit>{};
  }
  static std::string Doc(const std::string& topic, const std::string& token) {
    return "# " + topic + "\n\n## Overview\n\nThe " + topic + " peripheral is configured with " +
           token +
           ". Enable its clock first, then program the control register.\n\n## Registers\n\n" +
           token + "_CR controls the " + topic + ".\n";
  }

  std::string dir_;
  std::unique_ptr<Embedder> embedder_ = MakeBuiltinEmbedder(64);
  std::unique_ptr<Reranker> reranker_ = MakeBuiltinReranker();
  std::unique_ptr<Storage> storage_;
  std::unique_ptr<KnowledgeBase> kb_;
};

TEST_F(KnowledgeBaseTest, IngestSearchReplaceDelete) {
  auto a = Add("uart.md", Doc("UART", "USART1_BRR"));
  EXPECT_GT(a.chunks, 0);
  Add("spi.md", Doc("SPI", "SPI1_CR1"));
  Add("adc.pdf",
      MakePdf({"ADC overview\nThe ADC samples 12 bits.", "ADC1_SMPR sets the sampling time."}));
  auto hits = Find("which register sets the USART1_BRR baud");
  ASSERT_FALSE(hits.empty());
  EXPECT_EQ(hits[0].doc, "uart.md");
  EXPECT_GT(hits[0].score, 0);
  EXPECT_LE(hits[0].score, 1);
  auto pdf = Find("ADC1_SMPR sampling time");
  ASSERT_FALSE(pdf.empty());
  EXPECT_EQ(pdf[0].doc, "adc.pdf");
  // The passage runs from the overview on page 1 to the answer on page 2.
  EXPECT_LE(pdf[0].page, 2);
  EXPECT_EQ(pdf[0].end_page, 2);
  EXPECT_NE(pdf[0].text.find("ADC1_SMPR sets the sampling time"), std::string::npos);
  // Same bytes again: nothing happens.
  auto again = Add("uart.md", Doc("UART", "USART1_BRR"));
  EXPECT_TRUE(again.unchanged);
  EXPECT_EQ(again.doc_id, a.doc_id);
  // Changed content replaces the old chunks.
  auto changed = Add("uart.md", Doc("UART", "LPUART1_BRR"));
  EXPECT_EQ(changed.replaced_doc_id, a.doc_id);
  for (const auto& h : Find("USART1_BRR", 10)) {
    if (h.doc == "uart.md") {
      EXPECT_NE(h.text.find("LPUART1_BRR"), std::string::npos) << h.text;  // old chunks gone
    }
  }
  EXPECT_EQ(Find("LPUART1_BRR")[0].doc, "uart.md");
  auto docs = kb_->List("");
  ASSERT_TRUE(docs.ok());
  EXPECT_EQ(docs->size(), 3u);
  // Delete by name.
  auto removed = kb_->Delete("spi.md", "");
  ASSERT_TRUE(removed.ok());
  EXPECT_GT(*removed, 0);
  for (const auto& h : Find("SPI1_CR1", 10)) EXPECT_NE(h.doc, "spi.md");
  EXPECT_EQ(kb_->Delete("spi.md", "").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(KnowledgeBaseTest, AQueryNamingAPartPrefersThatPartsDocument) {
  // Two near-identical device headers; the part name is only in each one's
  // first comment, far from the line asked about. The first one ingested
  // wins ties, so only the part name can put the second one first.
  auto header = [](const std::string& part, const std::string& file) {
    std::string h = "/* avr/" + file + " - definitions for " + part + ". */\n";
    for (int i = 0; i < 120; ++i) {
      h += "#define REG" + std::to_string(i) + " _SFR_MEM8(0x" + std::to_string(100 + i) +
           ")  /* register " + std::to_string(i) + " */\n";
    }
    h += "/* Interrupt vectors */\n#define ADC_vect_num 21\n#define ADC_vect _VECTOR(21)  /* ADC "
         "Conversion Complete */\n";
    return h;
  };
  Add("avr/iom48pb.h", header("ATmega48PB", "iom48pb.h"));
  Add("avr/iom88pb.h", header("ATmega88PB", "iom88pb.h"));
  for (const std::string part : {"ATmega88PB", "ATmega48PB"}) {
    auto hits = Find("Which vector number does the ADC conversion complete interrupt have on the " +
                     part + "?");
    ASSERT_FALSE(hits.empty());
    const std::string want = part == "ATmega88PB" ? "avr/iom88pb.h" : "avr/iom48pb.h";
    EXPECT_EQ(hits[0].doc, want) << part;
    EXPECT_NE(hits[0].text.find("ADC_vect_num"), std::string::npos) << hits[0].text;
    EXPECT_EQ(hits[0].named, 1.0);
    EXPECT_GT(hits[0].doc_text, 0.0);
  }
}

TEST_F(KnowledgeBaseTest, WindowEvidenceBringsTheDensestWindowsPassageForward) {
  // A question asked in other words than the manual's: a short FAQ entry
  // holds all its words once, so its chunk leads the ranking; the driver
  // manual spreads them over short sections, two or three a section, and its
  // 300-word windows hold every one several times. The window stage fuses
  // the manual's passage over its densest window ahead of the FAQ.
  auto words = [](int n, int seed) {
    static const char* kWords[] = {"alpha", "bravo", "delta", "echo", "golf",  "hotel",
                                   "india", "kilo",  "lima",  "mike", "oscar", "papa"};
    std::string s;
    for (int i = 0; i < n; ++i)
      s += std::string(kWords[(i * 7 + seed) % 12]) + (i % 10 == 9 ? ". " : " ");
    return s;
  };
  for (int i = 0; i < 15; ++i) {
    Add("notes/n" + std::to_string(i) + ".md",
        "# Note " + std::to_string(i) + "\n\n## Body\n\n" + words(120, i) + "\n");
  }
  Add("faq.md",
      "# FAQ\n\n## Resets\n\nA chip that reboots in a flash erase was reset by its watchdog.\n");
  std::string manual = "# Flash driver\n\n";
  const std::string needle = "feed the watchdog from the erase loop every 100 ms";
  for (int i = 0; i < 12; ++i) {
    manual += "## Part " + std::to_string(i) + "\n\n" + words(90, i) + "\n";
    if (i == 6) {
      manual += "The flash erase can outlast the watchdog, which then reboots the part: " + needle +
                ".\n\n";
    } else if (i % 2 == 1) {
      manual += "The watchdog timer watches the flash. The watchdog timer watches the flash.\n\n";
    } else {
      manual += "A chip reboot follows an erase. A chip reboot follows an erase.\n\n";
    }
  }
  Add("driver.md", manual);
  const std::string q = "watchdog reboots the chip in a flash erase";
  KbSearchRequest r;
  r.query = q;
  r.max_results = 5;
  FusionOverrides off;
  off.window_docs = 0;
  r.overrides = &off;
  auto without = kb_->Search(r);
  ASSERT_TRUE(without.ok()) << without.status();
  ASSERT_FALSE(without->empty());
  EXPECT_EQ((*without)[0].doc, "faq.md");  // the premise: chunk evidence prefers the FAQ
  FusionOverrides on;  // 3 documents, weight 0.8, k 10, questions without an identifier
  on.window_docs = 3;
  on.window_weight = 0.8;
  on.window_k = 10;
  on.window_identifiers = 0;
  r.overrides = &on;
  auto found = kb_->Search(r);
  ASSERT_TRUE(found.ok()) << found.status();
  const std::vector<KbSearchHit>& with = *found;
  ASSERT_FALSE(with.empty());
  EXPECT_EQ(with[0].doc, "driver.md");
  EXPECT_NE(with[0].text.find(needle), std::string::npos) << with[0].text;
  EXPECT_GT(with[0].score, 0);
  EXPECT_LE(with[0].score, 1);
  // A question with an identifier keeps the chunk evidence's order.
  r.overrides = &on;
  r.query = q + " FLASH_CR";
  auto named = kb_->Search(r);
  r.overrides = &off;
  auto named_off = kb_->Search(r);
  ASSERT_TRUE(named.ok() && named_off.ok());
  ASSERT_FALSE(named->empty());
  EXPECT_EQ((*named)[0].doc, (*named_off)[0].doc);
  EXPECT_EQ((*named)[0].text, (*named_off)[0].text);
}

TEST_F(KnowledgeBaseTest, FiltersAndCollections) {
  Add("a.md", Doc("TIMER", "TIM2_ARR"), "stm32");
  Add("b.md", Doc("TIMER", "TIM2_ARR"), "nrf");  // same text, another collection
  KbSearchRequest r;
  r.query = "TIM2_ARR timer";
  r.collection = "nrf";
  auto hits = kb_->Search(r);
  ASSERT_TRUE(hits.ok());
  ASSERT_FALSE(hits->empty());
  for (const auto& h : *hits) EXPECT_EQ(h.doc, "b.md");
  r.collection.clear();
  r.docs = {"a.md"};
  hits = kb_->Search(r);
  for (const auto& h : *hits) EXPECT_EQ(h.doc, "a.md");
  r.docs.clear();
  r.content_types = {"code"};
  EXPECT_TRUE(kb_->Search(r)->empty());
}

TEST_F(KnowledgeBaseTest, BadSearchArgumentsAreInvalid) {
  Add("a.md", Doc("GPIO", "GPIOA_MODER"));
  auto code = [&](KbSearchRequest r) { return kb_->Search(r).status().code(); };
  KbSearchRequest ok;
  ok.query = "GPIO";
  EXPECT_EQ(code(ok), absl::StatusCode::kOk);
  KbSearchRequest r = ok;
  r.query = "";
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  r.query = std::string(4097, 'a');
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  r = ok;
  r.max_results = 0;
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  r.max_results = 101;
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  r = ok;
  r.threshold = -0.1;
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  r.threshold = 1.5;
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  r.threshold = 1.0;
  EXPECT_TRUE(kb_->Search(r)->size() <= 1u);
}

TEST_F(KnowledgeBaseTest, BadDocumentsFailAloneWithTheirName) {
  IngestRequest big;
  big.name = "huge.txt";
  big.bytes = std::string((50 << 20) + 1, 'a');
  auto r = kb_->Ingest(std::move(big));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("huge.txt"), std::string::npos);
  EXPECT_NE(r.status().message().find("limit"), std::string::npos);
  IngestRequest junk;
  junk.name = "blob.bin";
  junk.bytes = std::string(
      "\x7f"
      "ELF\0\0\0binary",
      14);
  EXPECT_EQ(kb_->Ingest(std::move(junk)).status().code(), absl::StatusCode::kInvalidArgument);
  Add("ok.md", Doc("CAN", "CAN1_BTR"));
  EXPECT_EQ(kb_->List("")->size(), 1u);
}

TEST_F(KnowledgeBaseTest, IndexesLoadOnReopenAndRebuildWhenLostOrDamaged) {
  for (int i = 0; i < 20; ++i)
    Add("doc" + std::to_string(i) + ".md",
        Doc("BLOCK" + std::to_string(i), "REG_X" + std::to_string(i)));
  auto before = Find("REG_X7 control register", 10);
  ASSERT_FALSE(before.empty());
  Open();
  EXPECT_EQ(kb_->open_report(), "loaded");
  auto same = Find("REG_X7 control register", 10);
  ASSERT_EQ(same.size(), before.size());
  for (size_t i = 0; i < same.size(); ++i) EXPECT_EQ(same[i].chunk_id, before[i].chunk_id);
  kb_.reset();
  fs::remove(dir_ + "/index/lexical.bm25");
  Open();
  EXPECT_NE(kb_->open_report().find("rebuilt"), std::string::npos) << kb_->open_report();
  auto rebuilt = Find("REG_X7 control register", 10);
  ASSERT_EQ(rebuilt.size(), before.size());
  for (size_t i = 0; i < rebuilt.size(); ++i) EXPECT_EQ(rebuilt[i].chunk_id, before[i].chunk_id);
  kb_.reset();
  { std::ofstream(dir_ + "/index/vectors.meta", std::ios::trunc) << "damaged"; }
  {
    std::fstream f(dir_ + "/index/lexical.bm25", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40);
    f << "XXXX";
  }
  Open();
  EXPECT_NE(kb_->open_report().find("rebuilt"), std::string::npos) << kb_->open_report();
  auto again = Find("REG_X7 control register", 10);
  ASSERT_EQ(again.size(), before.size());
  for (size_t i = 0; i < again.size(); ++i) EXPECT_EQ(again[i].chunk_id, before[i].chunk_id);
}

// A document's chunk records are written in slices before the write that
// stores its record: cut off between two slices (as by a crash), the
// document is not there, now or after a restart, its orphaned chunks are
// never found, and adding it again stores it whole.
TEST_F(KnowledgeBaseTest, ADocumentCutOffBetweenItsSlicesIsNotThere) {
  Add("uart.md", Doc("UART", "USART1_BRR"));
  int slices = 0;
  bool cut = true;
  auto open_sliced = [&] {
    kb_.reset();
    KnowledgeOptions o;
    o.commit_slice_bytes = 512;
    o.after_slice_for_test = [&](int slice) {
      ++slices;
      return cut && slice == 1 ? absl::AbortedError("cut off after slice 2") : absl::OkStatus();
    };
    auto kb = KnowledgeBase::Open(*storage_, dir_ + "/index", o, *embedder_, *reranker_);
    ASSERT_TRUE(kb.ok()) << kb.status();
    kb_ = *std::move(kb);
  };
  open_sliced();
  std::string big = "# Sliced\n\n";
  for (int i = 0; i < 40; ++i) {
    big += "## Section " + std::to_string(i) + "\n\nThe SLICEDREG" + std::to_string(i) +
           " register of the sliced block holds field " + std::to_string(i) +
           "; write it after the clock is enabled and before the block starts.\n\n";
  }
  IngestRequest r;
  r.name = "sliced.md";
  r.bytes = big;
  auto cut_off = kb_->Ingest(std::move(r));
  ASSERT_FALSE(cut_off.ok());
  EXPECT_EQ(slices, 2);
  auto absent = [&](const char* when) {
    SCOPED_TRACE(when);
    auto docs = kb_->List("");
    ASSERT_TRUE(docs.ok());
    ASSERT_EQ(docs->size(), 1u);
    EXPECT_EQ((*docs)[0].name, "uart.md");
    for (const auto& h : Find("SLICEDREG3 register sliced block", 10))
      EXPECT_NE(h.doc, "sliced.md");
    auto uart = Find("USART1_BRR");
    ASSERT_FALSE(uart.empty());
    EXPECT_EQ(uart[0].doc, "uart.md");
  };
  absent("after the cut");
  Open();  // a restart
  absent("after a restart");
  kb_.reset();
  fs::remove(dir_ + "/index/lexical.bm25");
  Open();  // a rebuild from the store skips the orphaned chunk records
  EXPECT_NE(kb_->open_report().find("rebuilt"), std::string::npos) << kb_->open_report();
  absent("after a rebuild");

  cut = false;
  slices = 0;
  open_sliced();
  IngestRequest again;
  again.name = "sliced.md";
  again.bytes = big;
  auto whole = kb_->Ingest(std::move(again));
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_GT(slices, 2);  // several slices, none of them a whole document
  Open();
  auto docs = kb_->List("");
  ASSERT_TRUE(docs.ok());
  EXPECT_EQ(docs->size(), 2u);
  for (int i : {0, 17, 39}) {
    const std::string reg = "SLICEDREG" + std::to_string(i);
    auto hits = Find(reg + " register sliced block", 3);
    ASSERT_FALSE(hits.empty()) << reg;
    EXPECT_EQ(hits[0].doc, "sliced.md") << reg;
    EXPECT_NE(hits[0].text.find(reg), std::string::npos) << reg << ": " << hits[0].text;
  }
}

// The in-memory indexes are updated on a thread of background priority
// (nice 10), so a vector index's training takes no core from streaming turns.
TEST_F(KnowledgeBaseTest, IndexesAreUpdatedAtBackgroundPriority) {
  Add("uart.md", Doc("UART", "USART1_BRR"));
  int found = 0;
  for (const auto& task : fs::directory_iterator("/proc/self/task")) {
    std::string comm;
    std::getline(std::ifstream(task.path() / "comm"), comm);
    if (comm != "fwaid-kb-index") continue;
    ++found;
    std::string stat;
    std::getline(std::ifstream(task.path() / "stat"), stat);
    // Fields after the parenthesized name: state is 3rd, nice the 19th.
    std::istringstream rest(stat.substr(stat.rfind(')') + 2));
    std::vector<std::string> fields{std::istream_iterator<std::string>(rest), {}};
    ASSERT_GT(fields.size(), 16u) << stat;
    // 10, or the test's own nice value if it already runs nicer (nice -n 19).
    errno = 0;
    const int own = getpriority(PRIO_PROCESS, 0);
    EXPECT_EQ(fields[16], std::to_string(errno == 0 ? std::max(10, own) : 10)) << stat;
  }
  EXPECT_EQ(found, 1);
  auto hits = Find("USART1_BRR");
  ASSERT_FALSE(hits.empty());
  EXPECT_EQ(hits[0].doc, "uart.md");
}

TEST_F(KnowledgeBaseTest, SvdRegistersAreSearchable) {
  Add("STM32F100.svd", kSvd);
  auto hits = Find("GPIOB_CRL reset value", 3);
  ASSERT_FALSE(hits.empty());
  EXPECT_EQ(hits[0].title_path, "STM32F100 > GPIOB > CRL");
  EXPECT_EQ(hits[0].content_type, "register");
}

TEST(CodeChunkerTest, FunctionsTypesAndMacroGroups) {
  std::string src =
      "#include <stdint.h>\n\n"
      "#define UART_BAUD 115200\n#define UART_PORT USART1\n\n"
      "typedef struct {\n  uint32_t sr;\n  uint32_t dr;\n} uart_regs_t;\n\n"
      "static void uart_putc(char c) {\n  while (!(USART1->SR & (1u << 7))) {\n  }\n  USART1->DR = "
      "c; /* } in a comment */\n}\n\n"
      "int uart_init(uint32_t baud)\n{\n  const char* s = \"{\";\n  return baud ? 0 : -1;\n}\n";
  ChunkOptions o;
  o.target_tokens = 30;
  o.max_tokens = 400;
  auto chunks = ChunkCode(src, o);
  ASSERT_GE(chunks.size(), 3u);
  bool putc_whole = false, init_named = false;
  for (const auto& c : chunks) {
    EXPECT_EQ(c.content_type, "code");
    if (c.text.find("static void uart_putc") != std::string::npos) {
      putc_whole = c.text.find("USART1->DR = c;") != std::string::npos;
    }
    for (const auto& s : c.title_path) init_named |= s == "uart_init";
  }
  EXPECT_TRUE(putc_whole);
  EXPECT_TRUE(init_named);
  EXPECT_EQ(chunks.back().start_line, 17);
}

TEST_F(KnowledgeBaseTest, CodeSearchFillsTheBudgetWithFileLineHeaders) {
  IngestRequest r;
  r.name = "hal/uart.c";
  r.kind = "code";
  r.bytes = "int uart_init(int baud)\n{\n  return baud;\n}\n\nvoid uart_deinit(void)\n{\n}\n";
  ASSERT_TRUE(kb_->Ingest(std::move(r)).ok());
  Add("manual.md", Doc("UART", "uart_init"));  // not code: not returned by codeSearch
  auto tool = MakeCodeSearchTool(*kb_);
  ToolContext ctx;
  auto res = tool->Run({{"query", "uart_init baud"}, {"tokensNum", 1000}}, ctx);
  ASSERT_FALSE(res.is_error) << res.content;
  EXPECT_NE(res.content.find("hal/uart.c:1-"), std::string::npos) << res.content;
  EXPECT_EQ(res.content.find("manual.md"), std::string::npos);
  EXPECT_TRUE(tool->Run({{"query", "x"}, {"tokensNum", 10}}, ctx).is_error);
}

TEST(KnowledgeRewriteTest, ShortQueriesAlsoSearchTheirVariants) {
  std::string dir = TempDir("fwai-kb-rw-");
  auto storage = Storage::Open(dir + "/db");
  ASSERT_TRUE(storage.ok());
  auto embedder = MakeBuiltinEmbedder(64);
  auto reranker = MakeBuiltinReranker();
  KnowledgeOptions o;
  int calls = 0;
  o.rewrite = [&](const std::string& q) {
    ++calls;
    return std::vector<std::string>{"OSPEEDR output speed"};
  };
  auto kb = KnowledgeBase::Open(**storage, dir + "/index", o, *embedder, *reranker);
  ASSERT_TRUE(kb.ok());
  IngestRequest a;
  a.name = "gpio.md";
  a.bytes = "# GPIO\n\n## OSPEEDR\n\nGPIOx_OSPEEDR sets the output speed of each pin.\n";
  ASSERT_TRUE((*kb)->Ingest(std::move(a)).ok());
  IngestRequest b;
  b.name = "other.md";
  b.bytes = "# Slew\n\n## Notes\n\nEdges that are too fast ring on long traces.\n";
  ASSERT_TRUE((*kb)->Ingest(std::move(b)).ok());
  KbSearchRequest r;
  r.query = "slew rate";
  auto hits = (*kb)->Search(r);
  ASSERT_TRUE(hits.ok());
  EXPECT_EQ(calls, 1);
  bool found = false;
  for (const auto& h : *hits) found |= h.doc == "gpio.md";
  EXPECT_TRUE(found) << "the variant's document is among the results";
  r.query = "which register sets GPIOx_OSPEEDR for fast edges on the LCD pins";
  ASSERT_TRUE((*kb)->Search(r).ok());
  EXPECT_EQ(calls, 1) << "long or identifier queries are not rewritten";
  kb->reset();
  fs::remove_all(dir);
}

TEST(KnowledgeEmbedderChangeTest, ChangingTheEmbedderReEmbeds) {
  std::string dir = TempDir("fwai-kb-emb-");
  auto reranker = MakeBuiltinReranker();
  {
    auto storage = Storage::Open(dir + "/db");
    auto e64 = MakeBuiltinEmbedder(64);
    auto kb = KnowledgeBase::Open(**storage, dir + "/index", {}, *e64, *reranker);
    ASSERT_TRUE(kb.ok());
    IngestRequest r;
    r.name = "a.md";
    r.bytes = "# DMA\n\nDMA1_CCR1 enables channel 1.\n";
    ASSERT_TRUE((*kb)->Ingest(std::move(r)).ok());
  }
  auto storage = Storage::Open(dir + "/db");
  auto e32 = MakeBuiltinEmbedder(32);
  auto kb = KnowledgeBase::Open(**storage, dir + "/index", {}, *e32, *reranker);
  ASSERT_TRUE(kb.ok()) << kb.status();
  EXPECT_NE((*kb)->open_report().find("re-embedded 1 collection"), std::string::npos)
      << (*kb)->open_report();
  KbSearchRequest q;
  q.query = "DMA1_CCR1 channel";
  q.mode = SearchMode::kVector;
  auto hits = (*kb)->Search(q);
  ASSERT_TRUE(hits.ok());
  ASSERT_FALSE(hits->empty());
  EXPECT_EQ((*hits)[0].doc, "a.md");
  EXPECT_EQ((*kb)->Stats("")->dimension, 32);
  kb->reset();
  fs::remove_all(dir);
}

TEST_F(KnowledgeBaseTest, CodeSearchAddsCachedWebContextWhenConfigured) {
  testing::FakeLlmServer fake;
  ASSERT_GT(fake.Start(), 0);
  auto http = MakeCurlHttpClient();
  IngestRequest r;
  r.name = "hal/uart.c";
  r.kind = "code";
  r.bytes = "int HAL_UART_Init(void* h)\n{\n  return 0;\n}\n";
  ASSERT_TRUE(kb_->Ingest(std::move(r)).ok());
  CodeSearchOptions o;
  o.web_context_url = fake.anthropic_base_url() + "/context";
  auto tool = MakeCodeSearchTool(*kb_, o, http.get());
  ToolContext ctx;
  auto a = tool->Run({{"query", "HAL_UART_Init"}}, ctx);
  ASSERT_FALSE(a.is_error) << a.content;
  EXPECT_NE(a.content.find("hal/uart.c:1-"), std::string::npos);
  EXPECT_NE(a.content.find("Web context"), std::string::npos) << a.content;
  EXPECT_NE(a.content.find("configures the UART from its handle"), std::string::npos);
  auto b = tool->Run({{"query", "HAL_UART_Init"}}, ctx);
  EXPECT_EQ(a.content, b.content);
  EXPECT_EQ(fake.request_count(), 1u);  // cached per query
  EXPECT_EQ(fake.requests()[0].body["tokensNum"].get<int>() > 0, true);
  // Not configured: no call at all.
  auto plain = MakeCodeSearchTool(*kb_);
  EXPECT_EQ(plain->Run({{"query", "other"}}, ctx).content.find("Web context"), std::string::npos);
  EXPECT_EQ(fake.request_count(), 1u);
}

TEST_F(KnowledgeBaseTest, DocumentSearchToolFormat) {
  Add("rm.pdf", MakePdf({"GPIO overview", "GPIOx_MODER configures the pin mode."}));
  Add("notes.md", Doc("GPIO", "GPIOx_OTYPER"));
  auto tool = MakeDocumentSearchTool(*kb_);
  ToolContext ctx;
  auto r = tool->Run({{"query", "GPIOx_MODER pin mode"}, {"max_results", 2}}, ctx);
  ASSERT_FALSE(r.is_error) << r.content;
  EXPECT_EQ(r.content.rfind("Retrieved data", 0), 0u);
  EXPECT_NE(r.content.find("source: rm.pdf"), std::string::npos) << r.content;
  EXPECT_NE(r.content.find(", pages 1-2"), std::string::npos)
      << r.content;  // the passage spans both pages
  EXPECT_NE(r.content.find("\n---\n"), std::string::npos);
  EXPECT_TRUE(tool->Run({{"query", "x"}, {"max_results", 50}}, ctx).is_error);
  EXPECT_TRUE(tool->Run(nlohmann::json::object(), ctx).is_error);
}

}  // namespace
}  // namespace fwai
