// SPI1 as a master at PCLK/16, 8-bit frames, software slave select.
#include <stdint.h>

#define REG(addr) (*(volatile uint32_t*)(addr))

#define RCC_APB2ENR REG(0x40021018)
#define RCC_APB2ENR_SPI1EN (1u << 12)
#define RCC_APB2ENR_IOPAEN (1u << 2)

#define SPI1_CR1 REG(0x40013000)
#define SPI1_CR2 REG(0x40013004)
#define SPI1_SR REG(0x40013008)
#define SPI1_DR REG(0x4001300C)
#define SPI_CR1_MSTR (1u << 2)
#define SPI_CR1_BR_Pos 3
#define SPI_CR1_SPE (1u << 6)
#define SPI_CR1_SSI (1u << 8)
#define SPI_CR1_SSM (1u << 9)
#define SPI_CR2_RXNEIE (1u << 6)
#define SPI_SR_RXNE (1u << 0)
#define SPI_SR_TXE (1u << 1)
#define SPI_SR_BSY (1u << 7)

void spi_init(void) {
  RCC_APB2ENR |= RCC_APB2ENR_SPI1EN | RCC_APB2ENR_IOPAEN;
  SPI1_CR1 = SPI_CR1_MSTR | (3u << SPI_CR1_BR_Pos) | SPI_CR1_SSM | SPI_CR1_SSI;
  SPI1_CR2 |= SPI_CR2_RXNEIE;
  SPI1_CR1 |= SPI_CR1_SPE;
}

uint8_t spi_transfer(uint8_t out) {
  while (!(SPI1_SR & SPI_SR_TXE)) {
  }
  SPI1_DR = out;
  while (!(SPI1_SR & SPI_SR_RXNE)) {
  }
  return (uint8_t)SPI1_DR;
}

void spi_wait_idle(void) {
  while (SPI1_SR & SPI_SR_BSY) {
  }
}
