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
// Index arrays are int64 (long long); kernels/sparse/_gpu_maps.py builds them (supernodes, levels,
// L's rows by supernodes).
#ifndef BATCHLU_LDLT_CUH
#define BATCHLU_LDLT_CUH

namespace blu {
namespace ldlt {

typedef long long index_t;

// Supernode g: columns f .. f+s-1 (f = sn_first[g], s = sn_size[g]) sharing the rows R_g below the
// run. Column f+t holds, from colptr[f+t]: its pivot, the run's rows f+t+1 .. f+s-1, then R_g; so the
// entry of panel row q >= t (q < s: row f+q; q >= s: row R_g[q-s]) is at colptr[f+t] + q - t, and row
// R_g[r] is at base[f+t] + r. Row i of L is non-zero exactly in the columns of the supernodes it lies
// below (rl_sn[rl_ptr[i] .. rl_ptr[i+1]), ascending, as their row R_g[rl_idx]) and at i itself.

// sum += sum over the columns k of supernode g of l_(R_g[ri], k) (l_(R_g[rj], k) d_k), k ascending.
template <typename T>
__device__ __forceinline__ T below_dot(index_t g, index_t ri, index_t rj, index_t b, index_t B, const index_t* sn_first,
                                       const index_t* sn_size, const index_t* base, const T* lx, const T* dd, T sum) {
    const index_t f = sn_first[g], e = f + sn_size[g];
    for (index_t k = f; k < e; ++k) {
        const index_t q = base[k];
        sum += lx[(q + ri) * B + b] * (lx[(q + rj) * B + b] * dd[k * B + b]);
    }
    return sum;
}

// Entry p = (i, j) of L (a column j of the level's supernodes, i >= j), matrix b: what the supernodes
// below the level contribute,
//     v_ij = c_ij - sum_k l_ik (l_jk d_k),   k over the columns where both rows i and j of L are
// non-zero and k < first column of j's supernode: the columns of the supernodes that both rows lie
// below (all descendants of j, on earlier levels, final), merged by supernode; the run's own columns
// are ldlt_panel's. i == j gives the pivot's part.
template <typename T>
__device__ __forceinline__ void external(index_t p, index_t b, index_t B, const index_t* col_of,
                                         const index_t* rowind, const index_t* base, const index_t* sn_first,
                                         const index_t* sn_size, const index_t* rl_ptr, const index_t* rl_sn,
                                         const index_t* rl_idx, const T* dd, T* lx) {
    const index_t i = rowind[p], j = col_of[p];
    index_t qj = rl_ptr[j];
    const index_t ej = rl_ptr[j + 1];
    T sum = T(0);
    if (i == j) {
        for (; qj < ej; ++qj)
            sum = below_dot<T>(rl_sn[qj], rl_idx[qj], rl_idx[qj], b, B, sn_first, sn_size, base, lx, dd, sum);
    } else {
        index_t qi = rl_ptr[i];
        const index_t ei = rl_ptr[i + 1];
        while (qj < ej && qi < ei) {
            const index_t gi = rl_sn[qi], gj = rl_sn[qj];
            if (gi == gj) {
                sum = below_dot<T>(gj, rl_idx[qi], rl_idx[qj], b, B, sn_first, sn_size, base, lx, dd, sum);
                ++qi;
                ++qj;
            } else if (gi < gj) {
                ++qi;
            } else {
                ++qj;
            }
        }
    }
    lx[p * B + b] -= sum;
}

// Static pivoting of the value v of a pivot, matrix b: |v| < tau[b] becomes -tau[b] if v < 0, else +tau[b]
// (an exact 0 becomes +tau), and is flagged; with perturb 0 or tau 0 nothing changes (a zero pivot then
// divides to Inf/NaN: info k > 0). NaN stays NaN (|NaN| < tau is false).
template <typename T>
__device__ __forceinline__ T pivot_rule(T v, T tau, int perturb, unsigned char* perturbed) {
    const T magnitude = v < T(0) ? -v : v;
    *perturbed = 0;
    if (perturb && magnitude < tau) {
        *perturbed = 1;
        return v < T(0) ? -tau : tau;
    }
    return v;
}

// Column j, matrix b: its pivot d_j = pivot_rule(v_jj) into dd (n, B) and flag (n, B), then l_ij = v_ij / d_j
// below the diagonal. lx's diagonal keeps v_jj until the factorization ends (the host then copies dd
// there), so that the threads of ldlt_wide_panels, which each apply the rule to it, read what no thread writes.
template <typename T>
__device__ __forceinline__ void pivot(index_t j, index_t b, index_t B, const index_t* colptr, const T* tau,
                                      int perturb, T* lx, T* dd, unsigned char* flag) {
    const index_t p0 = colptr[j], p1 = colptr[j + 1];
    unsigned char perturbed;
    const T d = pivot_rule<T>(lx[p0 * B + b], tau[b], perturb, &perturbed);
    dd[j * B + b] = d;
    flag[j * B + b] = perturbed;
    for (index_t p = p0 + 1; p < p1; ++p) lx[p * B + b] /= d;
}

// The same for one entry p of a column (a thread each): the pivot's thread writes d_j and its flag, the
// others their quotient.
template <typename T>
__device__ __forceinline__ void pivot_entry(index_t p, index_t b, index_t B, const index_t* col_of,
                                            const index_t* colptr, const T* tau, int perturb, T* lx, T* dd,
                                            unsigned char* flag) {
    const index_t j = col_of[p], p0 = colptr[j];
    unsigned char perturbed;
    const T d = pivot_rule<T>(lx[p0 * B + b], tau[b], perturb, &perturbed);
    if (p == p0) {
        dd[j * B + b] = d;
        flag[j * B + b] = perturbed;
    } else {
        lx[p * B + b] /= d;
    }
}

// The run's part of panel entry (q, t) of the supernode whose first column is f, matrix b: the left-looking
// dot product over its earlier columns u < t, sum_u l_(t+q),u (l_t,u d_u), u ascending.
template <typename T>
__device__ __forceinline__ T run_dot(index_t f, index_t t, index_t q, index_t b, index_t B, const index_t* colptr,
                                     const T* lx, const T* dd) {
    T sum = T(0);
    for (index_t u = 0; u < t; ++u) {
        const index_t cu = colptr[f + u];              // column u: row t at cu + t - u, row t+q at + q
        sum += lx[(cu + t - u + q) * B + b] * (lx[(cu + t - u) * B + b] * dd[(f + u) * B + b]);
    }
    return sum;
}

// Supernode g, matrix b, after `external`: the dense LDL^T of its panel, column by column (left-looking):
// column t's entries less run_dot, then pivot(f+t). One thread does the whole run (narrow runs).
template <typename T>
__device__ __forceinline__ void panel(index_t g, index_t b, index_t B, const index_t* sn_first,
                                      const index_t* sn_size, const index_t* colptr, const T* tau, int perturb,
                                      T* lx, T* dd, unsigned char* flag) {
    const index_t f = sn_first[g], s = sn_size[g];
    for (index_t t = 0; t < s; ++t) {
        const index_t c = colptr[f + t], len = colptr[f + t + 1] - c;
        for (index_t q = 0; t > 0 && q < len; ++q) lx[(c + q) * B + b] -= run_dot<T>(f, t, q, b, B, colptr, lx, dd);
        pivot<T>(f + t, b, B, colptr, tau, perturb, lx, dd, flag);
    }
}

// The same for one entry p of a wide run's column (a thread each; pivot(f+t) in the next launch).
template <typename T>
__device__ __forceinline__ void panel_entry(index_t p, index_t b, index_t B, const index_t* col_of,
                                            const index_t* sn_of, const index_t* sn_first, const index_t* colptr,
                                            const T* dd, T* lx) {
    const index_t j = col_of[p], f = sn_first[sn_of[j]];
    lx[p * B + b] -= run_dot<T>(f, j - f, p - colptr[j], b, B, colptr, lx, dd);
}

// Forward substitution L y = c, row i (a column of the level's supernodes), matrix rows[t], right-hand
// side r: y_i -= sum_k l_ik y_k over the columns of the supernodes row i lies below (descendants,
// earlier levels, final); the run's own columns are ldlt_forward_wide's.
template <typename T>
__device__ __forceinline__ T forward_below(index_t i, index_t t, index_t r, index_t R, index_t K, index_t B, index_t b,
                                           const index_t* base, const index_t* sn_first, const index_t* sn_size,
                                           const index_t* rl_ptr, const index_t* rl_sn, const index_t* rl_idx,
                                           const T* lx, const T* y) {
    T sum = T(0);
    for (index_t q = rl_ptr[i]; q < rl_ptr[i + 1]; ++q) {
        const index_t g = rl_sn[q], ri = rl_idx[q], f = sn_first[g], e = f + sn_size[g];
        for (index_t k = f; k < e; ++k) sum += lx[(base[k] + ri) * B + b] * y[(k * R + t) * K + r];
    }
    return sum;
}

template <typename T>
__device__ __forceinline__ void forward_external(index_t i, index_t t, index_t r, index_t R, index_t K, index_t B,
                                                 const index_t* rows, const index_t* base, const index_t* sn_first,
                                                 const index_t* sn_size, const index_t* rl_ptr, const index_t* rl_sn,
                                                 const index_t* rl_idx, const T* lx, T* y) {
    y[(i * R + t) * K + r] -= forward_below<T>(i, t, r, R, K, B, rows[t], base, sn_first, sn_size, rl_ptr, rl_sn,
                                               rl_idx, lx, y);
}

// Supernode g, matrix rows[t], right-hand side r, after forward_external: the run's rows in order,
//     y_(f+v) -= sum_{u<v} l_(f+v, f+u) y_(f+u).
template <typename T>
__device__ __forceinline__ T forward_run(index_t f, index_t v, index_t t, index_t r, index_t R, index_t K, index_t B,
                                         index_t b, const index_t* colptr, const T* lx, const T* y) {
    T sum = T(0);
    for (index_t u = 0; u < v; ++u) sum += lx[(colptr[f + u] + v - u) * B + b] * y[((f + u) * R + t) * K + r];
    return sum;
}

// Both for a narrow run, row by row (one thread for the run, matrix rows[t], right-hand side r): each row
// less the supernodes below, then less the run's earlier rows (the same operations, in the same order,
// as forward_external then ldlt_forward_wide).
template <typename T>
__device__ __forceinline__ void forward_runs(index_t g, index_t t, index_t r, index_t R, index_t K, index_t B,
                                             const index_t* rows, const index_t* sn_first, const index_t* sn_size,
                                             const index_t* colptr, const index_t* base, const index_t* rl_ptr,
                                             const index_t* rl_sn, const index_t* rl_idx, const T* lx, T* y) {
    const index_t b = rows[t], f = sn_first[g], s = sn_size[g];
    for (index_t v = 0; v < s; ++v) {
        T* yi = y + ((f + v) * R + t) * K + r;
        *yi -= forward_below<T>(f + v, t, r, R, K, B, b, base, sn_first, sn_size, rl_ptr, rl_sn, rl_idx, lx, y);
        if (v) *yi -= forward_run<T>(f, v, t, r, R, K, B, b, colptr, lx, y);
    }
}

// Backward substitution L^T x = z, column j of the level (levels from the last), matrix rows[t]:
//     x_j -= sum_i l_ij x_i   over the rows R_g below j's run (ancestors, already final).
template <typename T>
__device__ __forceinline__ T backward_below(index_t j, index_t t, index_t r, index_t R, index_t K, index_t B, index_t b,
                                            const index_t* colptr, const index_t* rowind, const index_t* base,
                                            const T* lx, const T* y) {
    T sum = T(0);
    for (index_t p = base[j]; p < colptr[j + 1]; ++p) sum += lx[p * B + b] * y[(rowind[p] * R + t) * K + r];
    return sum;
}

template <typename T>
__device__ __forceinline__ void backward_external(index_t j, index_t t, index_t r, index_t R, index_t K, index_t B,
                                                  const index_t* rows, const index_t* colptr, const index_t* rowind,
                                                  const index_t* base, const T* lx, T* y) {
    y[(j * R + t) * K + r] -= backward_below<T>(j, t, r, R, K, B, rows[t], colptr, rowind, base, lx, y);
}

// Supernode g, matrix rows[t], after backward_external: the run's columns from the last,
//     x_(f+v) -= sum_{u>v} l_(f+u, f+v) x_(f+u),   u descending (the order in which the x_(f+u) become final).
template <typename T>
__device__ __forceinline__ T backward_run(index_t f, index_t s, index_t v, index_t t, index_t r, index_t R, index_t K,
                                          index_t B, index_t b, const index_t* colptr, const T* lx, const T* y) {
    const index_t c = colptr[f + v];
    T sum = T(0);
    for (index_t u = s - 1; u > v; --u) sum += lx[(c + u - v) * B + b] * y[((f + u) * R + t) * K + r];
    return sum;
}

// Both for a narrow run, column by column from the last (one thread for the run, matrix rows[t]): each
// x_j less the rows below the run, then less the run's later rows (as backward_external then
// ldlt_backward_wide).
template <typename T>
__device__ __forceinline__ void backward_runs(index_t g, index_t t, index_t r, index_t R, index_t K, index_t B,
                                              const index_t* rows, const index_t* sn_first, const index_t* sn_size,
                                              const index_t* colptr, const index_t* rowind, const index_t* base,
                                              const T* lx, T* y) {
    const index_t b = rows[t], f = sn_first[g], s = sn_size[g];
    for (index_t v = s - 1; v >= 0; --v) {
        T* xj = y + ((f + v) * R + t) * K + r;
        *xj -= backward_below<T>(f + v, t, r, R, K, B, b, colptr, rowind, base, lx, y);
        if (v < s - 1) *xj -= backward_run<T>(f, s, v, t, r, R, K, B, b, colptr, lx, y);
    }
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

// The normwise backward error of one solution from its norms, in float64:
//     rn / (anorm xn + bn),   rn = ||res||_inf, xn = ||x||_inf, bn = ||b||_inf, anorm = ||A||_inf;
// +inf for a residual over a zero denominator, 0 for none; NaN when any entry or norm is not finite
// (`finite` false; as Refining._berr). The denominator is rounded after the product, as NumPy's, not fused.
__device__ __forceinline__ double backward_error(double rn, double xn, double bn, bool finite, double anorm) {
#ifdef __CUDA_ARCH__
    const double den = __dadd_rn(__dmul_rn(anorm, xn), bn);
#else
    const double den = anorm * xn + bn;
#endif
    if (!finite || !(den - den == 0.0)) return 0.0 / 0.0;
    if (den > 0.0) return rn / den;
    return rn > 0.0 ? 1.0 / 0.0 : 0.0;
}

}  // namespace ldlt
}  // namespace blu

#endif  // BATCHLU_LDLT_CUH
