// ADC1 scanning one channel continuously into memory with DMA1 channel 1.
#include <stdint.h>

#define REG(addr) (*(volatile uint32_t*)(addr))

#define RCC_AHBENR REG(0x40021014)
#define RCC_AHBENR_DMA1EN (1u << 0)
#define RCC_APB2ENR REG(0x40021018)
#define RCC_APB2ENR_ADC1EN (1u << 9)

#define ADC1_CR2 REG(0x40012408)
#define ADC1_SMPR2 REG(0x40012410)
#define ADC1_SQR3 REG(0x40012434)
#define ADC1_DR REG(0x4001244C)
#define ADC_CR2_ADON (1u << 0)
#define ADC_CR2_CONT (1u << 1)
#define ADC_CR2_CAL (1u << 2)
#define ADC_CR2_DMA (1u << 8)

#define DMA1_CCR1 REG(0x40020008)
#define DMA1_CNDTR1 REG(0x4002000C)
#define DMA1_CPAR1 REG(0x40020010)
#define DMA1_CMAR1 REG(0x40020014)
#define DMA_CCR1_EN (1u << 0)
#define DMA_CCR1_CIRC (1u << 5)
#define DMA_CCR1_MINC (1u << 7)
#define DMA_CCR1_PSIZE_Pos 8
#define DMA_CCR1_MSIZE_Pos 10

volatile uint16_t samples[16];

void adc_dma_start(void) {
  RCC_AHBENR |= RCC_AHBENR_DMA1EN;
  RCC_APB2ENR |= RCC_APB2ENR_ADC1EN;
  DMA1_CPAR1 = 0x4001244Cu;
  DMA1_CMAR1 = (uint32_t)(uintptr_t)samples;
  DMA1_CNDTR1 = 16u;
  DMA1_CCR1 =
      DMA_CCR1_MINC | DMA_CCR1_CIRC | (1u << DMA_CCR1_PSIZE_Pos) | (1u << DMA_CCR1_MSIZE_Pos);
  DMA1_CCR1 |= DMA_CCR1_EN;
  ADC1_SMPR2 = 7u;
  ADC1_SQR3 = 0u;
  ADC1_CR2 = ADC_CR2_ADON | ADC_CR2_CONT | ADC_CR2_DMA;
  ADC1_CR2 |= ADC_CR2_CAL;
  while (ADC1_CR2 & ADC_CR2_CAL) {
  }
  ADC1_CR2 |= ADC_CR2_ADON;
}
