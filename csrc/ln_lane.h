/*
 * ln_lane.h - the primitives in lane form: the same sums as ln_ref.h, but
 * written as arrays of LN_LANES accumulators updated by inner loops over
 * the lanes, with no per-element %, so that GCC and Clang keep the lanes in
 * vector registers and vectorize every loop for the target they compile
 * for (NEON on aarch64, AVX2 or AVX-512 on x86). Each lane sees the same
 * additions in the same order as in the reference, and the formulas are
 * the shared ones of ln_elem.h, so the results are the reference's bit for
 * bit. Part of the kernel template (see ln_tmpl.h). No include guard.
 *
 * Whole rows of LN_LANES elements are read and written with the level's
 * LN_LOAD_ROW / LN_STORE_ROW when it defines them (x86 converts float16 a
 * register at a time), else element by element.
 *
 * x and y may be the same row (in-place calls), so neither is restrict;
 * the parameters are never written.
 */
#include "ln_elem.h"

/*
 * A whole row of LN_LANES elements at p: levels that convert a row at a
 * time (LN_LOAD_ROW, x86 for float16) fill a row buffer first, others
 * load element j where it is used (GCC then keeps the lanes in registers).
 * LN_ROW_DECL(name, p) opens a row, LN_ROW_GET(name, p, j) is its element j.
 */
#undef LN_ROW_DECL
#undef LN_ROW_GET
#if defined(LN_LOAD_ROW)
#define LN_ROW_DECL(name, p) LN_T name[LN_LANES]; LN_LOAD_ROW(name, (p))
#define LN_ROW_GET(name, p, j) name[j]
#else
#define LN_ROW_DECL(name, p) (void)0
#define LN_ROW_GET(name, p, j) LN_LOAD((p) + (j))
#endif

/* Records of at most LN_SHORT features take the short path: all of
 * LN_LANES for float lanes, half of them for double lanes (32 doubles would
 * take four 512-bit registers for what usually fits in two). */
#undef LN_SHORT
#define LN_SHORT (sizeof(LN_T) == 8 ? LN_LANES / 2 : LN_LANES)

/*
 * Short records (d <= LN_SHORT): one partial block with at most one
 * element per lane, so total lane j is exactly +0.0 + (double)(+0 + v_j)
 * for j < d and +0.0 beyond, which add nothing to the tree (lanes are
 * never -0.0: +0 + -0 is +0). The record is read with masked loads into a
 * zero-padded row and reduced in registers: the same bits as the general
 * loops, with a fraction of their fixed cost per record.
 */
LN_ALWAYS_INLINE void LN_FN(load_part)(LN_T v[LN_LANES], const LN_S *x, size_t d,
                                       size_t width)
{
#if defined(LN_LOAD_PART)
    LN_LOAD_PART(v, x, d, width);
#else
    for (size_t j = 0; j < width; j++)
        v[j] = j < d ? LN_LOAD(x + j) : (LN_T)0;
#endif
}

/* The tree over the first w lanes (w a power of two >= d): the same as
 * over all LN_LANES when the others are +0.0. */
LN_ALWAYS_INLINE double LN_FN(tree_short)(double t[LN_LANES], size_t w)
{
    LN_UNROLL
    for (size_t h = w / 2; h >= 1; h /= 2)
        LN_UNROLL
        for (size_t j = 0; j < h; j++)
            t[j] += t[j + h];
    return t[0];
}

/* The short sums from the record's row v, loaded and zero-padded to w
 * lanes (w = LN_SHORT, or half of it for records that fit: lanes past d
 * are +0.0 and add nothing to the tree, so w never changes a bit). */
LN_ALWAYS_INLINE double LN_FN(sum_shifted_row)(const LN_T v[LN_LANES], size_t d, LN_T shift,
                                               size_t w)
{
    LN_T u[LN_LANES];
    double t[LN_LANES];
    for (size_t j = 0; j < w; j++)
        u[j] = j < d ? v[j] - shift : (LN_T)0;
    for (size_t j = 0; j < w; j++)
        t[j] = 0.0 + (double)((LN_T)0 + u[j]);
    return LN_FN(tree_short)(t, w);
}

LN_ALWAYS_INLINE double LN_FN(sum_squares_row)(const LN_T v[LN_LANES], size_t d, LN_T hi,
                                               LN_T lo, size_t w)
{
    LN_T u[LN_LANES];
    double t[LN_LANES];
    for (size_t j = 0; j < w; j++)
        u[j] = j < d ? LN_FN(center)(v[j], hi, lo) : (LN_T)0;
    for (size_t j = 0; j < w; j++)
        t[j] = 0.0 + (double)LN_FN(add_square)((LN_T)0, u[j]);
    return LN_FN(tree_short)(t, w);
}

static double LN_FN(sum_shifted_short)(const LN_S *x, size_t d, LN_T shift)
{
    LN_T v[LN_LANES];
    LN_FN(load_part)(v, x, d, LN_SHORT);
    return LN_FN(sum_shifted_row)(v, d, shift, LN_SHORT);
}

static double LN_FN(sum_squares_short)(const LN_S *x, size_t d, LN_T hi, LN_T lo)
{
    LN_T v[LN_LANES];
    LN_FN(load_part)(v, x, d, LN_SHORT);
    return LN_FN(sum_squares_row)(v, d, hi, lo, LN_SHORT);
}

/* The outputs of a short record from its row v (w lanes): masked stores
 * of the first d. */
LN_ALWAYS_INLINE void LN_FN(apply_row)(const LN_T v[LN_LANES], LN_S *y, size_t d, LN_T hi,
                                       LN_T r, LN_T c, const LN_P *restrict w,
                                       const LN_P *restrict b, size_t width)
{
#if defined(LN_STORE_PART)
    /* Gain and bias are read only below d: padded copies, each made only
     * when there is one. (GCC turns `w && j < d ? w[j] : 1` into masked
     * loads from w, and a masked load from NULL, every lane off, still
     * takes a microcode assist on AMD Zen: a (1, 16) float32 call without
     * gain or bias took 770 ns, against 430 ns with both.) */
    LN_T o[LN_LANES], wp[LN_LANES], bp[LN_LANES];
    if (w)
        for (size_t j = 0; j < width; j++)
            wp[j] = j < d ? (LN_T)w[j] : (LN_T)1;
    if (b)
        for (size_t j = 0; j < width; j++)
            bp[j] = j < d ? (LN_T)b[j] : (LN_T)0;
    for (size_t j = 0; j < width; j++)
        o[j] = LN_FN(affine)(LN_FN(normalize)(v[j], hi, r, c), w ? wp : NULL, b ? bp : NULL, j);
    LN_STORE_PART(y, o, d, width);
#else
    (void)width;
    for (size_t j = 0; j < d; j++)
        LN_STORE(y + j, LN_FN(affine)(LN_FN(normalize)(v[j], hi, r, c), w, b, j));
#endif
}

LN_ALWAYS_INLINE void LN_FN(apply_short)(const LN_S *x, LN_S *y, size_t d, LN_T hi,
                                         LN_T r, LN_T c, const LN_P *restrict w,
                                         const LN_P *restrict b)
{
    LN_T v[LN_LANES];
    LN_FN(load_part)(v, x, d, LN_SHORT);
    LN_FN(apply_row)(v, y, d, hi, r, c, w, b, LN_SHORT);
}

/*
 * Short records a group at a time, transposed: element j of the group's
 * record k is held at v[j][k], so that every step of the contract (the
 * subtraction of the shift, the conversion to double, each level of the
 * tree, the divisions and square roots, the outputs) is one vector
 * operation across LN_SHORT_GROUP records. The rows are moved in and out
 * of that layout by LN_FN(transpose) (vector blocks where the level has
 * them). Same operations in the same order as
 * the one-record short path (the tree over w lanes, w a power of two >= d:
 * lanes past d hold +0.0 and change nothing), so the same bits.
 */
#define LN_HAS_SHORT_ROWS 1

/* Float records of up to two lane rows are done in groups too: lane j then
 * holds (0 + u_j) + u_(j + LN_LANES), as the one block of the general
 * loops makes it (ln_contract.h, item 2), and the tree is over all
 * LN_LANES. (1e6, 40..63) float32 LayerNorm runs about 2x faster than
 * record by record, (1e6, 64) float16 2x; (1e6, 64) float32 RMSNorm, whose
 * record path is two full vectors per pass, about 7% slower. Double
 * records keep to LN_SHORT. */
#undef LN_GROUP_SHORT
#define LN_GROUP_SHORT (sizeof(LN_T) == 8 ? LN_SHORT : 2 * LN_LANES)
_Static_assert(2 * LN_LANES <= LN_BLOCK, "two lane rows make one block");
/* The short groups' statistics are the two-pass ones (ln_contract.h, item
 * 5): no record they take may be one the contract computes in one pass. */
_Static_assert(LN_GROUP_SHORT <= LN_ONE_PASS_MIN_D, "short groups are two-pass records");

/* Is a record of d features short (done in groups)? */
LN_ALWAYS_INLINE int LN_FN(is_short)(size_t d) { return d <= LN_GROUP_SHORT; }

typedef struct {
    union {
        LN_T v[2 * LN_LANES][LN_SHORT_GROUP];    /* transposed */
        LN_T rows[LN_SHORT_GROUP][2 * LN_LANES]; /* or in rows, for the level's own loops */
    };
    double mean[LN_SHORT_GROUP], var[LN_SHORT_GROUP], rstd[LN_SHORT_GROUP];
    LN_T hi[LN_SHORT_GROUP], lo[LN_SHORT_GROUP];
} LN_FN(short_group);

/* The lane width of a short record of d features, as group_stats picks
 * it: the smallest power of two >= d from LN_SHORT / 4 up. */
LN_ALWAYS_INLINE size_t LN_FN(group_width)(size_t d)
{
    if (d > LN_SHORT / 2)
        return LN_SHORT;
    return d > LN_SHORT / 4 ? LN_SHORT / 2 : LN_SHORT / 4;
}

/* 1 / sqrt(var + eps) of the group's first `count` records (eps 0 past
 * the n records there are, and for an invalid one: those records are
 * not kept). */
LN_ALWAYS_INLINE void LN_FN(group_rstd)(LN_FN(short_group) *g, size_t count, size_t n,
                                        const double *eps)
{
    for (size_t k = 0; k < count; k++) {
        double e = k < n && ln_eps_is_valid(eps[k]) ? eps[k] : 0.0;
        g->rstd[k] = 1.0 / sqrt(g->var[k] + e); /* ln_inverse_std for valid eps */
    }
}

/* The output pass's factor r and offset c (ln_elem.h) of the first
 * `count` records, in the compute type. */
LN_ALWAYS_INLINE void LN_FN(group_scale)(const LN_FN(short_group) *g, size_t count,
                                         LN_T r[LN_SHORT_GROUP], LN_T c[LN_SHORT_GROUP])
{
    for (size_t k = 0; k < count; k++) {
        r[k] = (LN_T)g->rstd[k];
        c[k] = LN_FN(offset)(g->lo[k], r[k]);
    }
}

/* Are all of the n records kept? */
LN_ALWAYS_INLINE int LN_FN(group_all_kept)(const int *keep, size_t n)
{
    int all = 1;
    for (size_t k = 0; k < n; k++)
        all &= keep[k] != 0;
    return all;
}

/* Each record's total of the group's first w lanes u (those past the
 * record's d features +0.0): the lanes widened to double and added by the
 * tree over w lanes. A block of LN_TOTAL_BLOCK records at a time, the
 * tree's first level added as the lanes are widened, so that the block's
 * lanes stay in registers (the whole group through memory, the
 * conversions' stores and the tree's loads and stores had taken a sixth
 * of a short backward). */
#define LN_TOTAL_BLOCK 4
_Static_assert(LN_SHORT_GROUP % LN_TOTAL_BLOCK == 0, "the group is whole blocks");
LN_ALWAYS_INLINE void LN_FN(group_total)(LN_T u[LN_LANES][LN_SHORT_GROUP], size_t w,
                                         double out[LN_SHORT_GROUP])
{
    for (size_t k0 = 0; k0 < LN_SHORT_GROUP; k0 += LN_TOTAL_BLOCK) {
        double t[LN_LANES / 2][LN_TOTAL_BLOCK];
        size_t h = w / 2;
        LN_UNROLL
        for (size_t j = 0; j < h; j++)
            for (size_t k = 0; k < LN_TOTAL_BLOCK; k++)
                t[j][k] = (double)u[j][k0 + k] + (double)u[j + h][k0 + k];
        LN_UNROLL
        for (h /= 2; h >= 1; h /= 2)
            LN_UNROLL
            for (size_t j = 0; j < h; j++)
                for (size_t k = 0; k < LN_TOTAL_BLOCK; k++)
                    t[j][k] += t[j + h][k];
        for (size_t k = 0; k < LN_TOTAL_BLOCK; k++)
            out[k0 + k] = t[0][k];
    }
}
#undef LN_TOTAL_BLOCK

/* A square block of LN_TBLOCK x LN_TBLOCK values transposed by the
 * level's hooks (x86: 8 floats or 4 doubles, one AVX register a row). */
#undef LN_TBLOCK
#if defined(LN_TRANSPOSE8_F32) && defined(LN_TRANSPOSE4_F64)
#define LN_TBLOCK (sizeof(LN_T) == sizeof(float) ? (size_t)8 : (size_t)4)
LN_ALWAYS_INLINE void LN_FN(transpose_block)(LN_T *dst, size_t ds, const LN_T *src, size_t ss)
{
    if (sizeof(LN_T) == sizeof(float))
        LN_TRANSPOSE8_F32((float *)dst, ds, (const float *)src, ss);
    else
        LN_TRANSPOSE4_F64((double *)dst, ds, (const double *)src, ss);
}
#endif

/* dst[c][r] = src[r][c] for r < nr, c < nc (ds and ss the rows' strides,
 * in elements): the short groups' moves between rows and their
 * transposed layout, data moves only, in blocks where the level gives
 * them: element by element, every value was moved on its own, three
 * times per record in the backward. */
LN_ALWAYS_INLINE void LN_FN(transpose)(LN_T *restrict dst, size_t ds, const LN_T *restrict src,
                                       size_t ss, size_t nr, size_t nc)
{
#if defined(LN_TBLOCK)
    if (nr % LN_TBLOCK == 0 && nc % LN_TBLOCK == 0) {
        for (size_t r = 0; r < nr; r += LN_TBLOCK)
            for (size_t c = 0; c < nc; c += LN_TBLOCK)
                LN_FN(transpose_block)(dst + c * ds + r, ds, src + r * ss + c, ss);
        return;
    }
#endif
    for (size_t c = 0; c < nc; c++)
        for (size_t r = 0; r < nr; r++)
            dst[c * ds + r] = src[r * ss + c];
}

/* Record k's row into rows[k] (zeros past d): the first lane row in
 * [0, w), a second one (d > LN_LANES) in [LN_LANES, 2 LN_LANES). */
LN_ALWAYS_INLINE void LN_FN(group_load)(LN_T rows[LN_SHORT_GROUP][2 * LN_LANES], const char *x,
                                        ptrdiff_t x_row, size_t n, size_t d, size_t w)
{
    size_t d1 = d < LN_LANES ? d : LN_LANES;
    for (size_t k = 0; k < LN_SHORT_GROUP; k++) {
        const LN_S *row = (const LN_S *)(x + (ptrdiff_t)k * x_row);
        if (k < n)
            LN_FN(load_part)(rows[k], row, d1, w);
        else
            for (size_t j = 0; j < w; j++)
                rows[k][j] = 0;
        if (d > LN_LANES && k < n)
            LN_FN(load_part)(rows[k] + LN_LANES, row + LN_LANES, d - LN_LANES, LN_LANES);
        else if (d > LN_LANES)
            for (size_t j = 0; j < LN_LANES; j++)
                rows[k][LN_LANES + j] = 0;
    }
}

/* Each record's total of the statistics' block lanes u_j, plus
 * u_(j + LN_LANES) in the second lane row (LN_T, in that order), by
 * group_total. shifted: u = x - x[0] ((T)0 + u, the block lane, is never
 * -0.0, and 0.0 + it is the total lane); else u = fma(c, c, lane) with c
 * the centered value (for RMSNorm, x itself: hi = lo = 0). */
LN_ALWAYS_INLINE void LN_FN(group_lanes)(LN_T v[2 * LN_LANES][LN_SHORT_GROUP], size_t d,
                                         size_t w, const LN_T hi[LN_SHORT_GROUP],
                                         const LN_T lo[LN_SHORT_GROUP], int shifted,
                                         double out[LN_SHORT_GROUP])
{
    size_t d1 = d < LN_LANES ? d : LN_LANES, d2 = d > LN_LANES ? d - LN_LANES : 0;
    LN_T u[LN_LANES][LN_SHORT_GROUP];
    for (size_t j = 0; j < d1; j++)
        for (size_t k = 0; k < LN_SHORT_GROUP; k++)
            u[j][k] = shifted ? (LN_T)0 + (v[j][k] - v[0][k])
                              : LN_FN(add_square)((LN_T)0, LN_FN(center)(v[j][k], hi[k], lo[k]));
    for (size_t j = 0; j < d2; j++)
        for (size_t k = 0; k < LN_SHORT_GROUP; k++)
            u[j][k] = shifted ? u[j][k] + (v[LN_LANES + j][k] - v[0][k])
                              : LN_FN(add_square)(u[j][k], LN_FN(center)(v[LN_LANES + j][k],
                                                                         hi[k], lo[k]));
    for (size_t j = d1; j < w; j++)
        for (size_t k = 0; k < LN_SHORT_GROUP; k++)
            u[j][k] = 0;
    LN_FN(group_total)(u, w, out);
}

LN_ALWAYS_INLINE void LN_FN(group_stats_w)(LN_FN(short_group) *g, const char *x,
                                           ptrdiff_t x_row, size_t n, size_t d,
                                           const double *eps, int rms, size_t w)
{
    LN_T (*v)[LN_SHORT_GROUP] = g->v, rows[LN_SHORT_GROUP][2 * LN_LANES];
    LN_T hi[LN_SHORT_GROUP], lo[LN_SHORT_GROUP];
    double t[LN_SHORT_GROUP], mean[LN_SHORT_GROUP], dd = (double)d;
    size_t wv = d > LN_LANES ? 2 * LN_LANES : w; /* the rows' width */
    LN_FN(group_load)(rows, x, x_row, n, d, w);
    LN_FN(transpose)(&v[0][0], LN_SHORT_GROUP, &rows[0][0], 2 * LN_LANES, LN_SHORT_GROUP, wv);
    for (size_t k = 0; k < LN_SHORT_GROUP; k++)
        hi[k] = lo[k] = 0;
    if (rms) {
        for (size_t k = 0; k < LN_SHORT_GROUP; k++)
            mean[k] = 0.0;
    } else {
        LN_FN(group_lanes)(v, d, w, hi, lo, 1, t);
        for (size_t k = 0; k < LN_SHORT_GROUP; k++) {
            mean[k] = (double)v[0][k] + t[k] / dd;
            hi[k] = (LN_T)mean[k];
            lo[k] = (LN_T)(mean[k] - (double)hi[k]);
        }
    }
    LN_FN(group_lanes)(v, d, w, hi, lo, 0, t);
    for (size_t k = 0; k < LN_SHORT_GROUP; k++) {
        g->mean[k] = mean[k];
        g->hi[k] = hi[k];
        g->lo[k] = lo[k];
        g->var[k] = t[k] / dd;
    }
    LN_FN(group_rstd)(g, LN_SHORT_GROUP, n, eps);
}

/* Does the level read short records other than float32's in place,
 * converting them in registers (float16 and bfloat16: ln_x86.h's
 * ln_short_stats_narrow16 for a quarter or half a lane row, and
 * ln_short_back_sums_16 for the backward's two lane rows)? float32's are
 * read in place wherever the level has short loops. */
LN_ALWAYS_INLINE int LN_FN(narrow_in_place)(void)
{
#if defined(LN_SHORT_NARROW_KIND)
    return 1;
#elif defined(LN_SHORT_STATS_ROWS)
    return sizeof(LN_S) == sizeof(float);
#else
    return 0;
#endif
}

#if defined(LN_SHORT_STATS_ROWS)
/* The level's own short groups (LN_SHORT_STATS_ROWS and
 * LN_SHORT_OUTPUT_ROWS, ln_x86.h; float compute) for records of more than
 * half a lane row: each record's lanes in registers, its rows left as
 * they are. float32 records of whole lane rows are read where they are;
 * others are first loaded as floats, zero-padded to their lane width,
 * into the group's rows (group_load). Measured against the transposed
 * form, one thread: float32 LayerNorm (1e6, d) d = 64 0.80x the time, 32
 * 0.70x, 48 0.89x, (1e5, 24) 0.91x, (4096, 64) 0.68x; RMSNorm (1e6, 64)
 * 0.75x; float16 and bfloat16 (1e6, 64) 0.75x, (1e6, 32) 0.70-0.78x,
 * (1e5, 24) 0.62-0.69x. d = 16 and 8 were 1.03-1.12x with the masked
 * loads of a whole lane row; read in place as one or two registers, float32
 * d = 16 and 8 now take the level's loops too (group_in_rows). */
_Static_assert(LN_SHORT_GROUP % 4 == 0, "the level's statistics fill four records at a time");

/* Does the level read the records in place (rows of whole registers)?
 * float32 rows of one or two lane rows; with narrow (a constant: only
 * the callers of d = 8 and 16 set it, so that the code of the other
 * widths stays as it was), of a quarter or half a lane row too, and then
 * float16 and bfloat16 rows as well (narrow_in_place). */
LN_ALWAYS_INLINE int LN_FN(group_direct)(size_t d, int narrow)
{
    return (sizeof(LN_S) == sizeof(float) && (d == LN_LANES || d == 2 * LN_LANES)) ||
           (LN_FN(narrow_in_place)() && narrow && (d == LN_LANES / 4 || d == LN_LANES / 2));
}

/* Is the group done by the level's own loops? Records of more than half
 * a lane row, and (narrow) those of d = 8 and 16 it reads in place: float32
 * (4096, 16) in cache 0.78x the time of the transposed form, (4096, 8)
 * 0.94x. float16 and bfloat16 LayerNorm records of any width too, from
 * the group's converted rows: out=, one thread, float16 (1e6, 16)
 * 0.74-0.75x, (1e6, 8) 0.72-0.77x, (1e6, 4) 0.81-0.82x, (4096, 16)
 * 0.75x, bfloat16 (1e6, 16) 0.76x. Not their RMSNorm records: (1e6, 8)
 * took 1.32x as long, (1e6, 4) 1.45x. (Their d = 8 and 16, LayerNorm's
 * and RMSNorm's, are read in place with narrow: float16 (1e6, 16) a
 * further 0.85x, bfloat16 0.97-0.99x, (1e6, 8) 0.91x.) Others of half a
 * lane row or less keep the transposed form. The same bits either way
 * (the lane order). */
LN_ALWAYS_INLINE int LN_FN(group_in_rows)(size_t d, int narrow, int rms)
{
    return d > LN_LANES / 2 || LN_FN(group_direct)(d, narrow) ||
           (sizeof(LN_S) < sizeof(float) && !rms);
}

LN_ALWAYS_INLINE void LN_FN(group_stats_rows)(LN_FN(short_group) *g, const char *x,
                                              ptrdiff_t x_row, size_t n, size_t d,
                                              const double *eps, int rms, int narrow)
{
    const char *src = x;
    ptrdiff_t src_row = x_row;
    if (!LN_FN(group_direct)(d, narrow)) {
        LN_FN(group_load)(g->rows, x, x_row, n, d, LN_FN(group_width)(d));
        src = (const char *)g->rows;
        src_row = (ptrdiff_t)sizeof g->rows[0];
    }
#if defined(LN_SHORT_NARROW_KIND)
    if (sizeof(LN_S) < sizeof(float) && LN_FN(group_direct)(d, narrow)) /* read in place */
        ln_short_stats_narrow16(src, src_row, n, d, rms, g->mean, g->var, g->hi, g->lo,
                                LN_SHORT_NARROW_KIND);
    else
#endif
        LN_SHORT_STATS_ROWS(src, src_row, n, d, rms, g->mean, g->var, g->hi, g->lo);
    LN_FN(group_rstd)(g, n, n, eps);
}
#endif

/* The statistics of the group's n records from x (rows x_row bytes apart).
 * The common widths (d a power of two) get loops of constant length. */
LN_ALWAYS_INLINE void LN_FN(group_stats)(LN_FN(short_group) *g, const char *x,
                                         ptrdiff_t x_row, size_t n, size_t d,
                                         const double *eps, int rms, int narrow)
{
#if defined(LN_SHORT_STATS_ROWS)
    if (LN_FN(group_in_rows)(d, narrow, rms)) {
        LN_FN(group_stats_rows)(g, x, x_row, n, d, eps, rms, narrow);
        return;
    }
#endif
    if (d == 2 * LN_LANES)
        LN_FN(group_stats_w)(g, x, x_row, n, 2 * LN_LANES, eps, rms, LN_LANES);
    else if (d > LN_LANES)
        LN_FN(group_stats_w)(g, x, x_row, n, d, eps, rms, LN_LANES);
    else if (d == LN_SHORT)
        LN_FN(group_stats_w)(g, x, x_row, n, LN_SHORT, eps, rms, LN_SHORT);
    else if (d == LN_SHORT / 2)
        LN_FN(group_stats_w)(g, x, x_row, n, LN_SHORT / 2, eps, rms, LN_SHORT / 2);
    else if (d == LN_SHORT / 4)
        LN_FN(group_stats_w)(g, x, x_row, n, LN_SHORT / 4, eps, rms, LN_SHORT / 4);
    else if (d < LN_SHORT / 4)
        LN_FN(group_stats_w)(g, x, x_row, n, d, eps, rms, LN_SHORT / 4);
    else if (d < LN_SHORT / 2)
        LN_FN(group_stats_w)(g, x, x_row, n, d, eps, rms, LN_SHORT / 2);
    else
        LN_FN(group_stats_w)(g, x, x_row, n, d, eps, rms, LN_SHORT);
}

/* One record's d outputs from its row v (w lanes filled). */
LN_ALWAYS_INLINE void LN_FN(group_store_row)(LN_S *row, const LN_T v[2 * LN_LANES], size_t d,
                                             size_t w)
{
#if defined(LN_STORE_PART)
    /* a lane row at a time: the level's part stores take at most one */
    LN_STORE_PART(row, v, d < LN_LANES ? d : LN_LANES, w < LN_LANES ? w : LN_LANES);
    if (d > LN_LANES)
        LN_STORE_PART(row + LN_LANES, v + LN_LANES, d - LN_LANES, LN_LANES);
#else
    for (size_t j = 0; j < d; j++)
        LN_STORE(row + j, v[j]);
#endif
}

#if defined(LN_STREAM_BYTES)
/* A whole group of contiguous records of at least 128 bytes each in a
 * streamed call (an out= array larger than the caches): packed in a
 * buffer, then written with streaming stores from y's first 64-byte
 * boundary on, so that the output lines are not read in first. float32
 * out=, one thread: (1e6, 64) 79 -> 62 ms, (1e6, 32) 43 -> 38 ms; but
 * (1e6, 16), 1 KiB a group, 21 -> 25 ms, so shorter records are not
 * streamed; nor float16 and bfloat16 records (a group of (1e6, 64) took
 * 1.06-1.10x as long streamed as stored plainly). */
LN_ALWAYS_INLINE void LN_FN(group_stream)(LN_T rows[LN_SHORT_GROUP][2 * LN_LANES], char *y,
                                          size_t n, size_t d, size_t w)
{
    _Alignas(64) LN_S buf[LN_SHORT_GROUP * 2 * LN_LANES];
    const char *src = (const char *)buf;
    if (sizeof(LN_S) == sizeof(LN_T) && d == 2 * LN_LANES)
        src = (const char *)rows; /* float32 rows of two lane rows: packed already */
    else
        for (size_t k = 0; k < n; k++)
            LN_FN(group_store_row)(buf + k * d, rows[k], d, w);
    size_t bytes = n * d * sizeof(LN_S), head = (64 - (uintptr_t)y % 64) % 64;
    head = head < bytes ? head : bytes;
    size_t mid = (bytes - head) / 64 * 64;
    memcpy(y, src, head);
    LN_STREAM_BYTES((void *)(y + head), src + head, mid);
    memcpy(y + head + mid, src + head + mid, bytes - head - mid);
}
#endif

/* The output rows (w lanes filled) of the records k with keep[k] into y
 * (the others are not written). stream: the call streams its outputs. */
LN_ALWAYS_INLINE void LN_FN(group_put)(LN_T rows[LN_SHORT_GROUP][2 * LN_LANES], char *y,
                                       ptrdiff_t y_row, size_t n, size_t d, const int *keep,
                                       int stream, size_t w)
{
#if defined(LN_STREAM_BYTES)
    if (stream && LN_FN(group_all_kept)(keep, n) && y_row == (ptrdiff_t)(d * sizeof(LN_S)) &&
        d * sizeof(LN_S) >= 128 && sizeof(LN_S) >= 4) {
        LN_FN(group_stream)(rows, y, n, d, w);
        return;
    }
#else
    (void)stream;
#endif
    for (size_t k = 0; k < n; k++)
        if (keep[k])
            LN_FN(group_store_row)((LN_S *)(y + (ptrdiff_t)k * y_row), rows[k], d, w);
}

/* The outputs of the records k with keep[k] (the others are not
 * written); wp and bp: the gain and bias, or NULL. stream: the call
 * streams its outputs. */
LN_ALWAYS_INLINE void LN_FN(group_output_d)(LN_FN(short_group) *g, char *y, ptrdiff_t y_row,
                                            size_t n, size_t d, const LN_P *restrict wp,
                                            const LN_P *restrict bp, const int *keep,
                                            int stream, size_t w)
{
    LN_T r[LN_SHORT_GROUP], c[LN_SHORT_GROUP];
    LN_FN(group_scale)(g, LN_SHORT_GROUP, r, c);
    for (size_t j = 0; j < w; j++)
        for (size_t k = 0; k < LN_SHORT_GROUP; k++)
            g->v[j][k] = LN_FN(affine)(LN_FN(normalize)(g->v[j][k], g->hi[k], r[k], c[k]),
                                       wp, bp, j);
    LN_T rows[LN_SHORT_GROUP][2 * LN_LANES];
    LN_FN(transpose)(&rows[0][0], 2 * LN_LANES, &g->v[0][0], LN_SHORT_GROUP, w, LN_SHORT_GROUP);
    LN_FN(group_put)(rows, y, y_row, n, d, keep, stream, w);
}

#if defined(LN_SHORT_STATS_ROWS)
LN_ALWAYS_INLINE void LN_FN(group_output_rows)(LN_FN(short_group) *g, const char *x,
                                               ptrdiff_t x_row, char *y, ptrdiff_t y_row,
                                               size_t n, size_t d, const LN_P *restrict wp,
                                               const LN_P *restrict bp, const int *keep,
                                               int stream, int narrow)
{
    LN_T r[LN_SHORT_GROUP], c[LN_SHORT_GROUP];
    LN_FN(group_scale)(g, n, r, c);
    int direct = LN_FN(group_direct)(d, narrow);
    const char *src = direct ? x : (const char *)g->rows;
    ptrdiff_t src_row = direct ? x_row : (ptrdiff_t)sizeof g->rows[0];
    /* Straight into y, unless streamed; narrow records (of at most 64
     * bytes) never are (group_put): through the group's rows, float32
     * (1e6, 16) out= took 1.08x as long, (1e6, 8) 1.14x. */
    int into_y = direct && (!stream || narrow) && LN_FN(group_all_kept)(keep, n);
    char *dst = into_y ? y : (char *)g->rows;
    ptrdiff_t dst_row = into_y ? y_row : (ptrdiff_t)sizeof g->rows[0];
#if defined(LN_SHORT_NARROW_KIND)
    if (sizeof(LN_S) < sizeof(float) && direct) /* 16-bit rows read in place */
        ln_short_output_narrow16(src, src_row, dst, dst_row, n, d, g->hi, r, c, wp, bp,
                                 LN_SHORT_NARROW_KIND, !into_y);
    else
#endif
        LN_SHORT_OUTPUT_ROWS(src, src_row, dst, dst_row, n, d, g->hi, r, c, wp, bp);
    if (into_y)
        return;
    LN_FN(group_put)(g->rows, y, y_row, n, d, keep, stream,
                     d > LN_LANES ? 2 * LN_LANES : LN_FN(group_width)(d));
}
#endif

LN_ALWAYS_INLINE void LN_FN(group_output)(LN_FN(short_group) *g, const char *x,
                                          ptrdiff_t x_row, char *y, ptrdiff_t y_row,
                                          size_t n, size_t d, const LN_P *restrict wp,
                                          const LN_P *restrict bp, const int *keep,
                                          int stream, int narrow, int rms)
{
#if defined(LN_SHORT_STATS_ROWS)
    if (LN_FN(group_in_rows)(d, narrow, rms)) {
        LN_FN(group_output_rows)(g, x, x_row, y, y_row, n, d, wp, bp, keep, stream, narrow);
        return;
    }
#endif
    if (d == 2 * LN_LANES)
        LN_FN(group_output_d)(g, y, y_row, n, 2 * LN_LANES, wp, bp, keep, stream, 2 * LN_LANES);
    else if (d > LN_LANES)
        LN_FN(group_output_d)(g, y, y_row, n, d, wp, bp, keep, stream, 2 * LN_LANES);
    else if (d == LN_SHORT)
        LN_FN(group_output_d)(g, y, y_row, n, LN_SHORT, wp, bp, keep, stream, LN_SHORT);
    else if (d == LN_SHORT / 2)
        LN_FN(group_output_d)(g, y, y_row, n, LN_SHORT / 2, wp, bp, keep, stream, LN_SHORT / 2);
    else if (d == LN_SHORT / 4)
        LN_FN(group_output_d)(g, y, y_row, n, LN_SHORT / 4, wp, bp, keep, stream, LN_SHORT / 4);
    else if (d < LN_SHORT / 4)
        LN_FN(group_output_d)(g, y, y_row, n, d, wp, bp, keep, stream, LN_SHORT / 4);
    else if (d < LN_SHORT / 2)
        LN_FN(group_output_d)(g, y, y_row, n, d, wp, bp, keep, stream, LN_SHORT / 2);
    else
        LN_FN(group_output_d)(g, y, y_row, n, d, wp, bp, keep, stream, LN_SHORT);
}

/*
 * The long sums go block by block (LN_BLOCK elements into float lanes,
 * then flushed into the double totals). Within a block each lane is one
 * chain of dependent additions, so one block at a time runs at the adder's
 * latency, not its throughput: whole blocks are taken two at a time, each
 * into its own lanes, and flushed in order (the same additions in the same
 * order as one at a time, so the same bits). A level whose registers
 * cannot hold two blocks' lanes beside the totals sets LN_PAIR_BLOCKS to
 * 0 (AVX2: 32 float lanes are four of its 16 registers a block, and the
 * subtraction and the addition of each element already fill both of
 * Zen 3's adders with one block at a time).
 */

#if !defined(LN_PAIR_BLOCKS)
#define LN_PAIR_BLOCKS 1
#endif

/* lane[j] += x - shift over the whole rows of [i, end). */
LN_ALWAYS_INLINE void LN_FN(add_shifted)(LN_T lane[LN_LANES], const LN_S *x, size_t i,
                                         size_t end, LN_T shift)
{
    for (; i + LN_LANES <= end; i += LN_LANES) {
        LN_ROW_DECL(xr_, x + i);
        for (size_t j = 0; j < LN_LANES; j++)
            lane[j] += LN_ROW_GET(xr_, x + i, j) - shift;
    }
    for (size_t j = 0; i + j < end; j++)
        lane[j] += LN_LOAD(x + i + j) - shift;
}

/* Sum of x[i] - shift. */
static double LN_FN(sum_shifted)(const LN_S *x, size_t d, LN_T shift)
{
    if (d <= LN_SHORT)
        return LN_FN(sum_shifted_short)(x, d, shift);
    double total[LN_LANES] = {0};
    size_t i = 0;
    for (; LN_PAIR_BLOCKS && i + 2 * LN_BLOCK <= d; i += 2 * LN_BLOCK) {
        LN_T a[LN_LANES] = {0}, b[LN_LANES] = {0};
        for (size_t k = 0; k < LN_BLOCK; k += LN_LANES) {
            LN_ROW_DECL(ar_, x + i + k);
            LN_ROW_DECL(br_, x + i + LN_BLOCK + k);
            for (size_t j = 0; j < LN_LANES; j++) {
                a[j] += LN_ROW_GET(ar_, x + i + k, j) - shift;
                b[j] += LN_ROW_GET(br_, x + i + LN_BLOCK + k, j) - shift;
            }
        }
        LN_FN(flush)(total, a);
        LN_FN(flush)(total, b);
    }
    for (; i < d;) {
        size_t end = d - i > LN_BLOCK ? i + LN_BLOCK : d;
        LN_T lane[LN_LANES] = {0};
        LN_FN(add_shifted)(lane, x, i, end, shift);
        i = end;
        LN_FN(flush)(total, lane);
    }
    return ln_tree_sum(total);
}

/* lane[j] += ((x - hi) - lo)^2 over [i, end). */
LN_ALWAYS_INLINE void LN_FN(add_squares)(LN_T lane[LN_LANES], const LN_S *x, size_t i,
                                         size_t end, LN_T hi, LN_T lo)
{
    for (; i + LN_LANES <= end; i += LN_LANES) {
        LN_ROW_DECL(xr_, x + i);
        for (size_t j = 0; j < LN_LANES; j++)
            lane[j] = LN_FN(add_square)(lane[j], LN_FN(center)(LN_ROW_GET(xr_, x + i, j), hi, lo));
    }
    for (size_t j = 0; i + j < end; j++)
        lane[j] = LN_FN(add_square)(lane[j], LN_FN(center)(LN_LOAD(x + i + j), hi, lo));
}

/* Sum of squares of the centered values (x - hi) - lo; far: the record
 * is read from memory (the level's loop asks for its lines ahead). */
static double LN_FN(sum_squares)(const LN_S *x, size_t d, LN_T hi, LN_T lo, int far)
{
    if (d <= LN_SHORT)
        return LN_FN(sum_squares_short)(x, d, hi, lo);
#if defined(LN_SHIFTED_SQUARES_ROWS)
    /* hi and lo 0 (RMSNorm's sums) in float: the centered values are x
     * itself (x - 0 is x), whose squares the level's loop sums in this
     * order (no shifted sums: s1 NULL). float64's loop has no such mode:
     * computing its shifted sums as well made (64, 768) 1.15x slower. */
    if (sizeof(LN_T) == sizeof(float) && hi == 0 && lo == 0) {
        double s;
        LN_SHIFTED_SQUARES_ROWS(x, d, (LN_T)0, NULL, &s, far);
        return s;
    }
#endif
    (void)far;
    double total[LN_LANES] = {0};
    size_t i = 0;
    for (; LN_PAIR_BLOCKS && i + 2 * LN_BLOCK <= d; i += 2 * LN_BLOCK) {
        LN_T a[LN_LANES] = {0}, b[LN_LANES] = {0};
        for (size_t k = 0; k < LN_BLOCK; k += LN_LANES) {
            LN_ROW_DECL(ar_, x + i + k);
            LN_ROW_DECL(br_, x + i + LN_BLOCK + k);
            for (size_t j = 0; j < LN_LANES; j++) {
                a[j] = LN_FN(add_square)(a[j], LN_FN(center)(LN_ROW_GET(ar_, x + i + k, j), hi, lo));
                b[j] = LN_FN(add_square)(
                    b[j], LN_FN(center)(LN_ROW_GET(br_, x + i + LN_BLOCK + k, j), hi, lo));
            }
        }
        LN_FN(flush)(total, a);
        LN_FN(flush)(total, b);
    }
    for (; i < d;) {
        size_t end = d - i > LN_BLOCK ? i + LN_BLOCK : d;
        LN_T lane[LN_LANES] = {0};
        LN_FN(add_squares)(lane, x, i, end, hi, lo);
        i = end;
        LN_FN(flush)(total, lane);
    }
    return ln_tree_sum(total);
}

/* Both sums of the one-pass statistics (ln_contract.h, item 5), block by
 * block: u = x - c into a, the squares of u into q. Only for records
 * longer than LN_ONE_PASS_MIN_D (no short path). The two arrays are
 * independent chains, so one block at a time keeps the adders busy. */
static void LN_FN(sum_shifted_squares)(const LN_S *x, size_t d, LN_T c, double *s1, double *s2,
                                       int far)
{
#if defined(LN_SHIFTED_SQUARES_ROWS)
    /* The level's own loop (ln_x86.h), in the same order, with the same
     * tree. */
    LN_SHIFTED_SQUARES_ROWS(x, d, c, s1, s2, far);
#else
    (void)far;
    double t1[LN_LANES] = {0}, t2[LN_LANES] = {0};
    LN_T a[LN_LANES] = {0}, q[LN_LANES] = {0};
    for (size_t i = 0; i < d;) {
        size_t end = d - i > LN_BLOCK ? i + LN_BLOCK : d;
        for (; i + LN_LANES <= end; i += LN_LANES) {
            LN_ROW_DECL(xr_, x + i);
            for (size_t j = 0; j < LN_LANES; j++)
                LN_FN(add_shifted_square)(&a[j], &q[j], LN_ROW_GET(xr_, x + i, j), c);
        }
        for (size_t j = 0; i + j < end; j++)
            LN_FN(add_shifted_square)(&a[j], &q[j], LN_LOAD(x + i + j), c);
        i = end;
        LN_FN(flush)(t1, a);
        LN_FN(flush)(t2, q);
    }
    *s1 = ln_tree_sum(t1);
    *s2 = ln_tree_sum(t2);
#endif
}

/* y[i] = affine(normalize(x[i])) for i in [i0, i1), element by element. */
LN_ALWAYS_INLINE void LN_FN(apply_tail)(const LN_S *x, LN_S *y, size_t i0, size_t i1,
                                     LN_T hi, LN_T r, LN_T c, const LN_P *restrict w,
                                     const LN_P *restrict b)
{
    for (size_t i = i0; i < i1; i++)
        LN_STORE(y + i, LN_FN(affine)(LN_FN(normalize)(LN_LOAD(x + i), hi, r, c), w, b, i));
}

/* The cache lines of a lane row of a record ahead, into L2 (not L1,
 * which holds the record being written). */
LN_ALWAYS_INLINE void LN_FN(prefetch_row)(const char *p)
{
    for (size_t off = 0; off < LN_LANES * sizeof(LN_S); off += 64)
        __builtin_prefetch(p + off, 0, 1);
}

#if defined(LN_STREAM_BYTES)
/* A row of outputs written with non-temporal stores: by the level's
 * LN_STREAM_ROW straight from the conversion, or converted into a small
 * buffer of the storage type first (a register at a time where the level
 * converts rows: element by element, float16 would cost more than the
 * memory traffic saved). */
LN_ALWAYS_INLINE void LN_FN(stream_row)(LN_S *dst, const LN_T v[LN_LANES])
{
#if defined(LN_STREAM_ROW)
    LN_STREAM_ROW(dst, v);
#else
    LN_S out[LN_LANES];
#if defined(LN_STORE_ROW)
    LN_STORE_ROW(out, v);
#else
    for (size_t j = 0; j < LN_LANES; j++)
        LN_STORE(out + j, v[j]);
#endif
    LN_STREAM_BYTES((void *)dst, out, sizeof out);
#endif
}
#endif

/* Does a record of d features in a streamed call pay for streaming?
 * Each streamed row writes its unaligned head and its tail element by
 * element; float32 or float64 rows of at least LN_STREAM_ROW_MIN bytes
 * gain (float32 out=, 1 thread, streamed against plain: (4096, 1000)
 * 0.66x the time, (20000, 520) 0.74x, but (1e5, 100) 1.25x). float16 and
 * bfloat16 rows, whose conversions cost more per byte, gain only from
 * LN_STREAM_ROW_MIN_HALF bytes ((16384, 4096) 0.85x, (8192, 2048) 0.99x,
 * (16384, 768) 1.2-1.4x). */
#define LN_STREAM_ROW_MIN 1024
#define LN_STREAM_ROW_MIN_HALF 8192
LN_ALWAYS_INLINE int LN_FN(stream_pays)(size_t d)
{
    size_t row = d * sizeof(LN_S);
    return row >= (sizeof(LN_S) >= 4 ? LN_STREAM_ROW_MIN : LN_STREAM_ROW_MIN_HALF);
}

/* The output of element j of the row at i. */
#define LN_OUT(j) \
    LN_FN(affine)(LN_FN(normalize)(LN_ROW_GET(xr_, x + i, j), hi, r, c), w, b, i + (j))

/* Whole rows from i0, then the tail. The rows are stored plainly, by the
 * level's LN_STORE_ROW, or streamed (stream_row). Instantiated once
 * per gain/bias combination by apply, so that each vectorizes with no test
 * per element. */
LN_ALWAYS_INLINE void LN_FN(apply_rows)(const LN_S *x, LN_S *y, size_t i0, size_t d,
                                     LN_T hi, LN_T r, LN_T c, const LN_P *restrict w,
                                     const LN_P *restrict b, int stream, const char *ahead)
{
    size_t i = i0;
    for (; i + LN_LANES <= d; i += LN_LANES) {
        LN_ROW_DECL(xr_, x + i);
#if defined(LN_STREAM_BYTES) || defined(LN_STORE_ROW)
        LN_T v[LN_LANES];
        for (size_t j = 0; j < LN_LANES; j++)
            v[j] = LN_OUT(j);
#if defined(LN_STREAM_BYTES)
        if (stream) {
            LN_FN(stream_row)(y + i, v);
            if (ahead)
                LN_FN(prefetch_row)(ahead + i * sizeof(LN_S));
            continue;
        }
#endif
#if defined(LN_STORE_ROW)
        LN_STORE_ROW(y + i, v);
        if (ahead)
            LN_FN(prefetch_row)(ahead + i * sizeof(LN_S));
        continue;
#endif
#endif
        for (size_t j = 0; j < LN_LANES; j++)
            LN_STORE(y + i + j, LN_OUT(j));
        if (ahead)
            LN_FN(prefetch_row)(ahead + i * sizeof(LN_S));
    }
    LN_FN(apply_tail)(x, y, i, d, hi, r, c, w, b);
}
#undef LN_OUT

/* Every gain/bias combination, each its own loop (w and b are constants
 * after inlining). */
LN_ALWAYS_INLINE void LN_FN(apply_params)(const LN_S *x, LN_S *y, size_t i0, size_t d,
                                       LN_T hi, LN_T r, LN_T c, const LN_P *restrict w,
                                       const LN_P *restrict b, int stream, const char *ahead)
{
    if (w && b)
        LN_FN(apply_rows)(x, y, i0, d, hi, r, c, w, b, stream, ahead);
    else if (w)
        LN_FN(apply_rows)(x, y, i0, d, hi, r, c, w, NULL, stream, ahead);
    else if (b)
        LN_FN(apply_rows)(x, y, i0, d, hi, r, c, NULL, b, stream, ahead);
    else
        LN_FN(apply_rows)(x, y, i0, d, hi, r, c, NULL, NULL, stream, ahead);
}

/* The output loops of rows read in place (float32, float64: no
 * LN_LOAD_ROW) may be built for another vector width than the level's
 * (LN_PLAIN_APPLY_ATTR, ln_avx512.c). */
#undef LN_APPLY_ATTR
#if defined(LN_PLAIN_APPLY_ATTR) && !defined(LN_LOAD_ROW)
#define LN_APPLY_ATTR LN_PLAIN_APPLY_ATTR
#else
#define LN_APPLY_ATTR
#endif

/* x and y are either the same row or disjoint (the batch layer makes sure
 * of it): one copy for each, so that neither needs overlap checks. */
LN_APPLY_ATTR static void LN_FN(apply_disjoint)(const LN_S *restrict x, LN_S *restrict y,
                                                size_t i0, size_t d, LN_T hi, LN_T r, LN_T c,
                                                const LN_P *restrict w, const LN_P *restrict b,
                                                int stream, const char *ahead)
{
    if (stream)
        LN_FN(apply_params)(x, y, i0, d, hi, r, c, w, b, 1, ahead);
    else
        LN_FN(apply_params)(x, y, i0, d, hi, r, c, w, b, 0, ahead);
}

LN_APPLY_ATTR static void LN_FN(apply_in_place)(LN_S *xy, size_t i0, size_t d, LN_T hi, LN_T r,
                                                LN_T c, const LN_P *restrict w,
                                                const LN_P *restrict b, int stream,
                                                const char *ahead)
{
    if (stream)
        LN_FN(apply_params)(xy, xy, i0, d, hi, r, c, w, b, 1, ahead);
    else
        LN_FN(apply_params)(xy, xy, i0, d, hi, r, c, w, b, 0, ahead);
}

/* ahead: a record ahead (ln_ops.h, record_ahead), whose lines each lane
 * row asks for while this one is written (NULL: none). */
static void LN_FN(apply)(const LN_S *x, LN_S *y, size_t d, LN_T hi, LN_T r, LN_T c,
                         const LN_P *restrict w, const LN_P *restrict b, int stream,
                         const char *ahead)
{
    if (d <= LN_SHORT) {
        LN_FN(apply_short)(x, y, d, hi, r, c, w, b);
        return;
    }
    size_t head = 0;
#if defined(LN_STREAM_BYTES)
    /* Streamed rows start at the first 64-byte aligned output. */
    stream = stream && LN_FN(stream_pays)(d);
    if (stream) {
        head = ((64 - (uintptr_t)y % 64) % 64) / sizeof(LN_S);
        if (head > d || (uintptr_t)y % sizeof(LN_S) != 0)
            head = d;
        LN_FN(apply_tail)(x, y, 0, head, hi, r, c, w, b);
    }
#else
    stream = 0;
#endif
    if ((const void *)x == (const void *)y)
        LN_FN(apply_in_place)(y, head, d, hi, r, c, w, b, stream, ahead);
    else
        LN_FN(apply_disjoint)(x, y, head, d, hi, r, c, w, b, stream, ahead);
}

/* n values to the compute type, exactly (mixed-dtype rows are staged with
 * this: a float16 row of a float32 call, a float32 row of a float64 one). */
static inline void LN_FN(widen)(const void *src, void *dst, size_t n)
{
    const LN_S *x = src;
    LN_T *t = dst;
    size_t i = 0;
    for (; i + LN_LANES <= n; i += LN_LANES) {
#if defined(LN_LOAD_ROW)
        /* Straight into dst (through a row on the stack, a (1, 768)
         * float16 call with gain and bias took 751 ns, now 638 ns). */
        LN_LOAD_ROW(t + i, x + i);
#else
        for (size_t j = 0; j < LN_LANES; j++)
            t[i + j] = LN_LOAD(x + i + j);
#endif
    }
    for (; i < n; i++)
        t[i] = LN_LOAD(x + i);
}

/* ---- the backward ---------------------------------------------------- */

/* The largest of the first w lanes (w a power of two; none NaN), in a
 * pairwise tree rather than a chain of w dependent comparisons: the
 * maximum of numbers is the same in any order. */
LN_ALWAYS_INLINE LN_T LN_FN(lane_max)(LN_T m[LN_LANES], size_t w)
{
    LN_UNROLL
    for (size_t h = w / 2; h >= 1; h /= 2)
        LN_UNROLL
        for (size_t j = 0; j < h; j++)
            m[j] = m[j + h] > m[j] ? m[j + h] : m[j];
    return m[0];
}

/*
 * back_sums keeps six lane arrays (four sums and two maxima) live at once:
 * 6 x 32 floats are 24 AVX2 registers of 16 (or 48 of NEON's 32), and GCC
 * spilled them to the stack in the inner loop, and zeroed them there with
 * rep stos for every block. So the record's lanes are taken LN_PART at a
 * time, each part over the whole record (64 bytes of each array: four NEON
 * registers). Each lane still sees the same additions in the same order:
 * the same bits. Levels that convert whole rows (LN_LOAD_ROW: float16,
 * bfloat16) take all lanes at once, on the row they convert. (The x86
 * levels have loops of their own, ln_x86.h's LN_BACK_SUMS_*: this lane
 * form is the portable level's.)
 */
#undef LN_PART
#if defined(LN_LOAD_ROW)
#define LN_PART ((size_t)LN_LANES)
#else
#define LN_PART (64 / sizeof(LN_T) < LN_LANES ? 64 / sizeof(LN_T) : (size_t)LN_LANES)
#endif
_Static_assert(LN_LANES % LN_PART == 0, "a whole number of parts make the lanes");

/* One element of back_sums (x value xv, dy value dyv, gain index i) into
 * lane j of a part's block lanes l0..l3 and maxima (one per lane of the
 * part: the largest value is the same in any order and any number of
 * lanes, the same bits). */
LN_ALWAYS_INLINE void LN_FN(back_sums_step)(LN_T l0[LN_PART], LN_T l1[LN_PART],
                                            LN_T l2[LN_PART], LN_T l3[LN_PART],
                                            LN_T mdy[LN_PART], LN_T mt[LN_PART], size_t j,
                                            LN_T xv, LN_T dyv, const LN_P *restrict w,
                                            size_t i, LN_T m0)
{
    LN_T t = xv - m0;
    LN_T g = LN_FN(gain_grad)(dyv, w, i);
    l0[j] += t;
    l1[j] = LN_FN(add_square)(l1[j], t);
    l2[j] += g;
    l3[j] = LN_FN(add_product)(l3[j], g, t);
    LN_T ad = (LN_T)fabs((double)dyv), at = (LN_T)fabs((double)t);
    mdy[j] = ad > mdy[j] ? ad : mdy[j];
    mt[j] = at > mt[j] ? at : mt[j];
}

#if !defined(LN_BACK_SUMS_ROWS) /* else the level's own loop, below */
/* A part's block lanes into its totals, out of line: inlined into
 * back_sums_part, GCC turned this flush into scalar conversions. */
static LN_NOINLINE void LN_FN(flush_part)(double *total, LN_T *lane)
{
    LN_FN(flush_lanes)(total, lane, LN_PART);
}

/* Lanes [j0, j0 + LN_PART) of back_sums over the whole record, block by
 * block: their totals into tot, their maxima into mdy_all and mt_all. */
LN_ALWAYS_INLINE void LN_FN(back_sums_part)(const LN_S *x, const LN_S *dy,
                                            const LN_P *restrict w, size_t d, size_t j0,
                                            LN_T m0, double tot[4][LN_LANES],
                                            LN_T mdy_all[LN_LANES], LN_T mt_all[LN_LANES])
{
    double t0[LN_PART] = {0}, t1[LN_PART] = {0}, t2[LN_PART] = {0}, t3[LN_PART] = {0};
    LN_T mdy[LN_PART] = {0}, mt[LN_PART] = {0};
    LN_T l0[LN_PART] = {0}, l1[LN_PART] = {0}, l2[LN_PART] = {0}, l3[LN_PART] = {0};
    for (size_t i = 0; i < d;) {
        size_t end = d - i > LN_BLOCK ? i + LN_BLOCK : d;
        for (; i + LN_LANES <= end; i += LN_LANES) {
            LN_ROW_DECL(xr_, x + i);
            LN_ROW_DECL(dr_, dy + i);
            for (size_t j = 0; j < LN_PART; j++)
                LN_FN(back_sums_step)(l0, l1, l2, l3, mdy, mt, j, LN_ROW_GET(xr_, x + i, j0 + j),
                                      LN_ROW_GET(dr_, dy + i, j0 + j), w, i + j0 + j, m0);
        }
        for (size_t j = 0; j < LN_PART && i + j0 + j < end; j++)
            LN_FN(back_sums_step)(l0, l1, l2, l3, mdy, mt, j, LN_LOAD(x + i + j0 + j),
                                  LN_LOAD(dy + i + j0 + j), w, i + j0 + j, m0);
        i = end;
        LN_FN(flush_part)(t0, l0);
        LN_FN(flush_part)(t1, l1);
        LN_FN(flush_part)(t2, l2);
        LN_FN(flush_part)(t3, l3);
    }
    for (size_t j = 0; j < LN_PART; j++) {
        tot[0][j0 + j] = t0[j];
        tot[1][j0 + j] = t1[j];
        tot[2][j0 + j] = t2[j];
        tot[3][j0 + j] = t3[j];
        mdy_all[j0 + j] = mdy[j];
        mt_all[j0 + j] = mt[j];
    }
}
#endif

/* The four sums of ln_back_sums in lane form (the order of ln_ref.h). */
static void LN_FN(back_sums)(const LN_S *x, const LN_S *dy, const LN_P *restrict w,
                             size_t d, LN_T m0, ln_back_sums *s)
{
    double tot[4][LN_LANES]; /* every lane written by its part */
#if defined(LN_BACK_SUMS_ROWS)
    /* The level's own loop (ln_x86.h), in the same order. */
    LN_T max_dy, max_t;
    LN_BACK_SUMS_ROWS(x, dy, w, d, m0, tot, &max_dy, &max_t);
    s->max_dy = max_dy;
    s->max_t = max_t;
#else
    LN_T mdy[LN_LANES], mt[LN_LANES];
    for (size_t j0 = 0; j0 < LN_LANES; j0 += LN_PART)
        LN_FN(back_sums_part)(x, dy, w, d, j0, m0, tot, mdy, mt);
    s->max_dy = LN_FN(lane_max)(mdy, LN_LANES);
    s->max_t = LN_FN(lane_max)(mt, LN_LANES);
#endif
    s->st = ln_tree_sum(tot[0]);
    s->stt = ln_tree_sum(tot[1]);
    s->g = ln_tree_sum(tot[2]);
    s->gt = ln_tree_sum(tot[3]);
}
#undef LN_PART

/* The deposits of element i (dyv, xh) for a constant `mode`. */
LN_ALWAYS_INLINE void LN_FN(back_deposit_at)(
    uint64_t *restrict w0, uint64_t *restrict w1, uint64_t *restrict w2, uint64_t *restrict b0,
    uint64_t *restrict b1, uint64_t *restrict b2, double *restrict pw, double *restrict pb,
    size_t i, LN_T dyv, LN_T xh, int mode)
{
    double v = (double)dyv * (double)xh, u = (double)dyv;
    if (mode == LN_BACK_3) {
        ln_deposit3(w0, w1, w2, i, v);
        ln_deposit_db(b0, b1, b2, i, u, 3, LN_DB_ON_GRID);
    } else if (mode == LN_BACK_2) {
        ln_deposit2(w1, w2, i, v);
        ln_deposit_db(b0, b1, b2, i, u, 2, LN_DB_ON_GRID);
    } else if (mode == LN_BACK_W3) {
        ln_deposit3(w0, w1, w2, i, v);
    } else if (mode == LN_BACK_W2) {
        ln_deposit2(w1, w2, i, v);
    } else if (mode == LN_BACK_PLAIN) {
        pw[i] += v;
        pb[i] += u;
    } else if (mode == LN_BACK_WPLAIN) {
        pw[i] += v;
    }
}

#define LN_SINKS w0, w1, w2, b0, b1, b2, pw, pb
#define LN_SINK_PARAMS                                                                 \
    uint64_t *restrict w0, uint64_t *restrict w1, uint64_t *restrict w2,              \
        uint64_t *restrict b0, uint64_t *restrict b1, uint64_t *restrict b2,          \
        double *restrict pw, double *restrict pb

/* dx of the elements [i0, i1) and their deposits (w: the gain, never NULL
 * here: ones when the layer has none, dy * 1 being exact). dx never
 * shares memory with x or dy (a new array, a scratch row, or a ufunc
 * output NumPy has separated from its inputs). */
LN_ALWAYS_INLINE void LN_FN(back_span)(const LN_S *restrict x, const LN_S *restrict dy,
                                       LN_S *restrict dx, size_t i0,
                                       size_t i1, const LN_P *restrict w, LN_T hi, LN_T r,
                                       LN_T c, LN_T a, LN_T bm, LN_SINK_PARAMS, int mode)
{
    for (size_t i = i0; i < i1; i++) {
        LN_T xh = LN_FN(normalize)(LN_LOAD(x + i), hi, r, c);
        LN_T dyv = LN_LOAD(dy + i);
        LN_STORE(dx + i, LN_FN(grad_input)(dyv * (LN_T)w[i], xh, a, bm, r));
        LN_FN(back_deposit_at)(LN_SINKS, i, dyv, xh, mode);
    }
}

/* The same over whole rows of LN_LANES (converted a row at a time where
 * the level does), then the tail; with stream (a constant), each whole
 * row of dx (64-byte aligned from dx on) written with non-temporal
 * stores. */
LN_ALWAYS_INLINE void LN_FN(back_rows)(const LN_S *restrict x, const LN_S *restrict dy,
                                       LN_S *restrict dx, size_t d,
                                       const LN_P *restrict w, LN_T hi, LN_T r, LN_T c,
                                       LN_T a, LN_T bm, LN_SINK_PARAMS, int mode, int stream)
{
    size_t i = 0;
#if defined(LN_LOAD_ROW) || defined(LN_STREAM_BYTES)
#if !defined(LN_LOAD_ROW)
    if (stream)
#endif
        for (; i + LN_LANES <= d; i += LN_LANES) {
            LN_ROW_DECL(xr_, x + i);
            LN_ROW_DECL(dr_, dy + i);
            LN_T v[LN_LANES];
            for (size_t j = 0; j < LN_LANES; j++) {
                LN_T xh = LN_FN(normalize)(LN_ROW_GET(xr_, x + i, j), hi, r, c);
                LN_T dyv = LN_ROW_GET(dr_, dy + i, j);
                v[j] = LN_FN(grad_input)(dyv * (LN_T)w[i + j], xh, a, bm, r);
                LN_FN(back_deposit_at)(LN_SINKS, i + j, dyv, xh, mode);
            }
#if defined(LN_STREAM_BYTES)
            if (stream) {
                LN_FN(stream_row)(dx + i, v);
                continue;
            }
#endif
#if defined(LN_STORE_ROW)
            LN_STORE_ROW(dx + i, v);
#else
            for (size_t j = 0; j < LN_LANES; j++)
                LN_STORE(dx + i + j, v[j]);
#endif
        }
#else
    (void)stream;
#endif
    LN_FN(back_span)(x, dy, dx, i, d, w, hi, r, c, a, bm, LN_SINKS, mode);
}

/* One loop per mode, each a function of its own whose restrict
 * parameters GCC honours (it drops restrict from inlined callees and
 * would then check for overlaps at run time); dx is streamed by the loop
 * without deposits only (back_apply). */
#define LN_BACK_LOOP(name, mode, stream)                                                    \
    static void LN_FN(name)(const LN_S *restrict x, const LN_S *restrict dy,                \
                            LN_S *restrict dx, size_t d, const LN_P *restrict w, LN_T hi,  \
                            LN_T r, LN_T c, LN_T a, LN_T bm, LN_SINK_PARAMS)                \
    {                                                                                       \
        LN_FN(back_rows)(x, dy, dx, d, w, hi, r, c, a, bm, LN_SINKS, mode, stream);         \
    }
LN_BACK_LOOP(back_loop_none, LN_BACK_NONE, 0)
LN_BACK_LOOP(back_loop_none_streamed, LN_BACK_NONE, 1)
LN_BACK_LOOP(back_loop_3, LN_BACK_3, 0)
LN_BACK_LOOP(back_loop_2, LN_BACK_2, 0)
LN_BACK_LOOP(back_loop_plain, LN_BACK_PLAIN, 0)
LN_BACK_LOOP(back_loop_w3, LN_BACK_W3, 0)
LN_BACK_LOOP(back_loop_w2, LN_BACK_W2, 0)
LN_BACK_LOOP(back_loop_wplain, LN_BACK_WPLAIN, 0)
#undef LN_BACK_LOOP

/* The terms of n elements alone (no dx), for a streamed dx (back_apply):
 * whole rows (converted a row at a time where the level does: element by
 * element, float16 (16384, 4096) took twice as long), then the tail. */
LN_ALWAYS_INLINE void LN_FN(back_terms_rows)(const LN_S *restrict x, const LN_S *restrict dy,
                                             size_t n, LN_T hi, LN_T r, LN_T c,
                                             LN_SINK_PARAMS, int mode)
{
    size_t i = 0;
    for (; i + LN_LANES <= n; i += LN_LANES) {
        LN_ROW_DECL(xr_, x + i);
        LN_ROW_DECL(dr_, dy + i);
        for (size_t j = 0; j < LN_LANES; j++) {
            LN_T xh = LN_FN(normalize)(LN_ROW_GET(xr_, x + i, j), hi, r, c);
            LN_FN(back_deposit_at)(LN_SINKS, i + j, LN_ROW_GET(dr_, dy + i, j), xh, mode);
        }
    }
    for (; i < n; i++) {
        LN_T xh = LN_FN(normalize)(LN_LOAD(x + i), hi, r, c);
        LN_FN(back_deposit_at)(LN_SINKS, i, LN_LOAD(dy + i), xh, mode);
    }
}

/* One loop per mode, as LN_BACK_LOOP's. */
#define LN_TERMS_LOOP(name, mode)                                                           \
    static void LN_FN(name)(const LN_S *restrict x, const LN_S *restrict dy, size_t n,      \
                            LN_T hi, LN_T r, LN_T c, LN_SINK_PARAMS)                        \
    {                                                                                       \
        LN_FN(back_terms_rows)(x, dy, n, hi, r, c, LN_SINKS, mode);                         \
    }
LN_TERMS_LOOP(back_terms_3, LN_BACK_3)
LN_TERMS_LOOP(back_terms_2, LN_BACK_2)
LN_TERMS_LOOP(back_terms_plain, LN_BACK_PLAIN)
LN_TERMS_LOOP(back_terms_w3, LN_BACK_W3)
LN_TERMS_LOOP(back_terms_w2, LN_BACK_W2)
LN_TERMS_LOOP(back_terms_wplain, LN_BACK_WPLAIN)
#undef LN_TERMS_LOOP

/* The terms of n elements into dw and db at features at, at + 1, ..., as
 * back_apply deposits them (both sums, dw alone, or nothing). */
static void LN_FN(back_terms)(const LN_S *x, const LN_S *dy, size_t n, LN_T hi, LN_T r,
                              LN_T c, ln_acc *dw, ln_acc *db, int path, size_t at)
{
    if (dw && !db) {
        uint64_t *const *sw = dw->sum;
        if (path == LN_DEPOSIT_PLAIN)
            LN_FN(back_terms_wplain)(x, dy, n, hi, r, c, NULL, NULL, NULL, NULL, NULL, NULL,
                                     dw->huge + at, NULL);
        else if (path == LN_DEPOSIT_3)
            LN_FN(back_terms_w3)(x, dy, n, hi, r, c, sw[0] + at, sw[1] + at, sw[2] + at, NULL,
                                 NULL, NULL, NULL, NULL);
        else
            LN_FN(back_terms_w2)(x, dy, n, hi, r, c, NULL, sw[1] + at, sw[2] + at, NULL, NULL,
                                 NULL, NULL, NULL);
        return;
    }
    if (!dw || !db)
        return;
    uint64_t *const *sw = dw->sum, *const *sb = db->sum;
    if (path == LN_DEPOSIT_3)
        LN_FN(back_terms_3)(x, dy, n, hi, r, c, sw[0] + at, sw[1] + at, sw[2] + at, sb[0] + at,
                            sb[1] + at, sb[2] + at, NULL, NULL);
    else if (path == LN_DEPOSIT_2)
        LN_FN(back_terms_2)(x, dy, n, hi, r, c, NULL, sw[1] + at, sw[2] + at, NULL, sb[1] + at,
                            sb[2] + at, NULL, NULL);
    else
        LN_FN(back_terms_plain)(x, dy, n, hi, r, c, NULL, NULL, NULL, NULL, NULL, NULL,
                                dw->huge + at, db->huge + at);
}

#undef LN_SINKS
#undef LN_SINK_PARAMS

/* dx of n elements, and their terms deposited into dw and db (both, dw
 * alone, or neither) at features at, at + 1, ...; path is LN_DEPOSIT_3,
 * _2 or _PLAIN (the scalar path is the record kernel's). One loop per
 * mode. stream (dx 64-byte aligned): dx written with non-temporal stores
 * by a loop of its own, then the terms by another (in one loop with the
 * deposits' loads and stores, a streamed dx had been 1.14-1.26x slower
 * than a plain one). */
static void LN_FN(back_apply)(const LN_S *x, const LN_S *dy, LN_S *dx, size_t n,
                              const LN_P *restrict w, LN_T hi, LN_T r, LN_T c, LN_T a,
                              LN_T bm, ln_acc *dw, ln_acc *db, int path, size_t at,
                              int stream)
{
    if (stream) {
        LN_FN(back_loop_none_streamed)(x, dy, dx, n, w, hi, r, c, a, bm, NULL, NULL, NULL,
                                       NULL, NULL, NULL, NULL, NULL);
        LN_FN(back_terms)(x, dy, n, hi, r, c, dw, db, path, at);
        return;
    }
    if (dw && !db) {
        uint64_t *const *sw = dw->sum;
        if (path == LN_DEPOSIT_PLAIN)
            LN_FN(back_loop_wplain)(x, dy, dx, n, w, hi, r, c, a, bm, NULL, NULL, NULL, NULL,
                                    NULL, NULL, dw->huge + at, NULL);
        else if (path == LN_DEPOSIT_3)
            LN_FN(back_loop_w3)(x, dy, dx, n, w, hi, r, c, a, bm, sw[0] + at, sw[1] + at,
                                sw[2] + at, NULL, NULL, NULL, NULL, NULL);
        else
            LN_FN(back_loop_w2)(x, dy, dx, n, w, hi, r, c, a, bm, NULL, sw[1] + at,
                                sw[2] + at, NULL, NULL, NULL, NULL, NULL);
        return;
    }
    if (!dw || !db) {
        LN_FN(back_loop_none)(x, dy, dx, n, w, hi, r, c, a, bm, NULL, NULL, NULL, NULL, NULL,
                              NULL, NULL, NULL);
        return;
    }
    uint64_t *const *sw = dw->sum, *const *sb = db->sum;
    if (path == LN_DEPOSIT_3)
        LN_FN(back_loop_3)(x, dy, dx, n, w, hi, r, c, a, bm, sw[0] + at, sw[1] + at,
                           sw[2] + at, sb[0] + at, sb[1] + at, sb[2] + at, NULL, NULL);
    else if (path == LN_DEPOSIT_2)
        LN_FN(back_loop_2)(x, dy, dx, n, w, hi, r, c, a, bm, NULL, sw[1] + at, sw[2] + at,
                           NULL, sb[1] + at, sb[2] + at, NULL, NULL);
    else
        LN_FN(back_loop_plain)(x, dy, dx, n, w, hi, r, c, a, bm, NULL, NULL, NULL, NULL, NULL,
                               NULL, dw->huge + at, db->huge + at);
}

/* ---- the backward of short records, a group at a time --------------- */

/*
 * Short records' backward (d <= LN_SHORT) in the transposed layout of
 * short_group: every step of back_sums (the shift, the four lane sums and
 * the maxima, the conversion to double, the tree) and of the dx loop is
 * one vector operation across LN_SHORT_GROUP records, in the order a
 * record alone takes (lane j holds element j; lanes past d are +0.0 and
 * change nothing in the tree). The deposits go back to rows: each term
 * into its feature's level sums, integers (bits(t)) summed exactly, so
 * adding up a group's records first changes no bit. float32, one
 * thread, against record by record: (1e5, 8) and (1e5, 16) 2.2-2.6x
 * faster, (1e5, 24) and (1e5, 32) 1.3-1.5x; records of two lane rows
 * (d up to 64) were 10-15% slower, and keep the record path.
 */
typedef struct {
    LN_T dyr[LN_SHORT_GROUP][2 * LN_LANES]; /* dy in rows */
#if defined(LN_SHORT_BACK_SUMS_ROWS)
    LN_T xr[LN_SHORT_GROUP][2 * LN_LANES]; /* x in rows, for the level's loops */
    const char *xs, *dys;                   /* the rows the level's loops read */
    ptrdiff_t xs_row, dys_row;
#else
    LN_T x[2 * LN_LANES][LN_SHORT_GROUP]; /* group_lanes' layout; one lane row used */
    LN_T dy[LN_LANES][LN_SHORT_GROUP];
#endif
    ln_back_group_sums s;
    LN_T m0[LN_SHORT_GROUP]; /* the shift of the sums */
} LN_FN(back_group);

/* Is a record of d features short for the backward (done in groups)?
 * With the level's own loops, float records of up to two lane rows too
 * (in the transposed form they had been 10-15% slower than the record
 * path). */
LN_ALWAYS_INLINE int LN_FN(back_is_short)(size_t d)
{
#if defined(LN_SHORT_BACK_SUMS_ROWS)
    return d <= 2 * LN_LANES;
#else
    return d <= LN_SHORT;
#endif
}

#if defined(LN_SHORT_BACK_SUMS_ROWS)
/* Does the level's loop read the group's rows in place (float32 records
 * of whole registers: 8, 16, 32 or 64 features)? Else float copies.
 * float16 records of whole registers too, and bfloat16 ones of one or
 * two lane rows, converted in registers: one thread, float16 (1e6, 64)
 * 0.71x the time, (1e5, 64) 0.79x, (1e5, 32) 0.83x, (1e6, 16) 0.92x,
 * (20000, 8) 0.90x; RMSNorm (1e5, 64) 0.68x, (1e5, 32) 0.80x, (1e6, 16)
 * 0.88x; bfloat16 (1e5, 64) 0.80-0.82x, (1e5, 32) 0.94-0.96x, but
 * (1e5, 16) 1.07-1.11x slower (its 8-float stores). */
LN_ALWAYS_INLINE int LN_FN(back_direct)(size_t d)
{
#if defined(LN_SHORT_NARROW_KIND)
    if (sizeof(LN_S) < sizeof(float)) /* float16 whole registers, bfloat16 lane rows */
        return d == 2 * LN_LANES || d == LN_LANES ||
               (LN_SHORT_NARROW_KIND == LN_ROWS_F16 && LN_FN(group_width)(d) == d);
#endif
    return sizeof(LN_S) == sizeof(float) && (LN_FN(group_width)(d) == d || d == 2 * LN_LANES);
}
#endif

/* The group's rows (n records of x and dy, rows x_row and dy_row bytes
 * apart), the forward's first-pass means when needed (not rms, no given
 * means), the shifts m0 (given[k], the caller's means, else the
 * first-pass mean, rounded to LN_T; 0 for RMSNorm) and back_sums' sums
 * around them. wp: the gain, padded with ones to LN_LANES. */
LN_ALWAYS_INLINE void LN_FN(back_group_sums)(LN_FN(back_group) *bg, const char *x,
                                             ptrdiff_t x_row, const char *dy,
                                             ptrdiff_t dy_row, size_t n, size_t d,
                                             const LN_P *restrict wp, const double *given,
                                             int rms)
{
    size_t w = LN_FN(group_width)(d);
#if defined(LN_SHORT_BACK_SUMS_ROWS)
    /* The level's own loops, on the rows in place (float32 rows of whole
     * registers) or on float copies, zero-padded to w. */
    bg->xs = x, bg->xs_row = x_row, bg->dys = dy, bg->dys_row = dy_row;
    if (!LN_FN(back_direct)(d)) {
        LN_FN(group_load)(bg->xr, x, x_row, n, d, w);
        LN_FN(group_load)(bg->dyr, dy, dy_row, n, d, w);
        bg->xs = (const char *)bg->xr, bg->xs_row = (ptrdiff_t)sizeof bg->xr[0];
        bg->dys = (const char *)bg->dyr, bg->dys_row = (ptrdiff_t)sizeof bg->dyr[0];
    }
#if defined(LN_SHORT_NARROW_KIND)
    if (sizeof(LN_S) < sizeof(float) && LN_FN(back_direct)(d))
        ln_short_back_sums_16(bg->xs, bg->xs_row, bg->dys, bg->dys_row, n, d, wp, given, rms,
                              &bg->s, bg->m0, LN_SHORT_NARROW_KIND);
    else
#endif
        LN_SHORT_BACK_SUMS_ROWS(bg->xs, bg->xs_row, bg->dys, bg->dys_row, n, d, wp, given, rms,
                                &bg->s, bg->m0);
#else
    LN_T rows[LN_SHORT_GROUP][2 * LN_LANES];
    LN_FN(group_load)(rows, x, x_row, n, d, w);
    LN_FN(group_load)(bg->dyr, dy, dy_row, n, d, w);
    LN_FN(transpose)(&bg->x[0][0], LN_SHORT_GROUP, &rows[0][0], 2 * LN_LANES, LN_SHORT_GROUP, w);
    LN_FN(transpose)(&bg->dy[0][0], LN_SHORT_GROUP, &bg->dyr[0][0], 2 * LN_LANES,
                     LN_SHORT_GROUP, w);
    for (size_t k = 0; k < LN_SHORT_GROUP; k++)
        bg->s.mean[k] = 0.0;
    if (!rms && !given) {
        LN_T zero[LN_SHORT_GROUP] = {0};
        double t[LN_SHORT_GROUP];
        LN_FN(group_lanes)(bg->x, d, w, zero, zero, 1, t);
        for (size_t k = 0; k < LN_SHORT_GROUP; k++)
            bg->s.mean[k] = (double)bg->x[0][k] + t[k] / (double)d;
    }
    for (size_t k = 0; k < LN_SHORT_GROUP; k++)
        bg->m0[k] = rms ? (LN_T)0 : (LN_T)(given && k < n ? given[k] : bg->s.mean[k]);
    /* back_sums' lanes, one element each */
    LN_T l0[LN_LANES][LN_SHORT_GROUP], l1[LN_LANES][LN_SHORT_GROUP];
    LN_T l2[LN_LANES][LN_SHORT_GROUP], l3[LN_LANES][LN_SHORT_GROUP];
    LN_T mdy[LN_SHORT_GROUP] = {0}, mt[LN_SHORT_GROUP] = {0};
    for (size_t j = 0; j < d; j++)
        for (size_t k = 0; k < LN_SHORT_GROUP; k++) {
            LN_T t = bg->x[j][k] - bg->m0[k], dyv = bg->dy[j][k];
            LN_T g = LN_FN(gain_grad)(dyv, wp, j);
            l0[j][k] = (LN_T)0 + t;
            l1[j][k] = LN_FN(add_square)((LN_T)0, t);
            l2[j][k] = (LN_T)0 + g;
            l3[j][k] = LN_FN(add_product)((LN_T)0, g, t);
            LN_T ad = (LN_T)fabs((double)dyv), at = (LN_T)fabs((double)t);
            mdy[k] = ad > mdy[k] ? ad : mdy[k];
            mt[k] = at > mt[k] ? at : mt[k];
        }
    for (size_t j = d; j < w; j++)
        for (size_t k = 0; k < LN_SHORT_GROUP; k++)
            l0[j][k] = l1[j][k] = l2[j][k] = l3[j][k] = 0;
    LN_FN(group_total)(l0, w, bg->s.st);
    LN_FN(group_total)(l1, w, bg->s.stt);
    LN_FN(group_total)(l2, w, bg->s.g);
    LN_FN(group_total)(l3, w, bg->s.gt);
    for (size_t k = 0; k < LN_SHORT_GROUP; k++) {
        bg->s.max_dy[k] = mdy[k];
        bg->s.max_t[k] = mt[k];
    }
#endif
}

/* A group's level sums (sw of dw's terms, sb of db's, of LN_SHORT_GROUP
 * records each: kept or not, each deposited something) added to each
 * feature's sums of dw and db (either may be NULL), and counted. */
LN_ALWAYS_INLINE void LN_FN(back_group_commit)(uint64_t sw[LN_ACC_LEVELS][2 * LN_LANES],
                                               uint64_t sb[LN_ACC_LEVELS][2 * LN_LANES], size_t d,
                                               ln_acc *dw, ln_acc *db, int levels)
{
    if (dw)
        ln_acc_count_n(dw, levels, LN_SHORT_GROUP);
    if (db)
        ln_acc_count_n(db, levels, LN_SHORT_GROUP);
    for (int l = LN_ACC_LEVELS - levels; l < LN_ACC_LEVELS; l++)
        for (size_t j = 0; j < d; j++) {
            if (dw)
                dw->sum[l][j] += sw[l][j];
            if (db)
                db->sum[l][j] += sb[l][j];
        }
}

/* The terms of the group's records (dy and xhat in rows) into the lowest
 * `levels` level sums of dw and db (either may be NULL): summed over the
 * group first, then added to each feature's sums. Records without
 * keep[k] deposit zeros (counted like the others, they add exactly
 * nothing), so that the loops have constant lengths and the group's
 * sums stay in registers ((1e5, 16) float32: about 25% faster than
 * skipping them). */
LN_ALWAYS_INLINE void LN_FN(back_group_deposit)(const LN_T dyr[LN_SHORT_GROUP][2 * LN_LANES],
                                                const LN_T xr[LN_SHORT_GROUP][LN_LANES],
                                                size_t d, const int *keep, ln_acc *dw,
                                                ln_acc *db, int levels)
{
    uint64_t sw[LN_ACC_LEVELS][2 * LN_LANES] = {{0}}, sb[LN_ACC_LEVELS][2 * LN_LANES] = {{0}};
    double v[LN_SHORT_GROUP][LN_LANES], u[LN_SHORT_GROUP][LN_LANES];
    for (size_t k = 0; k < LN_SHORT_GROUP; k++)
        for (size_t j = 0; j < d; j++) {
            v[k][j] = keep[k] ? (double)dyr[k][j] * (double)xr[k][j] : 0.0;
            u[k][j] = keep[k] ? (double)dyr[k][j] : 0.0;
        }
    if (levels == 3) {
        for (size_t k = 0; k < LN_SHORT_GROUP; k++)
            for (size_t j = 0; j < d; j++) {
                ln_deposit3(sw[0], sw[1], sw[2], j, v[k][j]);
                ln_deposit3(sb[0], sb[1], sb[2], j, u[k][j]);
            }
    } else {
        for (size_t k = 0; k < LN_SHORT_GROUP; k++)
            for (size_t j = 0; j < d; j++) {
                ln_deposit2(sw[1], sw[2], j, v[k][j]);
                ln_deposit2(sb[1], sb[2], j, u[k][j]);
            }
    }
    LN_FN(back_group_commit)(sw, sb, d, dw, db, levels);
}

/* dx of the records k with keep[k] into their rows (dx_row bytes apart)
 * from their coefficients (as back_output_span has them: hi, r, c, a,
 * bm), and the group's terms deposited. */
LN_ALWAYS_INLINE void LN_FN(back_group_output)(const LN_FN(back_group) *bg, char *dx,
                                               ptrdiff_t dx_row, size_t n, size_t d,
                                               const LN_P *restrict wp,
                                               const LN_T hi[LN_SHORT_GROUP],
                                               const LN_T r[LN_SHORT_GROUP],
                                               const LN_T c[LN_SHORT_GROUP],
                                               const LN_T a[LN_SHORT_GROUP],
                                               const LN_T bm[LN_SHORT_GROUP], const int *keep,
                                               ln_acc *dw, ln_acc *db, int levels)
{
    size_t w = LN_FN(group_width)(d);
#if defined(LN_SHORT_BACK_OUTPUT_ROWS)
    /* dx into its rows in place, or into a float copy first */
    int direct = LN_FN(back_direct)(d);
    LN_T out[LN_SHORT_GROUP][2 * LN_LANES];
    uint64_t sw[LN_ACC_LEVELS][2 * LN_LANES], sb[LN_ACC_LEVELS][2 * LN_LANES];
    ln_short_back_coefs co;
    for (size_t k = 0; k < LN_SHORT_GROUP; k++) {
        co.hi[k] = hi[k], co.r[k] = r[k], co.c[k] = c[k], co.a[k] = a[k], co.bm[k] = bm[k];
        co.keep[k] = keep[k];
    }
    char *dst = direct ? dx : (char *)out;
    ptrdiff_t dst_row = direct ? dx_row : (ptrdiff_t)sizeof out[0];
#if defined(LN_SHORT_NARROW_KIND)
    if (sizeof(LN_S) < sizeof(float) && direct)
        ln_short_back_output_16(bg->xs, bg->xs_row, bg->dys, bg->dys_row, dst, dst_row, n, d, wp,
                                &co, dw || db ? levels : 0, sw, sb, LN_SHORT_NARROW_KIND);
    else
#endif
        LN_SHORT_BACK_OUTPUT_ROWS(bg->xs, bg->xs_row, bg->dys, bg->dys_row, dst, dst_row, n, d,
                                  wp, &co, dw || db ? levels : 0, sw, sb);
    if (!direct)
        for (size_t k = 0; k < n; k++)
            if (keep[k])
                LN_FN(group_store_row)((LN_S *)(dx + (ptrdiff_t)k * dx_row), out[k], d, w);
    if (dw || db)
        LN_FN(back_group_commit)(sw, sb, d, dw, db, levels);
#else
    LN_T o[LN_LANES][LN_SHORT_GROUP], xh[LN_LANES][LN_SHORT_GROUP];
    for (size_t j = 0; j < w; j++)
        for (size_t k = 0; k < LN_SHORT_GROUP; k++) {
            xh[j][k] = LN_FN(normalize)(bg->x[j][k], hi[k], r[k], c[k]);
            LN_T g = LN_FN(gain_grad)(bg->dy[j][k], wp, j);
            o[j][k] = LN_FN(grad_input)(g, xh[j][k], a[k], bm[k], r[k]);
        }
    LN_T rows[LN_SHORT_GROUP][2 * LN_LANES], xr[LN_SHORT_GROUP][LN_LANES];
    LN_FN(transpose)(&rows[0][0], 2 * LN_LANES, &o[0][0], LN_SHORT_GROUP, w, LN_SHORT_GROUP);
    LN_FN(transpose)(&xr[0][0], LN_LANES, &xh[0][0], LN_SHORT_GROUP, w, LN_SHORT_GROUP);
    for (size_t k = 0; k < n; k++)
        if (keep[k])
            LN_FN(group_store_row)((LN_S *)(dx + (ptrdiff_t)k * dx_row), rows[k], d, w);
    if (dw || db)
        LN_FN(back_group_deposit)(bg->dyr, xr, d, keep, dw, db, levels);
#endif
}
