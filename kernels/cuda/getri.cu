// Batched inverse from the LU factors (xGETRI): inv(A) = U^-1 L^-1 P^T, one thread block per matrix.
//
// Row-major storage makes columns the coalesced direction, so every stage runs one thread per column j
// and walks block rows of NB rows (the paper's "one thread per row" on the transpose):
//   phase 1  L^-1 in place of L (strict lower), block rows top-down:
//            X[I, j] = L[I,I]^-1 (E[I, j] - L[I, <I] X[<I, j])
//   phase 2  U^-1 in place of U (upper), block rows bottom-up:
//            X[I, j] = U[I,I]^-1 (E[I, j] - U[I, >I] X[>I, j])
//   phase 3  out = U^-1 L^-1 P^T: block row I of the product, written through the permutation
//            (out[i][rp[j]] = (U^-1 L^-1)[i][j]), so the column interchange costs no extra pass.
// Each step uses delayed (left-looking) correction: the current block row of column j lives in
// registers (NB values), the NB x (active width) panel of L, U or U^-1 it needs is staged in shared
// memory (stored transposed, so one 16-byte load feeds several rows), and the already-finished part of
// column j is read from global memory by its own thread (coalesced across the warp). Flops: n^3/3 +
// n^3/3 + 2n^3/3 = 4n^3/3, LAPACK's getri count.
//
// Launch shapes: `getri_static` runs the three phases in one launch with ceil(n/32)*32 threads;
// the "dynamic" variant launches each phase-1/2 step with only its active columns
// (`getri_linv_step`, `getri_uinv_step`, the paper's dynamic allocation) and then `getri_product`.
// Matrices with info != 0 get NaN over their whole inverse.
#include "common.cuh"

namespace blu {

template <typename T, int NB> struct getri_panel {
    static constexpr int LDP = NB + 16 / (int)sizeof(T);  // padded: 16-byte rows, fewer bank conflicts
    static_assert((NB * sizeof(T)) % 16 == 0, "NB values must fill whole 16-byte vectors");
};

// w[r] += sign * p[r] * x for r < NB, p a 16-byte aligned shared row of the transposed panel.
template <int NB>
__device__ __forceinline__ void panel_axpy(float (&w)[NB], const float* p, float x) {
#pragma unroll
    for (int q = 0; q < NB / 4; ++q) {
        const float4 v = reinterpret_cast<const float4*>(p)[q];
        w[4 * q] = fmaf(v.x, x, w[4 * q]);
        w[4 * q + 1] = fmaf(v.y, x, w[4 * q + 1]);
        w[4 * q + 2] = fmaf(v.z, x, w[4 * q + 2]);
        w[4 * q + 3] = fmaf(v.w, x, w[4 * q + 3]);
    }
}
template <int NB>
__device__ __forceinline__ void panel_axpy(double (&w)[NB], const double* p, double x) {
#pragma unroll
    for (int q = 0; q < NB / 2; ++q) {
        const double2 v = reinterpret_cast<const double2*>(p)[q];
        w[2 * q] = fma(v.x, x, w[2 * q]);
        w[2 * q + 1] = fma(v.y, x, w[2 * q + 1]);
    }
}
template <int NB>
__device__ __forceinline__ void panel_axpy(c64 (&w)[NB], const c64* p, c64 x) {
#pragma unroll
    for (int q = 0; q < NB / 2; ++q) {
        const float4 v = reinterpret_cast<const float4*>(p)[q];
        w[2 * q] = fma_(w[2 * q], c64{v.x, v.y}, x);
        w[2 * q + 1] = fma_(w[2 * q + 1], c64{v.z, v.w}, x);
    }
}
template <int NB>
__device__ __forceinline__ void panel_axpy(c128 (&w)[NB], const c128* p, c128 x) {
#pragma unroll
    for (int q = 0; q < NB; ++q) {
        const double2 v = reinterpret_cast<const double2*>(p)[q];
        w[q] = fma_(w[q], c128{v.x, v.y}, x);
    }
}

// Stage rows [I0, I0+NB) x columns [l0, l1) of `lu` as panel[(l - l0) * LDP + r]; zero for rows or
// columns >= n and, with UPPER, for l < row (keeps only the upper triangle, diagonal included).
// Every copy is in flight at once (cp.async); the caller's barrier publishes the panel.
template <typename T, int NB, bool UPPER>
__device__ __forceinline__ void load_panel(const T* __restrict__ lu, T* panel, int n, int I0, int l0,
                                           int l1, int tid, int nt) {
    constexpr int LDP = getri_panel<T, NB>::LDP;
    const int w = l1 - l0;
    for (int idx = tid; idx < NB * w; idx += nt) {
        const int r = idx / w, l = l0 + (idx - r * w);
        const int row = I0 + r;
        if (row < n && l < n && (!UPPER || l >= row)) cp_async(&panel[(l - l0) * LDP + r], &lu[(long long)row * n + l]);
        else panel[(l - l0) * LDP + r] = zero<T>();
    }
    cp_async_wait();
}

// w[r] += sum_{l0 <= l < l1} panel[(l - base) * LDP + r] * col[l * n]: column j of L^-1 / U^-1 from
// global memory, U loads issued one group ahead of the multiply-adds that use them.
// Loads in flight per thread: fewer where 1024-thread blocks cap registers at 64.
template <typename T, int MAXT> struct prefetch {
    static constexpr int depth = MAXT > 256 ? 2 : (sizeof(T) == 16 ? 4 : 8);
};

template <typename T, int NB, int U>
__device__ __forceinline__ void panel_dot(T (&w)[NB], const T* panel, const T* __restrict__ col, int n,
                                          int l0, int l1, int base) {
    constexpr int LDP = getri_panel<T, NB>::LDP;
    int l = l0;
    if (l + U <= l1) {
        T nxt[U];
#pragma unroll
        for (int u = 0; u < U; ++u) nxt[u] = col[(long long)(l + u) * n];
        for (; l + 2 * U <= l1; l += U) {
            T cur[U];
#pragma unroll
            for (int u = 0; u < U; ++u) cur[u] = nxt[u];
#pragma unroll
            for (int u = 0; u < U; ++u) nxt[u] = col[(long long)(l + U + u) * n];
#pragma unroll
            for (int u = 0; u < U; ++u) panel_axpy<NB>(w, panel + (l + u - base) * LDP, cur[u]);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) panel_axpy<NB>(w, panel + (l + u - base) * LDP, nxt[u]);
        l += U;
    }
    for (; l < l1; ++l) panel_axpy<NB>(w, panel + (l - base) * LDP, col[(long long)l * n]);
}

// Phase 1 step for column j (j < min(n, I0 + NB)); panel = L[I0:I0+NB, 0:I0+NB] transposed.
template <typename T, int NB, int U>
__device__ __forceinline__ void linv_step(T* __restrict__ lu, const T* panel, int n, int I0, int j) {
    constexpr int LDP = getri_panel<T, NB>::LDP;
    T w[NB];
#pragma unroll
    for (int r = 0; r < NB; ++r) w[r] = (I0 + r == j) ? -one<T>() : zero<T>();  // negated: w = -X
    if (j < I0) {
        panel_axpy<NB>(w, panel + j * LDP, one<T>());  // X[j, j] = 1
        panel_dot<T, NB, U>(w, panel, lu + j, n, j + 1, I0, 0);
    }
    // Unit lower diagonal block, forward (w holds -X, so the update adds).
#pragma unroll
    for (int r = 1; r < NB; ++r) {
#pragma unroll
        for (int s = 0; s < r; ++s) w[r] = fms(w[r], panel[(I0 + s) * LDP + r], w[s]);
    }
#pragma unroll
    for (int r = 0; r < NB; ++r) {
        const int row = I0 + r;
        if (row < n && row > j) lu[(long long)row * n + j] = -w[r];
    }
}

// Phase 2 step for column j (I0 <= j < n); panel = U[I0:I0+NB, I0:npad] transposed (column l at l-I0).
template <typename T, int NB, int U>
__device__ __forceinline__ void uinv_step(T* __restrict__ lu, const T* panel, int n, int I0, int j) {
    constexpr int LDP = getri_panel<T, NB>::LDP;
    T w[NB];
#pragma unroll
    for (int r = 0; r < NB; ++r) w[r] = (I0 + r == j) ? -one<T>() : zero<T>();  // w = -X
    panel_dot<T, NB, U>(w, panel, lu + j, n, I0 + NB, j + 1, I0);
    // Upper diagonal block, backward; rows >= n stay zero and are never divided.
#pragma unroll
    for (int r = NB - 1; r >= 0; --r) {
        if (I0 + r < n) {
#pragma unroll
            for (int s = r + 1; s < NB; ++s) w[r] = fms(w[r], panel[s * LDP + r], w[s]);
            w[r] = div_(w[r], panel[r * LDP + r]);
        }
    }
#pragma unroll
    for (int r = 0; r < NB; ++r) {
        const int row = I0 + r;
        if (row < n && row <= j) lu[(long long)row * n + j] = -w[r];
    }
}

// Phase 3 block row for column j (< n): out[I0+r][rp[j]] = sum_{l >= max(I0, j)} Uinv[I0+r][l] Linv[l][j];
// panel = upper part of U^-1[I0:I0+NB, I0:npad] transposed.
template <typename T, int NB, int U>
__device__ __forceinline__ void product_step(const T* __restrict__ lu, const T* panel, T* __restrict__ out,
                                             int n, int I0, int j, int col) {
    constexpr int LDP = getri_panel<T, NB>::LDP;
    T acc[NB];
#pragma unroll
    for (int r = 0; r < NB; ++r) acc[r] = zero<T>();
    int l = I0;
    if (j >= I0) {
        panel_axpy<NB>(acc, panel + (j - I0) * LDP, one<T>());  // L^-1[j, j] = 1
        l = j + 1;
    }
    panel_dot<T, NB, U>(acc, panel, lu + j, n, l, n, I0);
#pragma unroll
    for (int r = 0; r < NB; ++r) {
        const int row = I0 + r;
        if (row < n) out[(long long)row * n + col] = acc[r];
    }
}

template <typename T>
__device__ __forceinline__ void fill_nan(T* out, long long count, int tid, int nt) {
    for (long long i = tid; i < count; i += nt) out[i] = nan_value<T>();
}

// Phase 3 over all block rows; rp = this matrix's row order (perm_from_piv in getrs.cu).
template <typename T, int NB, int U>
__device__ __forceinline__ void product_all(const T* __restrict__ lu, T* panel, const int* __restrict__ rp,
                                            T* __restrict__ out, int n, int tid, int nt) {
    const int npad = (n + NB - 1) / NB * NB;
    const int col = tid < n ? rp[tid] : 0;
    for (int I0 = 0; I0 < n; I0 += NB) {
        __syncthreads();
        load_panel<T, NB, true>(lu, panel, n, I0, I0, npad, tid, nt);
        __syncthreads();
        if (tid < n) product_step<T, NB, U>(lu, panel, out, n, I0, tid, col);
    }
}

// Shared memory: panel npad x LDP of T. rp (B, n): row order of P^T A (out[:, rp[j]] = (U^-1 L^-1)[:, j]).
template <typename T, int NB, int MAXT, int MINB = 0>
__global__ void __launch_bounds__(MAXT, MINB)
getri_static(T* __restrict__ lu, const int* __restrict__ rp, const int* __restrict__ info,
             T* __restrict__ out, int n) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int npad = (n + NB - 1) / NB * NB;
    T* panel = reinterpret_cast<T*>(smem_raw);
    const long long mat = blockIdx.x;
    const int tid = threadIdx.x, nt = blockDim.x;
    lu += mat * n * n;
    out += mat * n * n;
    if (info[mat] != 0) {
        fill_nan(out, (long long)n * n, tid, nt);
        return;
    }
    for (int I0 = 0; I0 < n; I0 += NB) {
        __syncthreads();
        load_panel<T, NB, false>(lu, panel, n, I0, 0, I0 + NB, tid, nt);
        __syncthreads();
        if (tid < n && tid < I0 + NB) linv_step<T, NB, prefetch<T, MAXT>::depth>(lu, panel, n, I0, tid);
    }
    for (int I0 = (n - 1) / NB * NB; I0 >= 0; I0 -= NB) {
        __syncthreads();
        load_panel<T, NB, false>(lu, panel, n, I0, I0, npad, tid, nt);
        __syncthreads();
        if (tid < n && tid >= I0) uinv_step<T, NB, prefetch<T, MAXT>::depth>(lu, panel, n, I0, tid);
    }
    product_all<T, NB, prefetch<T, MAXT>::depth>(lu, panel, rp + mat * n, out, n, tid, nt);
}

// Phases 1 and 2 interleaved: step b inverts L block row b (top-down) and U block row nb-1-b
// (bottom-up) between the same two barriers; their active columns are complementary (j < (b+1)NB for
// L, j >= (nb-1-b)NB for U), so the threads stay busier and the barrier count halves. The two panels
// are separate (2 x npad x LDP of T); L and U steps touch disjoint triangles of lu.
template <typename T, int NB, int MAXT, int MINB = 0>
__global__ void __launch_bounds__(MAXT, MINB)
getri_merged(T* __restrict__ lu, const int* __restrict__ rp, const int* __restrict__ info,
             T* __restrict__ out, int n) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    constexpr int LDP = getri_panel<T, NB>::LDP;
    const int npad = (n + NB - 1) / NB * NB;
    T* panel = reinterpret_cast<T*>(smem_raw);
    T* panel_u = panel + (long long)npad * LDP;
    const long long mat = blockIdx.x;
    const int tid = threadIdx.x, nt = blockDim.x;
    lu += mat * n * n;
    out += mat * n * n;
    if (info[mat] != 0) {
        fill_nan(out, (long long)n * n, tid, nt);
        return;
    }
    const int nblocks = npad / NB;
    for (int b = 0; b < nblocks; ++b) {
        const int IL = b * NB, IU = (nblocks - 1 - b) * NB;
        __syncthreads();
        load_panel<T, NB, false>(lu, panel, n, IL, 0, IL + NB, tid, nt);
        load_panel<T, NB, false>(lu, panel_u, n, IU, IU, npad, tid, nt);
        __syncthreads();
        if (tid < n && tid < IL + NB) linv_step<T, NB, prefetch<T, MAXT>::depth>(lu, panel, n, IL, tid);
        if (tid < n && tid >= IU) uinv_step<T, NB, prefetch<T, MAXT>::depth>(lu, panel_u, n, IU, tid);
    }
    product_all<T, NB, prefetch<T, MAXT>::depth>(lu, panel, rp + mat * n, out, n, tid, nt);
}

// Dynamic allocation: one launch per phase-1 step with round32(min(n, I0+NB)) threads, column j = tid.
template <typename T, int NB, int MAXT, int MINB = 0>
__global__ void __launch_bounds__(MAXT, MINB)
getri_linv_step(T* __restrict__ lu, const int* __restrict__ info, int n, int I0) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* panel = reinterpret_cast<T*>(smem_raw);
    const long long mat = blockIdx.x;
    if (info[mat] != 0) return;
    const int tid = threadIdx.x, nt = blockDim.x;
    lu += mat * n * n;
    load_panel<T, NB, false>(lu, panel, n, I0, 0, I0 + NB, tid, nt);
    __syncthreads();
    if (tid < n && tid < I0 + NB) linv_step<T, NB, prefetch<T, MAXT>::depth>(lu, panel, n, I0, tid);
}

// One launch per phase-2 step with round32(n - I0) threads, column j = I0 + tid.
template <typename T, int NB, int MAXT, int MINB = 0>
__global__ void __launch_bounds__(MAXT, MINB)
getri_uinv_step(T* __restrict__ lu, const int* __restrict__ info, int n, int I0) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* panel = reinterpret_cast<T*>(smem_raw);
    const long long mat = blockIdx.x;
    if (info[mat] != 0) return;
    const int tid = threadIdx.x, nt = blockDim.x;
    const int npad = (n + NB - 1) / NB * NB;
    lu += mat * n * n;
    load_panel<T, NB, false>(lu, panel, n, I0, I0, npad, tid, nt);
    __syncthreads();
    if (I0 + tid < n) uinv_step<T, NB, prefetch<T, MAXT>::depth>(lu, panel, n, I0, I0 + tid);
}

template <typename T, int NB, int MAXT, int MINB = 0>
__global__ void __launch_bounds__(MAXT, MINB)
getri_product(const T* __restrict__ lu, const int* __restrict__ rp, const int* __restrict__ info,
              T* __restrict__ out, int n) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* panel = reinterpret_cast<T*>(smem_raw);
    const long long mat = blockIdx.x;
    const int tid = threadIdx.x, nt = blockDim.x;
    lu += mat * n * n;
    out += mat * n * n;
    if (info[mat] != 0) {
        fill_nan(out, (long long)n * n, tid, nt);
        return;
    }
    product_all<T, NB, prefetch<T, MAXT>::depth>(lu, panel, rp + mat * n, out, n, tid, nt);
}

}  // namespace blu
