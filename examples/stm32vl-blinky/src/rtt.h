// RTT channels in SEGGER's layout: a control block named _SEGGER_RTT in RAM
// that a debugger (fwai, J-Link, OpenOCD, probe-rs) finds and reads while
// the core runs. Up-channel 0 "Terminal" carries the log, up-channel 1
// "Trace" a periodic trace; down-channel 0 "Terminal" takes commands.
#pragma once

#include <stdint.h>

#define RTT_TERMINAL 0u
#define RTT_TRACE 1u

// Sets up the control block; the ID is written last, so a debugger never
// finds a half-made block.
void rtt_init(void);
// Writes what fits of `s` to up-channel `channel` and returns that many
// bytes; never waits for the debugger (what does not fit is dropped).
unsigned rtt_write(unsigned channel, const char* s, unsigned n);
void rtt_puts(unsigned channel, const char* s);
// The next byte a debugger wrote to down-channel 0, or -1.
int rtt_getc(void);
