// RTT channels in SEGGER's layout (see rtt.h). Each buffer is a ring with
// one byte always left empty: the target writes an up-buffer's data and its
// write offset, the debugger only its read offset; a down-buffer the other
// way round.
#include "rtt.h"

#include <string.h>

struct rtt_ring {
  const char *name;
  char *buf;
  uint32_t size;
  volatile uint32_t wr;
  volatile uint32_t rd;
  uint32_t flags;  // 1: SEGGER's NO_BLOCK_TRIM mode
};

struct rtt_cb {
  char id[16];
  int32_t max_up;
  int32_t max_down;
  struct rtt_ring up[2];
  struct rtt_ring down[1];
};

struct rtt_cb _SEGGER_RTT;
static char terminal_up[256];
static char trace_up[512];
static char terminal_down[32];

static void ring_init(struct rtt_ring *r, const char *name, char *buf, uint32_t size) {
  r->name = name;
  r->buf = buf;
  r->size = size;
  r->wr = 0;
  r->rd = 0;
  r->flags = 1;
}

void rtt_init(void) {
  struct rtt_cb *cb = &_SEGGER_RTT;
  cb->max_up = 2;
  cb->max_down = 1;
  ring_init(&cb->up[RTT_TERMINAL], "Terminal", terminal_up, sizeof terminal_up);
  ring_init(&cb->up[RTT_TRACE], "Trace", trace_up, sizeof trace_up);
  ring_init(&cb->down[0], "Terminal", terminal_down, sizeof terminal_down);
  static const char id[] = "SEGGER RTT";
  __asm volatile("dmb" ::: "memory");  // the buffers before the ID
  for (int i = (int)sizeof id - 1; i >= 0; --i) ((volatile char *)cb->id)[i] = id[i];
}

unsigned rtt_write(unsigned channel, const char *s, unsigned n) {
  struct rtt_ring *r = &_SEGGER_RTT.up[channel];
  uint32_t wr = r->wr;
  const uint32_t rd = r->rd;
  const uint32_t room = (rd + r->size - wr - 1u) % r->size;
  if (n > room) n = room;
  for (unsigned i = 0; i < n; ++i) {
    r->buf[wr] = s[i];
    wr = (wr + 1u) % r->size;
  }
  __asm volatile("dmb" ::: "memory");  // the data before the offset
  r->wr = wr;
  return n;
}

void rtt_puts(unsigned channel, const char *s) { rtt_write(channel, s, (unsigned)strlen(s)); }

int rtt_getc(void) {
  struct rtt_ring *r = &_SEGGER_RTT.down[0];
  const uint32_t rd = r->rd;
  if (rd == r->wr) return -1;
  __asm volatile("dmb" ::: "memory");  // the offset before the data
  const int c = (unsigned char)r->buf[rd];
  __asm volatile("dmb" ::: "memory");  // the data before the slot is given back
  r->rd = (rd + 1u) % r->size;
  return c;
}
