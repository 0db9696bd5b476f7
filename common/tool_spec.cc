#include "common/tool_spec.h"

namespace fwai {

const std::string& ToolSpec::Text(ToolShape shape, Render render) const {
  const size_t i = static_cast<size_t>(shape);
  std::call_once(once_[i], [&] {
    text_[i] = render(*this).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  });
  return text_[i];
}

}  // namespace fwai
