/* The per-model arena: one allocation for parameters, gradients
 * and activations, so a model's memory is one number known before training
 * starts, and pointers into it never move. */
#include "ps_engine.h"
#include "ps_error.h"
#include "ps_log.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define ARENA_ALIGN 64 /* cache line and AVX-512 vector */

static ps_arena_allocator_t g_alloc; /* {NULL, NULL}: host memory */
static atomic_size_t g_bytes;        /* every committed arena of the process */

size_t ps_arena_bytes(void)
{
    return atomic_load_explicit(&g_bytes, memory_order_relaxed);
}

void ps_arena_set_allocator(const ps_arena_allocator_t *al)
{
    if (al && al->alloc && al->free) g_alloc = *al;
    else memset(&g_alloc, 0, sizeof g_alloc);
}

static void arena_release(ps_arena_t *a)
{
    if (a->base) atomic_fetch_sub_explicit(&g_bytes, a->size, memory_order_relaxed);
    if (a->release) a->release(a->base);
    else free(a->base);
}

void ps_arena_begin_sizing(ps_arena_t *a)
{
    size_t act = a->act_bytes;
    arena_release(a);
    memset(a, 0, sizeof *a);
    a->sizing = 1;
    a->act_bytes = act;
}

int ps_arena_commit(ps_arena_t *a)
{
    if (!a->sizing) {
        ps_error("ps_arena_commit called without ps_arena_begin_sizing");
        return PS_ESTATE;
    }
    size_t size = a->used ? a->used : ARENA_ALIGN;
    /* zeroed: gradients start at 0 and padding never holds NaN garbage */
    void *p = NULL;
    if (g_alloc.alloc) {
        p = g_alloc.alloc(size);
        if (!p) {
            ps_error("arena: cannot allocate %zu bytes (backend allocator)", size);
            return PS_ENOMEM;
        }
        a->release = g_alloc.free;
    } else {
        if (posix_memalign(&p, ARENA_ALIGN, size)) {
            ps_error("arena: cannot allocate %zu bytes", size);
            return PS_ENOMEM;
        }
        memset(p, 0, size);
        a->release = NULL;
    }
    a->base = p;
    a->size = size;
    atomic_fetch_add_explicit(&g_bytes, size, memory_order_relaxed);
    a->used = 0;
    a->sizing = 0;
    return 0;
}

static float *take(ps_arena_t *a, size_t numel, size_t es)
{
    if (numel > (SIZE_MAX - ARENA_ALIGN) / es) {
        ps_error("arena: request of %zu elements of %zu bytes overflows", numel, es);
        return NULL;
    }
    size_t bytes = (numel * es + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
    if (a->sizing) {
        a->used += bytes;
        return NULL;
    }
    if (!a->base || bytes > a->size - a->used) {
        ps_error("arena: request of %zu elements of %zu bytes exceeds the sized arena (%zu of "
                 "%zu bytes used) - pass 2 must take the same sizes as pass 1", numel, es,
                 a->used, a->size);
        return NULL;
    }
    float *p = (float *)(a->base + a->used);
    a->used += bytes;
    return p;
}

float *ps_arena_take(ps_arena_t *a, size_t numel)
{
    return take(a, numel, sizeof(float));
}

float *ps_arena_take_act(ps_arena_t *a, size_t numel)
{
    return take(a, numel, a->act_bytes ? a->act_bytes : sizeof(float));
}

void ps_arena_view(ps_arena_t *view, const ps_arena_t *parent, void *base, size_t bytes)
{
    memset(view, 0, sizeof *view);
    view->act_bytes = parent->act_bytes;
    view->base = base;
    view->size = base ? bytes : 0;
    view->sizing = base == NULL;
}

void ps_arena_free(ps_arena_t *a)
{
    if (!a) return;
    arena_release(a);
    memset(a, 0, sizeof *a);
}
