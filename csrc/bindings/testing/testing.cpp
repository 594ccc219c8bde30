// testing: pyserve._engine.testing (testing.h), put together from its parts.
#include "bindings/bindings.h"
#include "bindings/testing/testing.h"

namespace pyserve {

void bind_testing(pybind11::module_& m) {
  bind_testing_machine(m);
  bind_testing_kernels(m);
  bind_testing_attention(m);
  bind_testing_sampler(m);
  bind_testing_blocks(m);
  bind_testing_scheduler(m);
  bind_testing_disk_tier(m);
}

}  // namespace pyserve
