// Batched sign and log|det| from the LU factors: det(A) = (-1)^(interchanges) prod_i U[i][i].
// One warp per matrix; the sum of logs, the product of unit phases and the interchange parity are
// reduced with shuffles, in the input's precision. info < 0 gives NaN and NaN, info > 0 gives sign 0
// and logabsdet -inf (numpy.linalg.slogdet's answer for an exactly singular matrix).
#include "common.cuh"

namespace blu {

__device__ __forceinline__ float neg_inf(float) { return __int_as_float(0xff800000); }
__device__ __forceinline__ double neg_inf(double) { return __longlong_as_double(0xfff0000000000000ULL); }
__device__ __forceinline__ float log_(float v) { return logf(v); }
__device__ __forceinline__ double log_(double v) { return log(v); }

// d / |d| (the phase), with |d| = m > 0.
__device__ __forceinline__ float phase(float d, float) { return d < 0.0f ? -1.0f : 1.0f; }
__device__ __forceinline__ double phase(double d, double) { return d < 0.0 ? -1.0 : 1.0; }
__device__ __forceinline__ c64 phase(c64 d, float m) { return {d.re / m, d.im / m}; }
__device__ __forceinline__ c128 phase(c128 d, double m) { return {d.re / m, d.im / m}; }

// Renormalise a product of phases to modulus 1 (real: already +-1).
__device__ __forceinline__ float unit(float s) { return s; }
__device__ __forceinline__ double unit(double s) { return s; }
__device__ __forceinline__ c64 unit(c64 s) {
    const float m = hypotf(s.re, s.im);
    return {s.re / m, s.im / m};
}
__device__ __forceinline__ c128 unit(c128 s) {
    const double m = hypot(s.re, s.im);
    return {s.re / m, s.im / m};
}

template <typename T>
__global__ void __launch_bounds__(128)
slogdet_kernel(const T* __restrict__ lu, const int* __restrict__ piv, const int* __restrict__ info,
               T* __restrict__ sign, real_t<T>* __restrict__ logabsdet, int n, long long batch) {
    using R = real_t<T>;
    const long long mat = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x & 31;
    if (mat >= batch) return;
    const T* L = lu + mat * n * n;
    const int* pv = piv + mat * n;
    R acc = R(0);
    T s = one<T>();
    int parity = 0;
    for (int i = lane; i < n; i += 32) {
        const T d = L[(long long)i * n + i];
        const R m = abs_(d);
        acc += log_(m);
        s = s * phase(d, m);
        parity ^= (pv[i] != i);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        acc += __shfl_xor_sync(0xffffffffu, acc, off);
        s = s * shfl(s, lane ^ off);
        parity ^= __shfl_xor_sync(0xffffffffu, parity, off);
    }
    if (lane == 0) {
        const int code = info[mat];
        if (code < 0) {
            sign[mat] = nan_value<T>();
            logabsdet[mat] = nan_value<R>();
        } else if (code > 0) {
            sign[mat] = zero<T>();
            logabsdet[mat] = neg_inf(R(0));
        } else {
            s = unit(s);
            sign[mat] = parity ? -s : s;
            logabsdet[mat] = acc;
        }
    }
}

}  // namespace blu
