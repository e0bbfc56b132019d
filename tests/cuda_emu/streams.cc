// The emulator's streams and events (streams.h): a queue of work per stream, run in order when
// waited for, and events as points on those queues.
#include "tests/cuda_emu/streams.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace rt_emu {
namespace {

using Clock = std::chrono::steady_clock;

struct Item {
  Work work;  // runs once
  Poll poll;  // or runs until it returns true (enqueue_polled)
};

struct Stream {
  bool blocking = true;  // waits for, and is waited for by, the legacy default stream
  std::deque<Item> queue;
  uint64_t queued = 0, done = 0;  // items ever queued; items run
};
using StreamPtr = std::shared_ptr<Stream>;

// A point on a stream, reached once the stream has run `upto` items. Work and events hold the
// stream itself, so that a stream destroyed meanwhile stays valid to them.
struct Point {
  StreamPtr stream;
  uint64_t upto = 0;
  bool reached() const { return !stream || stream->done >= upto; }
};

struct Event {
  bool timing = true;
  Point at;                                  // the latest record; no stream before the first
  std::shared_ptr<Clock::time_point> when;   // written when that record runs
};

// One lock for every stream's state and for running queued work: the device runs one item at a
// time, whichever host thread waits for it.
std::recursive_mutex g_mu;
uint64_t g_queued = 0, g_run = 0, g_waits = 0;

const StreamPtr& legacy() {
  static const StreamPtr s = std::make_shared<Stream>();
  return s;
}
std::vector<StreamPtr>& created() {  // by stream_create, not yet destroyed
  static std::vector<StreamPtr> v;
  return v;
}
// A handle is a heap-allocated StreamPtr; 0 is the legacy default stream.
const StreamPtr& stream_of(cudaStream_t s) {
  return s ? *reinterpret_cast<StreamPtr*>(s) : legacy();
}
Event* event_of(cudaEvent_t e) { return reinterpret_cast<Event*>(e); }

// Takes s's next item off its queue and runs its work (a polled item's has nothing left to do).
void pop_and_run(Stream& s) {
  Work w = std::move(s.queue.front().work);
  s.queue.pop_front();
  ++s.done;  // counted before it runs: an item that throws is not run again
  ++g_run;
  w();
}
void run_to(Stream& s, uint64_t upto) {
  while (s.done < upto) {
    if (const Poll& p = s.queue.front().poll)
      while (!p()) std::this_thread::yield();  // a wait: until the item is done
    pop_and_run(s);
  }
}
void run_to(const Point& p) {
  if (p.stream) run_to(*p.stream, p.upto);
}
void run_all(Stream& s) { run_to(s, s.queued); }
// A query's share of the device's progress: s's next item runs, or a polled one is tried once.
void try_next(Stream& s) {
  if (const Poll& p = s.queue.front().poll; p && !p()) return;  // still waiting
  pop_and_run(s);
}

// A host wait: the caller blocks until p; counted when there was queued work to wait for, which a
// device slower than the host would make it wait for.
void wait_for(const Point& p) {
  if (p.reached()) return;
  ++g_waits;
  run_to(p);
}
void wait_all(const StreamPtr& s) { wait_for({s, s->queued}); }

// What s's next item waits for under the legacy default stream's rules: the default stream waits
// for all work queued so far on blocking streams, and a blocking stream for the default stream's.
std::vector<Point> implicit_waits(const StreamPtr& s) {
  std::vector<Point> waits;
  auto behind = [&](const StreamPtr& o) {
    if (o->done < o->queued) waits.push_back({o, o->queued});
  };
  if (s == legacy()) {
    for (const StreamPtr& o : created())
      if (o->blocking) behind(o);
  } else if (s->blocking) {
    behind(legacy());
  }
  return waits;
}

void push(const StreamPtr& s, Item it) {
  std::vector<Point> waits = implicit_waits(s);
  if (!waits.empty()) {  // the waits first (each try of a polled item: a no-op once reached)
    if (it.poll)
      it.poll = [waits, p = std::move(it.poll)] {
        for (const Point& w : waits) run_to(w);
        return p();
      };
    else
      it.work = [waits = std::move(waits), w = std::move(it.work)] {
        for (const Point& p : waits) run_to(p);
        w();
      };
  }
  s->queue.push_back(std::move(it));
  ++s->queued;
  ++g_queued;
}

}  // namespace

void enqueue(cudaStream_t s, Work work) {
  std::lock_guard lock(g_mu);
  push(stream_of(s), {std::move(work), {}});
}

void enqueue_polled(cudaStream_t s, Poll step) {
  std::lock_guard lock(g_mu);
  push(stream_of(s), {[] {}, std::move(step)});
}

void run_in_order(cudaStream_t s, Work work) {
  std::lock_guard lock(g_mu);
  const StreamPtr& st = stream_of(s);
  push(st, {std::move(work), {}});
  wait_all(st);
}

cudaError_t stream_create(cudaStream_t* s, unsigned flags) {
  if (!s) return cudaErrorInvalidValue;
  auto* handle = new StreamPtr(std::make_shared<Stream>());
  (*handle)->blocking = (flags & cudaStreamNonBlocking) == 0;
  std::lock_guard lock(g_mu);
  created().push_back(*handle);
  *s = reinterpret_cast<cudaStream_t>(handle);
  return cudaSuccess;
}

// CUDA returns at once and releases the stream when its work is done; running it all now is the
// same to the caller.
cudaError_t stream_destroy(cudaStream_t s) {
  if (!s) return cudaErrorInvalidResourceHandle;
  auto* handle = reinterpret_cast<StreamPtr*>(s);
  std::lock_guard lock(g_mu);
  run_all(**handle);
  auto& v = created();
  v.erase(std::remove(v.begin(), v.end(), *handle), v.end());
  delete handle;
  return cudaSuccess;
}

cudaError_t stream_synchronize(cudaStream_t s) {
  std::lock_guard lock(g_mu);
  wait_all(stream_of(s));
  return cudaSuccess;
}

cudaError_t stream_query(cudaStream_t s) {
  std::lock_guard lock(g_mu);
  Stream& st = *stream_of(s);
  if (st.done < st.queued) try_next(st);
  return st.done == st.queued ? cudaSuccess : cudaErrorNotReady;
}

void device_synchronize() {
  std::lock_guard lock(g_mu);
  auto pending = [](const StreamPtr& s) { return s->done < s->queued; };
  bool waited = pending(legacy());
  for (const StreamPtr& s : created()) waited = waited || pending(s);
  g_waits += waited;
  run_all(*legacy());
  for (const StreamPtr& s : created()) run_all(*s);
}

cudaError_t event_create(cudaEvent_t* e, unsigned flags) {
  if (!e) return cudaErrorInvalidValue;
  auto* ev = new Event;
  ev->timing = (flags & cudaEventDisableTiming) == 0;
  *e = reinterpret_cast<cudaEvent_t>(ev);
  return cudaSuccess;
}

// Waits already queued hold the point, not the event: destroying it does not change them.
cudaError_t event_destroy(cudaEvent_t e) {
  if (!e) return cudaErrorInvalidResourceHandle;
  std::lock_guard lock(g_mu);
  delete event_of(e);
  return cudaSuccess;
}

cudaError_t event_record(cudaEvent_t e, cudaStream_t s) {
  if (!e) return cudaErrorInvalidResourceHandle;
  std::lock_guard lock(g_mu);
  Event& ev = *event_of(e);
  const StreamPtr& st = stream_of(s);
  auto when = std::make_shared<Clock::time_point>();
  push(st, {[when] { *when = Clock::now(); }, {}});
  ev.at = {st, st->queued};
  ev.when = std::move(when);
  return cudaSuccess;
}

// An event never recorded counts as reached, as CUDA's.
cudaError_t event_synchronize(cudaEvent_t e) {
  if (!e) return cudaErrorInvalidResourceHandle;
  std::lock_guard lock(g_mu);
  wait_for(event_of(e)->at);
  return cudaSuccess;
}

cudaError_t event_query(cudaEvent_t e) {
  if (!e) return cudaErrorInvalidResourceHandle;
  std::lock_guard lock(g_mu);
  const Point& p = event_of(e)->at;
  if (!p.reached()) try_next(*p.stream);
  return p.reached() ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t stream_wait_event(cudaStream_t s, cudaEvent_t e) {
  if (!e) return cudaErrorInvalidResourceHandle;
  std::lock_guard lock(g_mu);
  const Point p = event_of(e)->at;  // the record as of now; later records do not move it
  if (!p.reached()) push(stream_of(s), {[p] { run_to(p); }, {}});
  return cudaSuccess;
}

cudaError_t event_elapsed_ms(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (!ms || !start || !end) return cudaErrorInvalidValue;
  std::lock_guard lock(g_mu);
  const Event& a = *event_of(start);
  const Event& b = *event_of(end);
  if (!a.timing || !b.timing || !a.at.stream || !b.at.stream)
    return cudaErrorInvalidResourceHandle;
  if (!a.at.reached() || !b.at.reached()) return cudaErrorNotReady;
  *ms = std::chrono::duration<float, std::milli>(*b.when - *a.when).count();
  return cudaSuccess;
}

uint64_t items_queued() {
  std::lock_guard lock(g_mu);
  return g_queued;
}
uint64_t items_run() {
  std::lock_guard lock(g_mu);
  return g_run;
}
uint64_t host_waits() {
  std::lock_guard lock(g_mu);
  return g_waits;
}

}  // namespace rt_emu
