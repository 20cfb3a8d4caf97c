/* CRC32C (Castagnoli, reflected polynomial 0x82F63B78).
 *
 * Software: slicing-by-8 tables.  Hardware: the SSE4.2 crc32 instruction has
 * a 3-cycle latency but 1-cycle throughput, so one dependent chain runs at a
 * third of the possible speed.  Large buffers are cut into three adjacent
 * blocks whose CRCs run interleaved and are then joined by "shifting" a CRC
 * over the length of the following block (a linear map in GF(2), tabulated
 * once), after Mark Adler's crc32c.c. */
#include "ps_crc32c.h"

#include <pthread.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define PS_CRC_X86 1
#endif

#define POLY 0x82f63b78u
#define LONG_BLK 8192
#define SHORT_BLK 256

static uint32_t sw_table[8][256];
#ifdef PS_CRC_X86
static uint32_t shift_long[4][256], shift_short[4][256];
#endif
static int crc_have_hw;
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

/* ---- GF(2) operators for appending zeros --------------------------------- */
#ifdef PS_CRC_X86
static uint32_t gf2_times(const uint32_t *mat, uint32_t vec)
{
    uint32_t sum = 0;
    for (; vec; vec >>= 1, mat++)
        if (vec & 1) sum ^= *mat;
    return sum;
}

static void gf2_square(uint32_t *sq, const uint32_t *mat)
{
    for (int n = 0; n < 32; n++) sq[n] = gf2_times(mat, mat[n]);
}

/* Operator that appends len zero bytes (len a power of two) to a raw CRC. */
static void zeros_op(uint32_t *even, size_t len)
{
    uint32_t odd[32], row = 1;
    odd[0] = POLY; /* one zero bit */
    for (int n = 1; n < 32; n++, row <<= 1) odd[n] = row;
    gf2_square(even, odd); /* two bits */
    gf2_square(odd, even); /* four bits */
    /* each square doubles: the first one below gives one zero byte */
    do {
        gf2_square(even, odd);
        len >>= 1;
        if (!len) return;
        gf2_square(odd, even);
        len >>= 1;
    } while (len);
    memcpy(even, odd, sizeof odd);
}

static void zeros_table(uint32_t tab[4][256], size_t len)
{
    uint32_t op[32];
    zeros_op(op, len);
    for (uint32_t n = 0; n < 256; n++)
        for (int k = 0; k < 4; k++) tab[k][n] = gf2_times(op, n << (8 * k));
}

static inline uint32_t crc_shift(uint32_t tab[4][256], uint32_t crc)
{
    return tab[0][crc & 0xff] ^ tab[1][(crc >> 8) & 0xff] ^ tab[2][(crc >> 16) & 0xff] ^
           tab[3][crc >> 24];
}
#endif

static void crc_init(void)
{
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ POLY : c >> 1;
        sw_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = sw_table[0][n];
        for (int k = 1; k < 8; k++) {
            c = sw_table[0][c & 0xff] ^ (c >> 8);
            sw_table[k][n] = c;
        }
    }
#ifdef PS_CRC_X86
    __builtin_cpu_init();
    crc_have_hw = !!__builtin_cpu_supports("sse4.2");
    if (crc_have_hw) {
        zeros_table(shift_long, LONG_BLK);
        zeros_table(shift_short, SHORT_BLK);
    }
#endif
}

static inline uint64_t load64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static uint32_t crc_sw(uint32_t crc, const unsigned char *p, size_t len)
{
    uint64_t c = crc ^ 0xffffffffu;
    while (len && ((uintptr_t)p & 7)) {
        c = sw_table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
        len--;
    }
    /* slicing-by-8 assumes little-endian word loads */
    for (; len >= 8; len -= 8, p += 8) {
        uint64_t w = load64(p) ^ c;
        c = sw_table[7][w & 0xff] ^ sw_table[6][(w >> 8) & 0xff] ^ sw_table[5][(w >> 16) & 0xff] ^
            sw_table[4][(w >> 24) & 0xff] ^ sw_table[3][(w >> 32) & 0xff] ^
            sw_table[2][(w >> 40) & 0xff] ^ sw_table[1][(w >> 48) & 0xff] ^ sw_table[0][w >> 56];
    }
    while (len--) c = sw_table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    return (uint32_t)c ^ 0xffffffffu;
}

#ifdef PS_CRC_X86
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const unsigned char *p,
                                                          size_t len)
{
    uint64_t c0 = crc ^ 0xffffffffu, c1, c2;
    while (len && ((uintptr_t)p & 7)) {
        c0 = _mm_crc32_u8((uint32_t)c0, *p++);
        len--;
    }
    while (len >= 3 * LONG_BLK) {
        const unsigned char *end = p + LONG_BLK;
        c1 = c2 = 0;
        do {
            c0 = _mm_crc32_u64(c0, load64(p));
            c1 = _mm_crc32_u64(c1, load64(p + LONG_BLK));
            c2 = _mm_crc32_u64(c2, load64(p + 2 * LONG_BLK));
            p += 8;
        } while (p < end);
        c0 = crc_shift(shift_long, (uint32_t)c0) ^ c1;
        c0 = crc_shift(shift_long, (uint32_t)c0) ^ c2;
        p += 2 * LONG_BLK;
        len -= 3 * LONG_BLK;
    }
    while (len >= 3 * SHORT_BLK) {
        const unsigned char *end = p + SHORT_BLK;
        c1 = c2 = 0;
        do {
            c0 = _mm_crc32_u64(c0, load64(p));
            c1 = _mm_crc32_u64(c1, load64(p + SHORT_BLK));
            c2 = _mm_crc32_u64(c2, load64(p + 2 * SHORT_BLK));
            p += 8;
        } while (p < end);
        c0 = crc_shift(shift_short, (uint32_t)c0) ^ c1;
        c0 = crc_shift(shift_short, (uint32_t)c0) ^ c2;
        p += 2 * SHORT_BLK;
        len -= 3 * SHORT_BLK;
    }
    for (; len >= 8; len -= 8, p += 8) c0 = _mm_crc32_u64(c0, load64(p));
    while (len--) c0 = _mm_crc32_u8((uint32_t)c0, *p++);
    return (uint32_t)c0 ^ 0xffffffffu;
}
#endif

uint32_t ps_crc32c_sw(uint32_t crc, const void *buf, size_t len)
{
    pthread_once(&crc_once, crc_init);
    return len ? crc_sw(crc, buf, len) : crc;
}

uint32_t ps_crc32c(uint32_t crc, const void *buf, size_t len)
{
    pthread_once(&crc_once, crc_init);
    if (!len) return crc;
#ifdef PS_CRC_X86
    if (crc_have_hw) return crc_hw(crc, buf, len);
#endif
    return crc_sw(crc, buf, len);
}

int ps_crc32c_hw(void)
{
    pthread_once(&crc_once, crc_init);
    return crc_have_hw;
}
