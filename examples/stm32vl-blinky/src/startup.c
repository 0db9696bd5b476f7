// Vector table and reset handler for the STM32F100 (Cortex-M3).
#include <stdint.h>

extern uint32_t _estack, _sidata, _sdata, _edata, _sbss, _ebss;
extern int main(void);
void Reset_Handler(void);
void Default_Handler(void);
void HardFault_Handler(void);
void SysTick_Handler(void);

__attribute__((section(".isr_vector"), used)) static void (*const vectors[])(void) = {
    (void (*)(void))&_estack,
    Reset_Handler,
    Default_Handler,    // NMI
    HardFault_Handler,  // HardFault
    HardFault_Handler,  // MemManage
    HardFault_Handler,  // BusFault
    HardFault_Handler,  // UsageFault
    0, 0, 0, 0,
    Default_Handler,    // SVCall
    Default_Handler,    // DebugMon
    0,
    Default_Handler,    // PendSV
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
