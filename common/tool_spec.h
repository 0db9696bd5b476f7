// common: a tool as a model is offered it — its name, what it does and the
// JSON schema of its input. A ToolSpec is immutable once made and is shared
// (ToolSpecPtr) by the tool that made it and every request that offers it, so
// offering a tool copies a pointer, not its schema. Each wire shape of it
// (Anthropic's tool, OpenAI's function, Gemini's declaration) is rendered to
// JSON text once, on the first request of that shape, and kept; that is safe
// from any number of threads at once.
#pragma once

#include <array>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

namespace fwai {

// The JSON shapes a tool takes on the providers' wires.
enum class ToolShape { kAnthropic, kFunction, kGemini };

class ToolSpec {
 public:
  // Builds the JSON of the tool in one shape.
  using Render = nlohmann::json (*)(const ToolSpec&);

  ToolSpec(std::string name, std::string description, nlohmann::json input_schema)
      : name(std::move(name)),
        description(std::move(description)),
        input_schema(std::move(input_schema)) {}
  ToolSpec(const ToolSpec&) = delete;
  ToolSpec& operator=(const ToolSpec&) = delete;

  const std::string name;
  const std::string description;
  const nlohmann::json input_schema;

  // `render(*this)` as compact JSON text (invalid UTF-8 replaced by U+FFFD),
  // made on the first call for `shape`; later calls for `shape` return that
  // text whatever `render` they pass.
  const std::string& Text(ToolShape shape, Render render) const;

 private:
  static constexpr size_t kShapes = 3;
  mutable std::array<std::once_flag, kShapes> once_;
  mutable std::array<std::string, kShapes> text_;
};

using ToolSpecPtr = std::shared_ptr<const ToolSpec>;

inline ToolSpecPtr MakeToolSpec(std::string name, std::string description,
                                nlohmann::json input_schema) {
  return std::make_shared<const ToolSpec>(std::move(name), std::move(description),
                                          std::move(input_schema));
}

}  // namespace fwai
