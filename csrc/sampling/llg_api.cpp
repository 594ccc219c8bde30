// llg_api: dlopen / dlsym of llguidance's C API (see llg_api.h).
#include "sampling/llg_api.h"

#include <dlfcn.h>

#include <atomic>
#include <mutex>
#include <stdexcept>

namespace pyserve {
namespace {

std::mutex g_mu;
LlgApi g_api;
std::atomic<const LlgApi*> g_loaded{nullptr};  // &g_api once filled in (read on every token: no lock)

template <class F>
void resolve(void* lib, const char* name, F& fn) {
  void* p = dlsym(lib, name);
  if (!p) throw std::runtime_error(std::string("llguidance: the library lacks ") + name + " (version too old?)");
  fn = reinterpret_cast<F>(p);
}

LlgApi resolve_all(void* lib) {
  LlgApi a{};
  resolve(lib, "llg_constraint_init_set_defaults", a.constraint_init_set_defaults);
  resolve(lib, "llg_new_tokenizer_v2", a.new_tokenizer_v2);
  resolve(lib, "llg_free_tokenizer", a.free_tokenizer);
  resolve(lib, "llg_new_matcher", a.new_matcher);
  resolve(lib, "llg_matcher_get_error", a.matcher_get_error);
  resolve(lib, "llg_matcher_is_error", a.matcher_is_error);
  resolve(lib, "llg_matcher_get_mask_byte_size", a.matcher_get_mask_byte_size);
  resolve(lib, "llg_matcher_compute_mask_into", a.matcher_compute_mask_into);
  resolve(lib, "llg_matcher_consume_token", a.matcher_consume_token);
  resolve(lib, "llg_matcher_rollback", a.matcher_rollback);
  resolve(lib, "llg_matcher_validate_tokens", a.matcher_validate_tokens);
  resolve(lib, "llg_matcher_is_accepting", a.matcher_is_accepting);
  resolve(lib, "llg_matcher_is_stopped", a.matcher_is_stopped);
  resolve(lib, "llg_clone_matcher", a.clone_matcher);
  resolve(lib, "llg_free_matcher", a.free_matcher);
  return a;
}

}  // namespace

const LlgApi& load_llguidance(const std::string& path) {
  std::lock_guard<std::mutex> lk(g_mu);
  if (g_loaded.load()) return g_api;
  // RTLD_LAZY: the wheel's library is also a Python extension; its Py* symbols resolve against this
  // process (a Python interpreter) if ever called, and the llg_* functions call none of them.
  void* lib = dlopen(path.c_str(), RTLD_LAZY | RTLD_LOCAL);
  if (!lib) throw std::runtime_error("llguidance: cannot load " + path + ": " + dlerror());
  g_api = resolve_all(lib);  // the handle stays open for the life of the process
  g_loaded.store(&g_api);
  return g_api;
}

const LlgApi& llg() {
  const LlgApi* a = g_loaded.load();
  if (!a) throw std::runtime_error("llguidance is not loaded");
  return *a;
}

}  // namespace pyserve
