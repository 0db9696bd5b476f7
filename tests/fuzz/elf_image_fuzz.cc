// The ELF image reader of the flash guard: any bytes give an error saying
// what is wrong, or an image whose segments lie in the file, and the guard's
// checks answer for it.
#include "server/hardware/firmware_image.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fwai;
  using namespace fwai::fuzz;
  auto img = ParseFirmwareImage(AsText(data, size), "fw.elf");
  if (!img.ok()) {
    FUZZ_CHECK(img.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  FUZZ_CHECK(!img->segments.empty());
  BoardConfig board;
  board.id = "sim-stm32vl";
  board.machine = "stm32vldiscovery";
  FUZZ_CHECK(ApplyBoardDefaults(board));
  (void)CheckImageFits(*img, board);
  (void)CheckImageTarget(*img, board);
  return 0;
}
