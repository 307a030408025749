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
//
// The family also holds the fused inverses inv_gje (section below), used while the matrix fits one
// block's registers, and inv_tiny (one thread per matrix, n <= 8); kernels/_gpu/_getri.py chooses
// between them: see docs/design.md#getri-dispatch.
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

// The delayed-correction sums on FP64 tensor cores: every kernel's MMA parameter (the dispatch picks it
// where it measured faster), possible with at most 512 threads (the scratch of 32 warps would not fit
// beside the panel at n = 1024).
template <typename T, int MAXT> struct GetriMma {
    static constexpr bool ok = MAXT <= 512;
};

// A warp's scratch: 8 rows x 32 sums (one row tile of the mma at a time, whatever NB), padded rows;
// _getri.py's launch_getri mirrors both numbers.
constexpr int kScratchRows = 8;
constexpr int kScratchLd = 33;

// The scratch of this thread's warp, after `cols` columns of panel (each LDP of T) in shared memory.
template <typename T, int NB>
__device__ __forceinline__ T* warp_scratch(unsigned char* smem, long long cols, int tid) {
    return reinterpret_cast<T*>(smem) + cols * getri_panel<T, NB>::LDP + (tid >> 5) * kScratchRows * kScratchLd;
}

template <typename T, bool LOWER>
__device__ __forceinline__ T x_at(const T* __restrict__ lu, int n, int l, int j) {
    if (l >= n || j >= n) return zero<T>();
    if constexpr (LOWER) return l > j ? lu[(long long)l * n + j] : (l == j ? one<T>() : zero<T>());
    else return l <= j ? lu[(long long)l * n + j] : zero<T>();
}

// A warp's 32 columns at once: w[r] += sum_{lo <= l < hi} panel[(l - base) * LDP + r] X[l, j] for
// j = jw + lane, as mma.sync m8n8k4 tiles (A = the panel transposed, NB rows x 4 l; B = 4 l x 8 columns
// of X, read from global memory; C = NB x 32), the sums handed back one column per lane through
// `scratch` (warp_scratch), one row tile of 8 at a time. X is masked as the triangle it is: L^-1
// (LOWER: unit diagonal, zero above) or U^-1 (zero below), and zero outside the matrix, so the ranges
// can be the warp's, not each column's.
// Every lane of the warp must call it (warp-uniform arguments but `w`). float / complex64 values are
// converted to double on the way in: their sums are accumulated in double and rounded to T once.
template <typename T, int NB, bool LOWER>
__device__ __forceinline__ void panel_dot_mma(T (&w)[NB], const T* panel, const T* __restrict__ lu, int n, int lo,
                                              int hi, int base, int jw, T* scratch, int lane) {
    constexpr bool CPLX = traits<T>::is_complex;
    constexpr int LDP = getri_panel<T, NB>::LDP;
    constexpr int MT = NB / 8;  // row tiles of 8; 4 column tiles of 8
    static_assert(NB % 8 == 0, "NB must be a multiple of 8");
    const int g = lane >> 2, t = lane & 3;
    double cr[MT][4][2], ci[MT][4][2];  // C[8 mt + g][8 nt + 2 t + e]
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) cr[mt][nt][e] = ci[mt][nt][e] = 0.0;
    // fragments of l .. l + 3 (lane: A[g][t], B[t][g]); the next group's are loaded before this one's mma
    T a[MT], b[4], an[MT], bn[4];
    auto fetch = [&](int l, T (&fa)[MT], T (&fb)[4]) {
        const int lt = l + t;
        const bool in = lt < hi;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) fa[mt] = in ? panel[(lt - base) * LDP + mt * 8 + g] : zero<T>();
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) fb[nt] = in ? x_at<T, LOWER>(lu, n, lt, jw + nt * 8 + g) : zero<T>();
    };
    if (lo < hi) fetch(lo, an, bn);
    for (int l = lo; l < hi; l += 4) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) a[mt] = an[mt];
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) b[nt] = bn[nt];
        if (l + 4 < hi) fetch(l + 4, an, bn);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
                if constexpr (CPLX) {
                    dmma(cr[mt][nt], a[mt].re, b[nt].re);
                    dmma(cr[mt][nt], -a[mt].im, b[nt].im);
                    dmma(ci[mt][nt], a[mt].re, b[nt].im);
                    dmma(ci[mt][nt], a[mt].im, b[nt].re);
                } else {
                    dmma(cr[mt][nt], a[mt], b[nt]);
                }
            }
    }
    static_assert(kScratchRows == 8, "one row tile of C at a time");
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                using R = real_t<T>;
                T& dst = scratch[g * kScratchLd + nt * 8 + 2 * t + e];
                if constexpr (CPLX) dst = T{R(cr[mt][nt][e]), R(ci[mt][nt][e])};
                else dst = R(cr[mt][nt][e]);
            }
        __syncwarp();
#pragma unroll
        for (int r = 0; r < 8; ++r) w[mt * 8 + r] = w[mt * 8 + r] + scratch[r * kScratchLd + lane];
        __syncwarp();  // the scratch is free again
    }
}

// Phase 1 step for column j (j < min(n, I0 + NB)); panel = L[I0:I0+NB, 0:I0+NB] transposed. MMA: called by
// every lane of a warp with a column below min(n, I0 + NB); `active` says whether lane's column is one.
template <typename T, int NB, int U, bool MMA = false>
__device__ __forceinline__ void linv_step(T* __restrict__ lu, const T* panel, int n, int I0, int j,
                                          bool active = true, T* scratch = nullptr, int lane = 0) {
    constexpr int LDP = getri_panel<T, NB>::LDP;
    T w[NB];
#pragma unroll
    for (int r = 0; r < NB; ++r) w[r] = (I0 + r == j) ? -one<T>() : zero<T>();  // negated: w = -X
    if constexpr (MMA) {
        const int jw = j - lane;  // the warp's first column
        if (jw < I0) panel_dot_mma<T, NB, true>(w, panel, lu, n, jw, I0, 0, jw, scratch, lane);  // X[j, j] = 1 included
    } else if (j < I0) {
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
        if (active && row < n && row > j) lu[(long long)row * n + j] = -w[r];
    }
}

// Phase 2 step for column j (I0 <= j < n); panel = U[I0:I0+NB, I0:npad] transposed (column l at l-I0).
// MMA: called by every lane of a warp with a column in [I0, n); `active` as in linv_step.
template <typename T, int NB, int U, bool MMA = false>
__device__ __forceinline__ void uinv_step(T* __restrict__ lu, const T* panel, int n, int I0, int j,
                                          bool active = true, T* scratch = nullptr, int lane = 0) {
    constexpr int LDP = getri_panel<T, NB>::LDP;
    T w[NB];
#pragma unroll
    for (int r = 0; r < NB; ++r) w[r] = (I0 + r == j) ? -one<T>() : zero<T>();  // w = -X
    if constexpr (MMA) {
        const int jw = j - lane, hi = min(n, jw + 32);
        if (I0 + NB < hi) panel_dot_mma<T, NB, false>(w, panel, lu, n, I0 + NB, hi, I0, jw, scratch, lane);
    } else {
        panel_dot<T, NB, U>(w, panel, lu + j, n, I0 + NB, j + 1, I0);
    }
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
        if (active && row < n && row <= j) lu[(long long)row * n + j] = -w[r];
    }
}

// Phase 3 block row for column j (< n): out[I0+r][rp[j]] = sum_{l >= max(I0, j)} Uinv[I0+r][l] Linv[l][j];
// panel = upper part of U^-1[I0:I0+NB, I0:npad] transposed.
// MMA: called by every lane of a warp with a column below n; `active` as in linv_step.
template <typename T, int NB, int U, bool MMA = false>
__device__ __forceinline__ void product_step(const T* __restrict__ lu, const T* panel, T* __restrict__ out,
                                             int n, int I0, int j, int col, bool active = true,
                                             T* scratch = nullptr, int lane = 0) {
    constexpr int LDP = getri_panel<T, NB>::LDP;
    T acc[NB];
#pragma unroll
    for (int r = 0; r < NB; ++r) acc[r] = zero<T>();
    if constexpr (MMA) {
        const int jw = j - lane;
        panel_dot_mma<T, NB, true>(acc, panel, lu, n, max(I0, jw), n, I0, jw, scratch, lane);  // L^-1[j, j] = 1 included
    } else {
        int l = I0;
        if (j >= I0) {
            panel_axpy<NB>(acc, panel + (j - I0) * LDP, one<T>());  // L^-1[j, j] = 1
            l = j + 1;
        }
        panel_dot<T, NB, U>(acc, panel, lu + j, n, l, n, I0);
    }
#pragma unroll
    for (int r = 0; r < NB; ++r) {
        const int row = I0 + r;
        if (active && row < n) out[(long long)row * n + col] = acc[r];
    }
}

template <typename T>
__device__ __forceinline__ void fill_nan(T* out, long long count, int tid, int nt) {
    for (long long i = tid; i < count; i += nt) out[i] = nan_value<T>();
}

// Phase 3 over all block rows; rp = this matrix's row order (perm_from_piv in getrs.cu). MMA: scratch =
// this warp's (warp_scratch).
template <typename T, int NB, int U, bool MMA = false>
__device__ __forceinline__ void product_all(const T* __restrict__ lu, T* panel, const int* __restrict__ rp,
                                            T* __restrict__ out, int n, int tid, int nt, T* scratch = nullptr) {
    const int npad = (n + NB - 1) / NB * NB;
    const int col = tid < n ? rp[tid] : 0;
    for (int I0 = 0; I0 < n; I0 += NB) {
        __syncthreads();
        load_panel<T, NB, true>(lu, panel, n, I0, I0, npad, tid, nt);
        __syncthreads();
        if constexpr (MMA) {
            if ((tid & ~31) < n) product_step<T, NB, U, true>(lu, panel, out, n, I0, tid, col, tid < n, scratch, tid & 31);
        } else if (tid < n) {
            product_step<T, NB, U>(lu, panel, out, n, I0, tid, col);
        }
    }
}

// Shared memory: panel npad x LDP of T (MMA: then the warps' scratch). rp (B, n): row order of P^T A
// (out[:, rp[j]] = (U^-1 L^-1)[:, j]). MMA: the sums on tensor cores (panel_dot_mma).
template <typename T, int NB, int MAXT, int MINB = 0, bool MMA = false>
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
    constexpr int D = prefetch<T, MAXT>::depth;
    static_assert(!MMA || GetriMma<T, MAXT>::ok, "MMA: at most 512 threads");
    T* const scratch = MMA ? warp_scratch<T, NB>(smem_raw, npad, tid) : nullptr;
    const int jw = tid & ~31;  // the warp's first column
    for (int I0 = 0; I0 < n; I0 += NB) {
        __syncthreads();
        load_panel<T, NB, false>(lu, panel, n, I0, 0, I0 + NB, tid, nt);
        __syncthreads();
        if constexpr (MMA) {
            if (jw < min(n, I0 + NB)) linv_step<T, NB, D, true>(lu, panel, n, I0, tid, tid < n && tid < I0 + NB, scratch, tid & 31);
        } else if (tid < n && tid < I0 + NB) {
            linv_step<T, NB, D>(lu, panel, n, I0, tid);
        }
    }
    for (int I0 = (n - 1) / NB * NB; I0 >= 0; I0 -= NB) {
        __syncthreads();
        load_panel<T, NB, false>(lu, panel, n, I0, I0, npad, tid, nt);
        __syncthreads();
        if constexpr (MMA) {
            if (jw < n && jw + 32 > I0) uinv_step<T, NB, D, true>(lu, panel, n, I0, tid, tid < n && tid >= I0, scratch, tid & 31);
        } else if (tid < n && tid >= I0) {
            uinv_step<T, NB, D>(lu, panel, n, I0, tid);
        }
    }
    product_all<T, NB, D, MMA>(lu, panel, rp + mat * n, out, n, tid, nt, scratch);
}

// Phases 1 and 2 interleaved: step b inverts L block row b (top-down) and U block row nb-1-b
// (bottom-up) between the same two barriers; their active columns are complementary (j < (b+1)NB for
// L, j >= (nb-1-b)NB for U), so the threads stay busier and the barrier count halves. The two panels
// are separate (2 x npad x LDP of T); L and U steps touch disjoint triangles of lu.
template <typename T, int NB, int MAXT, int MINB = 0, bool MMA = false>
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
    constexpr int D = prefetch<T, MAXT>::depth;
    static_assert(!MMA || GetriMma<T, MAXT>::ok, "MMA: at most 512 threads");
    T* const scratch = MMA ? warp_scratch<T, NB>(smem_raw, 2LL * npad, tid) : nullptr;
    const int jw = tid & ~31;  // the warp's first column
    const int nblocks = npad / NB;
    for (int b = 0; b < nblocks; ++b) {
        const int IL = b * NB, IU = (nblocks - 1 - b) * NB;
        __syncthreads();
        load_panel<T, NB, false>(lu, panel, n, IL, 0, IL + NB, tid, nt);
        load_panel<T, NB, false>(lu, panel_u, n, IU, IU, npad, tid, nt);
        __syncthreads();
        if constexpr (MMA) {
            if (jw < min(n, IL + NB)) linv_step<T, NB, D, true>(lu, panel, n, IL, tid, tid < n && tid < IL + NB, scratch, tid & 31);
            if (jw < n && jw + 32 > IU) uinv_step<T, NB, D, true>(lu, panel_u, n, IU, tid, tid < n && tid >= IU, scratch, tid & 31);
        } else {
            if (tid < n && tid < IL + NB) linv_step<T, NB, D>(lu, panel, n, IL, tid);
            if (tid < n && tid >= IU) uinv_step<T, NB, D>(lu, panel_u, n, IU, tid);
        }
    }
    product_all<T, NB, D, MMA>(lu, panel, rp + mat * n, out, n, tid, nt, scratch);
}

// Dynamic allocation: one launch per phase-1 step with round32(min(n, I0+NB)) threads, column j = tid.
// MMA: the sums on tensor cores; the warps' scratch after the (I0 + NB) x LDP panel.
template <typename T, int NB, int MAXT, int MINB = 0, bool MMA = false>
__global__ void __launch_bounds__(MAXT, MINB)
getri_linv_step(T* __restrict__ lu, const int* __restrict__ info, int n, int I0) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    static_assert(!MMA || GetriMma<T, MAXT>::ok, "MMA: at most 512 threads");
    T* panel = reinterpret_cast<T*>(smem_raw);
    const long long mat = blockIdx.x;
    if (info[mat] != 0) return;
    const int tid = threadIdx.x, nt = blockDim.x;
    lu += mat * n * n;
    load_panel<T, NB, false>(lu, panel, n, I0, 0, I0 + NB, tid, nt);
    __syncthreads();
    constexpr int D = prefetch<T, MAXT>::depth;
    if constexpr (MMA) {
        T* const scratch = warp_scratch<T, NB>(smem_raw, I0 + NB, tid);
        if ((tid & ~31) < min(n, I0 + NB))
            linv_step<T, NB, D, true>(lu, panel, n, I0, tid, tid < n && tid < I0 + NB, scratch, tid & 31);
    } else if (tid < n && tid < I0 + NB) {
        linv_step<T, NB, D>(lu, panel, n, I0, tid);
    }
}

// One launch per phase-2 step with round32(n - I0) threads, column j = I0 + tid. MMA: the scratch after
// the (npad - I0) x LDP panel.
template <typename T, int NB, int MAXT, int MINB = 0, bool MMA = false>
__global__ void __launch_bounds__(MAXT, MINB)
getri_uinv_step(T* __restrict__ lu, const int* __restrict__ info, int n, int I0) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    static_assert(!MMA || GetriMma<T, MAXT>::ok, "MMA: at most 512 threads");
    T* panel = reinterpret_cast<T*>(smem_raw);
    const long long mat = blockIdx.x;
    if (info[mat] != 0) return;
    const int tid = threadIdx.x, nt = blockDim.x;
    const int npad = (n + NB - 1) / NB * NB;
    lu += mat * n * n;
    load_panel<T, NB, false>(lu, panel, n, I0, I0, npad, tid, nt);
    __syncthreads();
    constexpr int D = prefetch<T, MAXT>::depth;
    if constexpr (MMA) {
        T* const scratch = warp_scratch<T, NB>(smem_raw, npad - I0, tid);
        uinv_step<T, NB, D, true>(lu, panel, n, I0, I0 + tid, I0 + tid < n, scratch, tid & 31);
    } else if (I0 + tid < n) {
        uinv_step<T, NB, D>(lu, panel, n, I0, I0 + tid);
    }
}

// MMA: the scratch after the npad x LDP panel.
template <typename T, int NB, int MAXT, int MINB = 0, bool MMA = false>
__global__ void __launch_bounds__(MAXT, MINB)
getri_product(const T* __restrict__ lu, const int* __restrict__ rp, const int* __restrict__ info,
              T* __restrict__ out, int n) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    static_assert(!MMA || GetriMma<T, MAXT>::ok, "MMA: at most 512 threads");
    T* panel = reinterpret_cast<T*>(smem_raw);
    const long long mat = blockIdx.x;
    const int tid = threadIdx.x, nt = blockDim.x;
    lu += mat * n * n;
    out += mat * n * n;
    if (info[mat] != 0) {
        fill_nan(out, (long long)n * n, tid, nt);
        return;
    }
    T* const scratch = MMA ? warp_scratch<T, NB>(smem_raw, (n + NB - 1) / NB * NB, tid) : nullptr;
    product_all<T, NB, prefetch<T, MAXT>::depth, MMA>(lu, panel, rp + mat * n, out, n, tid, nt, scratch);
}

// ====================================================================================================
// inv_gje
// ====================================================================================================
//
// Fused batched inverse with the whole matrix in registers: Gauss-Jordan with partial pivoting as
// LAPACK's xGETRF. (The fused solve is gesv_rows in gesv.cu.)
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
    constexpr int RS = rows_stride<T, CC>();  // thread tj's CC elements of the pivot row at tj * RS
    __shared__ T colbuf[2][NI];
    __shared__ __align__(16) T rowbuf[2][TJ * RS];
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
#pragma unroll 1
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
                // Pivot row to shared memory, each thread's CC elements contiguous (vector stores);
                // its column-k entry becomes 1 so that it scales to 1/a_pk.
                if (ti == pti) {
#pragma unroll
                    for (int r = 0; r < RR; ++r) {
                        if (r == prr) {
#pragma unroll
                            for (int c = 0; c < CC; ++c) rowbuf[buf][tj * RS + c] = x[r][c];
                        }
                    }
                    if (tj == kt) rowbuf[buf][tj * RS + kc] = one<T>();
                }
                const T ip = recip_(colbuf[buf][p]);
                __syncthreads();
                T rs[CC];
#pragma unroll
                for (int c = 0; c < CC; ++c) rs[c] = rowbuf[buf][tj * RS + c] * ip;
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

// ====================================================================================================
// inv_tiny
// ====================================================================================================
//
// Batched inverse of tiny matrices (n <= 8), one THREAD per matrix. inv_gje gives each matrix a block
// of 32 threads, which at n = 2-8 leaves most of them idle and spends the time in barriers: a
// thread per matrix does the same arithmetic with none. A block of MPB threads holds MPB consecutive
// matrices: they are read and written through shared memory in whole coalesced runs of the batch (the
// matrices are contiguous), each at an odd stride so that the threads' own matrices spread over the
// banks (tiny_stage_in / tiny_stage_out, common.cuh). Each thread runs inv_gje's Gauss-Jordan on its
// matrix in registers, fully unrolled over N so that no register is indexed at run time, with
// explicit row interchanges in LAPACK's order (pivot = the first row of largest cabs1) and the column
// unscrambling in reverse order at the end: inv(A) = inv(PA) P. The same operations as inv_gje (the
// pivot row scaled by recip_(pivot), its column-k entry taken as one; column k becomes -a_ik / a_pk),
// the same info and NaN semantics: -1 for a NaN/Inf input, k+1 for the first exactly zero pivot; any
// info != 0 writes NaN over the matrix.

template <typename T, int N, int MPB>
__global__ void __launch_bounds__(MPB)
inv_tiny(const T* __restrict__ a, T* __restrict__ out, int* __restrict__ info_out, long long batch) {
    using R = real_t<T>;
    constexpr int NN = N * N;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* stage = reinterpret_cast<T*>(smem_raw);  // MPB * tiny_ld<N>()

    const long long first = (long long)blockIdx.x * MPB;
    const int count = (int)min((long long)MPB, batch - first);
    const int tid = threadIdx.x;
    const T* A = a + first * NN;
    T* O = out + first * NN;
    tiny_stage_in<T, N, MPB>(stage, A, count, tid);
    __syncthreads();

    if (tid < count) {
        T* s = stage + tid * tiny_ld<N>();
        T x[N][N];
        const bool bad = tiny_load<T, N>(x, s);
        int info = bad ? -1 : 0;
        int perm[N];
#pragma unroll
        for (int k = 0; k < N; ++k) perm[k] = k;
#pragma unroll
        for (int k = 0; k < N; ++k) {
            if (info != 0) continue;  // (no break: every step stays unrolled, the matrix in registers)
            R best = R(-1);
            int p = k;  // only NaN left (overflow): no candidate, carry on with row k, result NaN
#pragma unroll
            for (int i = k; i < N; ++i) {
                const R v = cabs1(x[i][k]);
                if (v > best) {
                    best = v;
                    p = i;
                }
            }
            if (best == R(0)) {  // exact zero pivot: the inverse does not exist
                info = k + 1;
                continue;
            }
            perm[k] = p;
            tiny_swap_rows<T, N>(x, k, p);
            const T ip = recip_(x[k][k]);
            T rs[N];
#pragma unroll
            for (int j = 0; j < N; ++j) rs[j] = (j == k ? one<T>() : x[k][j]) * ip;
#pragma unroll
            for (int i = 0; i < N; ++i) {
                if (i != k) {
                    const T cv = x[i][k];
                    x[i][k] = zero<T>();
#pragma unroll
                    for (int j = 0; j < N; ++j) x[i][j] = fms(x[i][j], cv, rs[j]);
                }
            }
#pragma unroll
            for (int j = 0; j < N; ++j) x[k][j] = rs[j];
        }
        if (info != 0) {
#pragma unroll
            for (int e = 0; e < NN; ++e) s[e] = nan_value<T>();
        } else {
#pragma unroll
            for (int i = 0; i < N; ++i) {
#pragma unroll
                for (int j = 0; j < N; ++j) s[i * N + j] = x[i][j];
            }
            // inv(A) = X P: the interchanges on the columns, last first, in shared memory (an index
            // known at run time there keeps the registers above from going to local memory)
#pragma unroll
            for (int k = N - 1; k >= 0; --k) {
                const int p = perm[k];
                if (p != k) {
#pragma unroll
                    for (int i = 0; i < N; ++i) {
                        const T t = s[i * N + k];
                        s[i * N + k] = s[i * N + p];
                        s[i * N + p] = t;
                    }
                }
            }
        }
        info_out[first + tid] = info;
    }
    __syncthreads();
    tiny_stage_out<T, N, MPB>(O, stage, count, tid);
}

}  // namespace blu
