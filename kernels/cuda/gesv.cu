// Fused batched solve A X = B (xGESV) for matrices whose tile fits one block's registers: rows_run
// (rows.cuh) factors A in registers as getrf_rows does, puts the factors in shared memory and solves
// the two triangular systems from there (rows_trsm), KR right-hand sides a pass; X goes straight to
// its rows. kernels/_gpu/_gesv.py picks the tile (see docs/design.md#gesv-dispatch) and gives the
// dynamic shared memory (the factors); larger n go to getrf + getrs.
#include "common.cuh"
#include "rows.cuh"

namespace blu {

// Fused solve A X = B, b and x (B, n, nrhs), any nrhs; info as getrf_rows (-1 non-finite A, k + 1
// exact zero pivot: X all NaN).
template <typename T, int TI, int TJ, int RR, int CC, int KR, int MINB>
__global__ void __launch_bounds__(TI * TJ, MINB)
gesv_rows(const T* a, const T* b, T* x, int* __restrict__ info_out, int n, int nrhs) {
    const long long mat = blockIdx.x, nn = (long long)n * n, nb = (long long)n * nrhs;
    rows_run<T, TI, TJ, RR, CC, KR>(a + mat * nn, b + mat * nb, n, nrhs, nullptr, nullptr, x + mat * nb,
                                    info_out + mat);
}

}  // namespace blu
