#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "absl/strings/str_cat.h"
#include "server/catalog/tool_catalog.h"
#include "server/knowledge/embedder.h"
#include "server/knowledge/reranker.h"
#include "server/storage/storage.h"

namespace fwai {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// A schema property whose type names nothing ("" or [""]) is a string, as
// the normal form reads it: normalizing the result again changes nothing.
TEST(ToolNormalizeTest, AnEmptySchemaTypeIsAStringAndTheNormalFormIsStable) {
  for (const char* type : {R"("")", R"([""])", R"(["", "integer"])"}) {
    auto once = NormalizeToolJson(
        absl::StrCat(R"({"name":"read_file","description":"Read","inputSchema":{"type":"object",)",
                     R"("properties":{"path":{"type":)", type, R"(}}}})"));
    ASSERT_TRUE(once.ok()) << type << ": " << once.status();
    const std::string want =
        std::string(type).find("integer") != std::string::npos ? "integer" : "string";
    EXPECT_EQ(json::parse(*once)["Args"][0]["type"], want) << type;
    auto again = NormalizeToolJson(*once);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(*again, *once) << type;
  }
}

TEST(ToolNormalizeTest, AcceptsEveryShape) {
  auto native = NormalizeToolJson(
      R"({"ToolName":"openocd.flash_erase_sector","ToolDescription":"Erase sectors",
      "Args":[{"ArgName":"num","ArgDescription":"bank","type":"integer","required":true}]})");
  ASSERT_TRUE(native.ok());
  EXPECT_EQ(json::parse(*native)["Args"][0]["ArgName"], "num");
  auto mcp = NormalizeToolJson(R"({"name":"read_text_file","description":"Read a file",
      "inputSchema":{"type":"object","properties":{"path":{"type":"string","description":"File path"},
      "encoding":{"type":"string","enum":["utf8","latin1"]}},"required":["path"]}})");
  ASSERT_TRUE(mcp.ok());
  auto m = json::parse(*mcp);
  EXPECT_EQ(m["ToolName"], "read_text_file");
  ASSERT_EQ(m["Args"].size(), 2u);
  bool path_required = false, has_enum = false;
  for (const auto& a : m["Args"]) {
    if (a["ArgName"] == "path") path_required = a["required"];
    if (a.contains("enum")) has_enum = a["enum"][1] == "latin1";
  }
  EXPECT_TRUE(path_required);
  EXPECT_TRUE(has_enum);
  auto openai = NormalizeToolJson(
      R"({"type":"function","function":{"name":"get_weather","description":"Weather",
      "parameters":{"type":"object","properties":{"city":{"type":"string"}}}}})");
  ASSERT_TRUE(openai.ok());
  EXPECT_EQ(json::parse(*openai)["ToolName"], "get_weather");
  auto anthropic =
      NormalizeToolJson(R"({"name":"grep","description":"Search","input_schema":{"type":"object",
      "properties":{"pattern":{"type":"string"}}}})");
  ASSERT_TRUE(anthropic.ok());
  EXPECT_EQ(json::parse(*anthropic)["Args"][0]["ArgName"], "pattern");
  EXPECT_FALSE(NormalizeToolJson("[1,2]").ok());
  EXPECT_FALSE(NormalizeToolJson(R"({"description":"no name"})").ok());
  EXPECT_EQ(ToolUuid("git.bisect"), ToolUuid("git.bisect"));
  EXPECT_NE(ToolUuid("git.bisect"), ToolUuid("git.blame"));
  EXPECT_EQ(ToolUuid("x").size(), 36u);
}

class CatalogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string t = (fs::temp_directory_path() / "fwai-catalog-XXXXXX").string();
    dir_ = mkdtemp(t.data());
    Open();
  }
  void TearDown() override {
    catalog_.reset();
    storage_.reset();
    fs::remove_all(dir_);
  }
  void Open(CatalogOptions options = {}) {
    catalog_.reset();
    storage_.reset();
    storage_ = *Storage::Open(dir_);
    auto c = ToolCatalogStore::Open(*storage_, std::move(options), *embedder_, *reranker_);
    ASSERT_TRUE(c.ok()) << c.status();
    catalog_ = *std::move(c);
  }
  std::string dir_;
  std::unique_ptr<Embedder> embedder_ = MakeBuiltinEmbedder(64);
  // As the daemon ranks tools.
  std::unique_ptr<Reranker> reranker_ = MakeBuiltinReranker(ToolCatalogRerankWeights());
  std::unique_ptr<Storage> storage_;
  std::unique_ptr<ToolCatalogStore> catalog_;
};

std::vector<std::string> SmallCatalog() {
  return {
      R"({"ToolName":"openocd.flash_erase_sector","ToolDescription":"Erase sectors in bank num, starting at sector first up to and including last.","Args":[{"ArgName":"num","ArgDescription":"flash bank number"},{"ArgName":"first","ArgDescription":"first sector"},{"ArgName":"last","ArgDescription":"last sector"}]})",
      R"({"ToolName":"openocd.reset_halt","ToolDescription":"Reset the target and halt it immediately.","Args":[]})",
      R"({"ToolName":"gdb.info_registers","ToolDescription":"List of integer registers and their contents.","Args":[{"ArgName":"regname","ArgDescription":"register names"}]})",
      R"({"name":"git_bisect","description":"Use binary search to find the commit that introduced a bug","inputSchema":{"type":"object","properties":{"subcommand":{"type":"string","enum":["start","good","bad","reset"]}}}})",
  };
}

TEST_F(CatalogTest, RegisterSearchRemoveAndReopen) {
  auto uuids = catalog_->Register(SmallCatalog());
  ASSERT_TRUE(uuids.ok()) << uuids.status();
  ASSERT_EQ(uuids->size(), 4u);
  EXPECT_EQ((*uuids)[0], ToolUuid("openocd.flash_erase_sector"));
  auto hits = catalog_->Search("erase flash sectors 0 to 3 in bank 0", 2);
  ASSERT_TRUE(hits.ok());
  ASSERT_FALSE(hits->empty());
  EXPECT_EQ((*hits)[0].tool.name, "openocd.flash_erase_sector");
  EXPECT_EQ((*hits)[0].rank, 1);
  auto bisect = catalog_->Search("find which commit introduced the regression", 1);
  ASSERT_EQ(bisect->size(), 1u);
  EXPECT_EQ((*bisect)[0].tool.name, "git_bisect");
  for (auto mode : {CatalogMode::kSlices, CatalogMode::kWholeLexical}) {
    auto r = catalog_->Search("show the CPU registers", 1, mode);
    ASSERT_TRUE(r.ok());
    ASSERT_FALSE(r->empty());
    EXPECT_EQ((*r)[0].tool.name, "gdb.info_registers");
  }
  // Same name again replaces (same uuid, new text).
  ASSERT_TRUE(
      catalog_
          ->Register(
              {R"({"ToolName":"openocd.reset_halt","ToolDescription":"Halt after reset.","Args":[]})"})
          .ok());
  EXPECT_EQ(catalog_->size(), 4u);
  ASSERT_TRUE(catalog_->Remove("gdb.info_registers").ok());
  EXPECT_EQ(catalog_->Remove("gdb.info_registers").code(), absl::StatusCode::kNotFound);
  Open();
  EXPECT_EQ(catalog_->size(), 3u);
  auto list = catalog_->List();
  ASSERT_TRUE(list.ok());
  for (const auto& t : *list) EXPECT_NE(t.name, "gdb.info_registers");
  for (const auto& t : *list) {
    if (t.name == "openocd.reset_halt") {
      EXPECT_EQ(json::parse(t.document_json)["ToolDescription"], "Halt after reset.");
    }
  }
}

TEST_F(CatalogTest, BadEntriesAreRefusedWholeAndArgumentsChecked) {
  auto r = catalog_->Register({SmallCatalog()[0], R"({"ToolDescription":"nameless"})"});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("tool #2"), std::string::npos) << r.status();
  EXPECT_EQ(catalog_->size(), 0u);
  ASSERT_TRUE(catalog_->Register(SmallCatalog()).ok());
  EXPECT_EQ(catalog_->Search("", 5).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(catalog_->Search("x", 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(catalog_->Search("x", 101).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CatalogTest, FieldsOfTheWrongTypeAreRefusedNotThrown) {
  // Each of these threw out of the normalizer (or, for the enum, out of the
  // index) and took the daemon down.
  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"({"ToolName":"a","ToolDescription":{}})", "ToolDescription: expected a string"},
      {R"({"name":"b","description":5})", "description: expected a string"},
      {R"({"name":"c","inputSchema":{"properties":{"x":{"description":[]}}}})",
       "inputSchema.properties.x.description: expected a string"},
      {R"({"ToolName":"d","Args":[{"ArgName":"x","required":"yes"}]})", "Args[0].required"},
      {R"({"ToolName":"d","Args":[{"ArgName":"x","type":1}]})", "Args[0].type: expected a string"},
  };
  for (const auto& [doc, why] : bad) {
    auto r = catalog_->Register({doc});
    ASSERT_FALSE(r.ok()) << doc;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_NE(r.status().message().find("tool #1: " + why), std::string::npos) << r.status();
  }
  EXPECT_EQ(catalog_->size(), 0u);
  auto ok =
      catalog_->Register({R"({"type":7,"name":"e","description":"typed oddly"})",
                          R"({"ToolName":"f","Args":[{"ArgName":"mode","enum":[1,"two",null]}]})"});
  ASSERT_TRUE(ok.ok()) << ok.status();
  auto hits = catalog_->Search("mode two", 1);
  ASSERT_TRUE(hits.ok()) << hits.status();
  ASSERT_EQ(hits->size(), 1u);
  EXPECT_EQ((*hits)[0].tool.name, "f");
}

}  // namespace
}  // namespace fwai

namespace fwai {
namespace {

TEST_F(CatalogTest, NamingTheProgramOrTheChipFamilyPicksItsTool) {
  ASSERT_TRUE(
      catalog_
          ->Register({
              R"({"ToolName":"openocd.load_image","ToolDescription":"Load an image from file into target memory at an offset.","Args":[]})",
              R"({"ToolName":"gdb.load","ToolDescription":"Load an image from file into target memory.","Args":[]})",
              R"({"ToolName":"openocd.stm32f1x_mass_erase","ToolDescription":"Mass erases the entire flash device.","Args":[]})",
              R"({"ToolName":"openocd.stm32h7x_mass_erase","ToolDescription":"Mass erases the entire flash device.","Args":[]})",
              R"({"ToolName":"openocd.nrf5_mass_erase","ToolDescription":"Mass erases the entire flash device.","Args":[]})",
          })
          .ok());
  auto hits = catalog_->Search("load the image file into memory with gdb", 2);
  ASSERT_TRUE(hits.ok()) << hits.status();
  EXPECT_EQ((*hits)[0].tool.name, "gdb.load");
  hits = catalog_->Search("load the image file into memory with openocd", 2);
  ASSERT_TRUE(hits.ok());
  EXPECT_EQ((*hits)[0].tool.name, "openocd.load_image");
  // A part number finds its family's command; "wipe ... program memory" finds erase.
  hits = catalog_->Search("wipe the program memory of an STM32H743 in one go", 3);
  ASSERT_TRUE(hits.ok());
  EXPECT_EQ((*hits)[0].tool.name, "openocd.stm32h7x_mass_erase");
  hits = catalog_->Search("wipe the program memory of an nRF52832 in one go", 3);
  ASSERT_TRUE(hits.ok());
  EXPECT_EQ((*hits)[0].tool.name, "openocd.nrf5_mass_erase");
}

TEST_F(CatalogTest, AHypotheticalToolFindsARequestThatNamesNoCommand) {
  // The request shares words with the wrong tools only; a model's
  // hypothetical tool names the right one.
  const std::vector<std::string> docs = {
      R"({"ToolName":"openocd.wp","ToolDescription":"Set a data watchpoint at address for length bytes; access is r, w or a.","Args":[{"ArgName":"address","ArgDescription":"data address"}]})",
      R"({"ToolName":"gdb.break","ToolDescription":"Set a breakpoint at a line of the firmware so the core stops there.","Args":[]})",
      R"({"ToolName":"openocd.halt","ToolDescription":"Stop the core of the target whenever asked.","Args":[]})",
      R"({"ToolName":"gdb.set_var","ToolDescription":"Write a value to a variable of the firmware.","Args":[]})",
      R"({"ToolName":"openocd.reset_halt","ToolDescription":"Reset the target and halt it immediately.","Args":[]})",
  };
  const std::string request = "stop the core whenever the firmware writes to this variable";
  ASSERT_TRUE(catalog_->Register(docs).ok());
  Open();  // as reopened below: the same slots, so ties break the same way
  auto plain = catalog_->Search(request, 5);
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_NE((*plain)[0].tool.name, "openocd.wp");

  std::vector<std::string> asked;
  std::string answer = "openocd: wp ADDRESS LENGTH w - a data watchpoint on the address";
  CatalogOptions o;
  o.hyde = [&](const std::string& q) {
    asked.push_back(q);
    return answer;
  };
  Open(o);
  auto hits = catalog_->Search(request, 5);
  ASSERT_TRUE(hits.ok()) << hits.status();
  EXPECT_EQ((*hits)[0].tool.name, "openocd.wp");
  EXPECT_EQ(asked, std::vector<std::string>{request});
  // Only the offer's mode asks the model; the other modes stay plain.
  ASSERT_TRUE(catalog_->Search(request, 5, CatalogMode::kSlices).ok());
  ASSERT_TRUE(catalog_->Search(request, 5, CatalogMode::kWholeLexical).ok());
  EXPECT_EQ(asked.size(), 1u);
  // No answer (the model failed): the plain ranking, nothing lost.
  answer = "";
  hits = catalog_->Search(request, 5);
  ASSERT_TRUE(hits.ok());
  ASSERT_EQ(hits->size(), plain->size());
  for (size_t i = 0; i < hits->size(); ++i) EXPECT_EQ((*hits)[i].tool.name, (*plain)[i].tool.name);
  // At weight 0 the model is not asked.
  answer = "openocd: wp ADDRESS LENGTH w - a data watchpoint on the address";
  o.hyde_weight = 0;
  Open(o);
  hits = catalog_->Search(request, 5);
  ASSERT_TRUE(hits.ok());
  EXPECT_EQ((*hits)[0].tool.name, (*plain)[0].tool.name);
  EXPECT_EQ(asked.size(), 2u);
}

}  // namespace
}  // namespace fwai

namespace fwai {
namespace {

std::string McpDoc(const std::string& server, const std::string& tool) {
  return json({{"name", "mcp_" + server + "_" + tool},
               {"description", "tool " + tool + " of " + server},
               {"inputSchema", {{"type", "object"}}},
               {"source", "mcp:" + server}})
      .dump();
}

TEST_F(CatalogTest, McpToolsFollowTheirServers) {
  ASSERT_TRUE(catalog_->Register(SmallCatalog()).ok());
  // A document added by hand that says where it came from.
  ASSERT_TRUE(
      catalog_->Register({R"({"ToolName":"mcp.b.z","ToolDescription":"z","source":"mcp:b"})"})
          .ok());
  auto first = SyncMcpTools(*catalog_, {"a", "b", "c"},
                            {{"a", {McpDoc("a", "one"), McpDoc("a", "two")}},
                             {"b", {McpDoc("b", "x")}},
                             {"c", {McpDoc("c", "y")}}});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, 0);
  EXPECT_EQ(catalog_->size(), 9u);
  // Next start: a lists one tool only, b is no longer configured, c did not answer.
  auto next = SyncMcpTools(*catalog_, {"a", "c"}, {{"a", {McpDoc("a", "one")}}});
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(*next, 2);
  std::set<std::string> names;
  auto list = catalog_->List();
  ASSERT_TRUE(list.ok());
  for (const auto& t : *list) names.insert(t.name);
  EXPECT_EQ(names,
            (std::set<std::string>{"gdb.info_registers", "git_bisect", "mcp.b.z", "mcp_a_one",
                                   "mcp_c_y", "openocd.flash_erase_sector", "openocd.reset_halt"}));
  // Tools added by hand (no mcp: source) are never touched.
  auto none = SyncMcpTools(*catalog_, {}, {});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, 2);
  EXPECT_EQ(catalog_->size(), 5u);
}

}  // namespace
}  // namespace fwai
