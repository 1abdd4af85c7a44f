// A narrow, plain-type wrapper over PyTorch's c10 CUDA caching allocator, for bench/peers_c10.
//
// c10_peer.cc is the only file that includes PyTorch's headers, and it is compiled with the C++ ABI
// PyTorch was built with (-D_GLIBCXX_USE_CXX11_ABI=0/1); nothing of the standard library crosses this
// interface, so the rest of the binary may use the other ABI. c10 reports errors by throwing c10::Error:
// every function here catches and returns a failure value instead; LastError() has the message.
#ifndef GRAPHALLOC_BENCH_C10_PEER_H_
#define GRAPHALLOC_BENCH_C10_PEER_H_

#include <cstddef>

namespace graphalloc::bench::c10peer {

// Initializes the c10 caching allocator for `device_count` devices (PyTorch does this lazily on first
// CUDA use; a standalone program must do it). False on failure.
bool Init(int device_count);
// The allocator backend's name ("native" or "cudaMallocAsync", per PYTORCH_CUDA_ALLOC_CONF).
const char* Name();
// raw_alloc_with_stream on the current device (0); null on failure.
void* Alloc(std::size_t bytes, void* cuda_stream);
// raw_delete; false on failure.
bool Free(void* ptr);
// emptyCache; false on failure.
bool EmptyCache();
// The message of this thread's last failure.
const char* LastError();

}  // namespace graphalloc::bench::c10peer

#endif  // GRAPHALLOC_BENCH_C10_PEER_H_
