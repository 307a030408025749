// Helpers shared by the blocked getrf kernels (getrf_blocked.cu, getrf_lsm.cu): the pivot candidate and
// its block-wide arg-max, 16-byte vector views, the panel's leading dimension, and the factorization
// of one column panel held in shared memory with each thread's row in registers.
#ifndef BATCHLU_PANEL_CUH
#define BATCHLU_PANEL_CUH

#include "common.cuh"

namespace blu {

template <typename T> struct Vec16 {
    static constexpr int N = 16 / sizeof(T);
    union {
        uint4 raw;
        T v[N];
    };
};

// Pivot candidate: key = cabs1 (NaN -> +inf, non-candidates -1), tag = (0xffff - position) << 16 | row,
// so the larger (key, tag) wins: largest key, then smallest position (LAPACK's i?amax order).
template <typename R> struct Cand {
    R key;
    unsigned tag;
};

template <typename R> __device__ __forceinline__ bool better(const Cand<R>& a, const Cand<R>& b) {
    return a.key > b.key || (a.key == b.key && a.tag > b.tag);
}

template <typename R> __device__ __forceinline__ Cand<R> warp_argmax(Cand<R> c) {
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) {
        const Cand<R> other{__shfl_xor_sync(0xffffffffu, c.key, o), __shfl_xor_sync(0xffffffffu, c.tag, o)};
        if (better(other, c)) c = other;
    }
    return c;
}

template <typename T> __device__ __forceinline__ real_t<T> pivot_key(T x) {
    real_t<T> key = cabs1(x);
    return key >= real_t<T>(0) ? key : real_t<T>(__int_as_float(0x7f800000));  // NaN -> +inf
}

// Leading dimension of a panel in shared memory (column-major, NB columns of n rows): a multiple of 4
// elements keeps 16-byte alignment for the broadcast vector loads of U.
__host__ __device__ constexpr int ldp_for(int n) { return ((n + 3) & ~3) + 4; }

// Factor the panel P (column-major, leading dimension ldp; w <= NB live columns, global columns k0 ..)
// on its rows k0 .. n-1, one row per thread (row k0 + tid; needs n - k0 <= blockDim.x), held in
// registers. Partial pivoting with lazy swaps: rows never move in P; each thread tracks its row's
// current position, and on return posof[i] is the final position of panel row i (i >= k0). One
// block-wide arg-max (warp shuffles, one __syncthreads over double-buffered scratch `red`, 64 entries)
// per column. Thread 0 stores the pivots (pv[k0 + c] = position swapped with k0 + c, and pvt[c] too
// when pvt is not null) and keeps first_zero (first k + 1 with an exactly zero pivot: no swap, no
// scaling). Every row is stored back to P each column, so the next pivot row can be read by all.
// The caller synchronises before reading P or posof.
template <typename T, int NB>
__device__ __forceinline__ void panel_factor_rows(T* P, int ldp, int n, int k0, int w, int* posof,
                                                  int* pv, int* pvt, int& first_zero,
                                                  Cand<real_t<T>>* red) {
    using R = real_t<T>;
    const int tid = threadIdx.x, nw = blockDim.x >> 5, warp = tid >> 5, lane = tid & 31;
    const int i = k0 + tid;
    const bool mine = i < n;
    T row[NB];
#pragma unroll
    for (int c = 0; c < NB; ++c) row[c] = mine ? P[c * ldp + i] : zero<T>();
    int pos = i;
#pragma unroll
    for (int c = 0; c < NB; ++c) {
        if (c < w) {
            const int kk = k0 + c;
            Cand<R> cand{R(-1), 0u};
            if (mine && pos >= kk) cand = Cand<R>{pivot_key(row[c]), ((0xffffu - pos) << 16) | unsigned(i)};
            cand = warp_argmax(cand);
            Cand<R>* rb = red + (c & 1) * 32;
            if (lane == 0) rb[warp] = cand;
            __syncthreads();
            cand = rb[0];
            for (int wi = 1; wi < nw; ++wi) {
                const Cand<R> o = rb[wi];
                if (better(o, cand)) cand = o;
            }
            const int bp = 0xffff - int(cand.tag >> 16), br = int(cand.tag & 0xffffu);
            const T v = P[c * ldp + br];
            const bool zero_pivot = is_zero(v);
            if (tid == 0) {
                pv[kk] = bp;
                if (pvt) pvt[c] = bp;
                if (zero_pivot && first_zero == 0) first_zero = kk + 1;
            }
            if (i == br) pos = kk;
            else if (pos == kk) pos = bp;
            if (mine && pos > kk && !zero_pivot) {
                T prow[NB];
#pragma unroll
                for (int c2 = c + 1; c2 < NB; ++c2)
                    if (c2 < w) prow[c2] = P[c2 * ldp + br];
                const pivot_scale<T> scale(v);
                const T l = scale(row[c]);
                row[c] = l;
#pragma unroll
                for (int c2 = c + 1; c2 < NB; ++c2)
                    if (c2 < w) row[c2] = fms(row[c2], l, prow[c2]);
#pragma unroll
                for (int c2 = c + 1; c2 < NB; ++c2)
                    if (c2 < w) P[c2 * ldp + i] = row[c2];
            }
        }
    }
    if (mine) {
#pragma unroll
        for (int c = 0; c < NB; ++c) P[c * ldp + i] = row[c];
        posof[i] = pos;
    }
}

}  // namespace blu

#endif  // BATCHLU_PANEL_CUH
