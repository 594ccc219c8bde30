// threadpool: a fixed team of threads that run one function together, fork-join, many times per
// forward pass. Workers spin briefly between jobs (a forward pass issues hundreds of them) and sleep on
// a condition variable when the engine is idle, so an idle server costs no CPU.
//
// A job is a number of chunks that any thread of the team claims, one at a time, from one atomic word;
// the caller returns when every chunk is done, not when every thread has checked in. On a busy machine
// (an editor, a build, other servers beside the engine) a thread the kernel has descheduled then costs
// the job at most the chunk it holds: the threads that run take its share. A chunk computes the same
// values whichever thread runs it, so results stay bit-identical however the chunks fall.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace pyserve {

// Engine threads run under SCHED_BATCH at nice 0 (Linux; elsewhere a no-op). SCHED_BATCH: the kernel takes
// them for the CPU-bound threads they are, so a waking event loop (the server's, at SCHED_OTHER) preempts
// them and they never preempt it, while against other processes they keep a fair share of the cores. (A
// nice of 10 did the first too, but left the engine a tenth of a core beside one busy process: decode at
// 5 % of idle beside two; scripts/bench_busy.py.) PYSERVE_ENGINE_NICE=N and PYSERVE_ENGINE_SCHED=other
// override both, for measurements.
constexpr int ENGINE_NICE = 0;
// Applies the engine's scheduling class and nice value to the calling thread.
void lower_thread_priority();

class ThreadPool {
 public:
  // n_threads in total, the calling thread included (n_threads <= 0: one per CPU this process may run on).
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // The process's team of n_threads (<= 0: one per hardware thread), made on first use and shared by every
  // engine that asks for that size while one holds it: engines in one process take turns stepping
  // (step_turns.h), so a team of their own would only spin on the cores while another engine's team works.
  static std::shared_ptr<ThreadPool> shared(int n_threads);
  // The CPUs this process may run on (its affinity mask: taskset, cgroups' cpusets), at least 1.
  static int available_cpus();

  int size() const { return n_; }
  // Runs fn(ith, nth) for every ith in [0, nth), nth = size(): each ith once, on whichever thread claims
  // it (so per-ith scratch needs no lock), and returns when all have finished. Callers on several threads
  // (engines sharing the team) run one at a time. Not reentrant: fn must not call run().
  void run(const std::function<void(int, int)>& fn) { run_chunks(n_, fn); }
  // The same over n_chunks chunks (1 <= n_chunks <= MAX_CHUNKS): fn(chunk, n_chunks) for each.
  void run_chunks(int64_t n_chunks, const std::function<void(int, int)>& fn);
  // fn(begin, end) over [0, n) in contiguous chunks, a few per thread so that the threads that run can
  // take over a late one's share.
  template <typename F>
  void run_split(int64_t n, F&& fn) {
    const int64_t chunks = std::min<int64_t>(n, (int64_t)n_ * CHUNKS_PER_THREAD);
    if (chunks <= 0) return;
    run_chunks(chunks, [&](int c, int nc) {
      auto [b, e] = share(n, c, nc);
      fn(b, e);
    });
  }
  static constexpr int CHUNKS_PER_THREAD = 4;
  static constexpr int64_t MAX_CHUNKS = (1 << 20) - 1;

  // [begin, end) of thread ith's contiguous share of n items.
  static std::pair<int64_t, int64_t> share(int64_t n, int ith, int nth) {
    int64_t per = (n + nth - 1) / nth;
    int64_t b = std::min<int64_t>(n, per * ith);
    return {b, std::min<int64_t>(n, b + per)};
  }
  // fn(i) for i in [0, n), split in contiguous shares; on the caller alone when n <= inline_upto (a
  // barrier costs more than a few rows of element-wise work).
  template <typename F>
  void parallel_for(int64_t n, F&& fn, int64_t inline_upto = 0) {
    if (n <= inline_upto || n_ == 1) {
      for (int64_t i = 0; i < n; i++) fn(i);
      return;
    }
    run_split(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; i++) fn(i);
    });
  }

 private:
  void worker();
  uint64_t wait_for_job(uint64_t seen);
  void work_on_job();
  int n_;
  std::vector<std::thread> threads_;
  const std::function<void(int, int)>* job_ = nullptr;  // valid while a chunk of the current job is undone
  // The current job in one word, claimed by compare-and-swap: job number (24 bits) | chunks (20) | next
  // chunk to claim (20). A thread that read an older job's word fails its swap and claims nothing.
  std::atomic<uint64_t> claim_{0};
  std::atomic<int64_t> done_{0};  // chunks of the current job finished
  uint32_t job_number_ = 0;
  std::atomic<uint64_t> generation_{0};  // bumped once per job: what sleeping workers wait for
  std::atomic<int> sleepers_{0};         // workers asleep on cv_ (a job notifies only when some are)
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::mutex run_mu_;  // one caller's job at a time
};

}  // namespace pyserve
