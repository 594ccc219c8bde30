#include "threadpool.h"

#include <chrono>
#include <map>

#if defined(__linux__)
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
static inline void cpu_relax() { _mm_pause(); }
#elif defined(__aarch64__)
static inline void cpu_relax() { asm volatile("yield"); }
#else
static inline void cpu_relax() {}
#endif

namespace pyserve {

namespace {
// How long a worker spins for the next job before it sleeps: longer than the gap between two ops of
// a forward pass, far shorter than the gap between requests.
constexpr auto SPIN_FOR = std::chrono::microseconds(300);
// Busy-wait rounds before a waiting thread starts yielding its core: when the machine is oversubscribed
// (the server's event loop, other processes) the thread we wait for may need this very core to finish.
constexpr int PAUSE_ROUNDS = 2000;

inline void backoff(int round) {
  if (round < PAUSE_ROUNDS) cpu_relax();
  else std::this_thread::yield();
}
}  // namespace

void lower_thread_priority() {
#if defined(__linux__)
  // Linux nice values are per thread: this leaves the rest of the process (the event loop) as it is.
  setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), ENGINE_NICE);
#endif
}

std::shared_ptr<ThreadPool> ThreadPool::shared(int n_threads) {
  static std::mutex mu;
  static std::map<int, std::weak_ptr<ThreadPool>> teams;  // by size; a team ends with its last engine
  const int n = n_threads > 0 ? n_threads : (int)std::max(1u, std::thread::hardware_concurrency());
  std::lock_guard<std::mutex> lk(mu);
  std::shared_ptr<ThreadPool> team = teams[n].lock();
  if (!team) teams[n] = team = std::make_shared<ThreadPool>(n);
  return team;
}

ThreadPool::ThreadPool(int n_threads) {
  n_ = n_threads > 0 ? n_threads : (int)std::max(1u, std::thread::hardware_concurrency());
  for (int i = 1; i < n_; i++) threads_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_.store(true);
    generation_.fetch_add(1);
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::run(const std::function<void(int, int)>& fn) {
  if (n_ == 1) {
    fn(0, 1);
    return;
  }
  std::lock_guard<std::mutex> turn(run_mu_);
  job_ = &fn;
  pending_.store(n_ - 1, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lk(mu_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();
  fn(0, n_);
  for (int round = 0; pending_.load(std::memory_order_acquire) != 0; round++) backoff(round);
}

void ThreadPool::worker(int ith) {
  lower_thread_priority();
  uint64_t seen = 0;
  for (;;) {
    auto start = std::chrono::steady_clock::now();
    uint64_t g;
    for (int spins = 0;; spins++) {
      g = generation_.load(std::memory_order_acquire);
      if (g != seen) break;
      if ((spins & 255) == 255 && std::chrono::steady_clock::now() - start > SPIN_FOR) {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      }
      backoff(spins);
    }
    seen = g;
    if (stop_.load()) return;
    (*job_)(ith, n_);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace pyserve
