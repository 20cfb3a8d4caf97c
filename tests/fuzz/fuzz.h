/* Shared by the libFuzzer harnesses in this folder.  Each harness defines
 * one entry point named PS_FUZZ_ENTRY: LLVMFuzzerTestOneInput when built by
 * build.sh, a distinct name when tests/test_fuzz_replay.c #includes every
 * harness into one normal program that replays the seed corpus. */
#ifndef PS_FUZZ_H
#define PS_FUZZ_H
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* Where FUZZ_CHECK reports (stderr unless the replay test, which silences
 * the parsers' own stderr chatter, points it elsewhere). */
static FILE *fuzz_report_file;

/* A broken invariant is a bug: abort so libFuzzer saves the input and the
 * replay test fails. */
#define FUZZ_CHECK(cond, ...)                                                   \
    do {                                                                        \
        if (!(cond)) {                                                          \
            FILE *fr_ = fuzz_report_file ? fuzz_report_file : stderr;           \
            fprintf(fr_, "fuzz invariant failed at %s:%d: ", __FILE__, __LINE__); \
            fprintf(fr_, __VA_ARGS__);                                          \
            fputc('\n', fr_);                                                   \
            fflush(fr_);                                                        \
            abort();                                                            \
        }                                                                       \
    } while (0)
#endif

#ifndef PS_FUZZ_ENTRY
#define PS_FUZZ_ENTRY LLVMFuzzerTestOneInput
#endif
