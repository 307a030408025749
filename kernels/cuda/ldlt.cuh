// The per-thread work of the sparse LDL^T kernels (ldlt.cu): one function per kernel, each computing
// one (item, matrix) pair of a launch. Plain C++ on purpose (no intrinsics, no shared memory, no
// synchronisation): every thread reads only what earlier launches wrote and writes only its own
// outputs, so the threads of a launch may run in any order (tests run this text on the host, in two
// orders, against a dense reference).
//
// Layouts (batch-minor, so that the threads of one item, consecutive in b, read consecutive words):
//   lx    (nnz(L), B)  L's values in CSC order (plan.colptr / plan.rowind): the pivot d_j at colptr[j],
//                      the multipliers l_ij below it; on entry the permuted matrix C's lower triangle
//   y     (n, R, K)    right-hand sides / solutions of the matrices rows[0..R) (C's numbering)
//   values (B, nnz)    the input, one row per matrix (for residuals and norms, original numbering)
// Index arrays are int64 (long long). L's rows (strict lower part) in CSR: row i's entries are
// row_col[row_ptr[i]..row_ptr[i+1]) (columns k < i, ascending), at positions row_pos[.] of lx.
#ifndef BATCHLU_LDLT_CUH
#define BATCHLU_LDLT_CUH

namespace blu {
namespace ldlt {

typedef long long index_t;

// Entry p = (i, j) of L (column j of the level being factored), matrix b: the left-looking dot product
//     v_ij = c_ij - sum_k l_ik (l_jk d_k),   k over the columns where both row i and row j of L are
// non-zero (k < j; every such k is a descendant of j in the elimination tree, so it lies on an earlier
// level and is final). Row j's k are all < j, so the merge of the two sorted rows stops at row j's end.
// i == j gives the pivot before its check, d_j = c_jj - sum_k l_jk (l_jk d_k). The division by d_j is
// ldlt_pivots' (next launch): until then lx holds v_ij.
template <typename T>
__device__ __forceinline__ void entry(index_t p, index_t b, index_t B, const index_t* col_of,
                                      const index_t* rowind, const index_t* colptr, const index_t* row_ptr,
                                      const index_t* row_col, const index_t* row_pos, T* lx) {
    const index_t i = rowind[p], j = col_of[p];
    index_t qj = row_ptr[j];
    const index_t ej = row_ptr[j + 1];
    T sum = T(0);
    if (i == j) {
        for (; qj < ej; ++qj) {
            const T ljk = lx[row_pos[qj] * B + b];
            sum += ljk * (ljk * lx[colptr[row_col[qj]] * B + b]);
        }
    } else {
        index_t qi = row_ptr[i];
        const index_t ei = row_ptr[i + 1];
        while (qj < ej && qi < ei) {
            const index_t ki = row_col[qi], kj = row_col[qj];
            if (ki == kj) {
                const T ljk = lx[row_pos[qj] * B + b];
                sum += lx[row_pos[qi] * B + b] * (ljk * lx[colptr[kj] * B + b]);
                ++qi;
                ++qj;
            } else if (ki < kj) {
                ++qi;
            } else {
                ++qj;
            }
        }
    }
    lx[p * B + b] -= sum;
}

// Column j of the level, matrix b: static pivoting and the division. A pivot with |d| < tau[b] becomes
// -tau[b] if d < 0, else +tau[b] (an exact 0 becomes +tau), and is flagged (flag (n, B), 1 byte each);
// with perturb 0 or tau 0 nothing changes (a zero pivot then divides to Inf/NaN: info k > 0). NaN stays
// NaN (|NaN| < tau is false). Then l_ij = v_ij / d for the entries below the diagonal.
template <typename T>
__device__ __forceinline__ void pivot(index_t j, index_t b, index_t B, const index_t* colptr, const T* tau,
                                      int perturb, T* lx, unsigned char* flag) {
    const index_t p0 = colptr[j], p1 = colptr[j + 1];
    T d = lx[p0 * B + b];
    const T t = tau[b];
    const T magnitude = d < T(0) ? -d : d;
    unsigned char perturbed = 0;
    if (perturb && magnitude < t) {
        d = d < T(0) ? -t : t;
        perturbed = 1;
    }
    lx[p0 * B + b] = d;
    flag[j * B + b] = perturbed;
    for (index_t p = p0 + 1; p < p1; ++p) lx[p * B + b] /= d;
}

// Forward substitution L y = c, row i of the level, matrix rows[t], right-hand side r:
//     y_i -= sum_k l_ik y_k   over row i of L (k < i: descendants, earlier levels, final).
template <typename T>
__device__ __forceinline__ void forward(index_t i, index_t t, index_t r, index_t R, index_t K, index_t B,
                                        const index_t* rows, const index_t* row_ptr, const index_t* row_col,
                                        const index_t* row_pos, const T* lx, T* y) {
    const index_t b = rows[t];
    T sum = T(0);
    for (index_t q = row_ptr[i]; q < row_ptr[i + 1]; ++q)
        sum += lx[row_pos[q] * B + b] * y[(row_col[q] * R + t) * K + r];
    y[(i * R + t) * K + r] -= sum;
}

// Backward substitution L^T x = z, column j of the level (levels from the last), matrix rows[t]:
//     x_j -= sum_i l_ij x_i   over column j of L below its diagonal (i > j: ancestors, already final).
template <typename T>
__device__ __forceinline__ void backward(index_t j, index_t t, index_t r, index_t R, index_t K, index_t B,
                                         const index_t* rows, const index_t* colptr, const index_t* rowind,
                                         const T* lx, T* y) {
    const index_t b = rows[t];
    T sum = T(0);
    for (index_t p = colptr[j] + 1; p < colptr[j + 1]; ++p)
        sum += lx[p * B + b] * y[(rowind[p] * R + t) * K + r];
    y[(j * R + t) * K + r] -= sum;
}

// Residual in float64, row i of A (original numbering), matrix rows[t], right-hand side r:
//     out_i = b_i - sum_q a_iq x_q   over A's whole symmetric row i (a_ptr / a_col / a_src: the lower
// entries and their mirror images; a_src indexes a matrix's row of values). x, b, out: (R, n, K).
template <typename T>
__device__ __forceinline__ void residual(index_t i, index_t t, index_t r, index_t n, index_t K, index_t nnz,
                                         const index_t* rows, const index_t* a_ptr, const index_t* a_col,
                                         const index_t* a_src, const T* values, const double* x,
                                         const double* rhs, double* out) {
    const T* v = values + rows[t] * nnz;
    double sum = 0.0;
    for (index_t q = a_ptr[i]; q < a_ptr[i + 1]; ++q)
        sum += (double)v[a_src[q]] * x[(t * n + a_col[q]) * K + r];
    out[(t * n + i) * K + r] = rhs[(t * n + i) * K + r] - sum;
}

// Row i's sum of |a_iq| in float64, matrix b: out (B, n). ||A||_inf is their largest per matrix.
template <typename T>
__device__ __forceinline__ void row_sum(index_t i, index_t b, index_t n, index_t nnz, const index_t* a_ptr,
                                        const index_t* a_src, const T* values, double* out) {
    const T* v = values + b * nnz;
    double sum = 0.0;
    for (index_t q = a_ptr[i]; q < a_ptr[i + 1]; ++q) {
        const double a = (double)v[a_src[q]];
        sum += a < 0.0 ? -a : a;
    }
    out[b * n + i] = sum;
}

}  // namespace ldlt
}  // namespace blu

#endif  // BATCHLU_LDLT_CUH
