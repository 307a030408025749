// The register-tile elimination shared by getrf_rows (getrf.cu) and gesv_rows (gesv.cu).
//
// Batched LU with partial pivoting, the whole matrix in registers: right-looking, unblocked, one
// barrier per column. Any n whose tile fits one block's registers works (up to ~190 in float32);
// kernels/_gpu/_getrf.py dispatches it where it measured fastest on the H100 (n <= 64).
// gesv_rows is the same elimination followed by the triangular solves from shared memory (rows_trsm;
// kernels/_gpu/_gesv.py: the fused solve).
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
//     (when |p| < sfmin, where LAPACK's ?getrf2 divides, a_ik and p are first scaled by one power of
//     two so that 1/p is finite; no scaling for an exact zero pivot), and the
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

// The solve of gesv_rows (KR > 0 in rows_run): the factors, still in registers with lazy swaps, go to
// shared memory in LAPACK's row order (row fpos[ci] of `lus`; orig[q] = the row of A and B at position
// q), then L y = P^T B and U x = y are solved from there, KR right-hand sides at a time (the rest in
// further passes). Right-hand side j of a pass belongs to the H = NT / KR consecutive lanes j H ..
// j H + H - 1 (H divides 32: they share a warp), lane h of them holding rows h, h + H, ... in registers
// (y[s] is row h + H s). Step k: y_k comes from its lane by one shuffle, and each lane updates its rows
// below (forward) or above (backward) k with L or U's column k from shared memory, up to H distinct
// rows a warp instruction (the row stride, an odd number of 16-byte words, puts up to 8 of them in
// distinct banks). The slot of k (k / H) is unrolled and k % H runs, so every register index and
// which slots lie past k are compile-time; only the slot holding row k itself is predicated. After the
// two barriers that publish the factors and the reciprocals, none: the lanes of a right-hand side
// share a warp. x_k = y_k * (1 / u_kk) where |u_kk| >= sfmin (reciprocals formed once, one per
// thread), else y_k / u_kk.
template <typename T, int TI, int TJ, int RR, int CC, int KR>
__device__ __forceinline__ void rows_trsm(const T (&x)[RR][CC], const int* fpos, const T* Bm, int n,
                                          int nrhs, T* X) {
    constexpr int NT = TI * TJ;
    constexpr int H = NT / KR;           // lanes per right-hand side
    constexpr int NI = TI * RR;          // rows of the tile (>= n)
    constexpr int S = (NI + H - 1) / H;  // rows per lane
    constexpr int LD = rows_stride<T, TJ * CC>();
    static_assert(NT % KR == 0 && 32 % H == 0, "a right-hand side's lanes must share a warp");
    extern __shared__ __align__(16) unsigned char rows_dynamic[];  // NI x LD: gesv_rows_smem (_gesv.py)
    T* lus = reinterpret_cast<T*>(rows_dynamic);
    __shared__ __align__(16) T dinv[NI];         // 1 / u_qq; 0 where |u_qq| < sfmin (divide)
    __shared__ int orig[NI];

    const int tid = threadIdx.x;
    const int tj = tid % TJ, ti = tid / TJ;
#pragma unroll
    for (int r = 0; r < RR; ++r) {
        const int i = ti + TI * r;
        if (i < n) {
            const int f = fpos[ti * RR + r];
            if (tj == 0) orig[f] = i;
#pragma unroll
            for (int c = 0; c < CC; ++c) {
                const int j = tj + TJ * c;
                if (j < n) lus[f * LD + j] = x[r][c];
            }
        }
    }
    __syncthreads();
    for (int q = tid; q < n; q += NT) {
        const T u = lus[q * LD + q];
        dinv[q] = abs_(u) >= traits<T>::sfmin() ? div_(one<T>(), u) : zero<T>();
    }
    __syncthreads();

    const int lane = tid & 31, h = tid % H, jr = tid / H;
    const int src = lane - h;  // lane 0 of this right-hand side's H
    // row h + H s of the factors, for slot s: the last slot's row is clamped into the tile (its lanes
    // past NI - 1 hold no row, and their updates are predicated off)
    const T* first = lus + h * LD;
    const T* last = lus + min(h + H * (S - 1), NI - 1) * LD;
    auto at = [&](int s, int k) -> T { return s == S - 1 ? last[k] : first[H * s * LD + k]; };
    for (int j0 = 0; j0 < nrhs; j0 += KR) {
        const int j = j0 + jr;
        const bool mine = j < nrhs;
        T y[S];
#pragma unroll
        for (int s = 0; s < S; ++s) {
            const int q = h + H * s;
            y[s] = (mine && q < n) ? Bm[(long long)orig[q] * nrhs + j] : zero<T>();
        }
        // L y = P^T b: rows below k (unit diagonal). The rows past n - 1 take updates from whatever
        // lies past the factors in `lus`; they are never read back or stored.
#pragma unroll
        for (int kb = 0; kb < S; ++kb) {
            if (kb * H >= n) break;
#pragma unroll 1
            for (int kh = 0; kh < H; ++kh) {
                const int k = kb * H + kh;
                if (k >= n) break;
                const T yk = shfl(y[kb], src + kh);
                if (h > kh) y[kb] = fms(y[kb], at(kb, k), yk);
#pragma unroll
                for (int s = kb + 1; s < S; ++s) y[s] = fms(y[s], at(s, k), yk);
            }
        }
        // U x = y: rows above k
#pragma unroll
        for (int kb = S - 1; kb >= 0; --kb) {
            if (kb * H >= n) continue;
#pragma unroll 1
            for (int kh = H - 1; kh >= 0; --kh) {
                const int k = kb * H + kh;
                if (k >= n) continue;
                const T d = dinv[k];
                T xk = shfl(y[kb], src + kh);
                if (is_zero(d)) {
                    xk = div_(xk, lus[k * LD + k]);
                } else {
                    xk = xk * d;
                }
                if (h == kh) y[kb] = xk;
                if (h < kh) y[kb] = fms(y[kb], at(kb, k), xk);
#pragma unroll
                for (int s = 0; s < kb; ++s) y[s] = fms(y[s], at(s, k), xk);
            }
        }
#pragma unroll
        for (int s = 0; s < S; ++s) {
            const int q = h + H * s;
            if (mine && q < n) X[(long long)q * nrhs + j] = y[s];
        }
    }
}

// The kernel body. KR = 0 (getrf_rows): LU of A into L (original rows at their final positions), piv,
// info. KR > 0 (gesv_rows): the same LU, then X = A^-1 B by rows_trsm (B and X n x nrhs, KR right-hand
// sides a pass); L and piv unused.
template <typename T, int TI, int TJ, int RR, int CC, int KR>
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
    constexpr int RS = rows_stride<T, CC>();
    static_assert(NT % 32 == 0 && NT <= 1024, "the block must be whole warps");
    static_assert(TJ <= 32 && 32 % TJ == 0, "TJ must divide 32");
    static_assert(RR <= 32, "the pivoted-row mask is one 32-bit word");

    __shared__ __align__(16) T colv[2][NI + 32];  // + 32: search lanes past the last row read padding
    __shared__ __align__(16) T rowv[2][W][TJ * RS];
    __shared__ __align__(16) int4 cand[2][W];      // (key.hi, key.lo, position, colv index)
    __shared__ int pivs[NI];
    __shared__ int fpos[NI];

    const int tid = threadIdx.x;
    const int tj = tid % TJ, ti = tid / TJ;
    const int lane = tid & 31, warp = tid >> 5;
    const int tl = lane / TJ;  // ti within the warp

    T x[RR][CC];
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
                        for (int c = kc; c < CC; ++c) rowv[buf][warp][tj * RS + c] = x[r][c];
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
                if (tid == 0) pivs[k] = p;
                if (ti == pti) act &= ~(1u << pr);
#pragma unroll
                for (int q = 0; q < SR; ++q) spos[q] = spos[q] == p ? k : (spos[q] == k ? p : spos[q]);

                // l = a_ik / p for this thread's rows (the update skips pivoted rows): l * (1 / p) where
                // |p| >= sfmin, as LAPACK; below that, where LAPACK divides each l, (l 2^E) * (1 / (p 2^E))
                // (exact power-of-two scaling, so 1 / (p 2^E) is finite and no l overflows: |l| <= |p|
                // for real types, cabs1(l) <= cabs1(p) for complex). One reciprocal, so one copy of the
                // division in the loop body; no scaling for an exact zero pivot.
                T l[RR];
#pragma unroll
                for (int r = 0; r < RR; ++r) l[r] = colv[buf][ti * RR + r];
                if (!is_zero(pv)) {
                    const R sfmin = traits<T>::sfmin();
                    // complex: cabs1 >= 2 sfmin implies |p| >= sfmin; below that the modulus decides
                    const bool big = traits<T>::is_complex ? cabs1(pv) >= R(2) * sfmin || abs_(pv) >= sfmin
                                                           : abs_(pv) >= sfmin;
                    const R up = big ? R(1) : tiny_pivot_scale<R>();
                    const T rp = recip_(scale_real(pv, up));
                    if (big) {
#pragma unroll
                        for (int r = 0; r < RR; ++r) l[r] = l[r] * rp;
                    } else {
#pragma unroll
                        for (int r = 0; r < RR; ++r) l[r] = scale_real(l[r], up) * rp;
                    }
                } else if (info == 0) {
                    info = k + 1;
                }

                // rank-1 update of the unpivoted rows, columns > k; the owners store l in column k.
#pragma unroll
                for (int c = kc; c < CC; ++c) {
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
    }
    __syncthreads();
    if constexpr (KR > 0) {
        if (nonfinite || info != 0) {  // as xGESV: no solution; NaN over this matrix's X
            for (long long idx = tid; idx < (long long)n * nrhs; idx += NT) X[idx] = nan_value<T>();
        } else {
            rows_trsm<T, TI, TJ, RR, CC, KR>(x, fpos, Bm, n, nrhs, X);
        }
        if (tid == 0) *info_out = nonfinite ? -1 : info;
    } else {
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
    }
}

}  // namespace blu

#endif  // BATCHLU_ROWS_CUH
