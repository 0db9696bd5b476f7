// lm3s6965-hello: a banner on UART0 and a ping/pong shell, for QEMU's
// lm3s6965evb (a second simulated board type).
#include <stdint.h>

#ifndef FW_VERSION
#define FW_VERSION "0.0.0"
#endif

#define UART0_DR (*(volatile uint32_t *)0x4000C000u)
#define UART0_FR (*(volatile uint32_t *)0x4000C018u)
#define FR_RXFE (1u << 4)
#define FR_TXFF (1u << 5)

extern uint32_t _estack, _sidata, _sdata, _edata, _sbss, _ebss;
void reset(void);
static void hang(void) {
  for (;;) {
  }
}

__attribute__((section(".vectors"), used)) static void (*const vectors[16])(void) = {
    (void (*)(void))&_estack, reset, hang, hang, hang, hang, hang, 0, 0, 0, 0, hang, hang, 0, hang, hang,
};

volatile uint32_t uptime_loops;

static void putc_(char c) {
  while (UART0_FR & FR_TXFF) {
  }
  UART0_DR = (uint32_t)(unsigned char)c;
}

static void puts_(const char *s) {
  while (*s) {
    if (*s == '\n') putc_('\r');
    putc_(*s++);
  }
}

static int eq(const char *a, const char *b) {
  while (*a && *a == *b) a++, b++;
  return *a == *b;
}

void reset(void) {
  uint32_t *src = &_sidata;
  for (uint32_t *dst = &_sdata; dst < &_edata;) *dst++ = *src++;
  for (uint32_t *dst = &_sbss; dst < &_ebss;) *dst++ = 0;
  puts_("\nlm3s6965-hello " FW_VERSION " booted\n");
  char line[32];
  unsigned len = 0;
  for (;;) {
    uptime_loops++;
    if (UART0_FR & FR_RXFE) continue;
    char c = (char)(UART0_DR & 0xFF);
    if (c == '\r' || c == '\n') {
      line[len] = 0;
      if (eq(line, "ping")) puts_("pong\n");
      else if (eq(line, "version")) puts_("version " FW_VERSION "\n");
      else if (len) puts_("unknown command\n");
      len = 0;
    } else if (len + 1 < sizeof line) {
      line[len++] = c;
    }
  }
}
