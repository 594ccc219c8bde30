// gguf: a GGUF file's metadata and tensors as Python values (read_gguf, tensor_data), strings that are not
// UTF-8 kept as surrogate escapes.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <stdexcept>
#include <string>

#include "bindings/bindings.h"
#include "gguf/gguf.h"
#include "kernels/quant.h"

namespace py = pybind11;

namespace pyserve {

namespace {

// A string from a file as a Python str: bytes that are not valid UTF-8 (vocabulary pieces, or a damaged file)
// kept lossless as surrogate escapes, never a UnicodeDecodeError.
py::str file_str(const std::string& x) {
  PyObject* o = PyUnicode_DecodeUTF8(x.data(), (Py_ssize_t)x.size(), "surrogateescape");
  if (!o) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(o);
}

py::object to_py(const GGUFValue& v) {
  switch (v.type) {
    case GGUFType::STRING: return file_str(v.s);
    case GGUFType::BOOL: return py::bool_(v.i != 0);
    case GGUFType::FLOAT32: case GGUFType::FLOAT64: return py::float_(v.f);
    case GGUFType::UINT64: return py::int_((uint64_t)v.i);
    case GGUFType::ARRAY: break;
    default: return py::int_(v.i);
  }
  py::list out;
  if (v.elem_type == GGUFType::STRING) {
    for (const std::string& x : v.as) out.append(file_str(x));
  } else if (v.elem_type == GGUFType::BOOL) {
    for (int64_t x : v.ai) out.append(py::bool_(x != 0));
  } else if (v.elem_type == GGUFType::UINT64) {
    for (int64_t x : v.ai) out.append(py::int_((uint64_t)x));
  } else {
    for (int64_t x : v.ai) out.append(py::int_(x));
    for (double x : v.af) out.append(py::float_(x));
    for (const GGUFValue& x : v.aa) out.append(to_py(x));
  }
  return out;
}

py::list tensor_list(const GGUFFile& f) {
  py::list out;
  for (const GGUFTensor& t : f.tensors()) {
    py::list shape;
    for (int d = 0; d < t.n_dims; d++) shape.append(t.ne[d]);
    out.append(py::dict(py::arg("name") = file_str(t.name), py::arg("type") = (uint32_t)t.type,
                        py::arg("type_name") = type_traits((uint32_t)t.type)->name, py::arg("shape") = shape,
                        py::arg("offset") = t.offset, py::arg("nbytes") = t.nbytes));
  }
  return out;
}

}  // namespace

py::dict metadata_dict(const GGUFFile& f, int64_t max_array) {
  py::dict d;
  for (const auto& [k, v] : f.metadata())
    if (max_array < 0 || v.type != GGUFType::ARRAY || (int64_t)v.size() <= max_array) d[file_str(k)] = to_py(v);
  return d;
}

void bind_gguf(py::module_& m) {
  m.def("read_gguf", [](const std::string& path, int64_t max_array) {
    std::unique_ptr<GGUFFile> f;
    {
      py::gil_scoped_release nogil;
      f = std::make_unique<GGUFFile>(path);
    }
    return py::make_tuple(metadata_dict(*f, max_array), tensor_list(*f), f->version());
  }, py::arg("path"), py::arg("max_array") = -1,
        "-> (metadata: dict, tensors: list[dict], version); max_array >= 0 leaves out arrays longer than that. "
        "Raises GGUFError on a malformed file; parses with the GIL released.");
  m.def("tensor_data", [](const std::string& path, const py::str& py_name) {
    // names come back from read_gguf with surrogate escapes for non-UTF-8 bytes: encode them the same way
    PyObject* b = PyUnicode_AsEncodedString(py_name.ptr(), "utf-8", "surrogateescape");
    if (!b) throw py::error_already_set();
    const std::string name = py::reinterpret_steal<py::bytes>(b);
    GGUFFile f(path);
    const GGUFTensor* t = f.find(name);
    if (!t) throw std::invalid_argument(printable("no tensor '" + name + "' in " + path));
    return py::bytes(reinterpret_cast<const char*>(t->data), t->nbytes);
  }, py::arg("path"), py::arg("name"), "raw bytes of one tensor");
}

}  // namespace pyserve
