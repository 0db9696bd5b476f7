#include "tests/support/pdf_writer.h"

#include <cstdio>
#include <sstream>

namespace fwai::testing {
namespace {

std::string Escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '(' || c == ')' || c == '\\') o.push_back('\\');
    o.push_back(c);
  }
  return o;
}

}  // namespace

std::string MakePdf(const std::vector<std::string>& pages) {
  std::vector<std::string> objs;  // object bodies, numbered from 1
  const int n = static_cast<int>(pages.size());
  // 1: catalog, 2: pages, 3: font, then per page: page object, content stream.
  objs.push_back("<< /Type /Catalog /Pages 2 0 R >>");
  std::string kids;
  for (int i = 0; i < n; ++i) kids += std::to_string(4 + 2 * i) + " 0 R ";
  objs.push_back("<< /Type /Pages /Kids [" + kids + "] /Count " + std::to_string(n) + " >>");
  objs.push_back("<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>");
  for (int i = 0; i < n; ++i) {
    std::string content;
    if (!pages[i].empty()) {
      content = "BT /F1 11 Tf 50 780 Td 14 TL\n";
      std::stringstream ss(pages[i]);
      std::string line;
      while (std::getline(ss, line)) content += "(" + Escape(line) + ") '\n";
      content += "ET";
    }
    objs.push_back(
        "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 842] /Resources << /Font << /F1 3 0 R >> "
        ">> "
        "/Contents " +
        std::to_string(5 + 2 * i) + " 0 R >>");
    objs.push_back("<< /Length " + std::to_string(content.size()) + " >>\nstream\n" + content +
                   "\nendstream");
  }
  std::string out = "%PDF-1.4\n";
  std::vector<size_t> offsets;
  for (size_t i = 0; i < objs.size(); ++i) {
    offsets.push_back(out.size());
    out += std::to_string(i + 1) + " 0 obj\n" + objs[i] + "\nendobj\n";
  }
  size_t xref = out.size();
  out += "xref\n0 " + std::to_string(objs.size() + 1) + "\n0000000000 65535 f \n";
  char buf[32];
  for (size_t off : offsets) {
    std::snprintf(buf, sizeof(buf), "%010zu 00000 n \n", off);
    out += buf;
  }
  out += "trailer\n<< /Size " + std::to_string(objs.size() + 1) + " /Root 1 0 R >>\nstartxref\n" +
         std::to_string(xref) + "\n%%EOF\n";
  return out;
}

}  // namespace fwai::testing
