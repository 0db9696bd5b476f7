// Passages: what a search returns for a hit. The hit's chunk is widened with
// the text around it in the same section, up to a token budget, growing
// towards the lines or sentences that carry the query's terms; the
// best-matching sentences are marked. Pure text logic: the knowledge base
// loads the chunks, this file decides the window.
//
// Positions are document coordinates: (chunk index, byte offset in the
// chunk's own text, i.e. its text without the overlap it repeats from the
// previous chunk), so windows built for different hits of one document
// compare and merge exactly and no text is returned twice.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace fwai {

// Passage budget in tokens: the default, and the ceiling (the largest chunk
// the chunker makes).
inline constexpr int kDefaultPassageTokens = 512;
inline constexpr int kMaxPassageTokens = 512;

// One stored chunk of a document, as the passage builder sees it.
struct PassageChunk {
  uint32_t index = 0;  // position in its document
  std::string text;
  std::vector<std::string> title_path;
  int page = 0, start_line = 0, end_line = 0;
  int section = -1;  // the chunker's section number; -1: not recorded
  // Leading bytes of `text` repeated from the previous chunk (0 when the
  // previous chunk is absent or shares nothing).
  size_t overlap = 0;
  std::string_view own() const { return std::string_view(text).substr(overlap); }
};

// Whether text may grow from one chunk into the other: the same section
// number, or (chunks stored before sections were numbered) title paths of
// which one continues the other.
bool SameSection(const PassageChunk& a, const PassageChunk& b);

// The longest prefix of `next` that is also a suffix of `prev` (at least 16
// bytes, at most 2 KB): the overlap the chunker carries across a cut.
size_t OverlapLength(std::string_view prev, std::string_view next);

// Weights of the query's index terms for scoring text: each own term at its
// inverse document frequency, each expansion at its weight times that.
class QueryTermScorer {
 public:
  // `terms`: (index term, weight) as WeightedQuery returns them (own terms
  // weigh 1); `idf`: inverse document frequency of a term.
  QueryTermScorer(const std::vector<std::pair<std::string, float>>& terms,
                  const std::function<double(const std::string&)>& idf);
  // The share of the query's weight `text` covers, in [0,1]: own terms
  // count fully, expansions at their weight (never past the whole).
  double Coverage(std::string_view text) const;
  // The same over a set of terms already tokenized.
  double CoverageOfTerms(const std::vector<std::string>& terms) const;
  bool empty() const { return total_ <= 0; }

 private:
  std::unordered_map<std::string, double> weight_;  // term -> weight * idf
  double total_ = 0;                                // sum over own terms
};

struct DocPos {
  uint32_t chunk = 0;
  uint32_t offset = 0;  // in the chunk's own text
  friend bool operator<(const DocPos& a, const DocPos& b) {
    return a.chunk != b.chunk ? a.chunk < b.chunk : a.offset < b.offset;
  }
  friend bool operator==(const DocPos& a, const DocPos& b) {
    return a.chunk == b.chunk && a.offset == b.offset;
  }
  friend bool operator<=(const DocPos& a, const DocPos& b) { return !(b < a); }
};

struct Passage {
  DocPos begin, end;  // [begin, end)
  std::string text;
  std::vector<std::pair<int, int>> highlights;  // [begin, end) byte ranges in `text`
  int tokens = 0;
  int page = 0, end_page = 0, start_line = 0, end_line = 0;
  std::vector<uint32_t> chunks;  // chunk indexes the passage draws on
  // Within-document signals: the share of the query's weight the passage
  // covers, and the best single line or sentence's share.
  double coverage = 0, best_unit = 0;
};

// The chunks of one document that a passage may draw on, by index; returns
// null past the document's ends. `same_section(a, b)` says whether two
// chunks belong to one section (text may grow from one into the other).
struct PassageSource {
  std::function<const PassageChunk*(uint32_t index)> chunk;
  std::function<bool(const PassageChunk& a, const PassageChunk& b)> same_section;
};

// Whether a chunk only leads in to what follows it: a heading with a line or
// two (its own text at most a quarter of `budget` tokens), or text whose
// last line ends with a colon ("To reset the target:"). What answers it —
// steps, a numbered list, a code block — comes after it.
bool IsLeadIn(const PassageChunk& chunk, int budget);

// How a passage grows around its hit.
enum class PassageGrowth {
  // Towards the side whose next text carries more of the query's weight.
  kTowardsQuery,
  // The same, except for a hit on a lead-in (IsLeadIn): forward first,
  // through the rest of its section and the subsections under its heading,
  // then backward with what the budget leaves.
  kForwardFromLeadIn,
};

// The passage around chunk `hit`: the whole chunk (with the overlap it
// repeats), grown by lines or sentences of its section's neighbouring
// chunks up to max(budget, the chunk's own size) tokens (never over
// kMaxPassageTokens), as `growth` says. `budget` <= 0: the chunk alone.
Passage BuildPassage(const PassageSource& source, uint32_t hit, int budget,
                     const QueryTermScorer& scorer,
                     PassageGrowth growth = PassageGrowth::kTowardsQuery);

// The text of [begin, end) and its signals, as BuildPassage makes them (used
// to merge two passages or cut one back).
Passage RenderPassage(const PassageSource& source, DocPos begin, DocPos end,
                      const QueryTermScorer& scorer);

// Within-document ranking: a passage's score `score` moved, at weight
// `weight` in [0,1], toward its document's best passage score `doc_best`,
// scaled by the share of the query the passage covers and its best
// sentence's: (1 - w) score + w doc_best (0.8 + 0.1 coverage + 0.1 best).
// At weight 1 every passage of a document starts from its best passage's
// score and, within one document, the one covering more of the question
// comes first.
double WithinDocScore(double score, double doc_best, double coverage, double best_unit,
                      double weight);

// Token count of a window of text (CountTokens of what RenderPassage would return).
int PassageTokens(const PassageSource& source, DocPos begin, DocPos end);

}  // namespace fwai
