/* The step order of cuk_gemv_q8t's two forms (cuda/gemv_q8t.cu) and their k-split rules, in plain
 * C so that tests/test_q8t_order.c checks them without a GPU. A row's k is cut into 256-element
 * steps; residue group G (0..7) is the steps G, G + 8, G + 16, ..; a k-range of kw ranges takes
 * the ng = 8 / kw groups G0 = ks * ng .. G0 + ng - 1, walked group by group, each group's steps
 * ascending (the dp4a kernel's residue sums: cuda/cuk_q8.h). */
#ifndef G5_Q8T_ORDER_H
#define G5_Q8T_ORDER_H

#include <stdint.h>

#ifdef __CUDACC__
#define Q8T_HD static inline __host__ __device__
#else
#define Q8T_HD static inline
#endif

/* Step r (0-based) of the range's walk, or -1 past its end. */
Q8T_HD int q8t_nth_step(int G0, int ng, int steps, int r) {
    for (int gi = 0; gi < ng; gi++) {
        const int G = G0 + gi;
        if (G >= steps) return -1;
        const int cnt = (steps - G + 7) / 8;
        if (r < cnt) return G + 8 * r;
        r -= cnt;
    }
    return -1;
}

/* How many steps the range walks (range 0, G0 = 0, walks the most). */
Q8T_HD int q8t_range_steps(int G0, int ng, int steps) {
    int n = 0;
    for (int gi = 0; gi < ng && G0 + gi < steps; gi++) n += (steps - G0 - gi + 7) / 8;
    return n;
}

/* The step after st (in group gi): the group's next, else the next group's first; `steps` (or
 * more) when the walk is done. *gn gets the group it is in (gi + 1: group gi is finished). */
Q8T_HD int q8t_next_step(int G0, int ng, int steps, int gi, int st, int *gn) {
    int sn = st + 8, g = gi;
    if (sn >= steps) {
        g++;
        sn = g < ng ? G0 + g : steps;
    }
    *gn = g;
    return sn;
}

/* The L1 form's warps per 16-row tile: split k until about 2048 warps run (16 per SM of an H200),
 * while every warp keeps at least 2 steps. */
Q8T_HD int q8t_kw_l1(int64_t m, int64_t k) {
    const int64_t tiles = (m + 15) / 16, steps = k / 256;
    int kw = 1;
    while (kw < 8 && tiles * kw < 2048 && steps >= 4 * kw) kw *= 2;
    return kw;
}

/* The sx form's k-ranges per 128-row block: split k until about 256 CTAs run (2 per SM of an
 * H100/H200) while every range keeps at least 4 steps, and until a range's x fits max_steps slots
 * where it can (past 8 ranges the kernel takes a range in chunks). */
Q8T_HD int q8t_kw_sx(int64_t blocks, int steps, int max_steps) {
    int kw = 1;
    while (kw < 8 && (q8t_range_steps(0, 8 / kw, steps) > max_steps || (blocks * kw < 256 && steps >= 4 * kw))) kw *= 2;
    return kw;
}

#endif
