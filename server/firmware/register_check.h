// Register truth: the register addresses and bit fields C and C++ sources
// name, checked against the device's SVD (svd_model.h).
//
// A Checker reads sources one at a time (comments and strings skipped,
// object-like and function-like #defines followed, so a header's macros serve
// the files after it) and finds:
//  - absolute addresses: `*(volatile uint32_t *)0x40021018`, a macro that
//    expands to one (`#define USART1_CR1 REG(0x4001380C)`), `BASE + 0x0C`;
//  - CMSIS struct access: `RCC->APB2ENR`, `USART1->CR1`, `DMA1->CH[2].CCR`;
//  - bit masks and positions named after a field (`RCC_APB2ENR_USART1EN`,
//    `USART_CR1_UE_Pos`, `_Msk`) at their #define, and constants used on a
//    register (`REG |= MASK`, `REG = A | B`, `REG &= ~MASK`, `REG & MASK`).
// Each is checked: the address is a register of the peripheral it lies in
// (and the one its name says), aligned to its size; bits written are bits
// of some field, not reserved, and of no read-only field; bits read are of
// no write-only field; a value shifted into a field fits its width; a field
// macro's position, width and mask are the SVD's.
//
// A finding says where (file, line, column), what the code says, what the
// SVD says (with the SVD file and the element path) and a suggested fix. A
// macro the checker cannot evaluate is reported once as `unresolved` (a
// warning: it never guesses). Not thread-safe: one Checker per run.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "server/firmware/svd_model.h"

namespace fwai {

struct RegisterFinding {
  std::string file;
  int line = 0, column = 0;
  std::string severity;  // error | warning
  // unknown-register | wrong-register | misaligned | reserved-bits |
  // read-only | write-only | field-position | field-width | field-mask |
  // value-overflow | unknown-field | unresolved
  std::string kind;
  std::string symbol;     // what the code names ("RCC->APB2ENR", "USART_CR1_UE_Pos")
  std::string code_says;  // "writes bits 0x00004001 to RCC.APB2ENR"
  std::string svd_says;   // "APB2ENR has fields USART1EN [14], ..."; bit 0 is AFIOEN"
  std::string source;     // "STM32F100.svd: RCC/APB2ENR/USART1EN"
  std::string fix;

  nlohmann::json ToJson() const;
};

struct RegisterCheckStats {
  int files = 0;
  int lines = 0;
  int accesses = 0;  // register accesses and field macros checked
  int unresolved = 0;
};

class RegisterChecker {
 public:
  explicit RegisterChecker(const SvdDevice& svd);

  // Checks one source (a header's macros stay known for the files after it).
  void Check(const std::string& file, std::string_view text);

  const std::vector<RegisterFinding>& findings() const { return findings_; }
  const RegisterCheckStats& stats() const { return stats_; }
  // {"findings": [...], "checked": {...}}: the stable --json form.
  nlohmann::json ToJson() const;

  // Internals the implementation shares (register_check.cc).
  struct Macro {
    std::vector<std::string> params;  // function-like when not empty
    bool function_like = false;
    std::string body;
    std::string file;
    int line = 0;
  };
  struct RegRef;

 private:
  friend class RegisterScan;
  const SvdDevice& svd_;
  std::map<std::string, Macro> macros_;
  std::vector<RegisterFinding> findings_;
  std::map<std::string, bool> reported_unresolved_;
  // Macros found wrong where they are defined: their uses are not checked
  // again (one error, at its cause).
  std::set<std::string> wrong_macros_;
  RegisterCheckStats stats_;
};

}  // namespace fwai
