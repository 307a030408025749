// Sparse LDL^T of a batch of matrices that share one pattern (batchlu.sparse, after the seed paper 001):
// level by level over the elimination tree, one launch per level and step for the whole batch, static
// pivoting, triangular solves and the float64 residuals of iterative refinement. The per-thread work
// and the layouts are in ldlt.cuh; kernels/sparse/_gpu.py launches these.
//
// Every kernel is a flat 1-D grid over (item, matrix[, right-hand side]) with the matrix (then the
// right-hand side) fastest, so that a warp's threads work on one item of consecutive matrices: the same
// control flow (it depends on the pattern only) and consecutive words of the batch-minor arrays.
//
//   ldlt_entries   one level's entries (positions ent[first..first+count) of lx) x B matrices: the dot
//                  products
//   ldlt_pivots    one level's columns cols[first..first+count) x B: static pivoting, division by the pivot
//   ldlt_forward   one level's rows x R matrices x K: L y = c
//   ldlt_backward  one level's columns x R x K, levels from the last: L^T x = z
//   ldlt_residual  n rows x R x K: b - A x in float64
//   ldlt_row_sums  n rows x B: sum_j |a_ij| in float64 (for ||A||_inf)

#include "ldlt.cuh"

namespace blu {

template <typename T>
__global__ void ldlt_entries(const long long* __restrict__ ent, long long first, long long count, long long B,
                             const long long* __restrict__ col_of, const long long* __restrict__ rowind,
                             const long long* __restrict__ colptr, const long long* __restrict__ row_ptr,
                             const long long* __restrict__ row_col, const long long* __restrict__ row_pos,
                             T* lx) {
    const long long id = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= count * B) return;
    const long long e = id / B, b = id - e * B;
    ldlt::entry<T>(ent[first + e], b, B, col_of, rowind, colptr, row_ptr, row_col, row_pos, lx);
}

template <typename T>
__global__ void ldlt_pivots(const long long* __restrict__ cols, long long first, long long count, long long B,
                            const long long* __restrict__ colptr, const T* __restrict__ tau, int perturb,
                            T* lx, unsigned char* __restrict__ flag) {
    const long long id = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= count * B) return;
    const long long c = id / B, b = id - c * B;
    ldlt::pivot<T>(cols[first + c], b, B, colptr, tau, perturb, lx, flag);
}

template <typename T>
__global__ void ldlt_forward(const long long* __restrict__ cols, long long first, long long count, long long R,
                             long long K,
                             long long B, const long long* __restrict__ rows,
                             const long long* __restrict__ row_ptr, const long long* __restrict__ row_col,
                             const long long* __restrict__ row_pos, const T* __restrict__ lx, T* y) {
    const long long id = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= count * R * K) return;
    const long long c = id / (R * K), rest = id - c * (R * K), t = rest / K, r = rest - t * K;
    ldlt::forward<T>(cols[first + c], t, r, R, K, B, rows, row_ptr, row_col, row_pos, lx, y);
}

template <typename T>
__global__ void ldlt_backward(const long long* __restrict__ cols, long long first, long long count, long long R,
                              long long K,
                              long long B, const long long* __restrict__ rows,
                              const long long* __restrict__ colptr, const long long* __restrict__ rowind,
                              const T* __restrict__ lx, T* y) {
    const long long id = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= count * R * K) return;
    const long long c = id / (R * K), rest = id - c * (R * K), t = rest / K, r = rest - t * K;
    ldlt::backward<T>(cols[first + c], t, r, R, K, B, rows, colptr, rowind, lx, y);
}

template <typename T>
__global__ void ldlt_residual(long long n, long long R, long long K, long long nnz,
                              const long long* __restrict__ rows, const long long* __restrict__ a_ptr,
                              const long long* __restrict__ a_col, const long long* __restrict__ a_src,
                              const T* __restrict__ values, const double* __restrict__ x,
                              const double* __restrict__ rhs, double* __restrict__ out) {
    const long long id = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= n * R * K) return;
    // (t, i, r) with r fastest: out is (R, n, K)
    const long long t = id / (n * K), rest = id - t * (n * K), i = rest / K, r = rest - i * K;
    ldlt::residual<T>(i, t, r, n, K, nnz, rows, a_ptr, a_col, a_src, values, x, rhs, out);
}

template <typename T>
__global__ void ldlt_row_sums(long long n, long long B, long long nnz, const long long* __restrict__ a_ptr,
                              const long long* __restrict__ a_src, const T* __restrict__ values,
                              double* __restrict__ out) {
    const long long id = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= n * B) return;
    const long long b = id / n, i = id - b * n;   // out (B, n), i fastest
    ldlt::row_sum<T>(i, b, n, nnz, a_ptr, a_src, values, out);
}

}  // namespace blu
