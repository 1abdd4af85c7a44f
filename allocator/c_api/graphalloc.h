/* graphalloc's plain C ABI, exported by libgraphalloc.so.
 *
 * PyTorch loads the first two functions as its CUDA allocator, with no LD_PRELOAD:
 *   torch.cuda.memory.CUDAPluggableAllocator("libgraphalloc.so", "graphalloc_torch_malloc",
 *                                            "graphalloc_torch_free")
 * The others return a graphalloc_status code; graphalloc_last_error() holds the calling thread's last
 * message. No C++ type crosses this interface, and no argument can crash the process: bad input gets an
 * error code and leaves every other allocation intact. Each device's allocator is created on first use
 * (GRAPHALLOC_DEVICE selects the real or simulated device, GRAPHALLOC_SIM_MEMORY_MB the simulated device's
 * memory in MiB, GRAPHALLOC_CONF the configuration). */
#ifndef GRAPHALLOC_ALLOCATOR_C_API_GRAPHALLOC_H_
#define GRAPHALLOC_ALLOCATOR_C_API_GRAPHALLOC_H_

#include <stddef.h>
#include <stdint.h>

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
/* Returns every unused cached segment of `device` to the driver, and frees the pinned host buffers that
 * wakes kept for the next backed-up sleep. */
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
/* ---- Private pools (allocator/core/private_pool.h): memory kept apart from the default cache, for CUDA
 * graphs.
 *
 * A pool is named by its id on its device. The C ABI holds references ("users") on behalf of its callers:
 * graphalloc_pool_create returns the pool with one, graphalloc_pool_retain adds one and
 * graphalloc_pool_release drops one; a pool with no user, no graph pin and no live allocation returns its
 * memory to the device and is gone. While a route is open, the allocations it matches go to its pool; routes
 * nest and the innermost (latest opened) match wins. Route and pin handles are unique in the process. */

typedef struct graphalloc_pool_options {
  /* A default-pool allocation that would otherwise fail may take this pool's cached free blocks. */
  int use_on_oom;
  /* Blocks are never split: each allocation gets a segment of its own (memory registered whole elsewhere). */
  int no_split;
  /* No block of the pool's expandable segments spans two physical handles (NCCL/RDMA registration). */
  int handle_aligned;
} graphalloc_pool_options;

typedef struct graphalloc_pool_stats {
  size_t reserved_bytes; /* device memory of the pool's segments */
  size_t peak_reserved_bytes;
  size_t allocated_bytes; /* bytes of its live allocations */
  size_t peak_allocated_bytes;
  size_t segments;
  size_t live_blocks; /* live allocations, including frees deferred until a capture ends */
  int use_count;      /* users, every caller's (C++ handles and open routes too), not only this ABI's */
  int graph_pins;
} graphalloc_pool_stats;

/* Decides whether an allocation on `stream` goes to the route's pool (nonzero: yes). Called with no
 * allocator lock held, from whichever thread allocates, maybe from several at once, never after
 * graphalloc_end_route of its route has returned. It must not call graphalloc_end_route itself. */
typedef int (*graphalloc_route_predicate)(void* context, graphalloc_stream stream);

/* A new pool on `device` (options NULL: defaults); *pool receives its id, with one reference held. */
int graphalloc_pool_create(int device, const graphalloc_pool_options* options, uint64_t* pool);
/* One more reference to the live pool `pool` (INVALID_ARGUMENT once it is gone). */
int graphalloc_pool_retain(int device, uint64_t pool);
/* Drops one reference taken by graphalloc_pool_create or graphalloc_pool_retain. */
int graphalloc_pool_release(int device, uint64_t pool);
/* Route to `pool` every allocation on `stream`, until graphalloc_end_route(*route). */
int graphalloc_begin_allocate_to_pool_for_stream(int device, uint64_t pool, graphalloc_stream stream,
                                                 uint64_t* route);
/* Route to `pool` every allocation on a stream of the capture that `capturing_stream` is in now (joined
 * streams too), until graphalloc_end_route. FAILED_PRECONDITION if the stream is not capturing. While it is
 * open the allocator is in capture mode (no event queries, cross-stream frees deferred, nothing freed to the
 * device). */
int graphalloc_begin_allocate_to_pool_for_capture(int device, uint64_t pool,
                                                  graphalloc_stream capturing_stream, uint64_t* route);
/* Route to `pool` every allocation made by the calling thread, until graphalloc_end_route. */
int graphalloc_begin_allocate_to_pool_for_thread(int device, uint64_t pool, uint64_t* route);
/* Route to `pool` the allocations on the streams for which predicate(context, stream) is nonzero, until
 * graphalloc_end_route. capture_mode != 0 puts the allocator in capture mode while the route is open, for a
 * route opened just before its capture begins (as PyTorch's CUDA graphs do). `context` must stay valid
 * until graphalloc_end_route returns. */
int graphalloc_begin_allocate_to_pool_if(int device, uint64_t pool, graphalloc_route_predicate predicate,
                                         void* context, int capture_mode, uint64_t* route);
/* Ends a route. When it was the last capture route, frees deferred during captures happen now; an error of
 * theirs is returned, and the route has ended regardless. */
int graphalloc_end_route(uint64_t route);
/* The statistics of one pool. */
int graphalloc_pool_get_stats(int device, uint64_t pool, graphalloc_pool_stats* stats);
/* Returns the pool's cached free memory to the device (nothing while a graph pins it). FAILED_PRECONDITION
 * during a capture. */
int graphalloc_pool_empty_cache(int device, uint64_t pool);
/* A graph that replays into `pool` exists: every byte of the pool stays reserved until
 * graphalloc_pool_unpin(*pin), even when the pool has no user left. */
int graphalloc_pool_pin_for_graph(int device, uint64_t pool, uint64_t* pin);
int graphalloc_pool_unpin(uint64_t pin);

/* ---- Sleep and wake (allocator/core/pool_sleep.h): a sleeping pool's device memory goes back to the device
 * while every allocation keeps its address; a wake maps fresh memory at the same addresses, so pointers
 * held and CUDA graphs captured before the sleep stay valid after it. backup != 0 copies the live
 * allocations to pinned host memory first and back at the wake; backup == 0 discards them. While a pool
 * sleeps, allocations routed to it fail with FAILED_PRECONDITION and frees into it are allowed. Both wait
 * for the device first and fail with FAILED_PRECONDITION during a capture; a failure leaves each pool as
 * it was, asleep or awake. Only expandable segments keep their addresses: a pool with other segments
 * cannot sleep (FAILED_PRECONDITION naming them). ---- */

/* A new pool, as graphalloc_pool_create, with `tag` (NULL or "": none) naming it for graphalloc_sleep and
 * graphalloc_wake; several pools may share a tag. */
int graphalloc_pool_create_with_tag(int device, const graphalloc_pool_options* options, const char* tag,
                                    uint64_t* pool);
/* Sleeps the pools created with `tag` (INVALID_ARGUMENT when none has it), or with tag NULL the whole
 * allocator of `device` (its default pool and every private pool). Pools asleep already stay so. */
int graphalloc_sleep(int device, const char* tag, int backup);
/* Wakes the sleeping pools with `tag`, or with tag NULL every sleeping pool of `device`. */
int graphalloc_wake(int device, const char* tag);
/* Sleeps or wakes one pool; pool 0 is the default pool. */
int graphalloc_pool_sleep(int device, uint64_t pool, int backup);
int graphalloc_pool_wake(int device, uint64_t pool);
/* Whether `pool` (0: the default pool) sleeps, the bytes of its address space whose memory is asleep and
 * the pinned host bytes held for its backup (asleep: the backup; awake: the buffer a wake kept for the
 * next backed-up sleep, which graphalloc_empty_cache frees). Any output may be NULL. */
int graphalloc_pool_sleep_state(int device, uint64_t pool, int* asleep, size_t* sleeping_bytes,
                                size_t* backup_bytes);

/* ---- Mapping observers and pins (allocator/core/mapping_observer.h): how a communication library (NCCL,
 * RDMA) learns when the allocator maps and unmaps device memory, so that it registers each mapping once.
 * on_map is called once per mapping after it is mapped and accessible, before any allocation in it is handed
 * out; on_unmap once, before it is unmapped (and on_map again if the driver then refuses). Callbacks run with
 * no allocator lock held, from whichever thread maps or unmaps; they must not call graphalloc functions that
 * allocate, free or release memory. A mapping is an expandable segment's chunk (expandable != 0, handle its
 * CUmemGenericAllocationHandle) or a regular segment (expandable 0, handle 0). ---- */

typedef struct graphalloc_mapping_event {
  int device;
  uint64_t pool; /* 0: the default pool */
  void* ptr;
  size_t size;
  uint64_t handle;
  int expandable;
} graphalloc_mapping_event;

typedef void (*graphalloc_mapping_callback)(void* user_data, const graphalloc_mapping_event* event);

/* Calls on_map and on_unmap (either may be NULL) with user_data for every mapping of `device`'s allocator
 * from now on; replay_existing != 0 first calls on_map for every mapping that exists now. *observer
 * receives a handle, unique in the process, for graphalloc_remove_mapping_observer. */
int graphalloc_add_mapping_observer(int device, graphalloc_mapping_callback on_map,
                                    graphalloc_mapping_callback on_unmap, void* user_data,
                                    int replay_existing, uint64_t* observer);
/* No more calls once this returns (user_data may go then). */
int graphalloc_remove_mapping_observer(uint64_t observer);
/* Keeps the mappings holding any byte of [ptr, ptr + size) mapped until graphalloc_unpin_mapping of the same
 * range (counted): no empty_cache, out-of-memory release or growth unmaps them, and their pool cannot sleep.
 * The range must lie inside one segment of `device`'s allocator. */
int graphalloc_pin_mapping(int device, void* ptr, size_t size);
int graphalloc_unpin_mapping(int device, void* ptr, size_t size);
/* A new communication pool, as graphalloc_pool_create: every mapping of it stays mapped (registered once)
 * until the pool itself goes; it cannot sleep. */
int graphalloc_pool_create_for_communication(int device, const graphalloc_pool_options* options,
                                             uint64_t* pool);
/* The mapped bytes of `pool` that must stay mapped (pinned, or all of a communication pool's). */
int graphalloc_pool_pinned_bytes(int device, uint64_t pool, size_t* pinned_bytes);

/* ---- NCCL registration (allocator/registration/nccl_registration.h): every mapping of `pool` of
 * `device`'s allocator (pool UINT64_MAX: of every pool), present and future, registered with the NCCL
 * communicator `comm` (an ncclComm_t) by ncclCommRegister, and deregistered before it is unmapped. libnccl is
 * loaded at run time (GRAPHALLOC_NCCL_LIBRARY, else libnccl.so.2). Use it on a communication pool with
 * handle-aligned placement, so that each buffer lies inside one registration and stays registered. ---- */
#define GRAPHALLOC_ALL_POOLS UINT64_MAX
int graphalloc_nccl_register(int device, uint64_t pool, void* comm, uint64_t* registration);
/* Mappings registered now, and NCCL errors so far (the first one's message through graphalloc_last_error
 * when *errors != 0 and the call returns it). Either output may be NULL. */
int graphalloc_nccl_registration_stats(uint64_t registration, size_t* registered, size_t* errors);
/* Stops registering and deregisters everything it registered; call it before ncclCommDestroy. */
int graphalloc_nccl_unregister(uint64_t registration);

/* ---- Sharing blocks with other processes (docs/sharing.md). An exported block's memory reaches the
 * importing process as file descriptors over a Unix socket: expandable segments need exportable handles
 * (GRAPHALLOC_CONF=shareable_handles:True, else FAILED_PRECONDITION), regular segments go through CUDA IPC.
 * The block stays allocated, its memory unused by anything else, until its export is revoked and every
 * importer closed it (or died), even if its owner frees it meanwhile. ---- */

/* Writes the block's token (a NUL-terminated string of at most 256 bytes with the NUL) to `token`; ptr is
 * an address graphalloc_malloc returned on `device`. Exporting a block again gives the same token.
 * BUFFER_TOO_SMALL when token_size is too small (the export stands). */
int graphalloc_export_block(void* ptr, int device, char* token, size_t token_size);
/* Ends the export of the block at ptr: no new importer gets it; importers that have it keep it. */
int graphalloc_export_revoke(void* ptr, int device);
/* An opaque imported block. */
typedef struct graphalloc_import graphalloc_import_t;
/* Maps the block `token` names for `device` in this process: *ptr its first byte, *out the handle to
 * close. UNAVAILABLE when the exporter is gone, INVALID_ARGUMENT for a bad token, else the exporter's or the
 * driver's reason. */
int graphalloc_import_block(int device, const char* token, void** ptr, graphalloc_import_t** out);
/* Unmaps an imported block and tells its exporter (NULL: nothing). */
int graphalloc_import_close(graphalloc_import_t* import);

/* "graphalloc X.Y.Z": the library's version (the CMake project's), as `graphalloc --version` prints it. */
const char* graphalloc_version(void);

/* The calling thread's last error message ("" if none); valid until the thread's next graphalloc call. */
const char* graphalloc_last_error(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* GRAPHALLOC_ALLOCATOR_C_API_GRAPHALLOC_H_ */
