// Batched LU with partial pivoting, blocked left-looking (paper 000, Alg. 9) with L RESIDENT IN SHARED
// MEMORY: every finished block column of L stays on chip, so the matrix is read from global memory
// once and written once, and the left-looking updates read nothing from L2/DRAM. For the n where the
// L store fits one block's shared memory (see getrf_lsm_smem / _getrf.py).
//
// One thread block of NT >= n threads per matrix (blocks loop over the batch). Shared memory:
//  * P: the current panel, NB columns x n rows, column-major (leading dimension ldp), rows in the
//    order of positions at the time the panel is loaded;
//  * Q: the next panel, prefetched with cp.async by ORIGINAL row while this panel is worked on (the
//    positions are known only once this panel is factored), gathered into P through perm;
//  * S: the L store. Block column b (every panel but the last) keeps its rows j0 = b NB .. n-1,
//    column-major with leading dimension n - j0, indexed by current position: each panel's row
//    interchanges are applied to the stored blocks (one thread per stored column, the panel's
//    transpositions in order: n^2 element swaps in all), so the stored rows are always in position
//    order and end in LAPACK's.
//
// Panel k0 (block kb):
//  1. gather P from Q through perm (position -> original row), check for NaN/Inf; issue the prefetch of
//     the next panel into Q;
//  2. left-looking update with one barrier per block step b < kb. U_b = L_bb^-1 P_b (rows j0 .. j0+NB
//     of P) is ready at the start of step b; in step b, warp 0 (one lane per panel column) applies
//     block b to the next diagonal block's rows [j0 + NB, j0 + 2 NB) and solves them with L_b+1,b+1
//     (this is U_b+1, ready for step b + 1), while the other warps apply block b to the rows below:
//     P_i -= L_i,b U_b, with L_i,b in registers and U_b broadcast by 16-byte shared loads;
//  3. factor the panel (panel_factor_rows: one row per thread in registers, lazy swaps, one barrier per
//     column);
//  4. the U part above the diagonal block goes to global memory (final); the rows >= k0 go to S in
//     their final positions (the last panel: straight to global memory); the panel's interchanges are
//     applied to S and perm.
// At the end the L store is written to global memory, row by row, in LAPACK's order.
//
// info = -1 (NaN/Inf anywhere in the input, detected while gathering the panels): lu all NaN, piv
// identity. Otherwise info = first k + 1 with an exactly zero pivot (no swap, no scaling), or 0.
#include "panel.cuh"

namespace blu {

// Offset (elements) of block column b in the L store: NB * sum_{b' < b} (n - b' NB).
__host__ __device__ constexpr long long lsm_store_off(int n, int nb, int b) {
    return (long long)nb * ((long long)b * n - (long long)nb * b * (b - 1) / 2);
}

// Bytes of dynamic shared memory getrf_lsm<T, NB, NT> needs for order n (mirrored in _getrf.py).
template <typename T> __host__ __device__ constexpr size_t getrf_lsm_smem(int n, int nb) {
    return (2 * (size_t)nb * ldp_for(n) + (size_t)lsm_store_off(n, nb, (n - 1) / nb)) * sizeof(T) +
           (2 * (size_t)n + nb) * sizeof(int) + 16 + 64 * sizeof(Cand<real_t<T>>);
}

// Copy columns k0 .. k0 + w - 1 of A (all n rows) into Q[c * ldp + row] with cp.async (not waited for).
template <typename T>
__device__ __forceinline__ void lsm_fetch(T* Q, const T* A, int n, int ldp, int k0, int w, int nt) {
    for (int idx = threadIdx.x; idx < n * w; idx += nt) {
        const int r = idx / w, c = idx - r * w;
        cp_async(&Q[c * ldp + r], &A[(size_t)r * n + k0 + c]);
    }
}

// x <- L^-1 x for the unit lower triangular NB x NB block L (column-major, leading dimension ld).
template <typename T, int NB> __device__ __forceinline__ void lsm_unit_lower_solve(T (&x)[NB], const T* L, int ld) {
#pragma unroll
    for (int r = 1; r < NB; ++r)
#pragma unroll
        for (int q = 0; q < r; ++q) x[r] = fms(x[r], L[r + q * ld], x[q]);
}

template <typename T, int NB, int NT>
__global__ void __launch_bounds__(NT) getrf_lsm(const T* a, T* lu, int* piv, int* info, int n, long long batch) {
    using R = real_t<T>;
    static_assert((NB * sizeof(T)) % 16 == 0, "NB * sizeof(T) must be a multiple of 16 bytes");
    static_assert(NB <= 32 && NT % 32 == 0 && NT >= 64 && NT <= 1024, "NB <= 32, NT whole warps (>= 2)");
    constexpr int V = Vec16<T>::N;
    constexpr int NBULK = NT - 32;  // threads of the bulk update (warps 1 ..)
    extern __shared__ __align__(16) unsigned char smem[];
    const int ldp = ldp_for(n);
    const int npan = (n + NB - 1) / NB;
    T* const P = reinterpret_cast<T*>(smem);
    T* const Q = P + NB * ldp;
    T* const S = Q + NB * ldp;
    int* const perm = reinterpret_cast<int*>(S + lsm_store_off(n, NB, npan - 1));  // position -> original row
    int* const posof = perm + n;                                                   // panel row -> final position
    int* const pvt = posof + n;                                                    // the panel's pivots
    Cand<R>* const red = reinterpret_cast<Cand<R>*>((reinterpret_cast<size_t>(pvt + NB) + 15) & ~size_t(15));
    __shared__ int s_bad;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

    for (long long m = blockIdx.x; m < batch; m += gridDim.x) {
        const T* A = a + (size_t)m * n * n;
        T* LU = lu + (size_t)m * n * n;
        int* PV = piv + (size_t)m * n;
        int first_zero = 0;  // meaningful in thread 0

        for (int i = tid; i < n; i += NT) perm[i] = i;
        if (tid == 0) s_bad = 0;
        lsm_fetch(Q, A, n, ldp, 0, min(NB, n), NT);

        for (int kb = 0; kb < npan; ++kb) {
            const int k0 = kb * NB, w = min(NB, n - k0);
            const bool last = kb == npan - 1;

            // 1. this panel from Q (everyone's copies landed) into P, in position order.
            cp_async_wait();
            __syncthreads();
            bool bad = false;
            for (int idx = tid; idx < NB * n; idx += NT) {
                const int c = idx / n, i = idx - c * n;
                T v = zero<T>();
                if (c < w) {
                    v = Q[c * ldp + perm[i]];
                    bad |= !is_finite(v);
                }
                P[c * ldp + i] = v;
            }
            if (bad) s_bad = 1;
            __syncthreads();  // P complete, Q free
            if (!last) lsm_fetch(Q, A, n, ldp, k0 + NB, min(NB, n - k0 - NB), NT);

            // 2. left-looking update, one barrier per block step.
#ifndef BLU_SKIP_STEPS
            if (kb > 0) {
                if (warp == 0 && lane < NB) {  // U_0 = L_00^-1 P_0, lane = panel column
                    T x[NB];
#pragma unroll
                    for (int r = 0; r < NB; ++r) x[r] = P[lane * ldp + r];
                    lsm_unit_lower_solve<T, NB>(x, S, n);
#pragma unroll
                    for (int r = 1; r < NB; ++r) P[lane * ldp + r] = x[r];
                }
                __syncthreads();
                for (int b = 0; b < kb; ++b) {
                    const int j0 = b * NB, ld = n - j0;
                    const T* Lb = S + lsm_store_off(n, NB, b) - j0;  // Lb[i + q * ld]: row position i >= j0
                    if (warp == 0) {
                        // lanes (g, c): column c = lane % NB, rows r = g, g + G, ... of the next block
                        constexpr int G = 32 / NB;
                        T* const Pc = P + (lane % NB) * ldp;
                        T u[NB];
#pragma unroll
                        for (int q = 0; q < NB; ++q) u[q] = Pc[j0 + q];
#pragma unroll
                        for (int r0 = 0; r0 < NB; r0 += G) {
                            const int i = j0 + NB + r0 + lane / NB;
                            if (r0 + lane / NB < NB && i < n) {
                                T x = Pc[i];
#pragma unroll
                                for (int q = 0; q < NB; ++q) x = fms(x, Lb[i + q * ld], u[q]);
                                Pc[i] = x;
                            }
                        }
                        if (b + 1 < kb) {  // rows j0 + NB .. are a block of U: U_b+1 = L_b+1^-1 (...)
                            __syncwarp();
                            if (lane < NB) {
                                T x[NB];
#pragma unroll
                                for (int r = 0; r < NB; ++r) x[r] = Pc[j0 + NB + r];
                                lsm_unit_lower_solve<T, NB>(x, S + lsm_store_off(n, NB, b + 1), ld - NB);
#pragma unroll
                                for (int r = 1; r < NB; ++r) Pc[j0 + NB + r] = x[r];
                            }
                        }
                    } else {
                        for (int i = j0 + 2 * NB + tid - 32; i < n; i += NBULK) {
                            T l[NB];
#pragma unroll
                            for (int q = 0; q < NB; ++q) l[q] = Lb[i + q * ld];
#pragma unroll
                            for (int c = 0; c < NB; ++c) {
                                T acc = P[c * ldp + i];
                                const uint4* up = reinterpret_cast<const uint4*>(P + c * ldp + j0);
#pragma unroll
                                for (int g = 0; g < NB / V; ++g) {
                                    Vec16<T> u;
                                    u.raw = up[g];
#pragma unroll
                                    for (int e = 0; e < V; ++e) acc = fms(acc, l[g * V + e], u.v[e]);
                                }
                                P[c * ldp + i] = acc;
                            }
                        }
                    }
                    __syncthreads();
                }
            }

#endif
            // 3. factor the panel (rows k0 .. n-1, one per thread).
#ifndef BLU_SKIP_PANEL
            panel_factor_rows<T, NB>(P, ldp, n, k0, w, posof, PV, pvt, first_zero, red);
#else
            if (tid < NB) pvt[tid] = k0 + tid;
            if (k0 + tid < n) posof[k0 + tid] = k0 + tid;
#endif
            const int ip = k0 + tid;
            const int myperm = ip < n ? perm[ip] : 0;
            __syncthreads();

            // 4. write out, and apply the interchanges to perm and to the L store.
            if (ip < n) perm[posof[ip]] = myperm;
            for (int idx = tid; idx < k0 * w; idx += NT) {  // U above the diagonal block: final
                const int i = idx / w, c = idx - i * w;
                LU[(size_t)i * n + k0 + c] = P[c * ldp + i];
            }
            T* const Sk = S + lsm_store_off(n, NB, kb) - k0;
            for (int idx = tid; idx < (n - k0) * w; idx += NT) {
                const int i = k0 + idx / w, c = idx % w;
                const T v = P[c * ldp + i];
                if (last) LU[(size_t)posof[i] * n + k0 + c] = v;
                else Sk[posof[i] + c * (n - k0)] = v;
            }
            for (int j = tid; j < k0; j += NT) {
                const int b = j / NB, j0 = b * NB;
                T* col = S + lsm_store_off(n, NB, b) + (j - j0) * (n - j0) - j0;  // col[position]
                for (int c = 0; c < w; ++c) {
                    const int p1 = k0 + c, p2 = pvt[c];
                    if (p2 != p1) {
                        const T t = col[p1];
                        col[p1] = col[p2];
                        col[p2] = t;
                    }
                }
            }
            // (the next panel's first barrier orders these against the reads that follow)
        }
        __syncthreads();

        if (!s_bad) {
            // The L store (rows j0 .. n-1 of each block column but the last, in final order).
            for (int b = 0; b + 1 < npan; ++b) {
                const int j0 = b * NB, ld = n - j0;
                const T* Sb = S + lsm_store_off(n, NB, b);
                for (int idx = tid; idx < ld * NB; idx += NT) {
                    const int r = idx / NB, q = idx - r * NB;
                    LU[(size_t)(j0 + r) * n + j0 + q] = Sb[r + q * ld];
                }
            }
            if (tid == 0) info[m] = first_zero;
        } else {
            for (int idx = tid; idx < n * n; idx += NT) LU[idx] = nan_value<T>();
            for (int i = tid; i < n; i += NT) PV[i] = i;
            if (tid == 0) info[m] = -1;
        }
        __syncthreads();
    }
}

}  // namespace blu
