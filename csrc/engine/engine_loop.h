// engine_loop: runs Engine::step on a native thread of its own and hands the outputs over in batches.
//
// After every step that produced outputs it appends them to a queue and writes an eventfd once; the
// async side waits for the fd to become readable (trio.lowlevel.wait_readable), then drains the whole
// queue in one call: one wake-up per step, not per token. add() and abort() are thread-safe and wake the
// loop; when there is no work the thread sleeps on a condition variable (no CPU while idle).
#pragma once

#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"

namespace pyserve {

class EngineLoop {
 public:
  explicit EngineLoop(Engine& engine);  // creates the eventfd; throws std::runtime_error if it cannot
  ~EngineLoop();                        // stop()s and closes the fd

  void start();
  // Stops the thread after its current step. Requests still live stay in the engine (abort them first).
  void stop();
  int fd() const { return fd_; }

  void check(const Request& req) const { engine_.check(req); }  // Engine::check: thread-safe, queues nothing
  void add(Request req);               // Engine::add, then wakes the loop
  void abort(const std::string& id, int index = -1);  // Engine::abort, then wakes the loop
  // Everything produced since the last drain, in order; clears the fd's counter.
  std::vector<StepOutput> drain();

 private:
  void run();
  void wake();
  void signal_fd();

  Engine& engine_;
  int fd_ = -1;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false, kicked_ = false;
  std::vector<StepOutput> outbox_;
};

}  // namespace pyserve
