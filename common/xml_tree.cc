#include "common/xml_tree.h"

#include <expat.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace fwai {

const XmlNode* XmlNode::Child(const std::string& n) const {
  for (const auto& c : children) {
    if (c->name == n) return c.get();
  }
  return nullptr;
}

std::vector<const XmlNode*> XmlNode::Children(const std::string& n) const {
  std::vector<const XmlNode*> out;
  for (const auto& c : children) {
    if (c->name == n) out.push_back(c.get());
  }
  return out;
}

std::string XmlNode::Get(const std::string& n) const {
  const XmlNode* c = Child(n);
  return c ? std::string(absl::StripAsciiWhitespace(c->text)) : "";
}

std::string XmlNode::Attr(const std::string& a) const {
  auto it = attrs.find(a);
  return it == attrs.end() ? "" : it->second;
}

namespace {

struct Builder {
  std::unique_ptr<XmlNode> root;
  XmlNode* cur = nullptr;
};

void XMLCALL OnStart(void* data, const XML_Char* name, const XML_Char** attrs) {
  auto* b = static_cast<Builder*>(data);
  auto n = std::make_unique<XmlNode>();
  n->name = name;
  for (int i = 0; attrs[i]; i += 2) n->attrs[attrs[i]] = attrs[i + 1];
  XmlNode* raw = n.get();
  if (!b->cur) {
    if (!b->root) b->root = std::move(n);
  } else {
    raw->parent = b->cur;
    b->cur->children.push_back(std::move(n));
  }
  b->cur = raw;
}

void XMLCALL OnEnd(void* data, const XML_Char*) {
  auto* b = static_cast<Builder*>(data);
  if (b->cur) b->cur = b->cur->parent;
}

void XMLCALL OnText(void* data, const XML_Char* s, int len) {
  auto* b = static_cast<Builder*>(data);
  if (b->cur) b->cur->text.append(s, static_cast<size_t>(len));
}

}  // namespace

absl::StatusOr<std::unique_ptr<XmlNode>> ParseXmlTree(std::string_view xml,
                                                      const std::string& source) {
  if (xml.size() > static_cast<size_t>(INT32_MAX)) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": ", xml.size(), " bytes is too big to read"));
  }
  Builder b;
  XML_Parser p = XML_ParserCreate(nullptr);
  if (!p)
    return absl::ResourceExhaustedError(absl::StrCat(source, ": cannot create an XML parser"));
  XML_SetUserData(p, &b);
  XML_SetElementHandler(p, OnStart, OnEnd);
  XML_SetCharacterDataHandler(p, OnText);
  const bool ok = XML_Parse(p, xml.data(), static_cast<int>(xml.size()), 1) == XML_STATUS_OK;
  std::string error;
  if (!ok) {
    error = absl::StrCat(source, ":", XML_GetCurrentLineNumber(p), ": not well-formed XML (",
                         XML_ErrorString(XML_GetErrorCode(p)), ")");
  }
  XML_ParserFree(p);
  if (!ok) return absl::InvalidArgumentError(error);
  if (!b.root) return absl::InvalidArgumentError(absl::StrCat(source, ": no XML element in it"));
  return std::move(b.root);
}

}  // namespace fwai
