// Shared device helpers for batchlu's CUDA kernels: complex types, scalar traits, arithmetic,
// LAPACK's cabs1, finiteness tests and warp shuffles for every supported scalar type.
//
// Every kernel family (getrf.cu, getri.cu, getrs.cu, gesv.cu, slogdet.cu) includes this header: add to
// it freely, but a change of meaning here changes every family's kernels.
//
// Scalar types, matching the NumPy/CuPy dtypes bit for bit (C-order arrays are passed as raw pointers):
//   float, double, blu::c64 (complex64: {float re, im}), blu::c128 (complex128: {double re, im}).
// Every kernel lives in namespace blu; name expressions in Python read "blu::kernel<float, 16>",
// "blu::kernel<blu::c64, 16>" (kernels/_gpu/_runtime.py renders them).
#ifndef BATCHLU_COMMON_CUH
#define BATCHLU_COMMON_CUH

namespace blu {

struct __align__(8) c64 {
    float re, im;
};
struct __align__(16) c128 {
    double re, im;
};

// ---- traits --------------------------------------------------------------------------------------
template <typename T> struct traits;
template <> struct traits<float> {
    using real = float;
    static constexpr bool is_complex = false;
    __device__ static float eps() { return 5.9604645e-08f; }    // LAPACK slamch('E') = 2^-24
    __device__ static float sfmin() { return 1.17549435e-38f; } // slamch('S')
};
template <> struct traits<double> {
    using real = double;
    static constexpr bool is_complex = false;
    __device__ static double eps() { return 1.1102230246251565e-16; }
    __device__ static double sfmin() { return 2.2250738585072014e-308; }
};
template <> struct traits<c64> {
    using real = float;
    static constexpr bool is_complex = true;
    __device__ static float eps() { return 5.9604645e-08f; }
    __device__ static float sfmin() { return 1.17549435e-38f; }
};
template <> struct traits<c128> {
    using real = double;
    static constexpr bool is_complex = true;
    __device__ static double eps() { return 1.1102230246251565e-16; }
    __device__ static double sfmin() { return 2.2250738585072014e-308; }
};
template <typename T> using real_t = typename traits<T>::real;

// ---- constructors ----------------------------------------------------------------------------------
template <typename T> __device__ __forceinline__ T zero();
template <> __device__ __forceinline__ float zero<float>() { return 0.0f; }
template <> __device__ __forceinline__ double zero<double>() { return 0.0; }
template <> __device__ __forceinline__ c64 zero<c64>() { return {0.0f, 0.0f}; }
template <> __device__ __forceinline__ c128 zero<c128>() { return {0.0, 0.0}; }

template <typename T> __device__ __forceinline__ T one();
template <> __device__ __forceinline__ float one<float>() { return 1.0f; }
template <> __device__ __forceinline__ double one<double>() { return 1.0; }
template <> __device__ __forceinline__ c64 one<c64>() { return {1.0f, 0.0f}; }
template <> __device__ __forceinline__ c128 one<c128>() { return {1.0, 0.0}; }

template <typename T> __device__ __forceinline__ T nan_value();
template <> __device__ __forceinline__ float nan_value<float>() { return __int_as_float(0x7fc00000); }
template <> __device__ __forceinline__ double nan_value<double>() {
    return __longlong_as_double(0x7ff8000000000000LL);
}
template <> __device__ __forceinline__ c64 nan_value<c64>() {
    return {nan_value<float>(), nan_value<float>()};
}
template <> __device__ __forceinline__ c128 nan_value<c128>() {
    return {nan_value<double>(), nan_value<double>()};
}
// +inf of a real type (NVRTC has no math.h, so no INFINITY)
template <typename R> __device__ __forceinline__ R inf_value();
template <> __device__ __forceinline__ float inf_value<float>() { return __int_as_float(0x7f800000); }
template <> __device__ __forceinline__ double inf_value<double>() {
    return __longlong_as_double(0x7ff0000000000000LL);
}

// ---- arithmetic (real types use the built-in operators) -------------------------------------------
__device__ __forceinline__ c64 operator+(c64 a, c64 b) { return {a.re + b.re, a.im + b.im}; }
__device__ __forceinline__ c128 operator+(c128 a, c128 b) { return {a.re + b.re, a.im + b.im}; }
__device__ __forceinline__ c64 operator-(c64 a, c64 b) { return {a.re - b.re, a.im - b.im}; }
__device__ __forceinline__ c128 operator-(c128 a, c128 b) { return {a.re - b.re, a.im - b.im}; }
__device__ __forceinline__ c64 operator-(c64 a) { return {-a.re, -a.im}; }
__device__ __forceinline__ c128 operator-(c128 a) { return {-a.re, -a.im}; }
__device__ __forceinline__ c64 operator*(c64 a, c64 b) {
    return {fmaf(a.re, b.re, -a.im * b.im), fmaf(a.re, b.im, a.im * b.re)};
}
__device__ __forceinline__ c128 operator*(c128 a, c128 b) {
    return {fma(a.re, b.re, -a.im * b.im), fma(a.re, b.im, a.im * b.re)};
}
__device__ __forceinline__ bool operator==(c64 a, c64 b) { return a.re == b.re && a.im == b.im; }
__device__ __forceinline__ bool operator==(c128 a, c128 b) { return a.re == b.re && a.im == b.im; }
__device__ __forceinline__ bool operator!=(c64 a, c64 b) { return !(a == b); }
__device__ __forceinline__ bool operator!=(c128 a, c128 b) { return !(a == b); }

// acc - a * b, fused where the type allows (the inner step of every update).
__device__ __forceinline__ float fms(float acc, float a, float b) { return fmaf(-a, b, acc); }
__device__ __forceinline__ double fms(double acc, double a, double b) { return fma(-a, b, acc); }
__device__ __forceinline__ c64 fms(c64 acc, c64 a, c64 b) {
    float re = fmaf(-a.re, b.re, acc.re);
    float im = fmaf(-a.re, b.im, acc.im);
    return {fmaf(a.im, b.im, re), fmaf(-a.im, b.re, im)};
}
__device__ __forceinline__ c128 fms(c128 acc, c128 a, c128 b) {
    double re = fma(-a.re, b.re, acc.re);
    double im = fma(-a.re, b.im, acc.im);
    return {fma(a.im, b.im, re), fma(-a.im, b.re, im)};
}
// acc + a * b
__device__ __forceinline__ float fma_(float acc, float a, float b) { return fmaf(a, b, acc); }
__device__ __forceinline__ double fma_(double acc, double a, double b) { return fma(a, b, acc); }
__device__ __forceinline__ c64 fma_(c64 acc, c64 a, c64 b) { return fms(acc, -a, b); }
__device__ __forceinline__ c128 fma_(c128 acc, c128 a, c128 b) { return fms(acc, -a, b); }

__device__ __forceinline__ float conj_(float a) { return a; }
__device__ __forceinline__ double conj_(double a) { return a; }
__device__ __forceinline__ c64 conj_(c64 a) { return {a.re, -a.im}; }
__device__ __forceinline__ c128 conj_(c128 a) { return {a.re, -a.im}; }

__device__ __forceinline__ float real_part(float a) { return a; }
__device__ __forceinline__ double real_part(double a) { return a; }
__device__ __forceinline__ float real_part(c64 a) { return a.re; }
__device__ __forceinline__ double real_part(c128 a) { return a.re; }

// Complex division by Smith's algorithm. Its denominator b.re + b.im * r (|r| <= 1) overflows where a
// part of b is above half the largest float, and the quotient then comes out 0: such a b (a part above a
// quarter of it, a margin for rounding) is divided as b / 8 and the quotient scaled by 1 / 8 (powers of two,
// exact). The test is one compare on a branch the warp takes together almost always.
template <typename R> __device__ __forceinline__ R huge_part();
template <> __device__ __forceinline__ float huge_part<float>() { return 0x1p126f; }
template <> __device__ __forceinline__ double huge_part<double>() { return 0x1p1022; }
template <typename C, typename R>
__device__ __forceinline__ C smith_div_(C a, C b) {
    if (fabs(b.re) >= fabs(b.im)) {
        R r = b.im / b.re, d = b.re + b.im * r;
        return {(a.re + a.im * r) / d, (a.im - a.re * r) / d};
    }
    R r = b.re / b.im, d = b.im + b.re * r;
    return {(a.re * r + a.im) / d, (a.im * r - a.re) / d};
}
template <typename C, typename R>
__device__ __forceinline__ C cdiv_(C a, C b) {
    if (fmax(fabs(b.re), fabs(b.im)) > huge_part<R>()) {
        const R s = R(0.125);
        const C q = smith_div_<C, R>(a, C{b.re * s, b.im * s});
        return {q.re * s, q.im * s};
    }
    return smith_div_<C, R>(a, b);
}
__device__ __forceinline__ float div_(float a, float b) { return a / b; }
__device__ __forceinline__ double div_(double a, double b) { return a / b; }
__device__ __forceinline__ c64 div_(c64 a, c64 b) { return cdiv_<c64, float>(a, b); }
__device__ __forceinline__ c128 div_(c128 a, c128 b) { return cdiv_<c128, double>(a, b); }
__device__ __forceinline__ c64 operator/(c64 a, c64 b) { return div_(a, b); }
__device__ __forceinline__ c128 operator/(c128 a, c128 b) { return div_(a, b); }

// LAPACK's |x| for pivoting: |x| for real, cabs1 = |re| + |im| for complex (i?amax).
__device__ __forceinline__ float cabs1(float a) { return fabsf(a); }
__device__ __forceinline__ double cabs1(double a) { return fabs(a); }
__device__ __forceinline__ float cabs1(c64 a) { return fabsf(a.re) + fabsf(a.im); }
__device__ __forceinline__ double cabs1(c128 a) { return fabs(a.re) + fabs(a.im); }

// Modulus (LAPACK's abs() on complex, used for the sfmin test).
__device__ __forceinline__ float abs_(float a) { return fabsf(a); }
__device__ __forceinline__ double abs_(double a) { return fabs(a); }
__device__ __forceinline__ float abs_(c64 a) { return hypotf(a.re, a.im); }
__device__ __forceinline__ double abs_(c128 a) { return hypot(a.re, a.im); }

__device__ __forceinline__ bool is_finite(float a) { return isfinite(a); }
__device__ __forceinline__ bool is_finite(double a) { return isfinite(a); }
__device__ __forceinline__ bool is_finite(c64 a) { return isfinite(a.re) && isfinite(a.im); }
__device__ __forceinline__ bool is_finite(c128 a) { return isfinite(a.re) && isfinite(a.im); }

// Row stride of a row of CC elements per thread kept in shared memory by TJ threads (the candidate row
// `rowv` of rows.cuh, the pivot row of inv_gje): CC elements rounded up to whole 16-byte words, made an
// odd number of words (the TJ threads' vector loads then fall in distinct banks).
template <typename T, int CC> __host__ __device__ constexpr int rows_stride() {
    constexpr int v = sizeof(T) >= 16 ? 1 : 16 / int(sizeof(T));
    constexpr int words = (CC + v - 1) / v;
    return (words % 2 ? words : words + 1) * v;
}

// 1 / x: one division for real x; Smith's algorithm for complex x, two real divisions where
// div_(one, x) takes three; rounding within a few ulps of div_'s.
__device__ __forceinline__ float recip_(float x) { return 1.0f / x; }
__device__ __forceinline__ double recip_(double x) { return 1.0 / x; }
template <typename C> __device__ __forceinline__ C smith_recip_(C b) {
    if (fabs(b.re) >= fabs(b.im)) {
        const auto r = b.im / b.re;
        const auto t = 1 / (b.re + b.im * r);
        return {t, -r * t};
    }
    const auto r = b.re / b.im;
    const auto t = 1 / (b.im + b.re * r);
    return {r * t, -t};
}
// A part of b above a quarter of the largest float: 1 / b = (1 / (b / 8)) / 8, as cdiv_.
template <typename C> __device__ __forceinline__ C crecip_(C b) {
    using R = decltype(b.re);
    if (fmax(fabs(b.re), fabs(b.im)) > huge_part<R>()) {
        const R s = R(0.125);
        const C q = smith_recip_(C{b.re * s, b.im * s});
        return {q.re * s, q.im * s};
    }
    return smith_recip_(b);
}
__device__ __forceinline__ c64 recip_(c64 x) { return crecip_(x); }
__device__ __forceinline__ c128 recip_(c128 x) { return crecip_(x); }

// x * s for a real s (both parts of a complex x): exact for a power of two s away from overflow.
__device__ __forceinline__ float scale_real(float x, float s) { return x * s; }
__device__ __forceinline__ double scale_real(double x, double s) { return x * s; }
__device__ __forceinline__ c64 scale_real(c64 x, float s) { return {x.re * s, x.im * s}; }
__device__ __forceinline__ c128 scale_real(c128 x, double s) { return {x.re * s, x.im * s}; }

// The power of two that brings a nonzero pivot below sfmin (subnormal included) into the normal range
// with its reciprocal finite: 2^64 for float (|p 2^64| in [2^-85, 2^-62]), 2^128 for double.
template <typename R> __device__ __forceinline__ R tiny_pivot_scale();
template <> __device__ __forceinline__ float tiny_pivot_scale<float>() { return 0x1p64f; }
template <> __device__ __forceinline__ double tiny_pivot_scale<double>() { return 0x1p128; }

__device__ __forceinline__ bool is_zero(float a) { return a == 0.0f; }
__device__ __forceinline__ bool is_zero(double a) { return a == 0.0; }
__device__ __forceinline__ bool is_zero(c64 a) { return a.re == 0.0f && a.im == 0.0f; }
__device__ __forceinline__ bool is_zero(c128 a) { return a.re == 0.0 && a.im == 0.0; }

// x * (1 / p) where |p| >= sfmin, else x / p: LAPACK's ?getrf2 scaling of the pivot column.
template <typename T> struct pivot_scale {
    T p, rp;
    bool use_recip;
    __device__ __forceinline__ explicit pivot_scale(T pivot)
        : p(pivot), rp(div_(one<T>(), pivot)), use_recip(abs_(pivot) >= traits<T>::sfmin()) {}
    __device__ __forceinline__ T operator()(T x) const { return use_recip ? x * rp : div_(x, p); }
};

// ---- warp shuffles ---------------------------------------------------------------------------------
__device__ __forceinline__ float shfl(float v, int src, int width = 32) {
    return __shfl_sync(0xffffffffu, v, src, width);
}
__device__ __forceinline__ double shfl(double v, int src, int width = 32) {
    return __shfl_sync(0xffffffffu, v, src, width);
}
__device__ __forceinline__ c64 shfl(c64 v, int src, int width = 32) {
    return {shfl(v.re, src, width), shfl(v.im, src, width)};
}
__device__ __forceinline__ c128 shfl(c128 v, int src, int width = 32) {
    return {shfl(v.re, src, width), shfl(v.im, src, width)};
}

// ---- warp arg-max of the pivot search (getrf_rows, getrf_blocked) -------------------------------
// redux.sync (sm_80+) over the key's bits instead of a shuffle tree: one reduction for the common
// case of a unique largest high word.
constexpr unsigned kFullWarp = 0xffffffffu;
constexpr int kNoPos = 0x7fffffff;

__device__ __forceinline__ int redux_max(int v) {
    int r;
    asm volatile("redux.sync.max.s32 %0, %1, 0xffffffff;" : "=r"(r) : "r"(v));
    return r;
}
__device__ __forceinline__ unsigned redux_max(unsigned v) {
    unsigned r;
    asm volatile("redux.sync.max.u32 %0, %1, 0xffffffff;" : "=r"(r) : "r"(v));
    return r;
}
__device__ __forceinline__ int redux_min(int v) {
    int r;
    asm volatile("redux.sync.min.s32 %0, %1, 0xffffffff;" : "=r"(r) : "r"(v));
    return r;
}

// Pivot-search key: the bits of cabs1(v) (nonnegative reals order like their bits), NaN clamped to
// +inf (a NaN ties with +inf: the smaller position wins), as a high word and, for double, a low word.
struct RowsKey {
    int hi;       // -1: no candidate
    unsigned lo;  // 0 for float
};

__device__ __forceinline__ RowsKey rows_key_bits(float a) {
    const unsigned b = __float_as_uint(a) & 0x7fffffffu;
    return {int(min(b, 0x7f800000u)), 0u};
}
__device__ __forceinline__ RowsKey rows_key_bits(double a) {
    const long long b = __double_as_longlong(a);
    const int hi = int((unsigned long long)b >> 32) & 0x7fffffff;
    return hi >= 0x7ff00000 ? RowsKey{0x7ff00000, 0u} : RowsKey{hi, unsigned(b)};
}
// (real types: the bits of v itself, whose sign bit rows_key_bits clears)
__device__ __forceinline__ RowsKey rows_key(float v) { return rows_key_bits(v); }
__device__ __forceinline__ RowsKey rows_key(double v) { return rows_key_bits(v); }
__device__ __forceinline__ RowsKey rows_key(c64 v) { return rows_key_bits(cabs1(v)); }
__device__ __forceinline__ RowsKey rows_key(c128 v) { return rows_key_bits(cabs1(v)); }

__device__ __forceinline__ bool rows_better(RowsKey a, int pa, RowsKey b, int pb) {  // no branches
    return (a.hi > b.hi) | ((a.hi == b.hi) & ((a.lo > b.lo) | ((a.lo == b.lo) & (pa < pb))));
}

// The lane holding the warp's best candidate: largest key, ties to the smallest position (distinct
// among candidates). Every lane gets the answer. Lanes with key.hi < 0 hold no candidate; when no lane
// holds one the answer is a lane with key.hi = -1. The low word and the positions are only reduced
// when several lanes share the top word (warp-uniform branches).
template <bool WIDE> __device__ __forceinline__ int rows_argmax(RowsKey key, int pos) {
    const int mh = redux_max(key.hi);
    bool tie = key.hi == mh;
    unsigned eq = __ballot_sync(kFullWarp, tie);
    if (mh >= 0 && (eq & (eq - 1))) {
        if (WIDE) {
            const unsigned ml = redux_max(tie ? key.lo : 0u);
            tie = tie && key.lo == ml;
            eq = __ballot_sync(kFullWarp, tie);
        }
        if (eq & (eq - 1)) {
            const int mp = redux_min(tie ? pos : kNoPos);
            eq = __ballot_sync(kFullWarp, tie && pos == mp);
        }
    }
    return __ffs(eq) - 1;
}

// ---- FP64 tensor cores (sm_80+) ------------------------------------------------------------------
// c += A B for one m8n8k4 tile (mma.sync, warp-wide): lane = 4 g + t holds A[g][t] (a), B[t][g] (b) and
// C[g][2 t], C[g][2 t + 1] (c), the PTX fragment layouts.
__device__ __forceinline__ void dmma(double (&c)[2], double a, double b) {
    asm("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0, %1}, {%2}, {%3}, {%0, %1};\n"
        : "+d"(c[0]), "+d"(c[1])
        : "d"(a), "d"(b));
}

// ---- asynchronous copies global -> shared (sm_80+) -----------------------------------------------
// cp_async(dst, src) issues the copy of one element and does not wait for it; cp_async_wait() waits
// for all of this thread's copies (which are then visible to it; a barrier publishes them to the
// block). A loop of copies so keeps every load in flight instead of one per thread at a time.
template <typename T> __device__ __forceinline__ void cp_async(T* dst, const T* src) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    if constexpr (sizeof(T) == 16) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(src));
    } else {
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(s), "l"(src), "n"(sizeof(T)));
    }
}
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// 16 bytes of T, loaded or stored as one vector (raw) and read as elements (v).
template <typename T> struct Vec16 {
    static constexpr int N = 16 / sizeof(T);
    union {
        uint4 raw;
        T v[N];
    };
};

// 16 bytes (16-byte aligned at both ends) in one copy, through L1; a group of copies is closed by
// cp_async_commit, and cp_async_wait_group<N> waits until at most N of this thread's groups are in flight.
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait_group() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ---- one thread per matrix (getrf_tiny, inv_tiny) ----------------------------------------------------
// A block of MPB threads holds MPB consecutive N x N matrices of the batch in shared memory, matrix m at
// m * tiny_ld<N>(): an odd stride, so that the threads' own matrices fall in distinct banks.
template <int N> __host__ __device__ constexpr int tiny_ld() { return (N * N) | 1; }

// The block's `count` matrices from `src` (contiguous) into `stage`, coalesced; and back.
template <typename T, int N, int MPB>
__device__ __forceinline__ void tiny_stage_in(T* stage, const T* src, int count, int tid) {
    constexpr int NN = N * N;
    for (int idx = tid; idx < count * NN; idx += MPB) stage[(idx / NN) * tiny_ld<N>() + idx % NN] = src[idx];
}
template <typename T, int N, int MPB>
__device__ __forceinline__ void tiny_stage_out(T* dst, const T* stage, int count, int tid) {
    constexpr int NN = N * N;
    for (int idx = tid; idx < count * NN; idx += MPB) dst[idx] = stage[(idx / NN) * tiny_ld<N>() + idx % NN];
}

// A thread's matrix from its place `s` in the stage into registers; whether it holds a NaN or Inf.
template <typename T, int N>
__device__ __forceinline__ bool tiny_load(T (&x)[N][N], const T* s) {
    bool bad = false;
#pragma unroll
    for (int i = 0; i < N; ++i) {
#pragma unroll
        for (int j = 0; j < N; ++j) {
            x[i][j] = s[i * N + j];
            bad |= !is_finite(x[i][j]);
        }
    }
    return bad;
}

// Rows k and p (p >= k, known at run time) of a register matrix interchanged by selects: an index
// known only at run time would put the matrix in local memory.
template <typename T, int N>
__device__ __forceinline__ void tiny_swap_rows(T (&x)[N][N], int k, int p) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
        if (i > k) {
            const bool swap = i == p;
#pragma unroll
            for (int j = 0; j < N; ++j) {
                const T u = x[k][j], v = x[i][j];
                x[k][j] = swap ? v : u;
                x[i][j] = swap ? u : v;
            }
        }
    }
}


}  // namespace blu

#endif  // BATCHLU_COMMON_CUH
