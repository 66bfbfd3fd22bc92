// The stream hold used by cukern.timing.benchmark (not an op, so no six-question card).
//
// Launching a kernel costs the host a few to tens of microseconds. If the GPU is idle when the start event
// is recorded, the event fires at once and the timed interval then includes the host's time to launch the
// call: for a small kernel that gap is most of what the events measure. hold_stream keeps the stream busy
// for a given time, long enough for the host to queue the start event, the timed call and the end event
// behind it, so the events bracket GPU work only. It touches no memory, so it leaves L2 as the flush left it.
// One thread, sleeping in 1 µs steps on the global nanosecond timer (sm_70 and later).

namespace cukern {

__global__ void hold_stream(unsigned long long ns) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

}  // namespace cukern
