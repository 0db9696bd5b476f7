// A CMSIS-SVD device description as data: what register code is checked
// against (`fwai check registers`, the agent's checkRegisters tool, the
// flash guard's register_check).
//
// ParseSvdDevice reads the XML of one device and resolves what SVD leaves
// implicit: derivedFrom (peripherals, registers), <dim> arrays (registers
// and clusters, "%s" and "[%s]" names, dimIndex lists and ranges), clusters
// (flattened, their offsets added), and the size/access/resetValue defaults
// inherited from device to peripheral to cluster to register. Each register
// and field keeps its element path ("RCC/APB2ENR/USART1EN") so a finding can
// say exactly which element of which file it relied on.
//
// Errors name the source and, for malformed XML, the line. A device is
// immutable once parsed; its methods are safe from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace fwai {

struct SvdEnumValue {
  std::string name;
  uint64_t value = 0;
};

struct SvdField {
  std::string name;
  uint32_t bit_offset = 0;
  uint32_t bit_width = 1;
  std::string access;  // read-only | write-only | read-write | writeOnce | read-writeOnce
  std::vector<SvdEnumValue> values;
  std::string path;  // "RCC/APB2ENR/USART1EN"

  uint64_t Mask() const;
  bool Readable() const { return access != "write-only" && access != "writeOnce"; }
  bool Writable() const { return access != "read-only"; }
};

struct SvdRegister {
  std::string name;
  uint64_t offset = 0;  // from the peripheral's base (clusters added)
  uint32_t size = 32;   // bits
  std::string access;
  uint64_t reset_value = 0;
  std::vector<SvdField> fields;
  std::string path;  // "USART1/CR1", "DMA1/CH[2]/CCR"

  // The bits some field covers (all of the register's bits when it has none).
  uint64_t FieldBits() const;
  const SvdField* Field(std::string_view name) const;
  bool Readable() const { return access != "write-only" && access != "writeOnce"; }
  bool Writable() const { return access != "read-only"; }
};

struct SvdPeripheral {
  std::string name;
  std::string group;
  std::string derived_from;
  uint64_t base = 0;
  uint64_t block_size = 0;  // its <addressBlock>'s size (0: none given)
  std::vector<SvdRegister> registers;

  const SvdRegister* Register(std::string_view name) const;
  // The register whose bytes include `offset`, if any.
  const SvdRegister* RegisterAt(uint64_t offset) const;
  // One past the highest byte of any register.
  uint64_t End() const;
};

struct SvdDevice {
  std::string name;
  std::string source;  // the file (or knowledge base document) it came from
  uint32_t width = 32;
  std::vector<SvdPeripheral> peripherals;

  const SvdPeripheral* Peripheral(std::string_view name) const;
  // The peripheral whose register block holds `address`, if any.
  const SvdPeripheral* PeripheralAt(uint64_t address) const;
};

// Parses `xml` (the whole file). `source` names it in errors and paths.
[[nodiscard]] absl::StatusOr<SvdDevice> ParseSvdDevice(std::string_view xml,
                                                       const std::string& source);

// A number as SVD writes it: 0x.., 0X.., #binary (x: don't care, read as
// 0), 0b.., decimal. nullopt when it is none of these.
std::optional<uint64_t> ParseSvdNumber(std::string_view text);

}  // namespace fwai
