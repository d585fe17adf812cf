// Every inline-PTX wrapper the kernels use that sm_80 and newer have: asynchronous copies,
// ldmatrix, mma.sync, cached global accesses, named barriers, ex2. One wrapper per instruction
// form; each cites the section of the PTX ISA it implements (section titles rather than numbers,
// which move between ISA versions): https://docs.nvidia.com/cuda/parallel-thread-execution/
// sm_90-only instructions are in sm90.cuh.
#pragma once

#include <cstdint>

namespace swa_decode::ptx {

// The 32-bit .shared address of a generic pointer into this CTA's shared memory (the one
// conversion every shared-memory operand below takes). "Data Movement and Conversion
// Instructions: cvta".
__device__ __forceinline__ uint32_t smem_addr(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

// threadIdx.x, read anew where it is called: the compiler may not hoist a volatile asm out of a
// loop, so the addresses a loop body derives from it are recomputed per iteration instead of held
// in registers across the whole loop (the sm90 layer kernel's producer, which runs on 72).
// "Special Registers: %tid".
__device__ __forceinline__ int thread_index_x_unhoisted() {
  uint32_t tid;
  asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(tid));
  return static_cast<int>(tid);
}

// 16-byte global -> shared copy that bypasses L1 (each cache row is read once per CTA).
// src_bytes == 0 writes 16 zero bytes and reads nothing: masked rows can never inject NaN.
// "Data Movement and Conversion Instructions: cp.async".
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
// kBytes global -> shared, allocating in L1 (.cg, which bypasses it, takes only 16 bytes): the
// copy for rows aligned to 4 or 8 bytes only. src_bytes == 0 zero-fills as above.
// "Data Movement and Conversion Instructions: cp.async".
template <int kBytes>
__device__ __forceinline__ void cp_async_ca(uint32_t dst, const void* src, uint32_t src_bytes) {
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "cp.async copies 4, 8 or 16 bytes");
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src), "n"(kBytes), "r"(src_bytes));
}
// Arrives on the mbarrier once every cp.async this thread issued before it has landed (.noinc: the
// barrier's arrival count includes this arrive). "Data Movement and Conversion Instructions:
// cp.async.mbarrier.arrive".
__device__ __forceinline__ void cp_async_mbarrier_arrive(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// "Data Movement and Conversion Instructions: cp.async.commit_group".
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most kPending committed groups are still in flight.
// "Data Movement and Conversion Instructions: cp.async.wait_group / cp.async.wait_all".
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Four 8x8 b16 matrices, one row address per lane. "Warp-level Matrix Instructions: ldmatrix".
__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                            uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}
// Two 8x8 b16 matrices (lanes 0-15 give the row addresses). "Warp-level Matrix Instructions: ldmatrix".
__device__ __forceinline__ void ldmatrix_x2(uint32_t addr, uint32_t& r0, uint32_t& r1) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r0), "=r"(r1) : "r"(addr));
}
// The same, each matrix transposed. "Warp-level Matrix Instructions: ldmatrix".
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                                  uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// D (16x8 fp32) += A (16x16, row) * B (16x8, col), A and B f16 (kBf16 == false) or bf16: one
// wrapper for the two forms, so that a kernel templated on its tile type names one.
// "Warp-level Matrix Instructions: mma".
template <bool kBf16>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (kBf16) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// 16-byte load through the read-only (non-coherent) path: only for data no thread of the grid
// writes. "Data Movement and Conversion Instructions: ld.global.nc".
__device__ __forceinline__ uint4 ld_global_nc_v4(const void* ptr) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(ptr));
  return v;
}
// 8-byte load through the read-only path, as ld_global_nc_v4. "Data Movement and Conversion
// Instructions: ld.global.nc".
__device__ __forceinline__ uint2 ld_global_nc_v2(const void* ptr) {
  uint2 v;
  asm volatile("ld.global.nc.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(ptr));
  return v;
}
// 16-byte store. "Data Movement and Conversion Instructions: st".
__device__ __forceinline__ void st_global_v4(void* ptr, uint4 v) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"l"(ptr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

// Pulls the 128-byte line holding `address` into L2.
// "Data Movement and Conversion Instructions: prefetch, prefetchu".
__device__ __forceinline__ void prefetch_l2(const void* address) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(address));
}
// Pulls the line holding `address` into this SM's L1. "Data Movement and Conversion
// Instructions: prefetch, prefetchu".
__device__ __forceinline__ void prefetch_l1(const void* address) {
  asm volatile("prefetch.global.L1 [%0];\n" ::"l"(address));
}

// Barrier among kThreads threads (a multiple of 32) under hardware barrier `id` (1..15; 0 is
// __syncthreads). "Parallel Synchronization and Communication Instructions: bar, barrier".
template <int kThreads>
__device__ __forceinline__ void named_barrier_sync(uint32_t id) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(kThreads) : "memory");
}

// A 32-bit store to shared memory at `address` + kOffset (a shared-window address).
template <int kOffset = 0>
__device__ __forceinline__ void st_shared_u32(uint32_t address, uint32_t value) {
  asm volatile("st.shared.b32 [%0+%1], %2;\n" ::"r"(address), "n"(kOffset), "r"(value) : "memory");
}

// 2^x in one MUFU.EX2, no range fix-up; results below 2^-126 flush to 0. Not volatile: a pure
// function the compiler may move or merge. "Floating Point Instructions: ex2".
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace swa_decode::ptx
