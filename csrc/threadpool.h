// threadpool: a fixed team of threads that run one function together, fork-join, many times per
// forward pass. Workers spin briefly between jobs (a forward pass issues hundreds of them) and sleep on
// a condition variable when the engine is idle, so an idle server costs no CPU.
#pragma once

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

// Engine threads run at this nice value: when the server's event loop has work it gets a core first, and
// when it has none the engine loses nothing (Linux; elsewhere a no-op).
constexpr int ENGINE_NICE = 10;
// Applies ENGINE_NICE to the calling thread.
void lower_thread_priority();

class ThreadPool {
 public:
  // n_threads in total, the calling thread included (n_threads <= 0: one per hardware thread).
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // The process's team of n_threads (<= 0: one per hardware thread), made on first use and shared by every
  // engine that asks for that size while one holds it: engines in one process take turns stepping
  // (step_turns.h), so a team of their own would only spin on the cores while another engine's team works.
  static std::shared_ptr<ThreadPool> shared(int n_threads);

  int size() const { return n_; }
  // Runs fn(ith, nth) on every thread, the caller as ith 0, and returns when all have finished. Callers on
  // several threads (engines sharing the team) run one at a time. Not reentrant: fn must not call run().
  void run(const std::function<void(int, int)>& fn);

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
    run([&](int ith, int nth) {
      auto [b, e] = share(n, ith, nth);
      for (int64_t i = b; i < e; i++) fn(i);
    });
  }

 private:
  void worker(int ith);
  int n_;
  std::vector<std::thread> threads_;
  const std::function<void(int, int)>* job_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::mutex run_mu_;  // one caller's job at a time
};

}  // namespace pyserve
