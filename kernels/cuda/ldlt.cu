// Sparse LDL^T of a batch of matrices that share one pattern (batchlu.sparse, after the seed paper 001):
// level by level over the tree of L's supernodes, a few launches per level for the whole batch, static
// pivoting, triangular solves and the float64 residuals of iterative refinement. The per-thread work
// and the layouts are in ldlt.cuh; kernels/sparse/_gpu.py launches these.
//
// Every kernel is a flat 1-D grid over (item, matrix[, right-hand side]) with the matrix (then the
// right-hand side) fastest, so that a warp's threads work on one item of consecutive matrices: the same
// control flow (it depends on the pattern only) and consecutive words of the batch-minor arrays.
//
//   ldlt_external          one level's entries (positions ent[first..first+count) of lx) x B: what the
//                          supernodes below contribute (dot products)
//   ldlt_panel             one level's narrow supernodes x B: each run's dense LDL^T, static pivoting,
//                          division by the pivots, a thread per run and matrix
//   ldlt_wide_panels       one level's wide runs x groups of M matrices, a block each: the run's columns in
//                          order, each column's entries less the run's earlier columns, then static
//                          pivoting and the division by the pivot, a thread per (entry, matrix), a barrier
//                          between the steps
//   ldlt_forward_external  one level's wide runs' columns x R matrices x K: L y = c, the supernodes below
//   ldlt_forward_wide      one level's wide runs x groups of M of the R matrices (x K): L y = c within each
//                          run, a row at a time, its later rows' sums a thread each
//   ldlt_backward_external one level's wide runs' columns x R x K, levels from the last: L^T x = z, the
//                          rows below
//   ldlt_backward_wide     the same for L^T x = z, a column at a time from the last
//   ldlt_forward_runs, ldlt_backward_runs: both steps for the level's narrow runs, a thread per run
//   ldlt_residual          n rows x R x K: b - A x in float64
//   ldlt_row_sums          n rows x B: sum_j |a_ij| in float64 (for ||A||_inf)
//   ldlt_backward_error    R x K blocks: each solution's normwise backward error (refinement's test)

#include "ldlt.cuh"

namespace blu {

#define BLU_LDLT_ID const long long id = (long long)blockIdx.x * blockDim.x + threadIdx.x

template <typename T>
__global__ void ldlt_external(const long long* __restrict__ ent, long long first, long long count, long long B,
                              const long long* __restrict__ col_of, const long long* __restrict__ rowind,
                              const long long* __restrict__ base, const long long* __restrict__ sn_first,
                              const long long* __restrict__ sn_size, const long long* __restrict__ rl_ptr,
                              const long long* __restrict__ rl_sn, const long long* __restrict__ rl_idx,
                              const T* __restrict__ dd, T* lx) {
    BLU_LDLT_ID;
    if (id >= count * B) return;
    const long long e = id / B, b = id - e * B;
    ldlt::external<T>(ent[first + e], b, B, col_of, rowind, base, sn_first, sn_size, rl_ptr, rl_sn, rl_idx, dd, lx);
}

template <typename T>
__global__ void ldlt_panel(const long long* __restrict__ sn, long long first, long long count, long long B,
                           const long long* __restrict__ sn_first, const long long* __restrict__ sn_size,
                           const long long* __restrict__ colptr, const T* __restrict__ tau, int perturb, T* lx,
                           T* __restrict__ dd, unsigned char* __restrict__ flag) {
    BLU_LDLT_ID;
    if (id >= count * B) return;
    const long long g = id / B, b = id - g * B;
    ldlt::panel<T>(sn[first + g], b, B, sn_first, sn_size, colptr, tau, perturb, lx, dd, flag);
}

template <typename T>
__global__ void ldlt_forward_external(const long long* __restrict__ cols, long long first, long long count,
                                      long long R, long long K, long long B, const long long* __restrict__ rows,
                                      const long long* __restrict__ base, const long long* __restrict__ sn_first,
                                      const long long* __restrict__ sn_size, const long long* __restrict__ rl_ptr,
                                      const long long* __restrict__ rl_sn, const long long* __restrict__ rl_idx,
                                      const T* __restrict__ lx, T* y) {
    BLU_LDLT_ID;
    if (id >= count * R * K) return;
    const long long c = id / (R * K), rest = id - c * (R * K), t = rest / K, r = rest - t * K;
    ldlt::forward_external<T>(cols[first + c], t, r, R, K, B, rows, base, sn_first, sn_size, rl_ptr, rl_sn, rl_idx,
                              lx, y);
}

template <typename T>
__global__ void ldlt_backward_external(const long long* __restrict__ cols, long long first, long long count,
                                       long long R, long long K, long long B, const long long* __restrict__ rows,
                                       const long long* __restrict__ colptr, const long long* __restrict__ rowind,
                                       const long long* __restrict__ base, const T* __restrict__ lx, T* y) {
    BLU_LDLT_ID;
    if (id >= count * R * K) return;
    const long long c = id / (R * K), rest = id - c * (R * K), t = rest / K, r = rest - t * K;
    ldlt::backward_external<T>(cols[first + c], t, r, R, K, B, rows, colptr, rowind, base, lx, y);
}

template <typename T>
__global__ void ldlt_forward_runs(const long long* __restrict__ sn, long long first, long long count, long long R,
                                  long long K, long long B, const long long* __restrict__ rows,
                                  const long long* __restrict__ sn_first, const long long* __restrict__ sn_size,
                                  const long long* __restrict__ colptr, const long long* __restrict__ base,
                                  const long long* __restrict__ rl_ptr, const long long* __restrict__ rl_sn,
                                  const long long* __restrict__ rl_idx, const T* __restrict__ lx, T* y) {
    BLU_LDLT_ID;
    if (id >= count * R * K) return;
    const long long g = id / (R * K), rest = id - g * (R * K), t = rest / K, r = rest - t * K;
    ldlt::forward_runs<T>(sn[first + g], t, r, R, K, B, rows, sn_first, sn_size, colptr, base, rl_ptr, rl_sn, rl_idx,
                          lx, y);
}

template <typename T>
__global__ void ldlt_backward_runs(const long long* __restrict__ sn, long long first, long long count, long long R,
                                   long long K, long long B, const long long* __restrict__ rows,
                                   const long long* __restrict__ sn_first, const long long* __restrict__ sn_size,
                                   const long long* __restrict__ colptr, const long long* __restrict__ rowind,
                                   const long long* __restrict__ base, const T* __restrict__ lx, T* y) {
    BLU_LDLT_ID;
    if (id >= count * R * K) return;
    const long long g = id / (R * K), rest = id - g * (R * K), t = rest / K, r = rest - t * K;
    ldlt::backward_runs<T>(sn[first + g], t, r, R, K, B, rows, sn_first, sn_size, colptr, rowind, base, lx, y);
}

template <typename T>
__global__ void ldlt_residual(long long n, long long R, long long K, long long nnz,
                              const long long* __restrict__ rows, const long long* __restrict__ a_ptr,
                              const long long* __restrict__ a_col, const long long* __restrict__ a_src,
                              const T* __restrict__ values, const double* __restrict__ x,
                              const double* __restrict__ rhs, double* __restrict__ out) {
    BLU_LDLT_ID;
    if (id >= n * R * K) return;
    // (t, i, r) with r fastest: out is (R, n, K)
    const long long t = id / (n * K), rest = id - t * (n * K), i = rest / K, r = rest - i * K;
    ldlt::residual<T>(i, t, r, n, K, nnz, rows, a_ptr, a_col, a_src, values, x, rhs, out);
}

template <typename T>
__global__ void ldlt_row_sums(long long n, long long B, long long nnz, const long long* __restrict__ a_ptr,
                              const long long* __restrict__ a_src, const T* __restrict__ values,
                              double* __restrict__ out) {
    BLU_LDLT_ID;
    if (id >= n * B) return;
    const long long b = id / n, i = id - b * n;   // out (B, n), i fastest
    ldlt::row_sum<T>(i, b, n, nnz, a_ptr, a_src, values, out);
}

// The kernels whose blocks synchronise (ldlt_*wide*): each (item, matrix) pair of a block's phase: items [0, count) x the block's `here` matrices from `b0`,
// the matrix fastest, strided over the block's threads.
template <typename F>
__device__ __forceinline__ void blocks_each(long long count, long long b0, long long here, F f) {
    for (long long w = threadIdx.x; w < count * here; w += blockDim.x) {
        const long long e = w / here;
        f(e, b0 + (w - e * here));
    }
}

// A wide-run kernel's block: the run g (sn[first + block / groups]) and its share of `count` items
// (matrices, or rows of the solve) in groups of M: items [start, start + here).
struct WideShare {
    long long g, start, here;
};

__device__ __forceinline__ WideShare wide_share(const long long* __restrict__ sn, long long first, long long M,
                                                long long count) {
    const long long groups = (count + M - 1) / M, start = (blockIdx.x % groups) * M;
    return {sn[first + blockIdx.x / groups], start, count - start < M ? count - start : M};
}

template <typename T>
__global__ void ldlt_wide_panels(const long long* __restrict__ sn, long long first, long long M, long long B,
                                 const long long* __restrict__ sn_first, const long long* __restrict__ sn_size,
                                 const long long* __restrict__ col_of, const long long* __restrict__ sn_of,
                                 const long long* __restrict__ colptr, const T* __restrict__ tau, int perturb, T* lx,
                                 T* dd, unsigned char* flag) {
    const WideShare w = wide_share(sn, first, M, B);
    const long long b0 = w.start, here = w.here, f = sn_first[w.g], s = sn_size[w.g];
    for (long long t = 0; t < s; ++t) {
        const long long p0 = colptr[f + t], count = colptr[f + t + 1] - p0;
        if (t) {                                      // column 0 has no earlier column in its run
            blocks_each(count, b0, here, [&](long long e, long long b) {
                ldlt::panel_entry<T>(p0 + e, b, B, col_of, sn_of, sn_first, colptr, dd, lx);
            });
            __syncthreads();
        }
        blocks_each(count, b0, here, [&](long long e, long long b) {
            ldlt::pivot_entry<T>(p0 + e, b, B, col_of, colptr, tau, perturb, lx, dd, flag);
        });
        __syncthreads();
    }
}

// A wide run's rows in a solve, the block's (matrix, right-hand side) pairs p = t K + r of rows[w.start ..): row
// u final, every later (forward) or earlier (backward) row v of the run adds its term to its own sum in
// acc (y's shape), in forward_run's / backward_run's order, and row v takes its sum once the last term is in.
template <typename T>
__global__ void ldlt_forward_wide(const long long* __restrict__ sn, long long first, long long M, long long R,
                                  long long K, long long B, const long long* __restrict__ rows,
                                  const long long* __restrict__ sn_first, const long long* __restrict__ sn_size,
                                  const long long* __restrict__ colptr, const T* __restrict__ lx, T* y, T* acc) {
    const WideShare w = wide_share(sn, first, M, R);
    const long long p0 = w.start * K, here = w.here * K, f = sn_first[w.g], s = sn_size[w.g], RK = R * K;
    blocks_each(s - 1, p0, here, [&](long long e, long long p) { acc[(f + 1 + e) * RK + p] = T(0); });
    __syncthreads();
    for (long long u = 0; u + 1 < s; ++u) {
        const long long c = colptr[f + u];
        blocks_each(s - 1 - u, p0, here, [&](long long e, long long p) {
            const long long v = u + 1 + e;
            T* sum = acc + (f + v) * RK + p;
            *sum += lx[(c + v - u) * B + rows[p / K]] * y[(f + u) * RK + p];
            if (v == u + 1) y[(f + v) * RK + p] -= *sum;
        });
        __syncthreads();
    }
}

template <typename T>
__global__ void ldlt_backward_wide(const long long* __restrict__ sn, long long first, long long M, long long R,
                                   long long K, long long B, const long long* __restrict__ rows,
                                   const long long* __restrict__ sn_first, const long long* __restrict__ sn_size,
                                   const long long* __restrict__ colptr, const T* __restrict__ lx, T* y, T* acc) {
    const WideShare w = wide_share(sn, first, M, R);
    const long long p0 = w.start * K, here = w.here * K, f = sn_first[w.g], s = sn_size[w.g], RK = R * K;
    blocks_each(s - 1, p0, here, [&](long long v, long long p) { acc[(f + v) * RK + p] = T(0); });
    __syncthreads();
    for (long long u = s - 1; u >= 1; --u) {
        blocks_each(u, p0, here, [&](long long v, long long p) {
            T* sum = acc + (f + v) * RK + p;
            *sum += lx[(colptr[f + v] + u - v) * B + rows[p / K]] * y[(f + u) * RK + p];
            if (v == u - 1) y[(f + v) * RK + p] -= *sum;
        });
        __syncthreads();
    }
}

// Refinement's test: block (t, r) of R x K reduces its solution's three norms over the n rows (threads
// strided over the rows, then a tree in shared memory: a power-of-two block), and thread 0 writes the
// backward error. res, rhs (R, n, K) float64, x (R, n, K), anorm (R,), out (R, K).
template <typename T>
__global__ void ldlt_backward_error(long long n, long long K, const double* __restrict__ res, const T* __restrict__ x,
                                    const double* __restrict__ rhs, const double* __restrict__ anorm,
                                    double* __restrict__ out) {
    __shared__ double norms[3][256];
    __shared__ int finite[256];
    const long long id = blockIdx.x, t = id / K, r = id - t * K;
    double rn = 0.0, xn = 0.0, bn = 0.0;
    int ok = 1;
    for (long long i = threadIdx.x; i < n; i += blockDim.x) {
        const long long q = (t * n + i) * K + r;
        const double a = res[q] < 0.0 ? -res[q] : res[q], c = rhs[q] < 0.0 ? -rhs[q] : rhs[q];
        const double v = (double)x[q] < 0.0 ? -(double)x[q] : (double)x[q];
        ok = ok && a - a == 0.0 && v - v == 0.0 && c - c == 0.0;
        rn = a > rn ? a : rn;
        xn = v > xn ? v : xn;
        bn = c > bn ? c : bn;
    }
    const unsigned int me = threadIdx.x;
    norms[0][me] = rn;
    norms[1][me] = xn;
    norms[2][me] = bn;
    finite[me] = ok;
    __syncthreads();
    for (unsigned int half = blockDim.x / 2; half > 0; half /= 2) {
        if (me < half) {
            for (int k = 0; k < 3; ++k)
                norms[k][me] = norms[k][me + half] > norms[k][me] ? norms[k][me + half] : norms[k][me];
            finite[me] = finite[me] && finite[me + half];
        }
        __syncthreads();
    }
    if (me == 0) out[id] = ldlt::backward_error(norms[0][0], norms[1][0], norms[2][0], finite[0] != 0, anorm[t]);
}

#undef BLU_LDLT_ID

}  // namespace blu
