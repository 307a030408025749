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
//   ldlt_panel_entries     wide runs, column t: each entry's part from the run's earlier columns
//   ldlt_pivots            wide runs, column t's entries: static pivoting, division by the pivot
//   ldlt_forward_external  one level's wide runs' columns x R matrices x K: L y = c, the supernodes below
//   ldlt_forward_panel     one level's wide runs x R x K: L y = c within each run
//   ldlt_backward_external one level's wide runs' columns x R x K, levels from the last: L^T x = z, the
//                          rows below
//   ldlt_backward_panel    one level's wide runs x R x K: L^T x = z within each run
//   ldlt_forward_runs, ldlt_backward_runs: both steps for the level's narrow runs, a thread per run
//   ldlt_residual          n rows x R x K: b - A x in float64
//   ldlt_row_sums          n rows x B: sum_j |a_ij| in float64 (for ||A||_inf)
//
// The same work in one launch, for problems too small to fill the GPU a level at a time:
//   ldlt_factor_blocks     block k takes matrices [kM, kM + M) through every level and step, its threads
//                          over (item, matrix) with the matrix fastest, a barrier where the kernels above
//                          end a launch: the same per-thread functions in the same order, so the same bits
//   ldlt_solve_blocks      block k takes rows[kM .. kM + M) x K through the forward levels, the division
//                          by the pivots and the backward levels

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
__global__ void ldlt_panel_entries(const long long* __restrict__ ent, long long first, long long count, long long B,
                                   const long long* __restrict__ col_of, const long long* __restrict__ sn_of,
                                   const long long* __restrict__ sn_first, const long long* __restrict__ colptr,
                                   const T* __restrict__ dd, T* lx) {
    BLU_LDLT_ID;
    if (id >= count * B) return;
    const long long e = id / B, b = id - e * B;
    ldlt::panel_entry<T>(ent[first + e], b, B, col_of, sn_of, sn_first, colptr, dd, lx);
}

template <typename T>
__global__ void ldlt_pivots(const long long* __restrict__ ent, long long first, long long count, long long B,
                            const long long* __restrict__ col_of, const long long* __restrict__ colptr,
                            const T* __restrict__ tau, int perturb, T* lx, T* __restrict__ dd,
                            unsigned char* __restrict__ flag) {
    BLU_LDLT_ID;
    if (id >= count * B) return;
    const long long e = id / B, b = id - e * B;
    ldlt::pivot_entry<T>(ent[first + e], b, B, col_of, colptr, tau, perturb, lx, dd, flag);
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
__global__ void ldlt_forward_panel(const long long* __restrict__ sn, long long first, long long count, long long R,
                                   long long K, long long B, const long long* __restrict__ rows,
                                   const long long* __restrict__ sn_first, const long long* __restrict__ sn_size,
                                   const long long* __restrict__ colptr, const T* __restrict__ lx, T* y) {
    BLU_LDLT_ID;
    if (id >= count * R * K) return;
    const long long g = id / (R * K), rest = id - g * (R * K), t = rest / K, r = rest - t * K;
    ldlt::forward_panel<T>(sn[first + g], t, r, R, K, B, rows, sn_first, sn_size, colptr, lx, y);
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
__global__ void ldlt_backward_panel(const long long* __restrict__ sn, long long first, long long count, long long R,
                                    long long K, long long B, const long long* __restrict__ rows,
                                    const long long* __restrict__ sn_first, const long long* __restrict__ sn_size,
                                    const long long* __restrict__ colptr, const T* __restrict__ lx, T* y) {
    BLU_LDLT_ID;
    if (id >= count * R * K) return;
    const long long g = id / (R * K), rest = id - g * (R * K), t = rest / K, r = rest - t * K;
    ldlt::backward_panel<T>(sn[first + g], t, r, R, K, B, rows, sn_first, sn_size, colptr, lx, y);
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

// Each (item, matrix) pair of a block's phase: items [0, count) x the block's `here` matrices from `b0`,
// the matrix fastest, strided over the block's threads.
template <typename F>
__device__ __forceinline__ void blocks_each(long long count, long long b0, long long here, F f) {
    for (long long w = threadIdx.x; w < count * here; w += blockDim.x) {
        const long long e = w / here;
        f(e, b0 + (w - e * here));
    }
}

template <typename T>
__global__ void ldlt_factor_blocks(long long nlevels, long long M, long long B, const long long* __restrict__ ent_ptr,
                                   const long long* __restrict__ ent, const long long* __restrict__ narrow_ptr,
                                   const long long* __restrict__ narrow, const long long* __restrict__ step_ptr,
                                   const long long* __restrict__ step_ent_ptr, const long long* __restrict__ step_ent,
                                   const long long* __restrict__ col_of, const long long* __restrict__ rowind,
                                   const long long* __restrict__ base, const long long* __restrict__ sn_first,
                                   const long long* __restrict__ sn_size, const long long* __restrict__ sn_of,
                                   const long long* __restrict__ rl_ptr, const long long* __restrict__ rl_sn,
                                   const long long* __restrict__ rl_idx, const long long* __restrict__ colptr,
                                   const T* __restrict__ tau, int perturb, T* lx, T* dd, unsigned char* flag) {
    const long long b0 = (long long)blockIdx.x * M;
    if (b0 >= B) return;
    const long long here = B - b0 < M ? B - b0 : M;
    for (long long level = 0; level < nlevels; ++level) {
        if (level) {                                  // leaves: no supernode below them
            const long long lo = ent_ptr[level];
            blocks_each(ent_ptr[level + 1] - lo, b0, here, [&](long long e, long long b) {
                ldlt::external<T>(ent[lo + e], b, B, col_of, rowind, base, sn_first, sn_size, rl_ptr, rl_sn, rl_idx,
                                  dd, lx);
            });
            __syncthreads();
        }
        const long long lo = narrow_ptr[level];
        blocks_each(narrow_ptr[level + 1] - lo, b0, here, [&](long long g, long long b) {
            ldlt::panel<T>(narrow[lo + g], b, B, sn_first, sn_size, colptr, tau, perturb, lx, dd, flag);
        });
        __syncthreads();
        for (long long step = step_ptr[level]; step < step_ptr[level + 1]; ++step) {
            const long long first = step_ent_ptr[step], count = step_ent_ptr[step + 1] - first;
            if (step > step_ptr[level]) {             // column 0 has no earlier column in its run
                blocks_each(count, b0, here, [&](long long e, long long b) {
                    ldlt::panel_entry<T>(step_ent[first + e], b, B, col_of, sn_of, sn_first, colptr, dd, lx);
                });
                __syncthreads();
            }
            blocks_each(count, b0, here, [&](long long e, long long b) {
                ldlt::pivot_entry<T>(step_ent[first + e], b, B, col_of, colptr, tau, perturb, lx, dd, flag);
            });
            __syncthreads();
        }
    }
}

template <typename T>
__global__ void ldlt_solve_blocks(long long nlevels, long long M, long long n, long long R, long long K, long long B,
                                  const long long* __restrict__ rows, const long long* __restrict__ narrow_ptr,
                                  const long long* __restrict__ narrow, const long long* __restrict__ wide_ptr,
                                  const long long* __restrict__ wide, const long long* __restrict__ wide_cols_ptr,
                                  const long long* __restrict__ wide_cols, const long long* __restrict__ sn_first,
                                  const long long* __restrict__ sn_size, const long long* __restrict__ colptr,
                                  const long long* __restrict__ rowind, const long long* __restrict__ base,
                                  const long long* __restrict__ rl_ptr, const long long* __restrict__ rl_sn,
                                  const long long* __restrict__ rl_idx, const T* __restrict__ lx, T* y) {
    // the block's (matrix, right-hand side) pairs: rows[t0 ..) x K, counted as the factorization's matrices
    const long long t0 = (long long)blockIdx.x * M;
    if (t0 >= R) return;
    const long long here = (R - t0 < M ? R - t0 : M) * K, p0 = t0 * K;
    auto each = [&](const long long* ptr, const long long* items, long long level, auto f) {
        const long long lo = ptr[level];
        blocks_each(ptr[level + 1] - lo, p0, here, [&](long long e, long long p) {
            const long long t = p / K;
            f(items[lo + e], t, p - t * K);
        });
        __syncthreads();
    };
    for (long long level = 0; level < nlevels; ++level) {
        each(narrow_ptr, narrow, level, [&](long long g, long long t, long long r) {
            ldlt::forward_runs<T>(g, t, r, R, K, B, rows, sn_first, sn_size, colptr, base, rl_ptr, rl_sn, rl_idx, lx, y);
        });
        if (level)                                    // leaves: no supernode below them
            each(wide_cols_ptr, wide_cols, level, [&](long long i, long long t, long long r) {
                ldlt::forward_external<T>(i, t, r, R, K, B, rows, base, sn_first, sn_size, rl_ptr, rl_sn, rl_idx, lx,
                                          y);
            });
        each(wide_ptr, wide, level, [&](long long g, long long t, long long r) {
            ldlt::forward_panel<T>(g, t, r, R, K, B, rows, sn_first, sn_size, colptr, lx, y);
        });
    }
    blocks_each(n, p0, here, [&](long long i, long long p) {
        const long long t = p / K;
        y[i * R * K + p] /= lx[colptr[i] * B + rows[t]];
    });
    __syncthreads();
    for (long long level = nlevels - 1; level >= 0; --level) {
        each(narrow_ptr, narrow, level, [&](long long g, long long t, long long r) {
            ldlt::backward_runs<T>(g, t, r, R, K, B, rows, sn_first, sn_size, colptr, rowind, base, lx, y);
        });
        each(wide_cols_ptr, wide_cols, level, [&](long long j, long long t, long long r) {
            ldlt::backward_external<T>(j, t, r, R, K, B, rows, colptr, rowind, base, lx, y);
        });
        each(wide_ptr, wide, level, [&](long long g, long long t, long long r) {
            ldlt::backward_panel<T>(g, t, r, R, K, B, rows, sn_first, sn_size, colptr, lx, y);
        });
    }
}

#undef BLU_LDLT_ID

}  // namespace blu
