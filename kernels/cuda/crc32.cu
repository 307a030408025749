// CRC-32 (zlib's) of byte ranges held on the device, for the pipeline's input checksums
// (batchlu.pipeline._crc32 has the algebra; kernels/_gpu/_crc32.py the launches).
//
// Pass 1 (crc32_segments): thread (range r, segment j) computes the register R(0, .) of bytes
// [j*S, (j+1)*S) of range r front-padded with zeros to P*S bytes (P segments, a power of two): leading
// zeros leave R(0, .) unchanged, so every range shares one tree shape.
// Pass 2 (crc32_join), once per tree level: out[r][i] = Z^(S*2^t) in[r][2i]  xor  in[r][2i+1], the
// 32x32 GF(2) matrix given as its 32 columns.

#include "common.cuh"

namespace blu {

__device__ __forceinline__ unsigned int crc32_table_entry(unsigned int i) {
    unsigned int c = i;
#pragma unroll
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1u) ? 0xEDB88320u : 0u);
    return c;
}

// ranges: offsets[r], lengths[r] in bytes from base; out: [ranges][segments] registers.
__global__ void crc32_segments(const unsigned char* __restrict__ base,
                                          const long long* __restrict__ offsets,
                                          const long long* __restrict__ lengths,
                                          unsigned int* __restrict__ out, int segment, long long segments,
                                          int ranges) {
    __shared__ unsigned int table[256];
    for (int i = threadIdx.x; i < 256; i += blockDim.x) table[i] = crc32_table_entry(i);
    __syncthreads();
    long long id = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= segments * ranges) return;
    int r = (int)(id / segments);
    long long j = id - (long long)r * segments;
    long long length = lengths[r];
    long long pad = segments * segment - length;        // zero bytes in front of the range
    long long lo = j * segment - pad, hi = lo + segment;  // this segment, in the range's own bytes
    if (lo < 0) lo = 0;
    unsigned int c = 0;
    const unsigned char* p = base + offsets[r];
    for (long long k = lo; k < hi; ++k) c = table[(c ^ p[k]) & 0xFFu] ^ (c >> 8);
    out[id] = c;
}

__global__ void crc32_join(const unsigned int* __restrict__ in, unsigned int* __restrict__ out,
                                      const unsigned int* __restrict__ matrix, long long half, int ranges) {
    long long id = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= half * ranges) return;
    long long r = id / half, i = id - r * half;
    unsigned int left = in[r * 2 * half + 2 * i], right = in[r * 2 * half + 2 * i + 1];
    unsigned int v = 0;
#pragma unroll
    for (int b = 0; b < 32; ++b) v ^= (left >> b & 1u) ? matrix[b] : 0u;
    out[id] = v ^ right;
}

}  // namespace blu
