// Batched LU with partial pivoting for n <= 32: the whole matrix in registers.
//
// A group of NP lanes (NP a power of two, n <= NP <= 32) factors one matrix; a warp holds 32 / NP
// matrices. Lane i owns row i in NP registers (statically indexed: every loop over k and j is
// unrolled). Swaps are lazy: rows never move, each lane tracks the position `pos` of its row in
// LAPACK's current row order, and rows are written to their final positions at the end.
//
// Step k: the pivot is the row of largest cabs1(a[pos, k]) among positions >= k, ties going to the
// smallest position (LAPACK's i?amax on the swapped order); the pivot row is broadcast with
// shuffles and every row below it takes its rank-1 update.
//
// Outputs: lu (C-order, row `pos` <- the row of the lane that holds position pos), piv[k] = the
// position swapped with k (0-based), info = 0, the first k+1 with an exactly zero pivot, or -1
// when the input holds NaN/Inf (then lu is all NaN and piv is 0..n-1).
#include "common.cuh"

namespace {

struct Cand {
    double key;  // cabs1 of the candidate (double holds every float exactly)
    int pos;     // its position in the current row order (INT_MAX: not a candidate)
    int lane;
};

__device__ __forceinline__ bool better(const Cand& a, const Cand& b) {
    if (a.key != b.key) return a.key > b.key;
    if (a.pos != b.pos) return a.pos < b.pos;
    return a.lane < b.lane;
}

}  // namespace

template <typename T, int NP>
__global__ void __launch_bounds__(128) getrf_small(const T* a, T* lu, int* piv, int* info, int n,
                                                   long long batch) {
    static_assert(NP >= 1 && NP <= 32 && (NP & (NP - 1)) == 0, "NP must be a power of two <= 32");
    using namespace blu;
    const int lane = threadIdx.x & (NP - 1);
    const int per_block = blockDim.x / NP;
    const unsigned group_mask =
        (NP == 32 ? 0xffffffffu : ((1u << NP) - 1u)) << ((threadIdx.x & 31) & ~(NP - 1));

    for (long long base = (long long)blockIdx.x * per_block; base < batch;
         base += (long long)gridDim.x * per_block) {
        const long long m = base + threadIdx.x / NP;
        const bool active = m < batch;
        const bool valid = active && lane < n;
        const size_t off = (size_t)(active ? m : 0) * n * n;

        T r[NP];
        bool bad = false;
#pragma unroll
        for (int j = 0; j < NP; ++j) {
            r[j] = zero<T>();
            if (valid && j < n) {
                r[j] = a[off + (size_t)lane * n + j];
                bad |= !is_finite(r[j]);
            }
        }
        bad = (__ballot_sync(0xffffffffu, bad) & group_mask) != 0;

        int pos = lane;
        int first_zero = 0;
#pragma unroll
        for (int k = 0; k < NP; ++k) {
            if (k < n) {
                const bool cand = valid && pos >= k;
                double key = cand ? (double)cabs1(r[k]) : -1.0;
                if (!(key >= 0.0) && cand) key = __longlong_as_double(0x7ff0000000000000LL);
                Cand best{key, cand ? pos : 0x7fffffff, lane};
#pragma unroll
                for (int o = NP / 2; o >= 1; o >>= 1) {
                    Cand other{__shfl_xor_sync(0xffffffffu, best.key, o, NP),
                               __shfl_xor_sync(0xffffffffu, best.pos, o, NP),
                               __shfl_xor_sync(0xffffffffu, best.lane, o, NP)};
                    if (better(other, best)) best = other;
                }
                const T v = shfl(r[k], best.lane, NP);
                if (lane == 0 && active && !bad) piv[(size_t)m * n + k] = best.pos;
                const bool zero_pivot = is_zero(v);
                if (zero_pivot && first_zero == 0) first_zero = k + 1;

                if (lane == best.lane) pos = k;
                else if (pos == k) pos = best.pos;
                const bool upd = valid && pos > k && !zero_pivot;
                const pivot_scale<T> scale(zero_pivot ? one<T>() : v);
                const T l = scale(r[k]);
                if (upd) r[k] = l;
#pragma unroll
                for (int j = k + 1; j < NP; ++j) {
                    if (j < n) {
                        const T pj = shfl(r[j], best.lane, NP);
                        if (upd) r[j] = fms(r[j], l, pj);
                    }
                }
            }
        }

        if (valid) {
            T* out = lu + off + (size_t)(bad ? lane : pos) * n;
#pragma unroll
            for (int j = 0; j < NP; ++j)
                if (j < n) out[j] = bad ? nan_value<T>() : r[j];
            if (bad) piv[(size_t)m * n + lane] = lane;
            if (lane == 0) info[m] = bad ? -1 : first_zero;
        }
    }
}
