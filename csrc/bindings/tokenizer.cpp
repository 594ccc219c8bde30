// tokenizer: the native SentencePiece-BPE tokenizer (spm_tokenizer.h) as pyserve._engine.SpmTokenizer.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <stdexcept>

#include "bindings/bindings.h"
#include "tokenizer/spm_tokenizer.h"

namespace py = pybind11;

namespace pyserve {

namespace {

// A str's UTF-8; one holding surrogate escapes (a file's bytes that are not UTF-8) as those bytes.
std::string file_bytes(py::handle s) {
  Py_ssize_t n = 0;
  if (const char* p = PyUnicode_AsUTF8AndSize(s.ptr(), &n)) return std::string(p, (size_t)n);
  PyErr_Clear();
  py::bytes b = py::reinterpret_steal<py::bytes>(PyUnicode_AsEncodedString(s.ptr(), "utf-8", "surrogateescape"));
  if (!b) throw py::error_already_set();
  return std::string(b);
}

template <typename T>
std::vector<T> from_bytes(const py::bytes& b, const char* what) {
  std::string_view v = b;
  if (v.size() % sizeof(T)) throw std::invalid_argument(std::string("SpmTokenizer: ") + what + " is not whole items");
  std::vector<T> out(v.size() / sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), v.data(), v.size());
  return out;
}

// The texts of tokenizer.py's PackedTexts: `blob` cut at `ends` (uint32, each text's end).
std::vector<std::string> unpack_texts(std::string_view blob, const std::vector<uint32_t>& ends) {
  std::vector<std::string> out;
  out.reserve(ends.size());
  uint32_t start = 0;
  for (uint32_t end : ends) {
    if (end < start || end > blob.size()) throw std::invalid_argument("SpmTokenizer: text ends out of order");
    out.emplace_back(blob.substr(start, end - start));
    start = end;
  }
  return out;
}

std::shared_ptr<SpmTokenizer> make_spm(const py::bytes& blob, const py::bytes& ends, const py::bytes& scores,
                                       const py::bytes& types,
                                       const std::vector<std::tuple<int32_t, bool, bool>>& added,
                                       std::optional<int32_t> unk_id, bool byte_fallback, bool add_space_prefix) {
  SpmVocabSpec spec;
  const std::vector<uint32_t> text_ends = from_bytes<uint32_t>(ends, "ends");
  spec.scores = from_bytes<float>(scores, "scores");
  spec.types = from_bytes<uint8_t>(types, "types");
  for (const auto& [id, special, rstrip] : added) spec.added.push_back({id, special, rstrip});
  spec.unk_id = unk_id.value_or(-1);
  spec.byte_fallback = byte_fallback;
  spec.add_space_prefix = add_space_prefix;
  const std::string_view texts = blob;  // `blob` (immutable, referenced by the caller) outlives the call
  py::gil_scoped_release nogil;
  spec.tokens = unpack_texts(texts, text_ends);
  return std::make_shared<SpmTokenizer>(std::move(spec));
}

std::vector<int32_t> spm_encode(const SpmTokenizer& t, const py::str& text, bool parse_special) {
  Py_ssize_t n = 0;
  const char* p = PyUnicode_AsUTF8AndSize(text.ptr(), &n);  // UnicodeEncodeError for a lone surrogate
  if (!p) throw py::error_already_set();
  py::gil_scoped_release nogil;  // `text` (immutable, referenced by the caller) outlives the call
  return t.encode(std::string_view(p, (size_t)n), parse_special);
}

}  // namespace

void bind_tokenizer(py::module_& m) {
  py::class_<SpmTokenizer, std::shared_ptr<SpmTokenizer>>(m, "SpmTokenizer",
      "SentencePiece-BPE text -> ids (csrc/tokenizer/spm_tokenizer.h), the twin of the `tokenizers` pipeline for "
      "tokenizer.ggml.model 'llama'")
      .def(py::init(&make_spm), py::arg("texts"), py::arg("ends"), py::arg("scores"), py::arg("types"), py::arg("added"),
           py::arg("unk_id"), py::arg("byte_fallback"), py::arg("add_space_prefix"),
           "texts: the token texts' UTF-8 joined, ends: [n_vocab] uint32 each one's end (tokenizer.PackedTexts); "
           "scores: float32 bytes ([n_vocab] or empty); types: [n_vocab] uint8 GGUF "
           "token types; added: [(id, special, rstrip)]. ValueError naming what does not fit; releases the GIL")
      .def("encode", &spm_encode, py::arg("text"), py::arg("parse_special") = false,
           "-> ids, no BOS/EOS; ValueError if a character has no token and no fallback; releases the GIL")
      .def("token_to_id", [](const SpmTokenizer& t, const py::str& text) -> std::optional<int32_t> {
             int32_t id = t.token_to_id(file_bytes(text));
             return id < 0 ? std::nullopt : std::optional<int32_t>(id);
           }, py::arg("text"))
      .def_property_readonly("n_vocab", &SpmTokenizer::n_vocab);
}

}  // namespace pyserve
