/* graphalloc's plain C ABI, exported by libgraphalloc.so.
 *
 * PyTorch loads the first two functions as its CUDA allocator, with no LD_PRELOAD:
 *   torch.cuda.memory.CUDAPluggableAllocator("libgraphalloc.so", "graphalloc_torch_malloc",
 *                                            "graphalloc_torch_free")
 * The others return a graphalloc_status code; graphalloc_last_error() holds the calling thread's last
 * message. No C++ type crosses this interface, and no argument can crash the process: bad input gets an
 * error code and leaves every other allocation intact. Each device's allocator is created on first use
 * (GRAPHALLOC_DEVICE selects the real or simulated device, GRAPHALLOC_CONF the configuration). */
#ifndef GRAPHALLOC_ALLOCATOR_C_API_GRAPHALLOC_H_
#define GRAPHALLOC_ALLOCATOR_C_API_GRAPHALLOC_H_

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The same type as cudaStream_t and CUstream, declared without CUDA headers. */
struct CUstream_st;
typedef struct CUstream_st* graphalloc_stream;

typedef enum graphalloc_status {
  GRAPHALLOC_OK = 0,
  GRAPHALLOC_INVALID_ARGUMENT = 1, /* unknown pointer, double free, bad device, bad config */
  GRAPHALLOC_OUT_OF_MEMORY = 2,
  GRAPHALLOC_UNAVAILABLE = 3, /* no CUDA driver or device */
  GRAPHALLOC_FAILED_PRECONDITION = 4,
  GRAPHALLOC_BUFFER_TOO_SMALL = 5,
  GRAPHALLOC_INTERNAL = 6
} graphalloc_status;

/* PyTorch CUDAPluggableAllocator entry points. malloc returns NULL on failure (the message is in
 * graphalloc_last_error()); free reports a bad pointer on stderr and in graphalloc_last_error(). */
void* graphalloc_torch_malloc(size_t size, int device, graphalloc_stream stream);
void graphalloc_torch_free(void* ptr, size_t size, int device, graphalloc_stream stream);

/* *ptr receives device memory of at least `size` bytes usable on `stream` (NULL for size 0). */
int graphalloc_malloc(void** ptr, size_t size, int device, graphalloc_stream stream);
/* Returns `ptr` (from graphalloc_malloc on `device`) to the cache. NULL is accepted and ignored. */
int graphalloc_free(void* ptr, int device);
/* `ptr` is used on `stream` too: it is reused only after the work enqueued there has completed. */
int graphalloc_record_stream(void* ptr, int device, graphalloc_stream stream);
/* Returns every unused cached segment of `device` to the driver. */
int graphalloc_empty_cache(int device);
/* Caps the memory `device`'s allocator reserves at `fraction` of the device's total, in [0, 1]. */
int graphalloc_set_memory_fraction(double fraction, int device);
/* Writes the statistics of `device` as a NUL-terminated JSON object (PyTorch's memory_stats keys) into
 * buffer; *required (if not NULL) receives the size needed including the NUL. Returns
 * GRAPHALLOC_BUFFER_TOO_SMALL, writing nothing, when buffer_size is too small. */
int graphalloc_stats_json(int device, char* buffer, size_t buffer_size, size_t* required);
/* Writes a snapshot of `device`'s allocator (segments, blocks, statistics, history; the JSON format of
 * docs/snapshot_format.md) into buffer, with graphalloc_stats_json's buffer convention. */
int graphalloc_snapshot_json(int device, char* buffer, size_t buffer_size, size_t* required);
/* Turns the allocation history of `device` on (enabled != 0, keeping the newest max_entries events, with C++
 * stacks when stacks != 0) or off. */
int graphalloc_record_history(int device, int enabled, size_t max_entries, int stacks);
/* PyTorch's pluggable-allocator record_stream hook (set_record_stream_fn): `ptr`, from any device's
 * allocator, is used on `stream` too. A bad pointer is reported on stderr and in graphalloc_last_error(). */
void graphalloc_torch_record_stream(void* ptr, graphalloc_stream stream);
/* PyTorch's pluggable-allocator reset hook (set_reset_fn, called by torch.cuda.empty_cache()): empties the
 * cache of every device's allocator created so far. Errors go to stderr and graphalloc_last_error(). */
void graphalloc_torch_empty_cache(void);
/* PyTorch's set_memory_fraction_fn hook: graphalloc_set_memory_fraction with errors reported on stderr. */
void graphalloc_torch_set_memory_fraction(double fraction, int device);
/* Resets the peak values, or the accumulated counters, of the statistics of `device`. */
int graphalloc_reset_peak_stats(int device);
int graphalloc_reset_accumulated_stats(int device);
/* The calling thread's last error message ("" if none); valid until the thread's next graphalloc call. */
const char* graphalloc_last_error(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* GRAPHALLOC_ALLOCATOR_C_API_GRAPHALLOC_H_ */
