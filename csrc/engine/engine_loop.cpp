#include "engine/engine_loop.h"

#include "engine/step_turns.h"
#include "base/threadpool.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace pyserve {

EngineLoop::EngineLoop(Engine& engine) : engine_(engine) {
  fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd_ < 0) throw std::runtime_error(std::string("eventfd: ") + std::strerror(errno));
}

EngineLoop::~EngineLoop() {
  stop();
  ::close(fd_);
}

void EngineLoop::start() {
  std::lock_guard<std::mutex> lk(mu_);
  if (thread_.joinable()) return;
  stop_ = false;
  thread_ = std::thread([this] { run(); });
}

void EngineLoop::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void EngineLoop::wake() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    kicked_ = true;
  }
  cv_.notify_all();
}

void EngineLoop::add(Request req) {
  engine_.add(std::move(req));
  wake();
}

void EngineLoop::abort(const std::string& id, int index) {
  engine_.abort(id, index);
  wake();
}

void EngineLoop::signal_fd() {
  uint64_t one = 1;
  while (::write(fd_, &one, sizeof one) < 0 && errno == EINTR) {
  }
}

std::vector<StepOutput> EngineLoop::drain() {
  uint64_t n;
  while (::read(fd_, &n, sizeof n) < 0 && errno == EINTR) {
  }
  std::vector<StepOutput> out;
  std::lock_guard<std::mutex> lk(mu_);
  out.swap(outbox_);
  return out;
}

void EngineLoop::run() {
  lower_thread_priority();
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || kicked_ || engine_.has_work(); });
      if (stop_) return;
      kicked_ = false;
    }
    std::vector<StepOutput> outs;
    try {
      StepTurns::Turn turn(StepTurns::process());  // several engines in one process: one steps at a time
      outs = engine_.step();
    } catch (const std::exception& e) {
      outs = engine_.fail_all(e.what());
    }
    if (outs.empty()) continue;
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (StepOutput& o : outs) outbox_.push_back(std::move(o));
    }
    signal_fd();
  }
}

}  // namespace pyserve
