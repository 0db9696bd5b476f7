// GDB/MI: the input is what gdb prints (a transcript of MI records, split
// anywhere) while fwai runs a command, a console command, waits for a stop
// and decodes a Cortex-M fault. Whatever gdb prints, each call returns an
// answer or an error at once: no crash, no exception, no waiting for more.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "server/hardware/gdb_mi.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fwai;
  using namespace fwai::fuzz;
  // The record parser on its own, line by line.
  std::string_view text = AsText(data, size);
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    const size_t comma = line.find(',');
    if (comma != std::string_view::npos) (void)ParseMiResults(line.substr(comma + 1));
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  }
  // A session reading the transcript as gdb's output.
  int out = memfd_create("gdb-output", MFD_CLOEXEC);
  FUZZ_CHECK(out >= 0);
  FUZZ_CHECK(write(out, data, size) == static_cast<ssize_t>(size));
  FUZZ_CHECK(lseek(out, 0, SEEK_SET) == 0);
  int in = open("/dev/null", O_WRONLY | O_CLOEXEC);
  FUZZ_CHECK(in >= 0);
  auto gdb = GdbSession::Attach(in, out);
  (void)gdb->Mi("-data-list-register-values x", 1000);
  (void)gdb->Console("bt", 1000);
  (void)gdb->WaitStopped(1000);
  auto fault = DecodeFault(*gdb);
  if (fault.ok()) (void)fault->ToJson().dump();
  return 0;
}
