// Fused batched inverse: Gauss-Jordan elimination with partial pivoting, whole matrix in registers.
//
// One thread block per matrix. Thread (ti, tj) of a TI x TJ block owns the RR x CC elements
// (ti + TI*r, tj + TJ*c) and keeps them in registers for the whole run, so the n^3 multiply-adds read
// only registers and two broadcast vectors in shared memory (the pivot column and the pivot row).
// Pivoting is implicit: rows never move. `order` holds LAPACK's current row order (logical position ->
// physical row) and `pos` its inverse, so the pivot at step k is the FIRST row of largest cabs1 in that
// order, exactly the row xGETRF picks (the eliminated column equals the Schur complement column).
// After step k the pivot row p holds row k of the in-place inverse, and column k holds the multipliers
// -a_ik / a_pk; the result is unscrambled on the write:  inv(A)[k][order[m]] = X[order[k]][m].
//
// info as xGETRF: -1 for NaN/Inf input (checked first), k+1 for the first exactly zero pivot; any
// info != 0 writes NaN over the whole inverse. Elements of the padded tile (index >= n) never reach a
// pivot search or the output.
#include "common.cuh"

namespace blu {

template <typename T, int TI, int TJ, int RR, int CC>
__global__ void __launch_bounds__(TI * TJ, 1)
inv_gje(const T* __restrict__ a, T* __restrict__ out, int* __restrict__ info_out, int n) {
    using R = real_t<T>;
    constexpr int NT = TI * TJ;
    constexpr int NI = TI * RR;  // padded rows
    constexpr int NJ = TJ * CC;  // padded columns
    static_assert(NT % 32 == 0, "block must be whole warps");

    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* stage = reinterpret_cast<T*>(smem_raw);  // n*n, used for the unscrambling write only
    __shared__ T colbuf[2][NI];
    __shared__ T rowbuf[2][NJ];
    __shared__ int order[NI], pos[NI];

    const long long mat = blockIdx.x;
    const int tid = threadIdx.x;
    const int tj = tid % TJ, ti = tid / TJ;
    const int lane = tid & 31;
    const T* A = a + mat * (long long)n * n;
    T* O = out + mat * (long long)n * n;

    T x[RR][CC];
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
    for (int i = tid; i < NI; i += NT) {
        order[i] = i;
        pos[i] = i;
    }
    int info = __syncthreads_or(bad) ? -1 : 0;

    if (info == 0) {
#pragma unroll
        for (int kc = 0; kc < CC; ++kc) {
            for (int kt = 0; kt < TJ; ++kt) {
                const int k = kc * TJ + kt;
                if (k >= n) goto done;
                const int buf = k & 1;
                // Column k to shared memory, then zero it: the update writes -a_ik / a_pk there.
                if (tj == kt) {
#pragma unroll
                    for (int r = 0; r < RR; ++r) {
                        colbuf[buf][ti + TI * r] = x[r][kc];
                        x[r][kc] = zero<T>();
                    }
                }
                __syncthreads();
                // Pivot search, redundantly in every warp (no extra barrier): largest cabs1 among rows
                // not yet pivoted, ties to the first in LAPACK's current order.
                R best = R(-1);
                int bpos = 0x7fffffff;
                for (int r = lane; r < n; r += 32) {
                    const int pr = pos[r];
                    if (pr >= k) {
                        const R v = cabs1(colbuf[buf][r]);
                        if (v > best || (v == best && pr < bpos)) {
                            best = v;
                            bpos = pr;
                        }
                    }
                }
#pragma unroll
                for (int off = 16; off > 0; off >>= 1) {
                    const R ov = __shfl_xor_sync(0xffffffffu, best, off);
                    const int op = __shfl_xor_sync(0xffffffffu, bpos, off);
                    if (ov > best || (ov == best && op < bpos)) {
                        best = ov;
                        bpos = op;
                    }
                }
                if (best == R(0)) {  // exact zero pivot: the inverse does not exist
                    info = k + 1;
                    goto done;
                }
                if (bpos == 0x7fffffff) bpos = k;  // only NaN left (overflow): carry on, result NaN
                const int p = order[bpos];
                const int pti = p % TI, prr = p / TI;
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
                __syncthreads();
                const T ip = div_(one<T>(), colbuf[buf][p]);
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
