// Batched LU with partial pivoting (xGETRF) of C-order matrices: one family, four kernels.
//
//   getrf_tiny    n <= 8: one thread per matrix, the matrix in its registers, staged through shared memory;
//   getrf_small   n <= 32: NP lanes per matrix, one row per lane in registers, lazy swaps;
//   getrf_rows    the whole matrix in one block's registers (rows_run, rows.cuh), one barrier per column;
//   getrf_blocked any n: blocked left-looking LU, the current panel in shared memory.
//
// kernels/_gpu/_getrf.py picks the kernel and its tile for each (dtype, n): see docs/design.md#getrf-dispatch.
// Every kernel writes lu (LAPACK's L and U, rows in LAPACK's final order), piv (0-based interchanges, as
// scipy.linalg.lu_factor) and info: 0, the first k + 1 with an exactly zero pivot (the factorization
// goes on), or -1 when the input holds NaN/Inf (then lu is all NaN and piv is 0..n-1).
#include "common.cuh"
#include "rows.cuh"

namespace blu {

// ====================================================================================================
// getrf_tiny
// ====================================================================================================
//
// Batched LU with partial pivoting for n <= 8, one THREAD per matrix (getrf_small gives an n <= 8
// matrix NP lanes and a shuffle tree per pivot search). A block of MPB threads holds MPB consecutive
// matrices, read and written through shared memory in coalesced runs of the contiguous batch, each at
// an odd stride (the threads' own matrices spread over the banks; common.cuh's tiny_stage_in); lu may be a itself: a
// block reads all of its matrices before it writes any. Each thread factors its matrix in registers,
// every loop unrolled over N, rows interchanged by selects (an index known only at run time would put
// the matrix in local memory), as getrf_small computes it: the pivot is the first row of largest
// cabs1 (a NaN counts as the largest), an exactly zero pivot leaves its column unscaled and the
// factorization goes on, L is scaled by pivot_scale. Outputs as every kernel of the family.

template <typename T, int N, int MPB>
__global__ void __launch_bounds__(MPB)
getrf_tiny(const T* a, T* lu, int* __restrict__ piv, int* __restrict__ info_out, long long batch) {
    using R = real_t<T>;
    constexpr int NN = N * N;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* stage = reinterpret_cast<T*>(smem_raw);  // MPB * tiny_ld<N>()

    const long long first = (long long)blockIdx.x * MPB;
    const int count = (int)min((long long)MPB, batch - first);
    const int tid = threadIdx.x;
    tiny_stage_in<T, N, MPB>(stage, a + first * NN, count, tid);
    __syncthreads();

    if (tid < count) {
        T* s = stage + tid * tiny_ld<N>();
        int* P = piv + (first + tid) * N;
        T x[N][N];
        const bool bad = tiny_load<T, N>(x, s);
        int info = 0;
        if (bad) {
#pragma unroll
            for (int e = 0; e < NN; ++e) s[e] = nan_value<T>();
#pragma unroll
            for (int k = 0; k < N; ++k) P[k] = k;
            info = -1;
        } else {
#pragma unroll
            for (int k = 0; k < N; ++k) {
                R best = R(-1);
                int p = k;
#pragma unroll
                for (int i = k; i < N; ++i) {
                    R v = cabs1(x[i][k]);
                    if (!(v >= R(0))) v = inf_value<R>();  // NaN: the largest, as in getrf_small
                    if (v > best) {
                        best = v;
                        p = i;
                    }
                }
                P[k] = p;
                tiny_swap_rows<T, N>(x, k, p);
                const T v = x[k][k];
                if (is_zero(v)) {
                    if (info == 0) info = k + 1;
                    continue;
                }
                const pivot_scale<T> scale(v);
#pragma unroll
                for (int i = k + 1; i < N; ++i) {
                    const T l = scale(x[i][k]);
                    x[i][k] = l;
#pragma unroll
                    for (int j = k + 1; j < N; ++j) x[i][j] = fms(x[i][j], l, x[k][j]);
                }
            }
#pragma unroll
            for (int i = 0; i < N; ++i) {
#pragma unroll
                for (int j = 0; j < N; ++j) s[i * N + j] = x[i][j];
            }
        }
        info_out[first + tid] = info;
    }
    __syncthreads();
    tiny_stage_out<T, N, MPB>(lu + first * NN, stage, count, tid);
}

// ====================================================================================================
// getrf_small
// ====================================================================================================
//
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

template <typename T, int NP>
__global__ void __launch_bounds__(128) getrf_small(const T* a, T* lu, int* piv, int* info, int n,
                                                   long long batch) {
    static_assert(NP >= 1 && NP <= 32 && (NP & (NP - 1)) == 0, "NP must be a power of two <= 32");
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

// ====================================================================================================
// getrf_rows
// ====================================================================================================
//
// LU of A by rows_run (rows.cuh) with no right-hand sides: L, U, piv and info as above.
template <typename T, int TI, int TJ, int RR, int CC, int MINB>
__global__ void __launch_bounds__(TI * TJ, MINB)
getrf_rows(const T* a, T* lu, int* __restrict__ piv, int* __restrict__ info_out, int n) {
    const long long mat = blockIdx.x, nn = (long long)n * n;
    rows_run<T, TI, TJ, RR, CC, 0>(a + mat * nn, nullptr, n, 0, lu + mat * nn, piv + mat * n, nullptr,
                                   info_out + mat);
}

// ====================================================================================================
// getrf_blocked
// ====================================================================================================
//
// Batched LU with partial pivoting, any n: blocked left-looking LU after paper 000 (Alg. 9),
// adapted to C-order storage. One thread block per matrix, one thread per row (rows are looped over
// when n exceeds the block), the whole factorization in one kernel.
//
// For each column panel [k0, k0 + NB):
//  1. load the panel (all n rows, NB columns; NB contiguous elements per row in C-order) into shared
//     memory, column-major P[c * ldp + i], with cp.async (every element in flight at once). Row swaps
//     to the right of the panel are DELAYED: the panel is gathered through `perm` (position ->
//     original row), so no swap ever touches global memory;
//  2. left-looking correction with each earlier block column b of L (KB columns: NB by default, or a
//     divisor of NB, so that a wide panel needs less shared memory for L), read from global memory once per
//     panel into a shared staging buffer, row-major in swizzled 16-byte chunks (LRows; 16- or 8-byte
//     cp.async where the rows of LU are so aligned), double-buffered: the copy of block b + 1 is
//     issued at the start of step b and waited for at its end, so it flies while one warp solves
//     U_b = L_bb^-1 P_b and every row below the block takes P_i -= L_i,b * U_b, with L_i,b read by
//     its thread in vector loads into registers and U_b broadcast from shared memory (double and
//     complex128: FP64 tensor-core mma.sync over each warp's 32 rows instead, update_mma);
//  3. factor the panel with partial pivoting: per column one block-wide arg-max (warp shuffles, then
//     one __syncthreads across warps; LAPACK's i?amax tie-break by current position), lazy swaps
//     (each thread tracks the position of its own rows), scaling and the rank-1 update of the panel;
//  4. write the panel back. L and U values live in global memory in "original row" slots (row
//     perm[i] holds position i), so later swaps never move them; the last panel is written straight
//     to its final rows, and one final pass gathers the other columns into LAPACK's row order.
//
// info = -1 (NaN/Inf anywhere in the input, detected while loading the panels): lu all NaN, piv
// identity. Otherwise info = first k + 1 with an exactly zero pivot (no swap, no scaling), or 0.
//
// Shared memory (dynamic): NB * ldp scalars (P), 2 n KB scalars (the two staging buffers of L), n ints
// and 2 n shorts (row bookkeeping), the pivot records; ldp: see ldp_padded.

// The block's pivot for one column, one barrier: each warp's best candidate by redux.sync over the
// key bits (rows_argmax: largest cabs1, NaN as +inf, ties to the smallest position, as LAPACK's
// i?amax), its record (key, position, panel row) and the candidate's value and reciprocal to
// double-buffered slots; after the barrier every warp reduces the nw records the same way. `rp`: for
// real T the reciprocal, computed by every candidate while the arg-max runs (no division waits behind
// the barrier); for complex T the value to invert (nonzero), which only the warp's winner divides.
template <typename T> struct Pivot {
    int pos, row;  // current position and panel row of the pivot
    T v, rp;       // its value and 1 / v
};

template <typename T>
__device__ __forceinline__ Pivot<T> pivot_pick(blu::RowsKey key, int pos, int row, T v, T rp, int4* cb,
                                               T* vb, int warp, int lane, int nw) {
    constexpr bool WIDE = sizeof(real_t<T>) == 8;
    const int wl = rows_argmax<WIDE>(key, pos);
    if (lane == wl) {
        cb[warp] = make_int4(key.hi, int(key.lo), pos, row);
        vb[2 * warp] = v;
        // complex: the winner divides (a complex division costs more than a column's update, so
        // every lane dividing speculatively lost); real: rp came computed
        vb[2 * warp + 1] = blu::traits<T>::is_complex ? blu::div_(blu::one<T>(), rp) : rp;
    }
    __syncthreads();
    const int4 o = lane < nw ? cb[lane] : make_int4(-1, 0, kNoPos, 0);
    const int bl = rows_argmax<WIDE>(RowsKey{o.x, unsigned(o.y)}, o.z);
    return Pivot<T>{__shfl_sync(kFullWarp, o.z, bl), __shfl_sync(kFullWarp, o.w, bl), vb[2 * bl],
                    vb[2 * bl + 1]};
}

// pivot_pick's `rp` argument: 1 / x for real T, x itself for complex T.
template <typename T> __device__ __forceinline__ T recip_or_value(T x) {
    if constexpr (blu::traits<T>::is_complex) return x;
    else return blu::div_(blu::one<T>(), x);
}

// x / p as LAPACK's ?getrf2 scales the pivot column: x * (1 / p) where |p| >= sfmin, else x / p
// (pivot_scale in common.cuh, with the reciprocal computed beforehand).
template <typename T> __device__ __forceinline__ T scale_by(T x, const Pivot<T>& p) {
    return blu::abs_(p.v) >= blu::traits<T>::sfmin() ? x * p.rp : blu::div_(x, p.v);
}

// A thread's share of a copy of rows of K pieces each (K divides the block size): piece q of every
// rs-th row from row r0, as the flat loop idx = tid, tid + bd, ... over (row, piece) = (idx / K,
// idx % K) gives it, without a division per element. tid and bd are read afresh (volatile) at each
// use, so that these short-lived values are not kept in registers across the panel factorization.
template <int K> struct CopyLanes {
    int q, r0, rs;
    __device__ __forceinline__ CopyLanes() {
        unsigned t, b;
        asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
        asm volatile("mov.u32 %0, %%ntid.x;" : "=r"(b));
        q = int(t % K);
        r0 = int(t / K);
        rs = int(b / K);
    }
};

// The staging buffers of L, row-major (row i's NB elements at [i * NB, i * NB + NB)) in 16-byte
// chunks, chunk g of row i stored at chunk position g ^ h(i): the 8 rows that one phase of a 16-byte
// shared load touches (consecutive threads, consecutive rows, the same chunk) hit 8 different bank
// groups without padding. A thread reads its own row of L with NB / V vector loads, and whole chunks
// are copied from global memory with 16-byte cp.async where the rows of LU are 16-byte aligned.
template <typename T, int NB> struct LRows {
    static constexpr int V = Vec16<T>::N;  // elements per chunk
    static constexpr int C = NB / V;       // chunks per row (1 .. 16, a power of 2)
    __device__ __forceinline__ static int chunk(int i, int g) {
        if constexpr (C >= 8) return g ^ (i & 7);
        else if constexpr (C == 1) return 0;
        else return g ^ ((i / (8 / C)) & (C - 1));
    }
    __device__ __forceinline__ static int at(int i, int q) { return i * NB + chunk(i, q / V) * V + q % V; }
};

// Calls f(U{}) with U the widest copy piece that keeps every row of LU (n elements of T) aligned: uint4
// (16 bytes), uint2 (8 bytes, for 4-byte T) or T itself.
template <typename T, typename F> __device__ __forceinline__ void with_piece(const T* LU, int n, F&& f) {
    const size_t a = reinterpret_cast<size_t>(LU) | (size_t(n) * sizeof(T));
    if ((a & 15) == 0) f(uint4{});
    else if constexpr (sizeof(T) < 8) {
        if ((a & 7) == 0) f(uint2{});
        else f(T{});
    } else f(T{});
}

// Copy columns [j, j + NB) of rows rbeg..n-1 (positions; row perm[i] of LU) into the staging buffer Lb,
// in pieces of type U (16 bytes = one chunk, 8 bytes = half a chunk, or one element).
template <typename T, int NB, typename U>
__device__ __forceinline__ void stage_l_pieces(T* Lb, const T* LU, const int* perm, int n, int j, int rbeg) {
    using LR = LRows<T, NB>;
    constexpr int E = sizeof(U) / sizeof(T);  // elements per piece
    const CopyLanes<NB / E> cl;                // piece cl.q of the rows
    const int g = cl.q * E / LR::V, e = cl.q * E % LR::V;
    const T* src = LU + j + cl.q * E;
    for (int i = rbeg + cl.r0; i < n; i += cl.rs)
        blu::cp_async(reinterpret_cast<U*>(Lb + i * NB + LR::chunk(i, g) * LR::V + e),
                      reinterpret_cast<const U*>(src + perm[i] * n));
}

template <typename T, int NB>
__device__ __forceinline__ void stage_l(T* Lb, const T* LU, const int* perm, int n, int j, int rbeg) {
    with_piece(LU, n, [&](auto u) { stage_l_pieces<T, NB, decltype(u)>(Lb, LU, perm, n, j, rbeg); });
}

// Row permutation of columns [c0, c0 + wc) of LU (row i takes row perm[i]; rows with perm[i] == i stay)
// through G (n x wc scalars of shared memory, row-major), in pieces of type U: wc / E pieces per row,
// at most bd of them. Ends with a barrier.
template <typename T, typename U>
__device__ __forceinline__ void permute_rows(T* LU, T* G, const int* perm, int n, int c0, int wc, int tid, int bd) {
    constexpr int E = sizeof(U) / sizeof(T);
    const int K = wc / E, rs = bd / K, q = tid % K, r0 = tid / K;
    if (r0 < rs) {
        T* const g = G + q * E;
        const T* const src = LU + c0 + q * E;
        for (int i = r0; i < n; i += rs) {
            const int from = perm[i];
            if (from != i) blu::cp_async(reinterpret_cast<U*>(g + i * wc), reinterpret_cast<const U*>(src + from * n));
        }
    }
    blu::cp_async_wait();
    __syncthreads();
    if (r0 < rs) {
        const T* const g = G + q * E;
        T* const dst = LU + c0 + q * E;
        for (int i = r0; i < n; i += rs)
            if (perm[i] != i) *reinterpret_cast<U*>(dst + i * n) = *reinterpret_cast<const U*>(g + i * wc);
    }
    __syncthreads();
}

// Tensor-core form of step 2's update for double and complex128 (NB a multiple of 8, KB of 4): rows
// [rb, rb + 32) (one warp; those >= n are skipped) take P_i -= L_i,b * U_b with FP64 mma.sync
// m8n8k4 (D = A B + C; A = -L from the staging buffer, B = U_b from the panel, C = the rows' panel
// columns, all in the PTX fragment layouts: lane = 4 g + t holds A[g][t], B[t][g], C[g][2t, 2t + 1]).
// complex: C_re += (-L_re) U_re + L_im U_im and C_im += (-L_re) U_im + (-L_im) U_re, four real mma
// per tile. One warp-wide instruction replaces 8 FMAs per lane, and U_b is read from shared memory
// once per warp instead of by every row's thread. double: the same sums in the same order as the FMA
// loop (measured bit-identical); complex: the real and imaginary products are summed in another order.
// Where it is used: double and complex128, NB a multiple of 8, KB of 4 (B fragments: at most 16 per
// lane); not complex128 NB 8 without a blocks-per-SM bound, measured 0.97x with mma at n = 128 and 160
// (1.01-1.02x at 64 and 96, and with a bound; docs/design.md#getrf-dispatch).
template <typename T, int NB, int KB, int MINB> struct UpdateMma {
    static constexpr bool ok = sizeof(blu::real_t<T>) == 8 && NB % 8 == 0 && KB % 4 == 0 && NB * KB <= 256 &&
                               !(blu::traits<T>::is_complex && NB == 8 && MINB == 1);
};

template <typename T, int NB, int KB>
__device__ __forceinline__ void update_mma(T* P, const T* Lc, int ldp, int j0, int rb, int n, int lane) {
    using LR = LRows<T, KB>;
    constexpr bool CPLX = blu::traits<T>::is_complex;
    constexpr int NT = NB / 8, KS = KB / 4;  // n-tiles of 8 columns, k-steps of 4
    const int g = lane >> 2, t = lane & 3;
    T b[KS][NT];  // B fragments: U_b[4 ks + t][8 nt + g]
#pragma unroll
    for (int ks = 0; ks < KS; ++ks)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) b[ks][nt] = P[(nt * 8 + g) * ldp + j0 + ks * 4 + t];
#pragma unroll
    for (int mt = 0; mt < 4; ++mt) {
        const int r = rb + mt * 8;
        if (r >= n) break;  // warp-uniform
        const int i = r + g;
        const bool row_ok = i < n;
        const int ia = row_ok ? i : n - 1;  // rows past n: any valid staging row, result dropped
        double cr[NT][2], ci[NT][2];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const T v = row_ok ? P[(nt * 8 + 2 * t + e) * ldp + i] : blu::zero<T>();
                if constexpr (CPLX) {
                    cr[nt][e] = v.re;
                    ci[nt][e] = v.im;
                } else {
                    cr[nt][e] = v;
                }
            }
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) {
            const T l = Lc[LR::at(ia, ks * 4 + t)];
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                if constexpr (CPLX) {
                    blu::dmma(cr[nt], -l.re, b[ks][nt].re);
                    blu::dmma(cr[nt], l.im, b[ks][nt].im);
                    blu::dmma(ci[nt], -l.re, b[ks][nt].im);
                    blu::dmma(ci[nt], -l.im, b[ks][nt].re);
                } else {
                    blu::dmma(cr[nt], -l, b[ks][nt]);
                }
            }
        }
        if (row_ok) {
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    T& dst = P[(nt * 8 + 2 * t + e) * ldp + i];
                    if constexpr (CPLX) dst = T{cr[nt][e], ci[nt][e]};
                    else dst = cr[nt][e];
                }
        }
    }
}

// Column stride of the panel (the kernel's `ldp` argument, chosen by the caller,
// _getrf.blocked_ldp): 16-byte aligned columns (the broadcast vector loads), a multiple of
// 16 / sizeof(T) elements, at least n. Padded: n rounded up to 4 elements, plus 4 (fewer bank conflicts
// measured at n = 128); tight: n rounded up to 16 bytes, used where it lets more blocks share an SM.
template <typename T> __host__ __device__ constexpr int ldp_padded(int n) { return ((n + 3) & ~3) + 4; }

// REG: factor the panel with each thread's row in registers (n <= 512); otherwise in shared memory.
// MAXT, MINB: __launch_bounds__ (at most MAXT threads, MINB blocks per SM).
template <typename T, int NB, bool REG = true, int MAXT = 512, int MINB = 1, int KB = NB>
__global__ void __launch_bounds__(MAXT, MINB) getrf_blocked(const T* a, T* lu, int* piv, int* info, int n,
                                                      long long batch, int ldp) {
    static_assert((NB * sizeof(T)) % 16 == 0, "NB * sizeof(T) must be a multiple of 16 bytes");
    // NB divides 32, so it divides the block size (CopyLanes). Offsets within one matrix are ints: the
    // shared memory bounds n to a few thousand.
    static_assert(NB <= 32 && 32 % NB == 0, "NB must divide 32");
    static_assert(NB % KB == 0 && (KB * sizeof(T)) % 16 == 0, "KB must divide NB, in whole 16-byte chunks");
    constexpr int V = Vec16<T>::N;
    extern __shared__ __align__(16) unsigned char smem[];
    T* P = reinterpret_cast<T*>(smem);
    T* const L0 = P + NB * ldp;  // staging of L, two buffers of n x KB (LRows)
    T* const L1 = L0 + n * KB;
    int* perm = reinterpret_cast<int*>(L1 + n * KB);  // position -> original row
    short* slot = reinterpret_cast<short*>(perm + n);      // panel row -> original row at load
    short* posof = slot + n;                               // panel row -> current position
    // pivot records, double-buffered, one per warp (<= 16): int4 (key, position, panel row) and
    // (value, 1 / value)
    int4* cb = reinterpret_cast<int4*>(((reinterpret_cast<size_t>(posof + n)) + 15) & ~size_t(15));
    T* vb = reinterpret_cast<T*>(cb + 32);
    __shared__ int s_bad;

    const int tid = threadIdx.x, bd = blockDim.x, nw = bd >> 5;
    const int warp = tid >> 5, lane = tid & 31;

    for (long long m = blockIdx.x; m < batch; m += gridDim.x) {
        const T* A = a + (size_t)m * n * n;
        T* LU = lu + (size_t)m * n * n;
        int* PV = piv + (size_t)m * n;
        int first_zero = 0;  // meaningful in thread 0

        for (int i = tid; i < n; i += bd) perm[i] = i;
        if (tid == 0) s_bad = 0;
        __syncthreads();

        for (int k0 = 0; k0 < n; k0 += NB) {
            const int w = min(NB, n - k0);
            const bool last = k0 + NB >= n;
            const int nblk = k0 / KB;  // blocks of L (KB columns each) left of the panel

            // 1. gather the panel through perm (delayed swaps); stage the first block of L.
            // Every copy is issued before any is waited for (cp.async); each thread then checks the
            // panel elements it copied itself, which wait_all makes visible to it.
            bool bad = false;
            {
                const CopyLanes<NB> cl;
                if (cl.q < w) {
                    const T* src = A + k0 + cl.q;
                    for (int i = cl.r0; i < n; i += cl.rs) cp_async(P + cl.q * ldp + i, src + perm[i] * n);
                } else {
                    for (int i = cl.r0; i < n; i += cl.rs) P[cl.q * ldp + i] = zero<T>();
                }
                for (int i = tid; i < n; i += bd) slot[i] = perm[i];
                if (nblk > 0) stage_l<T, KB>(L0, LU, perm, n, 0, 0);
                cp_async_wait();
                if (cl.q < w)
                    for (int i = cl.r0; i < n; i += cl.rs) bad |= !is_finite(P[cl.q * ldp + i]);
            }
            if (bad) s_bad = 1;
            __syncthreads();

            // 2. left-looking correction, one earlier block column at a time.
            for (int b = 0; b < nblk; ++b) {
                const int j0 = b * KB;
                const T* Lc = (b & 1) ? L1 : L0;
                if (b + 1 < nblk) {  // issue the copy of the next block of L; waited for below
                    const int jn = j0 + KB;
                    stage_l<T, KB>((b & 1) ? L0 : L1, LU, perm, n, jn, jn);
                }
                if (warp == 0) {
                    if (lane < NB) {  // U_b = L_bb^-1 P_b, column `lane` of the panel
                        T x[KB];
#pragma unroll
                        for (int r = 0; r < KB; ++r) x[r] = P[lane * ldp + j0 + r];
#pragma unroll
                        for (int r = 1; r < KB; ++r)
#pragma unroll
                            for (int q = 0; q < r; ++q) x[r] = fms(x[r], Lc[LRows<T, KB>::at(j0 + r, q)], x[q]);
#pragma unroll
                        for (int r = 1; r < KB; ++r) P[lane * ldp + j0 + r] = x[r];
                    }
                }
                __syncthreads();
                if constexpr (UpdateMma<T, NB, KB, MINB>::ok) {
                    // the same rows as the loop below: warp w's lanes hold rows j0 + KB + 32 w + k bd
                    for (int rb = j0 + KB + warp * 32; rb < n; rb += bd)
                        update_mma<T, NB, KB>(P, Lc, ldp, j0, rb, n, lane);
                } else {
                    for (int i = j0 + KB + tid; i < n; i += bd) {
                        T l[KB];
#pragma unroll
                        for (int g = 0; g < KB / V; ++g) {
                            Vec16<T> v;
                            v.raw = *reinterpret_cast<const uint4*>(Lc + i * KB + LRows<T, KB>::chunk(i, g) * V);
#pragma unroll
                            for (int e = 0; e < V; ++e) l[g * V + e] = v.v[e];
                        }
#pragma unroll
                        for (int c = 0; c < NB; ++c) {
                            T acc = P[c * ldp + i];
                            const uint4* up = reinterpret_cast<const uint4*>(P + c * ldp + j0);
#pragma unroll
                            for (int g = 0; g < KB / V; ++g) {
                                Vec16<T> u;
                                u.raw = up[g];
#pragma unroll
                                for (int e = 0; e < V; ++e) acc = fms(acc, l[g * V + e], u.v[e]);
                            }
                            P[c * ldp + i] = acc;
                        }
                    }
                }
                cp_async_wait();  // the next block of L has landed (this thread's copies) ...
                __syncthreads();  // ... and everyone's, and nobody reads this block any more
            }

            // 3. factor the panel: rows k0..n-1, lazy swaps, one barrier per column.
            if (REG && n - k0 <= bd) {
                // One row per thread, held in registers (columns unrolled: static indexing). Each
                // thread stores its updated row back to P every step, so whichever row wins the next
                // arg-max can be read by all right after that step's barrier.
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
                        const bool cand = mine && pos >= kk;
                        RowsKey key = rows_key(row[c]);
                        if (!cand) key.hi = -1;
                        // (one where the reciprocal is unused: no division's slow path there)
                        const T x = cand && !is_zero(row[c]) ? row[c] : one<T>();
                        const Pivot<T> pv = pivot_pick(key, cand ? pos : kNoPos, i, row[c], recip_or_value(x),
                                                       cb + (c & 1) * 16, vb + (c & 1) * 32, warp, lane, nw);
                        const int bp = pv.pos, br = pv.row;
                        const bool zero_pivot = is_zero(pv.v);
                        if (tid == 0) {
                            PV[kk] = bp;
                            if (zero_pivot && first_zero == 0) first_zero = kk + 1;
                        }
                        if (i == br) pos = kk;
                        else if (pos == kk) pos = bp;
                        if (mine && pos > kk && !zero_pivot) {
                            const T l = scale_by(row[c], pv);
                            row[c] = l;
#pragma unroll
                            for (int c2 = c + 1; c2 < NB; ++c2)
                                if (c2 < w) row[c2] = fms(row[c2], l, P[c2 * ldp + br]);
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
            } else {
                // More rows than threads (n > 512): the same algorithm on shared memory.
                for (int i = k0 + tid; i < n; i += bd) posof[i] = i;
                for (int c = 0; c < w; ++c) {
                    const int kk = k0 + c;
                    RowsKey key{-1, 0u};
                    int kpos = kNoPos, krow = 0;
                    T x = zero<T>();
                    for (int i = k0 + tid; i < n; i += bd) {
                        const int p = posof[i];
                        if (p >= kk) {
                            const T v = P[c * ldp + i];
                            const RowsKey k = rows_key(v);
                            if (kpos == kNoPos || rows_better(k, p, key, kpos)) {
                                key = k;
                                kpos = p;
                                krow = i;
                                x = v;
                            }
                        }
                    }
                    const T xr = is_zero(x) ? one<T>() : x;  // (a zero pivot's reciprocal is unused)
                    const Pivot<T> pv = pivot_pick(key, kpos, krow, x, recip_or_value(xr), cb + (c & 1) * 16,
                                                   vb + (c & 1) * 32, warp, lane, nw);
                    const int bp = pv.pos, br = pv.row;
                    const bool zero_pivot = is_zero(pv.v);
                    if (tid == 0) {
                        PV[kk] = bp;
                        if (zero_pivot && first_zero == 0) first_zero = kk + 1;
                    }
                    for (int i = k0 + tid; i < n; i += bd) {
                        int p = posof[i];
                        if (p < kk) continue;
                        if (i == br) { posof[i] = kk; continue; }
                        if (p == kk) { p = bp; posof[i] = p; }
                        if (zero_pivot) continue;
                        const T l = scale_by(P[c * ldp + i], pv);
                        P[c * ldp + i] = l;
                        for (int c2 = c + 1; c2 < w; ++c2)
                            P[c2 * ldp + i] = fms(P[c2 * ldp + i], l, P[c2 * ldp + br]);
                    }
                }
            }
            __syncthreads();

            // 4. write the panel back (original-row slots; the last panel to its final rows).
            for (int i = k0 + tid; i < n; i += bd) perm[posof[i]] = slot[i];
            {
                const CopyLanes<NB> cl;
                if (cl.q < w) {
                    T* dst = LU + k0 + cl.q;
                    for (int i = cl.r0; i < n; i += cl.rs) {
                        const int dest = last ? (i < k0 ? i : posof[i]) : slot[i];
                        dst[dest * n] = P[cl.q * ldp + i];
                    }
                }
            }
            __syncthreads();
        }

        if (!s_bad) {
            // Gather the columns left of the last panel into LAPACK's row order. Every panel but the last
            // was stored at original-row slots, so this is one row permutation (row i takes row perm[i]),
            // done wc columns at a time through all the dynamic shared memory before the bookkeeping (G:
            // n x wc, row-major; wc as many columns as it holds, a multiple of V, at most bd pieces per
            // row), in the widest pieces that LU's row alignment allows.
            const int klast = ((n - 1) / NB) * NB;
            with_piece(LU, n, [&](auto u) {
                constexpr int pe = sizeof(u) / sizeof(T);  // elements per piece
                const int wmax = min((NB * ldp + 2 * n * KB) / n, bd * pe) / V * V;  // >= NB: NB * ldp >= NB * n
                for (int c0 = 0; c0 < klast; c0 += wmax)  // wc: a multiple of V (G's rows stay 16-byte aligned)
                    permute_rows<T, decltype(u)>(LU, P, perm, n, c0, min(wmax, klast - c0), tid, bd);
            });
            if (tid == 0) info[m] = first_zero;
        } else {
            for (int idx = tid; idx < n * n; idx += bd) LU[idx] = nan_value<T>();
            for (int i = tid; i < n; i += bd) PV[i] = i;
            if (tid == 0) info[m] = -1;
        }
        __syncthreads();
    }
}

// Bytes of dynamic shared memory getrf_blocked<T, NB, ..., KB> needs for order n, stride ldp (mirrored in
// _getrf.py).
template <typename T, int NB, int KB = NB> __host__ __device__ constexpr size_t getrf_blocked_smem(int n, int ldp) {
    return ((size_t)NB * ldp + 2 * (size_t)n * KB) * sizeof(T) + (size_t)n * (sizeof(int) + 2 * sizeof(short)) +
           16 + 32 * sizeof(int4) + 64 * sizeof(T);
}

}  // namespace blu
