// A small XML document as a tree of elements (expat underneath), for the
// formats fwai reads whole: CMSIS-SVD (the knowledge base, register checks).
//
// ParseXmlTree keeps element names, attributes and the text directly inside
// each element; comments and processing instructions are dropped. A document
// that is not well-formed is INVALID_ARGUMENT "SOURCE:LINE: not well-formed
// XML (WHY)". Nodes are immutable after parsing.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace fwai {

struct XmlNode {
  std::string name;
  std::map<std::string, std::string> attrs;
  std::string text;
  std::vector<std::unique_ptr<XmlNode>> children;
  XmlNode* parent = nullptr;

  // The first child element named `n`, or null.
  const XmlNode* Child(const std::string& n) const;
  std::vector<const XmlNode*> Children(const std::string& n) const;
  // The trimmed text of child `n` ("" when absent).
  std::string Get(const std::string& n) const;
  // Attribute `a` ("" when absent).
  std::string Attr(const std::string& a) const;
};

// The root element of `xml`. `source` names the document in errors.
[[nodiscard]] absl::StatusOr<std::unique_ptr<XmlNode>> ParseXmlTree(std::string_view xml,
                                                                    const std::string& source);

}  // namespace fwai
