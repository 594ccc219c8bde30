// step_turns: the engines of one process take turns at the cores, one step each, first come first served.
//
// Each engine's ThreadPool is sized to the machine (one thread per core by default) and its workers spin
// between the ops of a forward pass. Two engines stepping at once (several models behind one server) put
// twice as many spinning threads on the cores, and each fork-join barrier then waits on a thread that is
// not running. Taking turns keeps one team on the cores; a ticket order (not a bare mutex, which lets the
// thread that just released it take it again) makes two busy engines alternate. One engine alone takes
// an uncontended turn per step.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace pyserve {

class StepTurns {
 public:
  // The process's one order of turns (every EngineLoop takes its steps' turns here).
  static StepTurns& process() {
    static StepTurns turns;
    return turns;
  }

  // A turn held for the guard's lifetime.
  class Turn {
   public:
    explicit Turn(StepTurns& t) : t_(t) { t_.take(); }
    ~Turn() { t_.give(); }
    Turn(const Turn&) = delete;
    Turn& operator=(const Turn&) = delete;

   private:
    StepTurns& t_;
  };

 private:
  void take() {
    std::unique_lock<std::mutex> lk(mu_);
    const uint64_t ticket = next_++;
    cv_.wait(lk, [&] { return serving_ == ticket; });
  }
  void give() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      serving_++;
    }
    cv_.notify_all();
  }

  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t next_ = 0, serving_ = 0;  // the next ticket handed out; the ticket whose turn it is
};

}  // namespace pyserve
