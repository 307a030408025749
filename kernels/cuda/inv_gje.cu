// Fused batched inverse with the whole matrix in registers: Gauss-Jordan with partial pivoting as
// LAPACK's xGETRF. (The fused solve is gesv_rows in getrf_rows.cu.)
//
// One thread block per matrix. Thread (ti, tj) of a TI x TJ block owns the RR x CC elements
// (ti + TI*r, tj + TJ*c) and keeps them in registers for the whole run, so the multiply-adds read
// only registers and two broadcast vectors in shared memory (the pivot column and the pivot row).
// Pivoting is implicit: rows never move. `order` holds LAPACK's current row order (logical position ->
// physical row) and `pos` its inverse, so the pivot at step k is the FIRST row of largest cabs1 in that
// order, exactly the row xGETRF picks (the eliminated column equals the Schur complement column).
// The owners of column k reduce their own rows to one candidate each, so the pivot search after the
// barrier reads TI candidates instead of n entries.
//
// inv_gje: after step k the pivot row p holds row k of the in-place inverse and column k holds
// -a_ik / a_pk; the result is unscrambled on the write, inv(A)[k][order[m]] = X[order[k]][m], through
// shared memory (one read of A, one write of inv(A)).
//
// info as xGETRF: -1 for NaN/Inf input (checked first), k+1 for the first exactly zero pivot; any
// info != 0 writes NaN over the whole output. Elements of the padded tile (index >= n) never reach a
// pivot search or the output.
#include "common.cuh"

namespace blu {

// Load the tile, flag non-finite values; returns the block-wide verdict (uniform).
template <typename T, int TI, int TJ, int RR, int CC>
__device__ __forceinline__ bool gje_load(const T* __restrict__ A, T (&x)[RR][CC], int n, int ti, int tj) {
    bool bad = false;
#pragma unroll
    for (int r = 0; r < RR; ++r) {
#pragma unroll
        for (int c = 0; c < CC; ++c) {
            const int i = ti + TI * r, j = tj + TJ * c;
            x[r][c] = (i < n && j < n) ? A[(long long)i * n + j] : zero<T>();
            bad |= !is_finite(x[r][c]);
        }
    }
    return __syncthreads_or(bad) != 0;
}

// Column-k owner: best (cabs1, logical position) among its rows not yet pivoted.
template <typename R>
__device__ __forceinline__ void better(R v, int p, R& best, int& bpos) {
    if (v > best || (v == best && p < bpos)) {
        best = v;
        bpos = p;
    }
}

// After the barrier: every warp reduces the TI candidates (same answer in every warp).
template <typename R, int TI>
__device__ __forceinline__ void gje_pivot(const R* candv, const int* candp, int lane, R& best, int& bpos) {
    best = lane < TI ? candv[lane] : R(-1);
    bpos = lane < TI ? candp[lane] : 0x7fffffff;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const R ov = __shfl_xor_sync(0xffffffffu, best, off);
        const int op = __shfl_xor_sync(0xffffffffu, bpos, off);
        better(ov, op, best, bpos);
    }
}

template <typename T, int TI, int TJ, int RR, int CC, int MINB>
__global__ void __launch_bounds__(TI * TJ, MINB)
inv_gje(const T* __restrict__ a, T* __restrict__ out, int* __restrict__ info_out, int n) {
    using R = real_t<T>;
    constexpr int NT = TI * TJ;
    constexpr int NI = TI * RR;  // padded rows
    constexpr int NJ = TJ * CC;  // padded columns
    static_assert(NT % 32 == 0 && TI <= 32, "block must be whole warps; TI candidates per warp");

    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* stage = reinterpret_cast<T*>(smem_raw);  // n*n, used for the unscrambling write only
    __shared__ T colbuf[2][NI];
    __shared__ T rowbuf[2][NJ];
    __shared__ R candv[2][TI];
    __shared__ int candp[2][TI];
    __shared__ int order[NI], pos[NI];

    const long long mat = blockIdx.x;
    const int tid = threadIdx.x;
    const int tj = tid % TJ, ti = tid / TJ;
    const int lane = tid & 31;
    const T* A = a + mat * (long long)n * n;
    T* O = out + mat * (long long)n * n;

    T x[RR][CC];
    int mypos[RR];  // LAPACK's current position of each own row (pos[] in registers: no race)
#pragma unroll
    for (int r = 0; r < RR; ++r) mypos[r] = ti + TI * r;
    for (int i = tid; i < NI; i += NT) {
        order[i] = i;
        pos[i] = i;
    }
    int info = gje_load<T, TI, TJ, RR, CC>(A, x, n, ti, tj) ? -1 : 0;

    if (info == 0) {
#pragma unroll
        for (int kc = 0; kc < CC; ++kc) {
            for (int kt = 0; kt < TJ; ++kt) {
                const int k = kc * TJ + kt;
                if (k >= n) goto done;
                const int buf = k & 1;
                // Column k to shared memory, then zero it: the update writes -a_ik / a_pk there.
                if (tj == kt) {
                    R cb = R(-1);
                    int cp = 0x7fffffff;
#pragma unroll
                    for (int r = 0; r < RR; ++r) {
                        const int i = ti + TI * r;
                        colbuf[buf][i] = x[r][kc];
                        if (i < n && mypos[r] >= k) better(cabs1(x[r][kc]), mypos[r], cb, cp);
                        x[r][kc] = zero<T>();
                    }
                    candv[buf][ti] = cb;
                    candp[buf][ti] = cp;
                }
                __syncthreads();
                R best;
                int bpos;
                gje_pivot<R, TI>(candv[buf], candp[buf], lane, best, bpos);
                if (best == R(0)) {  // exact zero pivot: the inverse does not exist
                    info = k + 1;
                    goto done;
                }
                if (bpos == 0x7fffffff) bpos = k;  // only NaN left (overflow): carry on, result NaN
                const int p = order[bpos];
                const int pti = p % TI, prr = p / TI;
                {
                    const int q = order[k];
#pragma unroll
                    for (int r = 0; r < RR; ++r) {
                        const int i = ti + TI * r;
                        mypos[r] = i == p ? k : (i == q ? bpos : mypos[r]);
                    }
                }
                // Pivot row to shared memory; its column-k entry becomes 1 so that it scales to 1/a_pk.
                if (ti == pti) {
#pragma unroll
                    for (int r = 0; r < RR; ++r) {
                        if (r == prr) {
#pragma unroll
                            for (int c = 0; c < CC; ++c)
                                rowbuf[buf][tj + TJ * c] = (c == kc && tj == kt) ? one<T>() : x[r][c];
                        }
                    }
                }
                const T ip = div_(one<T>(), colbuf[buf][p]);
                __syncthreads();
                T rs[CC];
#pragma unroll
                for (int c = 0; c < CC; ++c) rs[c] = rowbuf[buf][tj + TJ * c] * ip;
#pragma unroll
                for (int r = 0; r < RR; ++r) {
                    T cv = colbuf[buf][ti + TI * r];
                    if (ti == pti && r == prr) cv = zero<T>();
#pragma unroll
                    for (int c = 0; c < CC; ++c) x[r][c] = fms(x[r][c], cv, rs[c]);
                }
                if (ti == pti) {
#pragma unroll
                    for (int r = 0; r < RR; ++r) {
                        if (r == prr) {
#pragma unroll
                            for (int c = 0; c < CC; ++c) x[r][c] = rs[c];
                        }
                    }
                }
                // Record the interchange. Every reader of order/pos for step k is past the barrier
                // above, and the next readers come after the next step's first barrier.
                if (tid == 0) {
                    const int q = order[k];
                    order[k] = p;
                    order[bpos] = q;
                    pos[p] = k;
                    pos[q] = bpos;
                }
            }
        }
    }
done:
    __syncthreads();
    const long long nn = (long long)n * n;
    if (info != 0) {
        for (long long idx = tid; idx < nn; idx += NT) O[idx] = nan_value<T>();
    } else {
#pragma unroll
        for (int r = 0; r < RR; ++r) {
#pragma unroll
            for (int c = 0; c < CC; ++c) {
                const int i = ti + TI * r, j = tj + TJ * c;
                if (i < n && j < n) stage[i * n + j] = x[r][c];
            }
        }
        __syncthreads();
        for (int idx = tid; idx < n * n; idx += NT) {
            const int k = idx / n, q = idx - k * n;
            O[idx] = stage[order[k] * n + pos[q]];
        }
    }
    if (tid == 0) info_out[mat] = info;
}

}  // namespace blu
