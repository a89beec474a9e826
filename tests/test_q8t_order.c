/* cuk_gemv_q8t's step order and k-split rules (cuda/q8t_order.h), without a GPU: the sx form's
 * walk (the n-th step staged in slot n, the cursor that moves a warp on and closes its groups)
 * against the L1 form's nested loops (for each group of the range, its steps ascending; a leaf
 * merge after each group, empty groups too), for 1..400 steps and every k-split; the split rules'
 * bounds. The two forms' bits are equal only if these walks are. */
#include <stdio.h>

#include "tests/test_util.h"

#include "cuda/q8t_order.h"

enum { MAXS = 400 };

/* The L1 form's walk of range ks of kw: the steps in order, and after which of them (counted)
 * each of the ng groups ends (a group with no steps ends where the previous one did). */
static int l1_walk(int steps, int kw, int ks, int *seq, int *ends) {
    const int ng = 8 / kw, G0 = ks * ng;
    int n = 0;
    for (int gi = 0; gi < ng; gi++) {
        for (int st = G0 + gi; st < steps; st += 8) seq[n++] = st;
        ends[gi] = n;
    }
    return n;
}

static void check_walks(void) {
    static int seq[MAXS], ends[8];
    int bad_nth = 0, bad_count = 0, bad_cursor = 0, cases = 0;
    for (int steps = 1; steps <= MAXS; steps++)
        for (int kw = 1; kw <= 8; kw *= 2)
            for (int ks = 0; ks < kw; ks++) {
                const int ng = 8 / kw, G0 = ks * ng, n = l1_walk(steps, kw, ks, seq, ends);
                cases++;
                bad_count += q8t_range_steps(G0, ng, steps) != n;
                for (int r = 0; r < n; r++) bad_nth += q8t_nth_step(G0, ng, steps, r) != seq[r];
                bad_nth += q8t_nth_step(G0, ng, steps, n) != -1;
                /* the sx kernel's cursor: start at (0, G0), one move per step; a group closes
                 * when the move leaves it, the rest (empty groups) after the walk */
                int gi = 0, st = G0, closed = 0, r = 0;
                for (; r < n; r++) {
                    if (st != seq[r]) bad_cursor++;
                    int gn;
                    const int sn = q8t_next_step(G0, ng, steps, gi, st, &gn);
                    if (gn != gi) {
                        if (gn != gi + 1 || ends[gi] != r + 1) bad_cursor++;
                        closed++;
                    }
                    gi = gn;
                    st = sn;
                }
                if (st < steps) bad_cursor++; /* the walk ends past the last step */
                for (; gi < ng; gi++) closed++;
                if (closed != ng) bad_cursor++;
            }
    T_CHECK(bad_count == 0, "q8t_range_steps = the L1 walk's length in all %d cases (%d wrong)", cases, bad_count);
    T_CHECK(bad_nth == 0, "q8t_nth_step = the L1 walk's r-th step, -1 past it (%d wrong)", bad_nth);
    T_CHECK(bad_cursor == 0, "q8t_next_step walks the L1 order and closes each group after its last step (%d wrong)",
            bad_cursor);
    /* range 0 is the longest: the sx kernel runs that many rounds for every range */
    int bad_long = 0;
    for (int steps = 1; steps <= MAXS; steps++)
        for (int kw = 1; kw <= 8; kw *= 2)
            for (int ks = 1; ks < kw; ks++)
                bad_long += q8t_range_steps(ks * (8 / kw), 8 / kw, steps) > q8t_range_steps(0, 8 / kw, steps);
    T_CHECK(bad_long == 0, "range 0 walks the most steps (%d exceptions)", bad_long);
}

static void check_splits(void) {
    static const int64_t blocks[] = {1, 5, 16, 48, 97, 128, 152, 1210};
    static const int maxs[] = {17, 18, 34, 69};
    int bad = 0, fit = 0, chunks = 0;
    for (size_t b = 0; b < sizeof blocks / sizeof blocks[0]; b++)
        for (size_t mi = 0; mi < sizeof maxs / sizeof maxs[0]; mi++)
            for (int steps = 1; steps <= MAXS; steps++) {
                const int kw = q8t_kw_sx(blocks[b], steps, maxs[mi]);
                if (kw != 1 && kw != 2 && kw != 4 && kw != 8) bad++;
                const int rs = q8t_range_steps(0, 8 / kw, steps);
                if (rs > maxs[mi]) {
                    if (kw != 8) bad++; /* chunks only when k cannot split further */
                    chunks++;
                } else {
                    fit++;
                }
                if (rs < 1) bad++;
                if (blocks[b] * kw > 2 * 256 && rs <= maxs[mi] && kw > 1 &&
                    q8t_range_steps(0, 16 / kw, steps) <= maxs[mi])
                    bad++; /* split further than the 256-CTA target or the slots ask */
            }
    T_CHECK(bad == 0, "q8t_kw_sx: kw in 1, 2, 4, 8; a range of >= 1 step; chunks only at kw 8; no split past the "
            "target (%d wrong; %d fit, %d chunked)", bad, fit, chunks);
    /* GLM-5's products (k <= 16384: 64 steps) fit their slots at once */
    int glm = 1;
    for (int steps = 1; steps <= 64; steps++) glm &= q8t_range_steps(0, 8 / q8t_kw_sx(48, steps, 17), steps) <= 17;
    T_CHECK(glm, "k <= 16384 fits 17 slots a range");
    int bad_l1 = 0;
    for (int64_t m = 1; m <= 200000; m = m * 3 + 1)
        for (int64_t k = 256; k <= (1 << 16); k *= 2) {
            const int kw = q8t_kw_l1(m, k);
            bad_l1 += (kw != 1 && kw != 2 && kw != 4 && kw != 8) || (kw > 1 && k / 256 < 2 * kw);
        }
    T_CHECK(bad_l1 == 0, "q8t_kw_l1: kw in 1, 2, 4, 8 and >= 2 steps a warp (%d wrong)", bad_l1);
}

int main(void) {
    check_walks();
    check_splits();
    return t_report("test_q8t_order");
}
