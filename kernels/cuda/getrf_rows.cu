// Batched LU with partial pivoting, the whole matrix in registers: right-looking, unblocked, one
// barrier per column. Any n whose tile fits one block's registers works (up to ~190 in float32);
// kernels/_gpu/_getrf.py dispatches it where it measured fastest on the H100 (n <= 64).
//
// One thread block per matrix. Thread (ti, tj) of a TI x TJ block (tid = ti * TJ + tj) owns the
// RR x CC elements (ti + TI r, tj + TJ c) of the (padded) matrix in a statically indexed register
// array for the whole run. The column loop is split as k = kc * TJ + kt: kc (the register slot of
// column k) is unrolled, kt runs; so every register index is a compile-time constant, and slots
// c < kc (columns already final) are skipped at compile time.
//
// Swaps are lazy: rows never move. Each thread keeps LAPACK's current position of its RR rows
// (`pos`); the pivot at step k is the row of largest cabs1 among positions >= k, ties to the
// smallest position (LAPACK's i?amax on the swapped order); the interchange (k, p) swaps the two
// positions. Rows are written to their final positions at the end; piv[k] = p.
//
// Step k (one __syncthreads, shared buffers double-buffered by k & 1):
//  1. the owners of column k (tj == kt) reduce their rows to one candidate, write column k to
//     `colv`; xor-shuffles over the warp's row groups give the warp's best candidate;
//  2. the TJ threads holding that row write its columns >= kc's slot to the warp's `rowv` slot; the
//     owner of its column-k element writes (key, position, pivot, 1/pivot) to `cand`;
//  3. barrier; every thread picks the best of the W warp candidates (same answer everywhere),
//     updates its positions, forms l = a_ik / pivot for its unpivoted rows (x * (1/p) when
//     |p| >= sfmin, else x / p: LAPACK's ?getrf2) and does the rank-1 update of its columns > k with
//     fma; l and the pivot-row value are zeroed where no update is due, so the fma's are not
//     predicated.
// Exact zero pivot: no swap (the first largest of all-zero candidates is position k), no scaling,
// info = k + 1 the first time, the factorization goes on. NaN/Inf anywhere in the input: info = -1,
// lu all NaN, piv 0..n-1.
//
// Loads and stores: a warp touches TJ consecutive elements of 32 / TJ rows per instruction (whole
// 32-byte sectors for TJ * sizeof(T) >= 32).
#include "common.cuh"

namespace blu {

template <typename R> struct __align__(16) RowsCand {
    R key;      // cabs1 of the pivot candidate (NaN -> +inf); -1: no candidate in this warp
    int pos;    // its current position
    int recip;  // |pivot| >= sfmin: scale by the reciprocal
};

template <typename R> __device__ __forceinline__ bool rows_better(R k1, int p1, R k0, int p0) {
    return k1 > k0 || (k1 == k0 && p1 < p0);
}

template <typename T, int TI, int TJ, int RR, int CC, int MINB>
__global__ void __launch_bounds__(TI * TJ, MINB)
getrf_rows(const T* a, T* lu, int* __restrict__ piv, int* __restrict__ info_out, int n) {
    using R = real_t<T>;
    constexpr int NT = TI * TJ;
    constexpr int W = NT / 32;
    constexpr int NI = TI * RR;
    constexpr int NJ = TJ * CC;
    constexpr int NOPOS = 0x7fffffff;
    static_assert(NT % 32 == 0 && NT <= 1024, "the block must be whole warps");
    static_assert(TJ <= 32 && 32 % TJ == 0, "TJ must divide 32");

    __shared__ __align__(16) T colv[2][NI];
    __shared__ __align__(16) T rowv[2][W][NJ];
    __shared__ RowsCand<R> cand[2][W];
    __shared__ T candp[2][W];
    __shared__ T candrp[2][W];
    __shared__ int pivs[NI];

    const long long mat = blockIdx.x;
    const int tid = threadIdx.x;
    const int tj = tid % TJ, ti = tid / TJ;
    const int lane = tid & 31, warp = tid >> 5;
    const long long nn = (long long)n * n;
    const T* A = a + mat * nn;

    T x[RR][CC];
    int pos[RR];
    bool bad = false;
#pragma unroll
    for (int r = 0; r < RR; ++r) {
        const int i = ti + TI * r;
        pos[r] = i;
#pragma unroll
        for (int c = 0; c < CC; ++c) {
            const int j = tj + TJ * c;
            x[r][c] = (i < n && j < n) ? A[(long long)i * n + j] : zero<T>();
            bad |= !is_finite(x[r][c]);
        }
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

                // 1. candidates of column k.
                R bkey = R(-1);
                int bpos = NOPOS;
                if (owner) {
#pragma unroll
                    for (int r = 0; r < RR; ++r) {
                        R v = cabs1(x[r][kc]);
                        if (!(v >= R(0))) v = R(__int_as_float(0x7f800000));
                        if (pos[r] >= k && pos[r] < n && rows_better(v, pos[r], bkey, bpos)) {
                            bkey = v;
                            bpos = pos[r];
                        }
                        colv[buf][ti * RR + r] = x[r][kc];
                    }
                }
#pragma unroll
                for (int off = TJ; off < 32; off <<= 1) {
                    const R ok = __shfl_xor_sync(0xffffffffu, bkey, off);
                    const int op = __shfl_xor_sync(0xffffffffu, bpos, off);
                    if (rows_better(ok, op, bkey, bpos)) {
                        bkey = ok;
                        bpos = op;
                    }
                }
                if (TJ > 1) {  // only the lanes of column k's class hold the warp's best
                    bkey = __shfl_sync(0xffffffffu, bkey, kt);
                    bpos = __shfl_sync(0xffffffffu, bpos, kt);
                }

                // 2. the warp's candidate row and its pivot.
#pragma unroll
                for (int r = 0; r < RR; ++r) {
                    if (pos[r] == bpos) {
#pragma unroll
                        for (int c = kc; c < CC; ++c) rowv[buf][warp][tj * CC + c] = x[r][c];
                        if (owner) {
                            const T p = x[r][kc];
                            cand[buf][warp] = RowsCand<R>{bkey, bpos, abs_(p) >= traits<T>::sfmin()};
                            candp[buf][warp] = p;
                            candrp[buf][warp] = div_(one<T>(), p);
                        }
                    }
                }
                if (lane == 0 && bpos == NOPOS) cand[buf][warp] = RowsCand<R>{R(-1), NOPOS, 0};
                __syncthreads();

                // 3. the block's pivot, then the update.
                RowsCand<R> best = cand[buf][0];
                int wbest = 0;
#pragma unroll
                for (int w = 1; w < W; ++w) {
                    const RowsCand<R> o = cand[buf][w];
                    if (rows_better(o.key, o.pos, best.key, best.pos)) {
                        best = o;
                        wbest = w;
                    }
                }
                const int p = best.pos;
                if (tid == 0) pivs[k] = p;
                const bool zero_pivot = best.key == R(0);
                if (zero_pivot && info == 0) info = k + 1;
#pragma unroll
                for (int r = 0; r < RR; ++r) pos[r] = pos[r] == p ? k : (pos[r] == k ? p : pos[r]);

                T l[RR];
                if (zero_pivot) {
#pragma unroll
                    for (int r = 0; r < RR; ++r) l[r] = colv[buf][ti * RR + r];
                } else if (best.recip) {
                    const T rp = candrp[buf][wbest];
#pragma unroll
                    for (int r = 0; r < RR; ++r) l[r] = colv[buf][ti * RR + r] * rp;
                } else {
                    const T pv = candp[buf][wbest];
#pragma unroll
                    for (int r = 0; r < RR; ++r) l[r] = div_(colv[buf][ti * RR + r], pv);
                }
#pragma unroll
                for (int r = 0; r < RR; ++r) {
                    if (!(pos[r] > k)) l[r] = zero<T>();
                }
#pragma unroll
                for (int c = kc; c < CC; ++c) {
                    T pc = rowv[buf][wbest][tj * CC + c];
                    if (c == kc && tj <= kt) pc = zero<T>();
#pragma unroll
                    for (int r = 0; r < RR; ++r) x[r][c] = fms(x[r][c], l[r], pc);
                }
                if (owner) {
#pragma unroll
                    for (int r = 0; r < RR; ++r) {
                        if (pos[r] > k) x[r][kc] = l[r];
                    }
                }
            }
        }
    }

    __syncthreads();
    T* L = lu + mat * nn;
#pragma unroll
    for (int r = 0; r < RR; ++r) {
        const int i = ti + TI * r;
        if (i < n) {
            T* row = L + (long long)(nonfinite ? i : pos[r]) * n;
#pragma unroll
            for (int c = 0; c < CC; ++c) {
                const int j = tj + TJ * c;
                if (j < n) row[j] = nonfinite ? nan_value<T>() : x[r][c];
            }
        }
    }
    for (int i = tid; i < n; i += NT) piv[mat * n + i] = nonfinite ? i : pivs[i];
    if (tid == 0) info_out[mat] = nonfinite ? -1 : info;
}

}  // namespace blu
