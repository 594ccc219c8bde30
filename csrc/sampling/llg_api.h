// llg_api: the part of llguidance's C API that the grammar component uses, loaded at run time.
//
// llguidance (MIT; github.com/guidance-ai/llguidance, parser/llguidance.h) ships as a Python wheel whose
// extension library also exports its C API (`llg_*`). We declare the structs and prototypes we call, with
// the header's layouts, and resolve the functions with dlopen/dlsym from the path Python finds for the
// installed package: no build-time dependency, and a missing or mismatched library is an error at the first
// constrained request, not at import.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

extern "C" {

struct LlgTokenizer;
struct LlgMatcher;

// Layouts as in llguidance.h (1.x): zero-initialise, then set fields.
struct LlgParserLimits {
  size_t max_items_in_row;
  uint64_t initial_lexer_fuel;
  uint64_t step_lexer_fuel;
  size_t step_max_items;
  size_t max_lexer_states;
  size_t max_grammar_size;
  bool precompute_large_lexemes;
  bool verbose_errors;
};

struct LlgConstraintInit {
  const LlgTokenizer* tokenizer;
  uint32_t log_buffer_level;
  uint32_t log_stderr_level;
  bool ff_tokens_ok;
  bool backtrack_ok;
  LlgParserLimits limits;  // zeros: llguidance's defaults
};

typedef size_t (*LlgTokenizeFn)(const void* user_data, const uint8_t* bytes, size_t bytes_len,
                                uint32_t* output_tokens, size_t output_tokens_len);

struct LlgTokenizerInitV2 {
  size_t struct_size;              // sizeof(LlgTokenizerInitV2): the library reads only this many bytes
  uint32_t vocab_size;
  uint32_t tok_eos;
  const uint32_t* token_lens;      // [vocab_size]
  const uint8_t* token_bytes;      // Σ token_lens; a special token's bytes are 0xFF + its name
  const char* tokenizer_json;      // unused (null)
  bool tokenize_assumes_string;
  LlgTokenizeFn tokenize_fn;       // unused (null): use_approximate_greedy_tokenize_fn
  bool use_approximate_greedy_tokenize_fn;
  const void* tokenize_user_data;
  const char* const* slices;       // null: llguidance's default slices
  const uint32_t* tok_eos_extra;   // [tok_eos_extra_count] further end-of-generation ids
  uint32_t tok_eos_extra_count;
};

}  // extern "C"

namespace pyserve {

// The llguidance functions pyserve calls (signatures as in llguidance.h).
struct LlgApi {
  void (*constraint_init_set_defaults)(LlgConstraintInit*, const LlgTokenizer*);
  LlgTokenizer* (*new_tokenizer_v2)(const LlgTokenizerInitV2*, char* error, size_t error_len);
  void (*free_tokenizer)(LlgTokenizer*);
  LlgMatcher* (*new_matcher)(const LlgConstraintInit*, const char* constraint_type, const char* data);
  const char* (*matcher_get_error)(LlgMatcher*);
  bool (*matcher_is_error)(const LlgMatcher*);
  size_t (*matcher_get_mask_byte_size)(const LlgMatcher*);
  int32_t (*matcher_compute_mask_into)(LlgMatcher*, uint32_t* mask, size_t mask_byte_len);
  int32_t (*matcher_consume_token)(LlgMatcher*, uint32_t token);
  int32_t (*matcher_rollback)(LlgMatcher*, size_t n_tokens);
  int32_t (*matcher_validate_tokens)(LlgMatcher*, const uint32_t* tokens, size_t n_tokens);
  bool (*matcher_is_accepting)(LlgMatcher*);
  bool (*matcher_is_stopped)(const LlgMatcher*);
  LlgMatcher* (*clone_matcher)(const LlgMatcher*);
  void (*free_matcher)(LlgMatcher*);
};

// Loads the library at `path` (once; later calls with any path return the loaded one). Throws
// std::runtime_error naming the path and dlerror's message, or the first missing symbol.
const LlgApi& load_llguidance(const std::string& path);
// The loaded API; throws std::runtime_error "llguidance is not loaded" before load_llguidance succeeded.
const LlgApi& llg();

}  // namespace pyserve
