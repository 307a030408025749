// The register-tile elimination shared by getrf_rows (getrf.cu) and gesv_rows (gesv.cu).
//
// Batched LU with partial pivoting, the whole matrix in registers: right-looking, unblocked, one
// barrier per column. Any n whose tile fits one block's registers works (up to ~190 in float32);
// kernels/_gpu/_getrf.py dispatches it where it measured fastest on the H100 (n <= 64).
// gesv_rows is the same elimination with the right-hand sides B riding along in more register
// columns, followed by a backward substitution sweep (kernels/_gpu/_gesv.py: the fused solve).
//
// One thread block per matrix. Thread (ti, tj) of a TI x TJ block (tid = ti * TJ + tj) owns the
// RR x CC elements (ti + TI r, tj + TJ c) of the (padded) matrix in a statically indexed register
// array for the whole run. The column loop is split as k = kc * TJ + kt: kc (the register slot of
// column k) is unrolled, kt runs; so every register index is a compile-time constant, and slots
// c < kc (columns already final) are skipped at compile time.
//
// Swaps are lazy: rows never move. LAPACK's pivot at step k is the row of largest cabs1 among the
// rows not yet pivoted, ties to the smallest CURRENT position (i?amax on the swapped order). A warp
// holds G = 32 / TJ row groups, WR = G * RR rows; "row slot" s = (ti % G) * RR + r numbers them, and
// the column-k buffer `colv` is indexed by ti * RR + r = warp * WR + s. Search lane s (SR = WR / 32
// rounded up slots per lane) keeps the current position of its rows (-1: padding), so a swap costs
// one compare per lane, not one per register row. Each thread keeps a bit mask of its unpivoted rows
// (`act`), which predicates the update: no zeroing selects.
//
// Step k (one __syncthreads, shared buffers double-buffered by k & 1):
//  1. the owners of column k (tj == kt) write it to `colv`; after __syncwarp each search lane reads
//     its rows' values and forms the key (cabs1 bits, NaN -> +inf, -1 when pivoted or padding);
//  2. the warp's best: redux.max over the key's high word; only when several lanes share it (ties,
//     all-zero columns) the low word and then the smallest position decide (`rows_argmax`);
//  3. the TJ threads holding that row write its columns >= kc's slot to the warp's `rowv` slot
//     (predicated stores), the search lane writes (key, position, colv index) to `cand`;
//  4. barrier; lane w reads warp w's candidate, `rows_argmax` again gives the block's pivot; every
//     thread clears the pivot row's `act` bit, search lanes swap the two positions, l = a_ik * (1/p)
//     (a_ik / p when |p| < sfmin, as LAPACK's ?getrf2; no scaling for an exact zero pivot), and the
//     rank-1 update of the unpivoted rows' columns > k runs as predicated fma's.
// Exact zero pivot: no swap (the first of the all-zero candidates is position k), no scaling, info =
// k + 1 the first time, the factorization goes on. NaN/Inf anywhere in the input: info = -1, lu all
// NaN, piv 0..n-1.
//
// Loads and stores: a warp touches TJ consecutive elements of 32 / TJ rows per instruction (whole
// 32-byte sectors for TJ * sizeof(T) >= 32). `rowv` rows are padded to an odd number of 16-byte
// words so the TJ readers' vector loads hit distinct banks.
#ifndef BATCHLU_ROWS_CUH
#define BATCHLU_ROWS_CUH

#include "common.cuh"

namespace blu {

// Row stride of a warp's candidate row in `rowv`: CC elements rounded up to whole 16-byte words, made
// an odd number of words (the TJ threads' vector loads then fall in distinct banks).
template <typename T, int CC> __host__ __device__ constexpr int rows_stride() {
    constexpr int v = sizeof(T) >= 16 ? 1 : 16 / int(sizeof(T));
    constexpr int words = (CC + v - 1) / v;
    return (words % 2 ? words : words + 1) * v;
}

// The kernel body. CB = 0: LU of A into L (original rows at their final positions), piv, info.
// CB > 0 (gesv_rows): B (n x nrhs, nrhs <= TJ * CB) rides along as CB more register columns per
// thread (column tj + TJ cb of B in slot CC + cb), so the elimination applies L^-1 P to it; then a
// backward sweep, one barrier per column, substitutes with U; X goes to its final rows; L, piv unused.
template <typename T, int TI, int TJ, int RR, int CC, int CB>
__device__ __forceinline__ void rows_run(const T* A, const T* Bm, int n, int nrhs, T* L, int* piv,
                                         T* X, int* info_out) {
    using R = real_t<T>;
    constexpr bool WIDE = sizeof(R) == 8;
    constexpr int NT = TI * TJ;
    constexpr int W = NT / 32;
    constexpr int G = 32 / TJ;          // row groups (ti) per warp
    constexpr int WR = G * RR;          // rows per warp
    constexpr int SR = (WR + 31) / 32;  // row slots per search lane
    constexpr int NI = TI * RR;
    constexpr int CX = CC + CB;         // register columns per thread: A's, then B's
    constexpr int RS = rows_stride<T, CX>();
    static_assert(NT % 32 == 0 && NT <= 1024, "the block must be whole warps");
    static_assert(TJ <= 32 && 32 % TJ == 0, "TJ must divide 32");
    static_assert(RR <= 32, "the pivoted-row mask is one 32-bit word");

    __shared__ __align__(16) T colv[2][NI + 32];  // + 32: search lanes past the last row read padding
    __shared__ __align__(16) T rowv[2][W][TJ * RS];
    __shared__ __align__(16) int4 cand[2][W];      // (key.hi, key.lo, position, colv index)
    __shared__ int pivs[NI];
    __shared__ int fpos[NI];
    // solve only (CB > 0): u_kk and 1 / u_kk (0 where the reciprocal is unsafe: divide) by position,
    // and the colv index of the row at each position.
    constexpr int NS = CB > 0 ? NI : 1;
    __shared__ T diag[NS], dinv[NS];
    __shared__ int rowat[NS];

    const int tid = threadIdx.x;
    const int tj = tid % TJ, ti = tid / TJ;
    const int lane = tid & 31, warp = tid >> 5;
    const int tl = lane / TJ;  // ti within the warp

    T x[RR][CX];
    unsigned act = 0;  // bit r: row ti + TI r is a real row not pivoted yet
    bool bad = false;
#pragma unroll
    for (int r = 0; r < RR; ++r) {
        const int i = ti + TI * r;
        if (i < n) act |= 1u << r;
#pragma unroll
        for (int c = 0; c < CC; ++c) {
            const int j = tj + TJ * c;
            x[r][c] = (i < n && j < n) ? A[(long long)i * n + j] : zero<T>();
            bad |= !is_finite(x[r][c]);
        }
#pragma unroll
        for (int c = 0; c < CB; ++c) {
            const int j = tj + TJ * c;
            x[r][CC + c] = (i < n && j < nrhs) ? Bm[(long long)i * nrhs + j] : zero<T>();
        }
    }
    int spos[SR];  // current position of this search lane's row slots; -1: padding or none
#pragma unroll
    for (int q = 0; q < SR; ++q) {
        const int s = lane + 32 * q;
        const int ci = warp * WR + s, i = ci / RR + TI * (ci % RR);
        spos[q] = (s < WR && i < n) ? i : -1;
    }
    const bool nonfinite = __syncthreads_or(bad) != 0;
    int info = 0;

    if (!nonfinite) {
#pragma unroll
        for (int kc = 0; kc < CC; ++kc) {
#pragma unroll 1
            for (int kt = 0; kt < TJ; ++kt) {
                const int k = kc * TJ + kt;
                if (k >= n) break;
                const int buf = k & 1;
                const bool owner = tj == kt;

                // 1. column k to shared memory; the search lanes' keys.
                if (owner) {
#pragma unroll
                    for (int r = 0; r < RR; ++r) colv[buf][ti * RR + r] = x[r][kc];
                }
                __syncwarp();
                RowsKey key{-1, 0u};
                int kpos = kNoPos, kslot = lane;
#pragma unroll
                for (int q = 0; q < SR; ++q) {
                    const int s = lane + 32 * q;
                    RowsKey v = rows_key(colv[buf][warp * WR + s]);
                    if (spos[q] < k) v.hi = -1;
                    if (q == 0) {
                        key = v;
                        kpos = spos[q];
                    } else if (rows_better(v, spos[q], key, kpos)) {
                        key = v;
                        kpos = spos[q];
                        kslot = s;
                    }
                }

                // 2-3. the warp's candidate row and its record.
                const int wl = rows_argmax<WIDE>(key, kpos);
                const int ws = SR == 1 ? wl : __shfl_sync(kFullWarp, kslot, wl);
                const int wti = ws / RR, wr = ws % RR;
#pragma unroll
                for (int r = 0; r < RR; ++r) {
                    if (tl == wti && r == wr) {
#pragma unroll
                        for (int c = kc; c < CX; ++c) rowv[buf][warp][tj * RS + c] = x[r][c];
                    }
                }
                int p, ci;  // the pivot's position and colv index
                if (W == 1) {
                    __syncwarp();
                    p = __shfl_sync(kFullWarp, kpos, wl);
                    ci = ws;
                } else {
                    if (lane == wl) cand[buf][warp] = make_int4(key.hi, int(key.lo), kpos, warp * WR + ws);
                    __syncthreads();
                    // 4. the block's pivot: the best of the W warp candidates.
                    int4 o = make_int4(-1, 0, kNoPos, 0);
                    if (lane < W) o = cand[buf][lane];
                    const int bl = rows_argmax<WIDE>(RowsKey{o.x, unsigned(o.y)}, o.z);
                    p = __shfl_sync(kFullWarp, o.z, bl);
                    ci = __shfl_sync(kFullWarp, o.w, bl);
                }
                const T pv = colv[buf][ci];
                const int pti = ci / RR, pr = ci - pti * RR, wb = pti / G;
                if (tid == 0) {
                    pivs[k] = p;
                    if (CB > 0) {
                        diag[k] = pv;
                        dinv[k] = zero<T>();  // replaced below where the reciprocal is safe
                    }
                }
                if (ti == pti) act &= ~(1u << pr);
#pragma unroll
                for (int q = 0; q < SR; ++q) spos[q] = spos[q] == p ? k : (spos[q] == k ? p : spos[q]);

                // l = a_ik / p for this thread's rows (the update skips pivoted rows).
                T l[RR];
#pragma unroll
                for (int r = 0; r < RR; ++r) l[r] = colv[buf][ti * RR + r];
                const R sfmin = traits<T>::sfmin();
                // complex: cabs1 >= 2 sfmin implies |p| >= sfmin; below that the modulus decides
                if (traits<T>::is_complex ? cabs1(pv) >= R(2) * sfmin : abs_(pv) >= sfmin) {
                    const T rp = div_(one<T>(), pv);
                    if (CB > 0 && tid == 0) dinv[k] = rp;
#pragma unroll
                    for (int r = 0; r < RR; ++r) l[r] = l[r] * rp;
                } else if (is_zero(pv)) {
                    if (info == 0) info = k + 1;
                } else if (abs_(pv) >= sfmin) {
                    const T rp = div_(one<T>(), pv);
                    if (CB > 0 && tid == 0) dinv[k] = rp;
#pragma unroll
                    for (int r = 0; r < RR; ++r) l[r] = l[r] * rp;
                } else {
#pragma unroll
                    for (int r = 0; r < RR; ++r) l[r] = div_(l[r], pv);
                }

                // rank-1 update of the unpivoted rows, columns > k; the owners store l in column k.
#pragma unroll
                for (int c = kc; c < CX; ++c) {
                    const T pc = rowv[buf][wb][tj * RS + c];
#pragma unroll
                    for (int r = 0; r < RR; ++r) {
                        if (((act >> r) & 1) && (c > kc || tj > kt)) x[r][c] = fms(x[r][c], l[r], pc);
                    }
                }
                if (owner) {
#pragma unroll
                    for (int r = 0; r < RR; ++r) {
                        if ((act >> r) & 1) x[r][kc] = l[r];
                    }
                }
            }
        }
    }

    // Every row to its final position (the search lanes know them).
#pragma unroll
    for (int q = 0; q < SR; ++q) {
        const int s = lane + 32 * q;
        if (s < WR) fpos[warp * WR + s] = spos[q];
        if (CB > 0 && s < WR && spos[q] >= 0) rowat[spos[q]] = warp * WR + s;
    }
    __syncthreads();
    if constexpr (CB == 0) {
#pragma unroll
        for (int r = 0; r < RR; ++r) {
            const int i = ti + TI * r;
            if (i < n) {
                T* row = L + (long long)fpos[ti * RR + r] * n;
#pragma unroll
                for (int c = 0; c < CC; ++c) {
                    const int j = tj + TJ * c;
                    if (j < n) row[j] = nonfinite ? nan_value<T>() : x[r][c];
                }
            }
        }
        for (int i = tid; i < n; i += NT) piv[i] = nonfinite ? i : pivs[i];
        if (tid == 0) *info_out = nonfinite ? -1 : info;
    } else {
        if (nonfinite || info != 0) {  // as xGESV: no solution; NaN over this matrix's X
            for (long long idx = tid; idx < (long long)n * nrhs; idx += NT) X[idx] = nan_value<T>();
            if (tid == 0) *info_out = nonfinite ? -1 : info;
            return;
        }
        int mypos[RR];  // final position of each of this thread's rows; kNoPos for padding
#pragma unroll
        for (int r = 0; r < RR; ++r) {
            const int f = fpos[ti * RR + r];
            mypos[r] = f < 0 ? kNoPos : f;
        }
        // Backward, one barrier per column: the threads of the row at position k form x_k = y_k / u_kk
        // (times the reciprocal kept by the forward sweep where that is safe) and put it in rowv, the
        // owners of column k put u_ik in colv; then y_i -= u_ik x_k for the rows at positions i < k.
        // (A variant with one barrier per TJ columns, each thread solving the TJ x TJ diagonal block
        // for its columns, measured 1.0-1.5x slower on the H100: docs/design.md.)
#pragma unroll
        for (int kc = CC - 1; kc >= 0; --kc) {
#pragma unroll 1
            for (int kt = TJ - 1; kt >= 0; --kt) {
                const int k = kc * TJ + kt;
                if (k >= n) continue;
                const int buf = k & 1;
                const int ci = rowat[k];
                const int pti = ci / RR, pr = ci - pti * RR;
                if (tj == kt) {
#pragma unroll
                    for (int r = 0; r < RR; ++r) colv[buf][ti * RR + r] = x[r][kc];
                }
                if (ti == pti) {
                    const T d = dinv[k];
                    const bool recip = !is_zero(d);
#pragma unroll
                    for (int r = 0; r < RR; ++r) {
                        if (r == pr) {
#pragma unroll
                            for (int c = 0; c < CB; ++c) {
                                x[r][CC + c] = recip ? x[r][CC + c] * d : div_(x[r][CC + c], diag[k]);
                                rowv[buf][0][tj * RS + c] = x[r][CC + c];
                            }
                        }
                    }
                }
                if (W == 1) {
                    __syncwarp();
                } else {
                    __syncthreads();
                }
                T xk[CB];
#pragma unroll
                for (int c = 0; c < CB; ++c) xk[c] = rowv[buf][0][tj * RS + c];
#pragma unroll
                for (int r = 0; r < RR; ++r) {
                    if (mypos[r] < k) {
                        const T cv = colv[buf][ti * RR + r];
#pragma unroll
                        for (int c = 0; c < CB; ++c) x[r][CC + c] = fms(x[r][CC + c], cv, xk[c]);
                    }
                }
            }
        }
#pragma unroll
        for (int r = 0; r < RR; ++r) {
            if (mypos[r] != kNoPos) {
                T* row = X + (long long)mypos[r] * nrhs;
#pragma unroll
                for (int c = 0; c < CB; ++c) {
                    const int j = tj + TJ * c;
                    if (j < nrhs) row[j] = x[r][CC + c];
                }
            }
        }
        if (tid == 0) *info_out = 0;
    }
}

}  // namespace blu

#endif  // BATCHLU_ROWS_CUH
