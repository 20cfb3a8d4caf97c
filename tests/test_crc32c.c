/* ps_crc32c: published check values (the CRC catalogue's "123456789" and
 * RFC 3720 appendix B.4), a bit-at-a-time reference written here, and the
 * hardware path against the table path on every length 0..300 at every
 * alignment, plus long buffers that cross the 3-way interleave blocks. */
#include "ps_crc32c.h"
#include "tests/lib/tap.h"

#include <stdint.h>
#include <string.h>

static uint64_t rng_state = 0x243f6a8885a308d3ull;
static uint8_t rnd8(void)
{
    rng_state ^= rng_state << 13; rng_state ^= rng_state >> 7; rng_state ^= rng_state << 17;
    return (uint8_t)(rng_state >> 24);
}

/* one bit at a time, straight from the definition */
static uint32_t crc_bitwise(uint32_t crc, const uint8_t *p, size_t n)
{
    crc = ~crc;
    while (n--) {
        crc ^= *p++;
        for (int k = 0; k < 8; k++) crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1)));
    }
    return ~crc;
}

int main(void)
{
    uint8_t buf[48];
    diag("hardware crc32 in use: %d", ps_crc32c_hw());

    is_int(ps_crc32c(0, "123456789", 9), 0xe3069283u, "check value \"123456789\"");
    is_int(ps_crc32c_sw(0, "123456789", 9), 0xe3069283u, "check value \"123456789\" (sw)");
    is_int(ps_crc32c(0, "", 0), 0, "empty buffer -> 0");
    is_int(ps_crc32c(0x12345678u, NULL, 0), 0x12345678u, "zero length keeps the running crc");

    memset(buf, 0, 32);
    is_int(ps_crc32c(0, buf, 32), 0x8a9136aau, "RFC 3720: 32 bytes of zeros");
    is_int(ps_crc32c_sw(0, buf, 32), 0x8a9136aau, "RFC 3720: 32 bytes of zeros (sw)");
    memset(buf, 0xff, 32);
    is_int(ps_crc32c(0, buf, 32), 0x62a8ab43u, "RFC 3720: 32 bytes of 0xff");
    for (int i = 0; i < 32; i++) buf[i] = (uint8_t)i;
    is_int(ps_crc32c(0, buf, 32), 0x46dd794eu, "RFC 3720: 32 incrementing bytes");
    for (int i = 0; i < 32; i++) buf[i] = (uint8_t)(31 - i);
    is_int(ps_crc32c(0, buf, 32), 0x113fdb5cu, "RFC 3720: 32 decrementing bytes");
    static const uint8_t iscsi[48] = {
        0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18,
        0x28, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
    is_int(ps_crc32c(0, iscsi, 48), 0xd9963a56u, "RFC 3720: iSCSI read PDU");
    is_int(ps_crc32c_sw(0, iscsi, 48), 0xd9963a56u, "RFC 3720: iSCSI read PDU (sw)");

    /* every length 0..300 at alignments 0..7, hw == sw == bitwise */
    static uint8_t big[3 * 8192 * 2 + 3 * 256 * 3 + 64];
    for (size_t i = 0; i < sizeof big; i++) big[i] = rnd8();
    long bad = 0, cases = 0;
    for (size_t off = 0; off < 8; off++)
        for (size_t len = 0; len <= 300; len++, cases++) {
            uint32_t seed = len & 1 ? 0 : 0xdeadbeefu;
            uint32_t ref = crc_bitwise(seed, big + off, len);
            bad += ps_crc32c(seed, big + off, len) != ref || ps_crc32c_sw(seed, big + off, len) != ref;
        }
    is_int(bad, 0, "%ld (length, alignment) cases: hw == sw == bitwise", cases);

    /* lengths around the 3x256 and 3x8192 interleave thresholds */
    static const size_t lens[] = {767, 768, 769, 1536, 1543, 2304 + 5, 24575, 24576, 24577,
                                  49152, 49152 + 768 + 7, sizeof big - 7};
    bad = 0;
    for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++)
        for (size_t off = 0; off < 8; off += 3) {
            size_t len = lens[k] + off <= sizeof big ? lens[k] : sizeof big - off;
            uint32_t ref = crc_bitwise(0, big + off, len);
            if (ps_crc32c(0, big + off, len) != ref || ps_crc32c_sw(0, big + off, len) != ref) {
                bad++;
                diag("length %zu offset %zu differs", len, off);
            }
        }
    is_int(bad, 0, "long buffers across the interleave block sizes agree with bitwise");

    /* incremental == one-shot for many split points */
    size_t total = sizeof big - 8;
    uint32_t whole = ps_crc32c(0, big, total);
    bad = 0;
    for (size_t cut = 0; cut <= total; cut += 997) {
        uint32_t c = ps_crc32c(0, big, cut);
        c = ps_crc32c(c, big + cut, total - cut);
        uint32_t s = ps_crc32c_sw(ps_crc32c_sw(0, big, cut), big + cut, total - cut);
        bad += c != whole || s != whole;
    }
    is_int(bad, 0, "split anywhere: crc(crc(a), b) == crc(ab), hw and sw");
    /* a flipped bit anywhere changes the crc */
    big[12345] ^= 0x10;
    ok(ps_crc32c(0, big, total) != whole, "one flipped bit changes the crc");
    return tap_done();
}
