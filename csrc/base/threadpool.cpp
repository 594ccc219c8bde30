#include "base/threadpool.h"

#include <chrono>
#include <map>
#include <cstdlib>
#include <stdexcept>
#include <string>

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
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
  // Per thread (Linux nice values and policies are): the rest of the process (the event loop) keeps its own.
  static const int nice = [] {
    const char* v = std::getenv("PYSERVE_ENGINE_NICE");
    return v ? std::atoi(v) : ENGINE_NICE;
  }();
  static const bool batch = [] {
    const char* v = std::getenv("PYSERVE_ENGINE_SCHED");
    return !(v && std::string(v) == "other");
  }();
  if (batch) {
    sched_param sp{};
    pthread_setschedparam(pthread_self(), SCHED_BATCH, &sp);
  }
  if (nice != 0) setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), nice);
#endif
}

int ThreadPool::available_cpus() {
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
#endif
  return (int)std::max(1u, std::thread::hardware_concurrency());
}

std::shared_ptr<ThreadPool> ThreadPool::shared(int n_threads) {
  static std::mutex mu;
  static std::map<int, std::weak_ptr<ThreadPool>> teams;  // by size; a team ends with its last engine
  const int n = n_threads > 0 ? n_threads : available_cpus();
  std::lock_guard<std::mutex> lk(mu);
  std::shared_ptr<ThreadPool> team = teams[n].lock();
  if (!team) teams[n] = team = std::make_shared<ThreadPool>(n);
  return team;
}

ThreadPool::ThreadPool(int n_threads) {
  n_ = n_threads > 0 ? n_threads : available_cpus();
  for (int i = 1; i < n_; i++) threads_.emplace_back([this] { worker(); });
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

namespace {
constexpr int CHUNK_BITS = 20;
constexpr uint64_t CHUNK_MASK = (1u << CHUNK_BITS) - 1;
constexpr uint64_t JOB_MASK = (1u << 24) - 1;
inline uint64_t pack(uint64_t job, uint64_t chunks, uint64_t next) {
  return (job & JOB_MASK) << (2 * CHUNK_BITS) | chunks << CHUNK_BITS | next;
}
inline int64_t chunks_of(uint64_t w) { return (int64_t)((w >> CHUNK_BITS) & CHUNK_MASK); }
inline int64_t next_of(uint64_t w) { return (int64_t)(w & CHUNK_MASK); }
}  // namespace

void ThreadPool::run_chunks(int64_t n_chunks, const std::function<void(int, int)>& fn) {
  if (n_chunks <= 0) return;
  if (n_ == 1 || n_chunks == 1) {
    for (int64_t c = 0; c < n_chunks; c++) fn((int)c, (int)n_chunks);
    return;
  }
  if (n_chunks > MAX_CHUNKS) throw std::invalid_argument("ThreadPool::run_chunks: more than MAX_CHUNKS chunks");
  std::lock_guard<std::mutex> turn(run_mu_);
  job_ = &fn;
  done_.store(0, std::memory_order_relaxed);
  claim_.store(pack(++job_number_, (uint64_t)n_chunks, 0), std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) {
    { std::lock_guard<std::mutex> lk(mu_); }  // a worker between its check and its wait holds mu_
    cv_.notify_all();
  }
  work_on_job();
  for (int round = 0; done_.load(std::memory_order_acquire) != n_chunks; round++) backoff(round);
}

// Claims and runs chunks of the current job until none is left to claim.
void ThreadPool::work_on_job() {
  for (;;) {
    uint64_t w = claim_.load(std::memory_order_acquire);
    do {
      if (next_of(w) >= chunks_of(w)) return;
    } while (!claim_.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel, std::memory_order_acquire));
    (*job_)((int)next_of(w), (int)chunks_of(w));  // job_ is this job's: the chunk we hold is not done
    done_.fetch_add(1, std::memory_order_acq_rel);
  }
}

// Spins for the next job (generation != seen) for SPIN_FOR, then sleeps on cv_; returns the generation.
uint64_t ThreadPool::wait_for_job(uint64_t seen) {
  const auto start = std::chrono::steady_clock::now();
  for (int spins = 0;; spins++) {
    const uint64_t g = generation_.load(std::memory_order_acquire);
    if (g != seen) return g;
    if ((spins & 255) == 255 && std::chrono::steady_clock::now() - start > SPIN_FOR) {
      std::unique_lock<std::mutex> lk(mu_);
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      cv_.wait(lk, [&] { return generation_.load(std::memory_order_seq_cst) != seen; });
      sleepers_.fetch_sub(1, std::memory_order_relaxed);
    }
    backoff(spins);
  }
}

void ThreadPool::worker() {
  lower_thread_priority();
  uint64_t seen = 0;
  for (;;) {
    seen = wait_for_job(seen);
    if (stop_.load()) return;
    work_on_job();
  }
}

}  // namespace pyserve
