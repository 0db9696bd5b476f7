// stm32vl-blinky: a boot banner, a counter and a command shell on USART1 and RTT.
//
// Commands (a line on the UART or RTT down-channel 0): ping | version | led on | led off | count | fault | burst N | semihost TEXT | semihost-cat PATH
#include <stdint.h>
#include <string.h>

#ifndef FW_VERSION
#define FW_VERSION "0.0.0"
#endif

#define REG(addr) (*(volatile uint32_t *)(addr))

// RCC
#define RCC_APB2ENR REG(0x40021018)
#define RCC_APB2ENR_IOPAEN (1u << 2)
#define RCC_APB2ENR_IOPCEN (1u << 4)
#define RCC_APB2ENR_USART1EN (1u << 14)
// GPIOA (USART1 TX on PA9), GPIOC (LEDs on PC8 / PC9)
#define GPIOA_CRH REG(0x40010804)
#define GPIOC_CRH REG(0x40011004)
#define GPIOC_ODR REG(0x4001100C)
#define GPIOC_BSRR REG(0x40011010)
#define LED_BLUE (1u << 8)
// USART1
#define USART1_SR REG(0x40013800)
#define USART1_DR REG(0x40013804)
#define USART1_BRR REG(0x40013808)
#define USART1_CR1 REG(0x4001380C)
#define USART_SR_RXNE (1u << 5)
#define USART_SR_TXE (1u << 7)
#define USART_CR1_UE (1u << 13)
#define USART_CR1_TE (1u << 3)
#define USART_CR1_RE (1u << 2)
// SysTick and the system control block
#define SYST_CSR REG(0xE000E010)
#define SYST_RVR REG(0xE000E014)
#define SYST_CVR REG(0xE000E018)
#define SCB_SHCSR REG(0xE000ED24)

#define CPU_HZ 24000000u
#include "rtt.h"  // RTT channels (rtt.c)

volatile uint32_t ticks;      // milliseconds since boot
volatile uint32_t counter;    // increments every 100 ms
volatile uint32_t led_state;  // last value written to the LED

void SysTick_Handler(void) {
  ticks++;
  if (ticks % 100 == 0) counter++;
}

static void uart_putc(char c) {
  while (!(USART1_SR & USART_SR_TXE)) {
  }
  USART1_DR = (uint32_t)(unsigned char)c;
}

// The console a command answers on: the UART, or RTT's terminal channel
// for a command that came over RTT.
static unsigned console_rtt;

static void con_putc(char c) {
  if (console_rtt) {
    rtt_write(RTT_TERMINAL, &c, 1);
    return;
  }
  if (c == '\n') uart_putc('\r');
  uart_putc(c);
}

static void con_puts(const char *s) {
  while (*s) con_putc(*s++);
}

static void con_puthex(uint32_t v) {
  static const char digits[] = "0123456789abcdef";
  con_puts("0x");
  for (int shift = 28; shift >= 0; shift -= 4) con_putc(digits[(v >> shift) & 0xF]);
}

// `v` in decimal at the end of `buf` (11 bytes); returns where it starts.
static char *format_dec(char *buf, uint32_t v) {
  int i = 10;
  buf[i] = 0;
  do {
    buf[--i] = (char)('0' + v % 10);
    v /= 10;
  } while (v && i > 0);
  return &buf[i];
}

// Reports a fault on the UART and stops; a debugger finds the core in here.
__attribute__((noinline, used)) void fault_report(uint32_t *frame) {
  console_rtt = 0;
  con_puts("\nFAULT: hard fault at pc=");
  con_puthex(frame[6]);
  con_puts("\n");
  for (;;) {
  }
}

__attribute__((naked)) void HardFault_Handler(void) {
  __asm volatile(
      "tst lr, #4\n"
      "ite eq\n"
      "mrseq r0, msp\n"
      "mrsne r0, psp\n"
      "b fault_report\n");
}

static void trigger_fault(void) {
  // A load from an address where nothing is mapped: a precise bus fault that
  // escalates to HardFault because the bus fault handler is not enabled.
  volatile uint32_t *bad = (volatile uint32_t *)0x3FFFFFF0u;
  (void)*bad;
}

static void led_set(int on) {
  GPIOC_BSRR = on ? LED_BLUE : (LED_BLUE << 16);
  led_state = on ? 1u : 0u;
  con_puts(on ? "led on" : "led off");
  con_puts(" GPIOC_ODR=");
  con_puthex(GPIOC_ODR);
  con_puts("\n");
}

// Writes all of `s` to RTT up-channel `channel`, waiting while its ring is
// full as long as a debugger keeps taking bytes (100 ms without progress:
// nobody reads it). Returns 0 if it gave up.
static int rtt_write_all(unsigned channel, const char *s, unsigned n) {
  uint32_t since = ticks;
  while (n > 0) {
    const unsigned w = rtt_write(channel, s, n);
    if (w > 0) {
      s += w;
      n -= w;
      since = ticks;
    } else if (ticks - since > 100u) {
      return 0;
    }
  }
  return 1;
}

// `burst N`: N lines of 64 bytes on the trace channel as fast as the
// debugger drains it ("burst I ms=T ....", T the milliseconds since boot).
static void burst(const char *arg) {
  uint32_t n = 0;
  while (*arg >= '0' && *arg <= '9') n = n * 10u + (uint32_t)(*arg++ - '0');
  char line[65], dec[11];
  for (uint32_t i = 0; i < n; ++i) {
    unsigned len = 0;
    for (const char *p = "burst "; *p;) line[len++] = *p++;
    for (const char *p = format_dec(dec, i); *p;) line[len++] = *p++;
    for (const char *p = " ms="; *p;) line[len++] = *p++;
    for (const char *p = format_dec(dec, ticks); *p;) line[len++] = *p++;
    line[len++] = ' ';
    while (len < 63) line[len++] = '.';
    line[len++] = '\n';
    if (!rtt_write_all(RTT_TRACE, line, len)) {
      con_puts("burst stopped: nobody reads RTT\n");
      return;
    }
  }
  con_puts("burst done\n");
}

// ARM semihosting: a call to the debugger (or simulator) attached. Only on a
// board that has one: without, the BKPT is a HardFault.
static int semihost(int op, void *arg) {
  register int r0 __asm__("r0") = op;
  register void *r1 __asm__("r1") = arg;
  __asm volatile("bkpt 0xAB" : "+r"(r0) : "r"(r1) : "memory");
  return r0;
}

// `semihost TEXT`: TEXT on the semihosting console.
static void semihost_write(const char *text) {
  char line[80];
  unsigned len = 0;
  for (const char *p = "semihosting: "; *p;) line[len++] = *p++;
  while (*text && len < sizeof line - 2) line[len++] = *text++;
  line[len++] = '\n';
  line[len] = 0;
  semihost(0x04, line);  // SYS_WRITE0
  con_puts("semihost: written\n");
}

// `semihost-cat PATH`: the first bytes of a host file, read by semihosting,
// on the console (a simulator that keeps its files from the firmware says
// the open failed).
static void semihost_cat(const char *path) {
  uint32_t open_args[3] = {(uint32_t)path, 0 /* "r" */, (uint32_t)strlen(path)};
  const int fd = semihost(0x01, open_args);  // SYS_OPEN
  if (fd < 0) {
    con_puts("semihost-cat: open failed\n");
    return;
  }
  char buf[48];
  uint32_t read_args[3] = {(uint32_t)fd, (uint32_t)buf, sizeof buf - 1};
  const int left = semihost(0x06, read_args);  // SYS_READ: the bytes not read
  const int n = left >= 0 && left < (int)sizeof buf ? (int)(sizeof buf - 1) - left : 0;
  buf[n] = 0;
  uint32_t close_args[1] = {(uint32_t)fd};
  semihost(0x02, close_args);  // SYS_CLOSE
  for (int i = 0; i < n; ++i) {
    if (buf[i] == '\n' || buf[i] == '\r') buf[i] = ' ';
  }
  con_puts("semihost-cat: ");
  con_puts(buf);
  con_puts("\n");
}

static void handle(const char *line) {
  char dec[11];
  if (strcmp(line, "ping") == 0) {
    con_puts("pong\n");
  } else if (strcmp(line, "version") == 0) {
    con_puts("version " FW_VERSION "\n");
  } else if (strcmp(line, "led on") == 0) {
    led_set(1);
  } else if (strcmp(line, "led off") == 0) {
    led_set(0);
  } else if (strcmp(line, "count") == 0) {
    con_puts("counter ");
    con_puts(format_dec(dec, counter));
    con_puts("\n");
  } else if (strncmp(line, "semihost ", 9) == 0) {
    semihost_write(line + 9);
  } else if (strncmp(line, "semihost-cat ", 13) == 0) {
    semihost_cat(line + 13);
  } else if (strncmp(line, "burst ", 6) == 0) {
    burst(line + 6);
  } else if (strcmp(line, "fault") == 0) {
    con_puts("triggering a hard fault\n");
    trigger_fault();
  } else if (line[0] != 0) {
    con_puts("unknown command: ");
    con_puts(line);
    con_puts("\n");
  }
}

// A command line being typed on one console.
struct line_buf {
  char text[64];
  unsigned len;
};

// Adds `c`; returns 1 when it ended a line (then in `text`).
static int line_add(struct line_buf *l, char c) {
  if (c == '\r' || c == '\n') {
    l->text[l->len] = 0;
    l->len = 0;
    return 1;
  }
  if (l->len + 1 < sizeof l->text) l->text[l->len++] = c;
  return 0;
}

int main(void) {
  rtt_init();
  RCC_APB2ENR |= RCC_APB2ENR_IOPAEN | RCC_APB2ENR_IOPCEN | RCC_APB2ENR_USART1EN;
  GPIOA_CRH = (GPIOA_CRH & ~(0xFu << 4)) | (0xBu << 4);  // PA9: alternate push-pull, 50 MHz
  GPIOC_CRH = (GPIOC_CRH & ~0xFFu) | 0x22u;               // PC8, PC9: push-pull outputs
  USART1_BRR = CPU_HZ / 115200u;
  USART1_CR1 = USART_CR1_UE | USART_CR1_TE | USART_CR1_RE;

  SYST_RVR = CPU_HZ / 1000u - 1u;
  SYST_CVR = 0;
  SYST_CSR = 0x7;  // processor clock, interrupt, enable
  (void)SCB_SHCSR;

  con_puts("\nstm32vl-blinky " FW_VERSION " booted\n");
  rtt_puts(RTT_TERMINAL, "rtt: stm32vl-blinky " FW_VERSION " booted\n");

  struct line_buf uart = {0}, rtt = {0};
  uint32_t traced = 0;
  char dec[11];
  for (;;) {
    if (USART1_SR & USART_SR_RXNE) {
      if (line_add(&uart, (char)(USART1_DR & 0xFF))) {
        if (uart.text[0] != 0) {
          rtt_puts(RTT_TERMINAL, "uart cmd: ");
          rtt_puts(RTT_TERMINAL, uart.text);
          rtt_puts(RTT_TERMINAL, "\n");
        }
        handle(uart.text);
      }
    }
    const int c = rtt_getc();
    if (c >= 0 && line_add(&rtt, (char)c)) {
      console_rtt = 1;
      handle(rtt.text);
      console_rtt = 0;
    }
    if (ticks - traced >= 1000u) {
      traced = ticks;
      rtt_puts(RTT_TRACE, "tick counter=");
      rtt_puts(RTT_TRACE, format_dec(dec, counter));
      rtt_puts(RTT_TRACE, "\n");
    }
  }
}
