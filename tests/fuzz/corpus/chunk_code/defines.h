/* Registers */
#ifndef REGS_H
#define REGS_H
#define RCC_BASE 0x40021000u
#define RCC_APB2ENR (*(volatile unsigned *)(RCC_BASE + 0x18))
typedef struct { volatile unsigned CRL, CRH, IDR, ODR; } GPIO_TypeDef;
enum mode { INPUT = 0, OUTPUT = 1 };
static inline void set(GPIO_TypeDef *g, int pin) { g->ODR |= (1u << pin); }
const char *s = "} not a brace { // nor a comment";
char c = '}';
#endif
