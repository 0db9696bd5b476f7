// Window evidence: a document's text cut into fixed windows of words (the
// unit a plain full-text engine returns), each scored by BM25 against the
// question. For a question asked in other words than its document's, the
// densest window of the top documents often holds the answer where the
// best-ranked chunk does not; the knowledge base fuses the passages that
// overlap the best windows into its ranking by weighted reciprocal rank.
// Pure text logic over the chunks PassageChunk describes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "server/knowledge/passage.h"

namespace fwai {

// Words of a window and the step between windows (half a window: every
// span of half a window lies whole in one).
inline constexpr int kWindowWords = 300;

struct TextWindow {
  DocPos begin, end;  // [begin, end) in document coordinates
  double score = 0;   // BM25 against the question
  // The chunk holding most of the window's query weight: the passage is
  // grown around it when no ranked passage overlaps the window.
  uint32_t best_chunk = 0;
};

// The windows of `chunks` (one document's, in index order; their own text,
// i.e. without the overlap each repeats, is what is cut), `words` words each
// with a step of words / 2, scored by BM25 (k1 1.2, b 0.75, the windows'
// average length) with `term_weight` (index term -> weight x idf) as the
// question's terms. Windows scoring 0 are left out. Sorted best first (ties:
// earlier first).
std::vector<TextWindow> ScoreWindows(const std::vector<const PassageChunk*>& chunks,
                                     const std::unordered_map<std::string, double>& term_weight,
                                     int words = kWindowWords);

// Whether [begin, end) overlaps the window.
bool OverlapsWindow(const TextWindow& w, DocPos begin, DocPos end);

// The fused score of an item at 0-based `rank` in the current ranking whose
// best overlapping window is at 0-based `window_rank` (-1: none), at weight
// `weight` and constant `k`, normalized so that first in both scores 1:
// (1 / (k + rank + 1) + weight / (k + window_rank + 1)) / ((1 + weight) / (k + 1)).
double WindowFusedScore(size_t rank, int window_rank, double weight, double k);

}  // namespace fwai
