// XXH3-64 (xxHash's, seed 0) of byte ranges held on the device, for the pipeline's input checksums
// (batchlu.pipeline._xxh3 has the decomposition, its NumPy model and the last step, merge;
// kernels/_gpu/_xxh3.py the launches). Ranges are longer than 240 bytes (XXH3's long path) and start
// and end on 4-byte boundaries (the launcher checks both).
//
// Pass 1 (xxh3_blocks): thread (range r, block k) sums, for each of the 8 lanes, the terms of the 16
//   stripes of 64 bytes of block k of range r (additions mod 2^64): sums[r][k][lane].
// Pass 2 (xxh3_lanes): thread (range r, lane j) runs lane j through the range's whole blocks
//   (acc += sum; scramble), then adds the terms of the stripes after them and of the last 64 bytes:
//   acc[r][j]. The host merges the 8 lanes with the length.

#include "common.cuh"

namespace blu {

typedef unsigned long long xxh3_u64;

// The secret's words at byte offsets 0, 8, ..., 184 (stripe s, lane j: word s + j; scramble: 16 + j)
__constant__ xxh3_u64 xxh3_key[24] = {
    0xbe4ba423396cfeb8ULL, 0x1cad21f72c81017cULL, 0xdb979083e96dd4deULL, 0x1f67b3b7a4a44072ULL,
    0x78e5c0cc4ee679cbULL, 0x2172ffcc7dd05a82ULL, 0x8e2443f7744608b8ULL, 0x4c263a81e69035e0ULL,
    0xcb00c391bb52283cULL, 0xa32e531b8b65d088ULL, 0x4ef90da297486471ULL, 0xd8acdea946ef1938ULL,
    0x3f349ce33f76faa8ULL, 0x1d4f0bc7c7bbdcf9ULL, 0x3159b4cd4be0518aULL, 0x647378d9c97e9fc8ULL,
    0xc3ebd33483acc5eaULL, 0xeb6313faffa081c5ULL, 0x49daf0b751dd0d17ULL, 0x9e68d429265516d3ULL,
    0xfca1477d58be162bULL, 0xce31d07ad1b8f88fULL, 0x280416958f3acb45ULL, 0x7e404bbbcafbd7afULL};
// ... at byte offsets 121 + 8 j: the key of the range's last stripe
__constant__ xxh3_u64 xxh3_last_key[8] = {
    0xea647378d9c97e9fULL, 0xc5c3ebd33483acc5ULL, 0x17eb6313faffa081ULL, 0xd349daf0b751dd0dULL,
    0x2b9e68d429265516ULL, 0x8ffca1477d58be16ULL, 0x45ce31d07ad1b8f8ULL, 0xaf280416958f3acbULL};
__constant__ xxh3_u64 xxh3_init[8] = {
    0xC2B2AE3DULL, 0x9E3779B185EBCA87ULL, 0xC2B2AE3D27D4EB4FULL, 0x165667B19E3779F9ULL,
    0x85EBCA77C2B2AE63ULL, 0x85EBCA77ULL, 0x27D4EB2F165667C5ULL, 0x9E3779B1ULL};

// Little-endian 64-bit word at p (4-byte aligned)
__device__ __forceinline__ xxh3_u64 xxh3_word(const unsigned char* p) {
    const unsigned int* q = reinterpret_cast<const unsigned int*>(p);
    return (xxh3_u64)q[0] | ((xxh3_u64)q[1] << 32);
}

// Lane j's term of the stripe at p with key word `key`: words j (with the key) and j ^ 1.
__device__ __forceinline__ xxh3_u64 xxh3_term(const unsigned char* p, int j, xxh3_u64 key) {
    xxh3_u64 k = xxh3_word(p + 8 * j) ^ key;
    return (k & 0xFFFFFFFFULL) * (k >> 32) + xxh3_word(p + 8 * (j ^ 1));
}

// sums: [ranges][max_blocks][8]; blocks[r] = (lengths[r] - 1) / 1024 whole blocks of range r.
__global__ void xxh3_blocks(const unsigned char* __restrict__ base, const long long* __restrict__ offsets,
                            const long long* __restrict__ blocks, xxh3_u64* __restrict__ sums,
                            long long max_blocks, int ranges) {
    long long id = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= max_blocks * ranges) return;
    int r = (int)(id / max_blocks);
    long long k = id - (long long)r * max_blocks;
    if (k >= blocks[r]) return;
    const unsigned char* p = base + offsets[r] + k * 1024;
    xxh3_u64 s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int stripe = 0; stripe < 16; ++stripe) {
#pragma unroll
        for (int j = 0; j < 8; ++j) s[j] += xxh3_term(p + 64 * stripe, j, xxh3_key[stripe + j]);
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) sums[id * 8 + j] = s[j];
}

// acc: [ranges][8], the lanes after the last stripe.
__global__ void xxh3_lanes(const unsigned char* __restrict__ base, const long long* __restrict__ offsets,
                           const long long* __restrict__ lengths, const xxh3_u64* __restrict__ sums,
                           xxh3_u64* __restrict__ acc, long long max_blocks, int ranges) {
    long long id = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= 8LL * ranges) return;
    int r = (int)(id / 8), j = (int)(id - 8LL * r);
    long long length = lengths[r];
    long long blocks = (length - 1) / 1024;
    const unsigned char* p = base + offsets[r];
    const xxh3_u64* sum = sums + (long long)r * max_blocks * 8 + j;
    xxh3_u64 a = xxh3_init[j], scramble = xxh3_key[16 + j];
    for (long long k = 0; k < blocks; ++k) {
        a += sum[8 * k];
        a ^= a >> 47;
        a ^= scramble;
        a *= 0x9E3779B1ULL;
    }
    long long stripes = ((length - 1) - 1024 * blocks) / 64;
    for (long long s = 0; s < stripes; ++s) a += xxh3_term(p + 1024 * blocks + 64 * s, j, xxh3_key[s + j]);
    a += xxh3_term(p + length - 64, j, xxh3_last_key[j]);
    acc[id] = a;
}

}  // namespace blu
