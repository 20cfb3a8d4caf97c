/* CRC32C (Castagnoli) of wire payloads: SSE4.2 crc32 instruction where the
 * CPU has it (chosen once at run time), table-driven otherwise. */
#ifndef PS_CRC32C_H
#define PS_CRC32C_H
#include <stddef.h>
#include <stdint.h>
/* Extend crc (start with 0) over buf[0..len). */
uint32_t ps_crc32c(uint32_t crc, const void *buf, size_t len);
/* The portable implementation, exposed so tests compare the two. */
uint32_t ps_crc32c_sw(uint32_t crc, const void *buf, size_t len);
/* 1 if ps_crc32c uses the SSE4.2 instruction (for benchmarks to report). */
int ps_crc32c_hw(void);
#endif
