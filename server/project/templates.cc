#include "server/project/templates.h"

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"

namespace fwai {
namespace {

namespace fs = std::filesystem;

// Shared by bare-metal and FreeRTOS: the STM32F100RB of the STM32VLDISCOVERY.
constexpr const char* kLinkerScript = R"(/* STM32F100RB: 128 KiB flash, 8 KiB SRAM. */
ENTRY(Reset_Handler)

MEMORY
{
  FLASH (rx)  : ORIGIN = 0x08000000, LENGTH = 128K
  RAM   (rwx) : ORIGIN = 0x20000000, LENGTH = 8K
}

_estack = ORIGIN(RAM) + LENGTH(RAM);

SECTIONS
{
  .isr_vector : { KEEP(*(.isr_vector)) } > FLASH
  .text : {
    *(.text*)
    *(.rodata*)
    . = ALIGN(4);
  } > FLASH
  _sidata = LOADADDR(.data);
  .data : {
    _sdata = .;
    *(.data*)
    . = ALIGN(4);
    _edata = .;
  } > RAM AT > FLASH
  .bss (NOLOAD) : {
    _sbss = .;
    *(.bss*)
    *(COMMON)
    . = ALIGN(4);
    _ebss = .;
  } > RAM
}
)";

constexpr const char* kStartup = R"(// Vector table and reset handler for the STM32F100 (Cortex-M3).
#include <stdint.h>

extern uint32_t _estack, _sidata, _sdata, _edata, _sbss, _ebss;
extern int main(void);
void Reset_Handler(void);
void Default_Handler(void);
void HardFault_Handler(void) __attribute__((weak, alias("Default_Handler")));
void SVC_Handler(void) __attribute__((weak, alias("Default_Handler")));
void PendSV_Handler(void) __attribute__((weak, alias("Default_Handler")));
void SysTick_Handler(void) __attribute__((weak, alias("Default_Handler")));

__attribute__((section(".isr_vector"), used)) static void (*const vectors[])(void) = {
    (void (*)(void))&_estack,
    Reset_Handler,
    Default_Handler,    // NMI
    HardFault_Handler,  // HardFault
    HardFault_Handler,  // MemManage
    HardFault_Handler,  // BusFault
    HardFault_Handler,  // UsageFault
    0, 0, 0, 0,
    SVC_Handler,
    Default_Handler,    // DebugMon
    0,
    PendSV_Handler,
    SysTick_Handler,
};

void Reset_Handler(void) {
  uint32_t *src = &_sidata;
  for (uint32_t *dst = &_sdata; dst < &_edata;) *dst++ = *src++;
  for (uint32_t *dst = &_sbss; dst < &_ebss;) *dst++ = 0;
  main();
  for (;;) {
  }
}

void Default_Handler(void) {
  for (;;) {
  }
}
)";

constexpr const char* kUart = R"(// USART1 on PA9/PA10 at 115200 baud (24 MHz core clock).
#pragma once
#include <stdint.h>

#define REG(addr) (*(volatile uint32_t *)(addr))
#define RCC_APB2ENR REG(0x40021018)
#define GPIOA_CRH REG(0x40010804)
#define USART1_SR REG(0x40013800)
#define USART1_DR REG(0x40013804)
#define USART1_BRR REG(0x40013808)
#define USART1_CR1 REG(0x4001380C)
#define CPU_HZ 24000000u

static inline void uart_init(void) {
  RCC_APB2ENR |= (1u << 2) | (1u << 14);               // GPIOA, USART1
  GPIOA_CRH = (GPIOA_CRH & ~(0xFu << 4)) | (0xBu << 4);  // PA9: alternate push-pull
  USART1_BRR = CPU_HZ / 115200u;
  USART1_CR1 = (1u << 13) | (1u << 3) | (1u << 2);      // UE, TE, RE
}

static inline void uart_putc(char c) {
  while (!(USART1_SR & (1u << 7))) {
  }
  USART1_DR = (uint32_t)(unsigned char)c;
}

static inline void uart_puts(const char *s) {
  while (*s) {
    if (*s == '\n') uart_putc('\r');
    uart_putc(*s++);
  }
}

// Non-blocking: -1 when nothing has arrived.
static inline int uart_getc(void) { return (USART1_SR & (1u << 5)) ? (int)(USART1_DR & 0xFF) : -1; }
)";

constexpr const char* kBareMain =
    R"(// @NAME@: a boot banner on USART1 and a line shell (ping -> pong).
#include <string.h>

#include "uart.h"

#ifndef FW_VERSION
#define FW_VERSION "0.1.0"
#endif

int main(void) {
  uart_init();
  uart_puts("\n@NAME@ " FW_VERSION " booted\n");
  char line[64];
  unsigned len = 0;
  for (;;) {
    int c = uart_getc();
    if (c < 0) continue;
    if (c == '\r' || c == '\n') {
      line[len] = 0;
      if (strcmp(line, "ping") == 0) uart_puts("pong\n");
      else if (strcmp(line, "version") == 0) uart_puts("version " FW_VERSION "\n");
      else if (len) uart_puts("unknown command\n");
      len = 0;
    } else if (len + 1 < sizeof line) {
      line[len++] = (char)c;
    }
  }
}
)";

constexpr const char* kBareMakefile =
    R"(# @NAME@ for the STM32F100RB (STM32VLDISCOVERY), built with arm-none-eabi-gcc.
# Objects with their -fstack-usage .su files; the link writes a map (what was
# linked, for the SBOM) and prints the memory use.
VERSION ?= 0.1.0
BUILD ?= build
CC = arm-none-eabi-gcc
OBJCOPY = arm-none-eabi-objcopy
CFLAGS = -mcpu=cortex-m3 -mthumb -Os -g3 -Wall -Wextra -ffreestanding -ffunction-sections \
         -fdata-sections -fstack-usage -Isrc -DFW_VERSION=\"$(VERSION)\"
LDFLAGS = -mcpu=cortex-m3 -mthumb -nostartfiles -T stm32f100rb.ld -Wl,--gc-sections -specs=nano.specs \
          -specs=nosys.specs -Wl,-Map=$(BUILD)/@NAME@.map -Wl,--print-memory-usage
SRCS = src/startup.c src/main.c
OBJS = $(SRCS:src/%.c=$(BUILD)/%.o)

all: $(BUILD)/@NAME@.elf $(BUILD)/@NAME@.bin

$(BUILD)/%.o: src/%.c src/uart.h Makefile
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/@NAME@.elf: $(OBJS) stm32f100rb.ld Makefile
	$(CC) $(OBJS) $(LDFLAGS) -o $@
	arm-none-eabi-size $@

$(BUILD)/@NAME@.bin: $(BUILD)/@NAME@.elf
	$(OBJCOPY) -O binary $< $@

clean:
	rm -rf $(BUILD)

.PHONY: all clean
)";

constexpr const char* kRtosMakefile =
    R"(# @NAME@: FreeRTOS on the STM32F100RB (Cortex-M3), built with arm-none-eabi-gcc.
# The kernel is not bundled: point FREERTOS_KERNEL at a FreeRTOS-Kernel checkout.
FREERTOS_KERNEL ?= $(HOME)/FreeRTOS-Kernel
VERSION ?= 0.1.0
BUILD ?= build
CC = arm-none-eabi-gcc
ifeq ($(wildcard $(FREERTOS_KERNEL)/tasks.c),)
$(error FreeRTOS kernel not found at $(FREERTOS_KERNEL); clone FreeRTOS-Kernel and set FREERTOS_KERNEL=...)
endif
PORT = $(FREERTOS_KERNEL)/portable/GCC/ARM_CM3
CFLAGS = -mcpu=cortex-m3 -mthumb -Os -g3 -Wall -ffreestanding -ffunction-sections -fdata-sections \
         -Isrc -I$(FREERTOS_KERNEL)/include -I$(PORT) -DFW_VERSION=\"$(VERSION)\"
LDFLAGS = -nostartfiles -T stm32f100rb.ld -Wl,--gc-sections -specs=nano.specs -specs=nosys.specs
SRCS = src/startup.c src/main.c $(FREERTOS_KERNEL)/tasks.c $(FREERTOS_KERNEL)/list.c $(FREERTOS_KERNEL)/queue.c \
       $(FREERTOS_KERNEL)/timers.c $(PORT)/port.c $(FREERTOS_KERNEL)/portable/MemMang/heap_4.c

all: $(BUILD)/@NAME@.elf

$(BUILD)/@NAME@.elf: $(SRCS) src/FreeRTOSConfig.h stm32f100rb.ld Makefile
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS) $(SRCS) $(LDFLAGS) -o $@

clean:
	rm -rf $(BUILD)

.PHONY: all clean
)";

constexpr const char* kRtosConfig =
    R"(// FreeRTOS settings for the STM32F100RB: 24 MHz, 1 kHz tick, 4 KiB heap.
#pragma once

#define configUSE_PREEMPTION 1
#define configCPU_CLOCK_HZ 24000000u
#define configTICK_RATE_HZ 1000u
#define configMAX_PRIORITIES 4
#define configMINIMAL_STACK_SIZE 96
#define configTOTAL_HEAP_SIZE (4 * 1024)
#define configMAX_TASK_NAME_LEN 8
#define configUSE_16_BIT_TICKS 0
#define configUSE_IDLE_HOOK 0
#define configUSE_TICK_HOOK 0
#define configUSE_MUTEXES 1
#define configCHECK_FOR_STACK_OVERFLOW 0
#define configSUPPORT_DYNAMIC_ALLOCATION 1
#define configKERNEL_INTERRUPT_PRIORITY 255
#define configMAX_SYSCALL_INTERRUPT_PRIORITY 191
#define INCLUDE_vTaskDelay 1

// The port's handlers take the vector table's names.
#define vPortSVCHandler SVC_Handler
#define xPortPendSVHandler PendSV_Handler
#define xPortSysTickHandler SysTick_Handler
)";

constexpr const char* kRtosMain =
    R"(// @NAME@: two FreeRTOS tasks; the banner once the scheduler runs.
#include "FreeRTOS.h"
#include "task.h"
#include "uart.h"

#ifndef FW_VERSION
#define FW_VERSION "0.1.0"
#endif

static void banner(void *arg) {
  (void)arg;
  uart_puts("\n@NAME@ " FW_VERSION " booted (FreeRTOS)\n");
  for (;;) vTaskDelay(pdMS_TO_TICKS(1000));
}

static void shell(void *arg) {
  (void)arg;
  for (;;) {
    int c = uart_getc();
    if (c == 'p') uart_puts("pong\n");
    vTaskDelay(1);
  }
}

int main(void) {
  uart_init();
  xTaskCreate(banner, "banner", configMINIMAL_STACK_SIZE * 2, NULL, 2, NULL);
  xTaskCreate(shell, "shell", configMINIMAL_STACK_SIZE * 2, NULL, 1, NULL);
  vTaskStartScheduler();
  for (;;) {
  }
}
)";

constexpr const char* kZephyrCmake = R"(cmake_minimum_required(VERSION 3.20.0)
set(BOARD stm32vl_disco)
find_package(Zephyr REQUIRED HINTS $ENV{ZEPHYR_BASE})
project(@NAME@)
target_sources(app PRIVATE src/main.c)
)";

constexpr const char* kZephyrMain =
    R"(/* @NAME@: a Zephyr application printing its boot line on the console. */
#include <zephyr/kernel.h>
#include <zephyr/sys/printk.h>

int main(void) {
  printk("@NAME@ booted on %s\n", CONFIG_BOARD);
  while (1) {
    k_msleep(1000);
  }
  return 0;
}
)";

constexpr const char* kArduinoSketch =
    R"(// @NAME@: an Arduino sketch with a boot line and a serial echo.
void setup() {
  Serial.begin(115200);
  Serial.println("@NAME@ booted");
  pinMode(LED_BUILTIN, OUTPUT);
}

void loop() {
  digitalWrite(LED_BUILTIN, (millis() / 500) % 2);
  if (Serial.available()) {
    String line = Serial.readStringUntil('\n');
    line.trim();
    if (line == "ping") Serial.println("pong");
  }
}
)";

constexpr const char* kGitignore = "build/\n.fwai/runs/\n";

std::string Fill(const char* text, const std::string& name) {
  return absl::StrReplaceAll(text, {{"@NAME@", name}});
}

}  // namespace

std::vector<std::string> TemplateNames() { return {"bare-metal", "freertos", "zephyr", "arduino"}; }

absl::StatusOr<ProjectTemplate> MakeTemplate(const std::string& name,
                                             const std::string& project_name) {
  if (project_name.empty() || project_name.size() > 64 ||
      project_name.find_first_not_of(
          "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_") !=
          std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("project name '", project_name, "': use letters, digits, - and _"));
  }
  ProjectTemplate t;
  t.name = name;
  ProjectSettings& s = t.settings;
  s.name = project_name;
  s.baud = 115200;
  if (name == "bare-metal" || name == "freertos") {
    const bool rtos = name == "freertos";
    t.description = rtos ? "FreeRTOS on the STM32F100RB (set FREERTOS_KERNEL to a kernel checkout)"
                         : "Bare-metal C for the STM32F100RB; builds with arm-none-eabi-gcc and "
                           "runs on the simulated board";
    t.files = {{"Makefile", Fill(rtos ? kRtosMakefile : kBareMakefile, project_name)},
               {"stm32f100rb.ld", kLinkerScript},
               {"src/startup.c", kStartup},
               {"src/uart.h", kUart},
               {"src/main.c", Fill(rtos ? kRtosMain : kBareMain, project_name)},
               {".gitignore", kGitignore}};
    if (rtos) t.files.push_back({"src/FreeRTOSConfig.h", kRtosConfig});
    s.build_system = "make";
    s.build_command = "make";
    s.flash_command = "fwai flash";
    s.image = absl::StrCat("build/", project_name, ".elf");
    s.target = "stm32f100rb";
    s.board = "stm32vldiscovery";
    s.debug_interface = "stlink";
    s.boot_pattern = "booted";
  } else if (name == "zephyr") {
    t.description = "A Zephyr application (west build / west flash)";
    t.files = {
        {"CMakeLists.txt", Fill(kZephyrCmake, project_name)},
        {"prj.conf", "CONFIG_PRINTK=y\nCONFIG_SERIAL=y\nCONFIG_CONSOLE=y\nCONFIG_UART_CONSOLE=y\n"},
        {"src/main.c", Fill(kZephyrMain, project_name)},
        {".gitignore", kGitignore}};
    s.build_system = "zephyr";
    s.build_command = "west build -b stm32vl_disco .";
    s.flash_command = "west flash";
    s.image = "build/zephyr/zephyr.elf";
    s.target = "stm32f100rb";
    s.board = "stm32vl_disco";
    s.debug_interface = "stlink";
    s.boot_pattern = "booted";
  } else if (name == "arduino") {
    t.description = "An Arduino sketch (arduino-cli compile / upload)";
    t.files = {{project_name + ".ino", Fill(kArduinoSketch, project_name)},
               {"sketch.yaml", "default_fqbn: arduino:avr:uno\ndefault_port: /dev/ttyACM0\n"},
               {".gitignore", kGitignore}};
    s.build_system = "arduino";
    s.build_command = "arduino-cli compile --fqbn arduino:avr:uno --output-dir build .";
    s.flash_command = "arduino-cli upload -p /dev/ttyACM0 --fqbn arduino:avr:uno .";
    s.image = absl::StrCat("build/", project_name, ".ino.elf");
    s.target = "atmega328p";
    s.board = "arduino:avr:uno";
    s.serial_port = "/dev/ttyACM0";
    s.boot_pattern = "booted";
  } else {
    return absl::InvalidArgumentError(absl::StrCat("template '", name, "': expected one of ",
                                                   absl::StrJoin(TemplateNames(), ", ")));
  }
  return t;
}

absl::Status WriteTemplate(const ProjectTemplate& t, const std::string& root, bool force) {
  std::error_code ec;
  std::vector<std::string> existing;
  for (const auto& f : t.files) {
    if (fs::exists(fs::path(root) / f.path, ec)) existing.push_back(f.path);
  }
  if (!existing.empty() && !force) {
    return absl::AlreadyExistsError(absl::StrCat("the ", t.name, " template would replace ",
                                                 absl::StrJoin(existing, ", "), " in ", root,
                                                 "; nothing was written (--force replaces them)"));
  }
  for (const auto& f : t.files) {
    const fs::path p = fs::path(root) / f.path;
    fs::create_directories(p.parent_path(), ec);
    if (ec)
      return absl::PermissionDeniedError(
          absl::StrCat("cannot create ", p.parent_path().string(), ": ", ec.message()));
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out << f.content;
    out.close();
    if (!out) return absl::DataLossError(absl::StrCat("cannot write ", p.string()));
  }
  return absl::OkStatus();
}

}  // namespace fwai
