// Batched solve from the LU factors (xGETRS, no transpose): x = U^-1 L^-1 P^T b, b of shape (B, n, k).
// Two kernels: getrs_warp (below: one warp per matrix and group of right-hand sides, the default) and
// getrs_kernel (one block per matrix and group); kernels/_gpu/_getrs.py picks one (getrs_plan).
//
// getrs_kernel: block (mat, chunk) solves KC right-hand-side columns of one matrix; its columns of b
// live in shared memory (Y, npad x KC) for the whole run, loaded through the row order rp (Y = P^T B).
// Block rows of NB rows are solved with delayed correction:
//   forward   Y[I] -= L[I, <I] Y[<I]   then the unit lower NB x NB diagonal block
//   backward  Y[I] -= U[I, >I] Y[>I]   then the upper diagonal block (divides by U[i][i])
// The block row's L (U) part is staged in shared memory in chunks of 16 KB with cp.async (coalesced
// row segments, every copy in flight at once), and the diagonal block beside it; each LU element is
// read from global memory once per right-hand-side chunk. The correction is spread over all 256
// threads as (row r, column c, part) with the dot product split into P = 256 / (NB*KC) strided parts,
// four partial sums in flight; the diagonal block is solved by one thread per column from shared
// memory. (Reading L and U from global memory inside the dot products and the diagonal solves instead
// was latency-bound at 6-10x the memory floor: docs/design.md.) The interchanges become the row
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

// Columns of one staged chunk of L or U rows (NB x GETRS_TW elements, 16 KB), and its row stride
// (padded by 16 bytes: the rows a warp reads fall in different banks). Mirrored in _getrs.py.
template <typename T, int NB> __host__ __device__ constexpr int getrs_tw() { return 16384 / (NB * int(sizeof(T))); }
template <typename T, int NB> __host__ __device__ constexpr int getrs_ldt() {
    return getrs_tw<T, NB>() + (sizeof(T) >= 16 ? 1 : 16 / int(sizeof(T)));
}

// acc + sum_{l = part, part + P, ... < w} Lr[l] * Y[l][c] (Y with KC columns), four sums in flight.
template <typename T, int KC, int P>
__device__ __forceinline__ T chunk_dot(T acc, const T* Lr, const T* Y, int c, int part, int w) {
    T s0 = zero<T>(), s1 = zero<T>(), s2 = zero<T>(), s3 = zero<T>();
    int l = part;
    for (; l + 3 * P < w; l += 4 * P) {
        s0 = fma_(s0, Lr[l], Y[l * KC + c]);
        s1 = fma_(s1, Lr[l + P], Y[(l + P) * KC + c]);
        s2 = fma_(s2, Lr[l + 2 * P], Y[(l + 2 * P) * KC + c]);
        s3 = fma_(s3, Lr[l + 3 * P], Y[(l + 3 * P) * KC + c]);
    }
    for (; l < w; l += P) s0 = fma_(s0, Lr[l], Y[l * KC + c]);
    return acc + ((s0 + s1) + (s2 + s3));
}

// Stage rows I0 .. I0 + NB - 1 (those < n), columns l0 .. l0 + w - 1 of lu into Lt (cp.async, all in
// flight; the caller waits and synchronizes).
template <typename T, int NB, int NT>
__device__ __forceinline__ void stage_rows(T* Lt, const T* L, int n, int I0, int l0, int w, int tid) {
    constexpr int LDT = getrs_ldt<T, NB>();
    for (int idx = tid; idx < NB * w; idx += NT) {
        const int rr = idx / w, l = idx - rr * w;
        if (I0 + rr < n) cp_async(&Lt[rr * LDT + l], &L[(long long)(I0 + rr) * n + l0 + l]);
    }
}

// Y[I0 + r][c] -= the (r, c) dot products of this block row (partial sums over `part` reduced
// through `red`); ends with a barrier.
template <typename T, int NB, int KC, int P>
__device__ __forceinline__ void apply_correction(T* Y, T* red, T acc, int row, int n, int r, int c,
                                                 int part, int tid) {
    if (P == 1) {
        if (row < n) Y[row * KC + c] = Y[row * KC + c] - acc;
    } else {
        red[tid] = acc;
        __syncthreads();
        if (part == 0 && row < n) {
            T t = Y[row * KC + c];
#pragma unroll
            for (int q = 0; q < P; ++q) t = t - red[q * NB * KC + r * KC + c];
            Y[row * KC + c] = t;
        }
    }
    __syncthreads();
}

template <typename T, int NB, int KC>
__global__ void __launch_bounds__(256)
getrs_kernel(const T* __restrict__ lu, const int* __restrict__ rp, const int* __restrict__ info,
             const T* __restrict__ b, T* __restrict__ x, int n, int k) {
    constexpr int NT = 256;
    static_assert(NB * KC <= NT && NT % (NB * KC) == 0, "one (row, column) pair per thread at least");
    constexpr int P = NT / (NB * KC);
    constexpr int TW = getrs_tw<T, NB>(), LDT = getrs_ldt<T, NB>();
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int npad = (n + NB - 1) / NB * NB;
    T* Y = reinterpret_cast<T*>(smem_raw);  // npad x KC
    T* red = Y + (long long)npad * KC;      // P x NB x KC partial sums (P > 1)
    T* Lt = red + NT;                       // NB x LDT: a chunk of the block row's L or U
    T* Dg = Lt + NB * LDT;                  // NB x NB: the diagonal block

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

    // Forward: L y = P^T b, block row I = [I0, I0 + NB): Y[I] -= L[I, <I] Y[<I] from chunks of L's
    // rows staged in shared memory, then the unit lower diagonal block (one thread per column).
    for (int I0 = 0; I0 < n; I0 += NB) {
        __syncthreads();  // Y of the previous block row is final; Lt and Dg are free
        for (int idx = tid; idx < NB * NB; idx += NT) {
            const int q = idx / NB, s = idx - q * NB;
            if (s < q && I0 + q < n) cp_async(&Dg[idx], &L[(long long)(I0 + q) * n + I0 + s]);
        }
        T acc = zero<T>();
        for (int l0 = 0; l0 < I0; l0 += TW) {
            const int w = min(TW, I0 - l0);
            stage_rows<T, NB, NT>(Lt, L, n, I0, l0, w, tid);
            cp_async_wait();
            __syncthreads();
            acc = chunk_dot<T, KC, P>(acc, Lt + r * LDT, Y + l0 * KC, c, part, w);
            __syncthreads();
        }
        cp_async_wait();
        apply_correction<T, NB, KC, P>(Y, red, acc, I0 + r, n, r, c, part, tid);
        if (tid < KC) {
            T y[NB];
#pragma unroll
            for (int q = 0; q < NB; ++q) y[q] = Y[(I0 + q) * KC + tid];
#pragma unroll
            for (int q = 1; q < NB; ++q) {
                if (I0 + q < n) {
#pragma unroll
                    for (int s = 0; s < q; ++s) y[q] = fms(y[q], Dg[q * NB + s], y[s]);
                }
            }
#pragma unroll
            for (int q = 0; q < NB; ++q) Y[(I0 + q) * KC + tid] = y[q];
        }
    }

    // Backward: U x = y, block rows from the last: Y[I] -= U[I, >I] Y[>I], then the upper diagonal
    // block (divides by U[i][i]).
    for (int I0 = (n - 1) / NB * NB; I0 >= 0; I0 -= NB) {
        const int I1 = min(I0 + NB, n);
        __syncthreads();
        for (int idx = tid; idx < NB * NB; idx += NT) {
            const int q = idx / NB, s = idx - q * NB;
            if (s >= q && I0 + s < n) cp_async(&Dg[idx], &L[(long long)(I0 + q) * n + I0 + s]);
        }
        T acc = zero<T>();
        for (int l0 = I1; l0 < n; l0 += TW) {
            const int w = min(TW, n - l0);
            stage_rows<T, NB, NT>(Lt, L, n, I0, l0, w, tid);
            cp_async_wait();
            __syncthreads();
            acc = chunk_dot<T, KC, P>(acc, Lt + r * LDT, Y + l0 * KC, c, part, w);
            __syncthreads();
        }
        cp_async_wait();
        apply_correction<T, NB, KC, P>(Y, red, acc, I0 + r, n, r, c, part, tid);
        if (tid < KC) {
            T y[NB];
#pragma unroll
            for (int q = 0; q < NB; ++q) y[q] = Y[(I0 + q) * KC + tid];
#pragma unroll
            for (int q = NB - 1; q >= 0; --q) {
                if (I0 + q < n) {
#pragma unroll
                    for (int s = q + 1; s < NB; ++s) {
                        if (I0 + s < n) y[q] = fms(y[q], Dg[q * NB + s], y[s]);
                    }
                    y[q] = div_(y[q], Dg[q * NB + q]);
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

// ====================================================================================================
// getrs_warp
// ====================================================================================================
//
// One warp per (matrix, group of KC right-hand-side columns), NW independent warps a block: no block
// barrier anywhere. The warp's columns of b live in its shared memory (Y, npad x KC, npad = n rounded
// up to 32; loaded with cp.async, all in flight at once), swapped into P^T b there (lane c applies the
// interchanges to column c, so no lane waits for another). Block rows of 32 rows, lane r holding row
// I0 + r of its KC columns in registers (acc):
//   forward   acc -= L[I, <I] Y[<I], then the unit lower 32 x 32 diagonal block;
//   backward  acc -= U[I, >I] Y[>I], then the upper diagonal block (x_s = y_s / u_ss).
// L and U come through shared memory in chunks of 32 rows x 64 bytes (getrs_cw columns), NS - 1
// chunks ahead in flight (cp.async, NS slots): every element of LU read once, in 64-byte row segments.
// In the correction, lane r reads 16 bytes of its own row (the padded stride puts a quarter-warp's 8
// rows in distinct banks) and each Y row as a broadcast: one 16-byte load of Y feeds 16 / sizeof(T)
// fused multiply-adds per lane, against two loads a multiply-add in getrs_kernel. In the diagonal
// block, the lane that holds row s stores it when final (after its reciprocal scaling, backward), and
// every lane reads it back as a broadcast after __syncwarp.
// Rows and columns past n are zeros in Y and in the staged chunks, so they add nothing; chunks wholly
// past n are not staged.

// Columns of a staged chunk (64 bytes of each of 32 rows) and its row stride (+ 16 bytes: the 8 rows a
// quarter-warp reads fall in distinct banks). Mirrored in _getrs.py.
template <typename T> __host__ __device__ constexpr int getrs_cw() { return 64 / int(sizeof(T)); }
template <typename T> __host__ __device__ constexpr int getrs_ldw() {
    return getrs_cw<T>() + (sizeof(T) >= 16 ? 1 : 16 / int(sizeof(T)));
}

// out = p[0 .. N), in 16-byte shared loads where N elements are whole 16-byte words (p is then
// 16-byte aligned).
template <typename T, int N> __device__ __forceinline__ void lds_row(T (&out)[N], const T* p) {
    if constexpr ((N * sizeof(T)) % 16 == 0) {
#pragma unroll
        for (int w = 0; w < int(N * sizeof(T) / 16); ++w) {
            Vec16<T> v;
            v.raw = reinterpret_cast<const uint4*>(p)[w];
#pragma unroll
            for (int e = 0; e < Vec16<T>::N; ++e) out[w * Vec16<T>::N + e] = v.v[e];
        }
    } else {
#pragma unroll
        for (int i = 0; i < N; ++i) out[i] = p[i];
    }
}
template <typename T, int N> __device__ __forceinline__ void sts_row(T* p, const T (&in)[N]) {
    if constexpr ((N * sizeof(T)) % 16 == 0) {
#pragma unroll
        for (int w = 0; w < int(N * sizeof(T) / 16); ++w) {
            Vec16<T> v;
#pragma unroll
            for (int e = 0; e < Vec16<T>::N; ++e) v.v[e] = in[w * Vec16<T>::N + e];
            reinterpret_cast<uint4*>(p)[w] = v.raw;
        }
    } else {
#pragma unroll
        for (int i = 0; i < N; ++i) p[i] = in[i];
    }
}

// Stage rows I0 .. I0 + 31, columns l0 .. l0 + getrs_cw - 1 of L (n x n) into dst (cp.async, not
// waited for); zeros past n. vec: 16-byte copies (n a multiple of 16 / sizeof(T), L 16-byte aligned).
template <typename T>
__device__ __forceinline__ void getrs_stage(T* dst, const T* L, int n, int I0, int l0, bool vec, int lane) {
    constexpr int CW = getrs_cw<T>(), LDW = getrs_ldw<T>();
    constexpr int V = sizeof(T) >= 16 ? 1 : 16 / int(sizeof(T));
    if (vec) {
        constexpr int PR = CW / V;  // 16-byte pieces a row
#pragma unroll
        for (int q = 0; q < PR; ++q) {
            const int t = lane + 32 * q, r = t / PR, p = t - r * PR, i = I0 + r, j = l0 + p * V;
            T* d = dst + r * LDW + p * V;
            if (i < n && j < n) {
                cp_async16(d, L + (long long)i * n + j);
            } else {
                *reinterpret_cast<int4*>(d) = make_int4(0, 0, 0, 0);
            }
        }
    } else {
#pragma unroll
        for (int q = 0; q < CW; ++q) {
            const int t = lane + 32 * q, r = t / CW, c = t - r * CW, i = I0 + r, j = l0 + c;
            T* d = dst + r * LDW + c;
            if (i < n && j < n) {
                cp_async(d, L + (long long)i * n + j);
            } else {
                *d = zero<T>();
            }
        }
    }
}

// (, 1) in __launch_bounds__: without it ptxas held float at 64 registers and spilled.
template <typename T, int KC, int NW, int NS>
__global__ void __launch_bounds__(32 * NW, 1)
getrs_warp(const T* __restrict__ lu, const int* __restrict__ piv, const int* __restrict__ info,
           const T* __restrict__ b, T* __restrict__ x, int n, int k, int groups, long long tasks, int vec) {
    constexpr int CW = getrs_cw<T>(), LDW = getrs_ldw<T>();
    constexpr int V = sizeof(T) >= 16 ? 1 : 16 / int(sizeof(T));
    static_assert(KC <= 32 && CW % V == 0 && 32 % CW == 0 && NS >= 2,
                  "a lane per column; chunks tile a block row; a chunk in flight while one is computed");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long long task = (long long)blockIdx.x * NW + warp;
    if (task >= tasks) return;  // whole warps: no barrier below spans more than one
    const long long mat = task / groups;
    const int c0 = int(task - mat * groups) * KC;
    const int npad = (n + 31) & ~31;
    T* Lt = reinterpret_cast<T*>(smem_raw) + (long long)warp * (NS * 32 * LDW + npad * KC);  // NS chunks
    T* Y = Lt + NS * 32 * LDW;                                                                 // npad x KC
    const T* L = lu + mat * (long long)n * n;
    b += mat * (long long)n * k;
    x += mat * (long long)n * k;

    if (info != nullptr && info[mat] != 0) {
        for (int idx = lane; idx < n * KC; idx += 32) {
            const int i = idx / KC, c = idx - i * KC;
            if (c0 + c < k) x[(long long)i * k + c0 + c] = nan_value<T>();
        }
        return;
    }
    // The chunk after (I, l): forward, block rows up, each from column 0 to its diagonal block;
    // backward, block rows down, each from the last column to its diagonal block. False after the last.
    const int lmax = (n - 1) / CW * CW;  // the last chunk holding a column < n
    auto advance = [n, lmax](int& I, int& l, bool& fwd) -> bool {
        if (fwd) {
            if (l + CW < min(I + 32, n)) {
                l += CW;
            } else if (I + 32 < n) {
                I += 32;
                l = 0;
            } else {
                fwd = false;
                l = lmax;
            }
        } else if (l > I) {
            l -= CW;
        } else if (I > 0) {
            I -= 32;
            l = lmax;
        } else {
            return false;
        }
        return true;
    };

    // b's columns to Y (cp.async: every element in flight at once), then the first NS - 1 chunks.
    for (int idx = lane; idx < npad * KC; idx += 32) {
        const int i = idx / KC, c = idx - i * KC;
        if (i < n && c0 + c < k) {
            cp_async(&Y[idx], &b[(long long)i * k + c0 + c]);
        } else {
            Y[idx] = zero<T>();
        }
    }
    cp_async_commit();
    const bool vecl = vec != 0;
    int fI = 0, fl = 0;  // the next chunk to stage
    bool ffwd = true, fmore = true;
#pragma unroll
    for (int q = 0; q < NS - 1; ++q) {
        if (fmore) {
            getrs_stage(Lt + q * 32 * LDW, L, n, fI, fl, vecl, lane);
            fmore = advance(fI, fl, ffwd);
        }
        cp_async_commit();
    }
    cp_async_wait_group<NS - 1>();
    __syncwarp();
    // Y = P^T b: lane c swaps column c's rows k and piv[k] in order (in-range interchanges only).
    const int* pm = piv + mat * n;
    for (int k0 = 0; k0 < n; k0 += 32) {
        const int pk = k0 + lane < n ? pm[k0 + lane] : 0;
        const int kend = min(32, n - k0);
        for (int t = 0; t < kend; ++t) {
            const int kk = k0 + t, q = __shfl_sync(kFullWarp, pk, t);
            if (q > kk && q < n && lane < KC) {
                const T u = Y[kk * KC + lane];
                Y[kk * KC + lane] = Y[q * KC + lane];
                Y[q * KC + lane] = u;
            }
        }
    }
    __syncwarp();

    int I0 = 0, l0 = 0, slot = 0;
    bool fwd = true;
    T acc[KC];
    lds_row(acc, Y + lane * KC);
    for (;;) {
        // the chunk NS - 1 ahead into the slot computed last
        if (fmore) {
            getrs_stage(Lt + (slot + NS - 1) % NS * 32 * LDW, L, n, fI, fl, vecl, lane);
            fmore = advance(fI, fl, ffwd);
        }
        cp_async_commit();
        cp_async_wait_group<NS - 1>();
        __syncwarp();

        const T* Lr = Lt + slot * 32 * LDW + lane * LDW;  // this lane's row of the chunk
        if (fwd ? l0 < I0 : l0 >= I0 + 32) {
            // the correction: acc -= (32 x CW chunk) Y[l0 .. l0 + CW)
#pragma unroll
            for (int l = 0; l < CW; l += V) {
                T lv[V];
                lds_row(lv, Lr + l);
#pragma unroll
                for (int v = 0; v < V; ++v) {
                    T yv[KC];
                    lds_row(yv, Y + (l0 + l + v) * KC);
#pragma unroll
                    for (int c = 0; c < KC; ++c) acc[c] = fms(acc[c], lv[v], yv[c]);
                }
            }
        } else if (fwd) {
            // the unit lower diagonal block, columns l0 .. l0 + CW - 1 of it (not unrolled: the body
            // is KC wide, and unrolled copies of it overflowed the instruction cache)
            const int s0 = l0 - I0, s1 = min(s0 + CW, n - I0);
#pragma unroll 1
            for (int s = s0; s < s1; ++s) {
                if (lane == s) sts_row(Y + (I0 + s) * KC, acc);
                __syncwarp();
                T ys[KC];
                lds_row(ys, Y + (I0 + s) * KC);
                if (lane > s) {
                    const T lv = Lr[s - s0];
#pragma unroll
                    for (int c = 0; c < KC; ++c) acc[c] = fms(acc[c], lv, ys[c]);
                }
            }
        } else {
            // the upper diagonal block, columns l0 + CW - 1 down to l0 of it; the lane whose diagonal
            // element lies in this chunk forms its reciprocal first
            const int s0 = l0 - I0, s1 = min(s0 + CW, n - I0);
            const int own = min(max(lane - s0, 0), CW - 1);
            const pivot_scale<T> d(Lr[own]);
#pragma unroll 1
            for (int s = s1 - 1; s >= s0; --s) {
                if (lane == s) {
#pragma unroll
                    for (int c = 0; c < KC; ++c) acc[c] = d(acc[c]);
                    sts_row(Y + (I0 + s) * KC, acc);
                }
                __syncwarp();
                T ys[KC];
                lds_row(ys, Y + (I0 + s) * KC);
                if (lane < s) {
                    const T uv = Lr[s - s0];
#pragma unroll
                    for (int c = 0; c < KC; ++c) acc[c] = fms(acc[c], uv, ys[c]);
                }
            }
        }
        __syncwarp();  // the next iteration stages into this slot
        const int pI = I0;
        const bool pfwd = fwd;
        if (!advance(I0, l0, fwd)) break;
        if (I0 != pI || fwd != pfwd) lds_row(acc, Y + (I0 + lane) * KC);  // a new block row
        slot = slot + 1 == NS ? 0 : slot + 1;
    }
    for (int idx = lane; idx < n * KC; idx += 32) {
        const int i = idx / KC, c = idx - i * KC;
        if (c0 + c < k) x[(long long)i * k + c0 + c] = Y[idx];
    }
}

}  // namespace blu
