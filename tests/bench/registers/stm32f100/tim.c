// TIM2 as a 1 kHz tick with its update interrupt.
#include <stdint.h>

#define REG(addr) (*(volatile uint32_t*)(addr))

#define RCC_APB1ENR REG(0x4002101C)
#define RCC_APB1ENR_TIM2EN (1u << 0)

#define TIM2_CR1 REG(0x40000000)
#define TIM2_DIER REG(0x4000000C)
#define TIM2_SR REG(0x40000010)
#define TIM2_EGR REG(0x40000014)
#define TIM2_PSC REG(0x40000028)
#define TIM2_ARR REG(0x4000002C)
#define TIM_CR1_CEN (1u << 0)
#define TIM_CR1_ARPE (1u << 7)
#define TIM_DIER_UIE (1u << 0)
#define TIM_SR_UIF (1u << 0)
#define TIM_EGR_UG (1u << 0)

volatile uint32_t ticks;

void tim2_init(uint32_t pclk) {
  RCC_APB1ENR |= RCC_APB1ENR_TIM2EN;
  TIM2_PSC = pclk / 1000000u - 1u;
  TIM2_ARR = 999u;
  TIM2_EGR = TIM_EGR_UG;
  TIM2_DIER |= TIM_DIER_UIE;
  TIM2_CR1 |= TIM_CR1_ARPE | TIM_CR1_CEN;
}

void TIM2_IRQHandler(void) {
  if (TIM2_SR & TIM_SR_UIF) {
    TIM2_SR &= ~TIM_SR_UIF;
    ++ticks;
  }
}
