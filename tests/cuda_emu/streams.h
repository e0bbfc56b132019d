// The emulator's streams and events. Work queued on a stream runs only when something waits for
// it (a synchronize, an event the host or another stream waits for, a copy to pageable host memory,
// cudaFree): the latest moment CUDA allows. So host code that reads a result without waiting for
// it sees the old contents, and a stream that does not wait for another's event runs before that
// event's work, every time rather than on an unlucky day. Streams created without
// cudaStreamNonBlocking, and the legacy default stream (0), wait for each other as on the device.
// All queued work runs under one lock, on whichever thread waits for it, one item at a time.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>

namespace rt_emu {

using Work = std::function<void()>;
// A step of work that is done once it returns true: a kernel that waits for something outside the
// device (a peer's data in a collective), which a GPU keeps running while the host polls.
using Poll = std::function<bool()>;

// Queues `work` on stream s (nullptr: the legacy default stream).
void enqueue(cudaStream_t s, Work work);
// Queues an item that runs `step` until it returns true: a query tries it once (cudaErrorNotReady
// while it is false), a wait tries it until it is true.
void enqueue_polled(cudaStream_t s, Poll step);
// Queues `work` on s and returns once it, and everything before it on s, has run: how a call that
// is synchronous with the host (cudaMemcpy to pageable memory) keeps the stream's order.
void run_in_order(cudaStream_t s, Work work);

cudaError_t stream_create(cudaStream_t* s, unsigned flags);
cudaError_t stream_destroy(cudaStream_t s);
cudaError_t stream_synchronize(cudaStream_t s);
// cudaSuccess when all s's queued work has run; otherwise lets one more item run first (the device
// moves on while the host polls) and answers cudaErrorNotReady if that was not the last.
cudaError_t stream_query(cudaStream_t s);
void device_synchronize();

cudaError_t event_create(cudaEvent_t* e, unsigned flags);
cudaError_t event_destroy(cudaEvent_t e);
cudaError_t event_record(cudaEvent_t e, cudaStream_t s);
cudaError_t event_synchronize(cudaEvent_t e);
cudaError_t event_query(cudaEvent_t e);
cudaError_t stream_wait_event(cudaStream_t s, cudaEvent_t e);
cudaError_t event_elapsed_ms(float* ms, cudaEvent_t start, cudaEvent_t end);

// Items queued on every stream so far, and items that have run (tests of the emulator).
uint64_t items_queued();
uint64_t items_run();
// Times a host thread blocked on queued work (a synchronize, a copy that completes before it
// returns, cudaFree): each would stall it on a device slower than the host.
uint64_t host_waits();

}  // namespace rt_emu
