// Batched solve from the LU factors (xGETRS, no transpose): x = U^-1 L^-1 P^T b, b of shape (B, n, k).
//
// Block (mat, chunk) solves KC right-hand-side columns of one matrix; its columns of b live in shared
// memory (Y, npad x KC) for the whole run, loaded through the row order rp (Y = P^T B). Block rows of NB rows are solved with delayed correction:
//   forward   Y[I] -= L[I, <I] Y[<I]   then the unit lower NB x NB diagonal block
//   backward  Y[I] -= U[I, >I] Y[>I]   then the upper diagonal block (divides by U[i][i])
// The correction is spread over all 256 threads as (row r, column c, part) with the dot product split
// into P = 256 / (NB*KC) strided parts; L and U rows are read from global memory, each element once
// per chunk, contiguously per thread, with four partial sums in flight. The interchanges become the row
// order rp once per matrix (`perm_from_piv`, one thread per matrix), so no block runs a serial chain of
// swaps; getri uses the same rp for its column interchange.
// With `info` given (solve), matrices with info != 0 get NaN; without it (lu_solve), a zero pivot
// gives inf/NaN in its own x, as the CPU backend does.
#include "common.cuh"

namespace blu {

// rp[i] = original row at position i of P^T A, from LAPACK's interchanges (row k <-> piv[k]).
// Out-of-range entries (never produced by getrf) are skipped rather than followed out of bounds.
__global__ void __launch_bounds__(128)
perm_from_piv(const int* __restrict__ piv, int* __restrict__ rp, int n, long long batch) {
    const long long mat = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (mat >= batch) return;
    const int* p = piv + mat * n;
    int* r = rp + mat * n;
    for (int i = 0; i < n; ++i) r[i] = i;
    for (int k = 0; k < n; ++k) {
        const int q = p[k];
        if (q != k && q > k && q < n) {
            const int t = r[k];
            r[k] = r[q];
            r[q] = t;
        }
    }
}

// Partial dot product sum_{l = l0, l0+P, ... < l1} Lr[l] * Y[l][c] with four independent sums.
template <typename T, int KC, int P>
__device__ __forceinline__ T strided_dot(const T* __restrict__ Lr, const T* Y, int c, int l0, int l1) {
    T s0 = zero<T>(), s1 = zero<T>(), s2 = zero<T>(), s3 = zero<T>();
    int l = l0;
    for (; l + 3 * P < l1; l += 4 * P) {
        s0 = fma_(s0, Lr[l], Y[l * KC + c]);
        s1 = fma_(s1, Lr[l + P], Y[(l + P) * KC + c]);
        s2 = fma_(s2, Lr[l + 2 * P], Y[(l + 2 * P) * KC + c]);
        s3 = fma_(s3, Lr[l + 3 * P], Y[(l + 3 * P) * KC + c]);
    }
    for (; l < l1; l += P) s0 = fma_(s0, Lr[l], Y[l * KC + c]);
    return (s0 + s1) + (s2 + s3);
}

template <typename T, int NB, int KC>
__global__ void __launch_bounds__(256)
getrs_kernel(const T* __restrict__ lu, const int* __restrict__ rp, const int* __restrict__ info,
             const T* __restrict__ b, T* __restrict__ x, int n, int k) {
    constexpr int NT = 256;
    static_assert(NB * KC <= NT && NT % (NB * KC) == 0, "one (row, column) pair per thread at least");
    constexpr int P = NT / (NB * KC);
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int npad = (n + NB - 1) / NB * NB;
    T* Y = reinterpret_cast<T*>(smem_raw);  // npad x KC
    T* red = Y + (long long)npad * KC;      // P x NB x KC partial sums (P > 1)

    const long long mat = blockIdx.x;
    const int c0 = blockIdx.y * KC;
    const int tid = threadIdx.x;
    const int c = tid % KC, r = (tid / KC) % NB, part = tid / (KC * NB);
    const T* L = lu + mat * n * n;
    const int* rpm = rp + mat * n;
    b += mat * (long long)n * k;
    x += mat * (long long)n * k;

    if (info != nullptr && info[mat] != 0) {
        for (int idx = tid; idx < n * KC; idx += NT) {
            const int i = idx / KC, cc = idx - i * KC;
            if (c0 + cc < k) x[(long long)i * k + c0 + cc] = nan_value<T>();
        }
        return;
    }
    for (int idx = tid; idx < npad * KC; idx += NT) {
        const int i = idx / KC, cc = idx - i * KC;
        Y[idx] = (i < n && c0 + cc < k) ? b[(long long)rpm[i] * k + c0 + cc] : zero<T>();
    }

    // Forward: L y = P^T b.
    for (int I0 = 0; I0 < n; I0 += NB) {
        __syncthreads();
        const int row = I0 + r;
        if (I0 > 0) {
            T s = zero<T>();
            if (row < n) s = strided_dot<T, KC, P>(L + (long long)row * n, Y, c, part, I0);
            if (P == 1) {
                Y[row * KC + c] = Y[row * KC + c] - s;
            } else {
                red[tid] = s;
                __syncthreads();
                if (part == 0) {
                    T t = Y[row * KC + c];
#pragma unroll
                    for (int q = 0; q < P; ++q) t = t - red[q * NB * KC + r * KC + c];
                    Y[row * KC + c] = t;
                }
            }
            __syncthreads();
        }
        if (tid < KC) {
            T y[NB];
#pragma unroll
            for (int q = 0; q < NB; ++q) y[q] = Y[(I0 + q) * KC + tid];
#pragma unroll
            for (int q = 1; q < NB; ++q) {
                if (I0 + q < n) {
                    const T* Lr = L + (long long)(I0 + q) * n + I0;
#pragma unroll
                    for (int s = 0; s < q; ++s) y[q] = fms(y[q], Lr[s], y[s]);
                }
            }
#pragma unroll
            for (int q = 0; q < NB; ++q) Y[(I0 + q) * KC + tid] = y[q];
        }
    }

    // Backward: U x = y.
    for (int I0 = (n - 1) / NB * NB; I0 >= 0; I0 -= NB) {
        const int I1 = min(I0 + NB, n);
        __syncthreads();
        const int row = I0 + r;
        if (I1 < n) {
            T s = zero<T>();
            if (row < n) s = strided_dot<T, KC, P>(L + (long long)row * n, Y, c, I1 + part, n);
            if (P == 1) {
                Y[row * KC + c] = Y[row * KC + c] - s;
            } else {
                red[tid] = s;
                __syncthreads();
                if (part == 0) {
                    T t = Y[row * KC + c];
#pragma unroll
                    for (int q = 0; q < P; ++q) t = t - red[q * NB * KC + r * KC + c];
                    Y[row * KC + c] = t;
                }
            }
            __syncthreads();
        }
        if (tid < KC) {
            T y[NB];
#pragma unroll
            for (int q = 0; q < NB; ++q) y[q] = Y[(I0 + q) * KC + tid];
#pragma unroll
            for (int q = NB - 1; q >= 0; --q) {
                if (I0 + q < n) {
                    const T* Ur = L + (long long)(I0 + q) * n + I0;
#pragma unroll
                    for (int s = q + 1; s < NB; ++s) {
                        if (I0 + s < n) y[q] = fms(y[q], Ur[s], y[s]);
                    }
                    y[q] = div_(y[q], Ur[q]);
                }
            }
#pragma unroll
            for (int q = 0; q < NB; ++q) Y[(I0 + q) * KC + tid] = y[q];
        }
    }
    __syncthreads();
    for (int idx = tid; idx < n * KC; idx += NT) {
        const int i = idx / KC, cc = idx - i * KC;
        if (c0 + cc < k) x[(long long)i * k + c0 + cc] = Y[idx];
    }
}

}  // namespace blu
