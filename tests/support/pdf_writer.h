// Writes small, valid PDF files (Helvetica text, one text block per page) so
// tests exercise the real pdftotext without binary fixtures.
#pragma once

#include <string>
#include <vector>

namespace fwai::testing {

// Each string is one page; lines are split on '\n'. An empty page has no text.
std::string MakePdf(const std::vector<std::string>& pages);

}  // namespace fwai::testing
