// What the Python binding's parts share: see python/py_support.h.
#include "python/py_support.h"

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/sparse_batch.h"
#include "worker/worker.h"
#include "worker/worker_flags.h"


namespace tessera::python {

// ---------------------------------------------------------------------------
// Errors

void ThrowIfError(const absl::Status& s) {
  if (!s.ok()) throw StatusError(s);
}

[[noreturn]] void ThrowInvalid(const std::string& message) { throw StatusError(absl::InvalidArgumentError(message)); }

ExceptionTypes exception_types;

void RaiseStatus(const absl::Status& s) {
  PyObject* type = exception_types.error;
  std::string text(s.message());
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      type = exception_types.invalid_argument;
      break;
    case absl::StatusCode::kDeadlineExceeded:
      type = exception_types.deadline;
      break;
    default:
      text = absl::StrCat(absl::StatusCodeToString(s.code()), ": ", s.message());
  }
  py::object instance = py::reinterpret_borrow<py::object>(type)(text);
  instance.attr("code") = absl::StatusCodeToString(s.code());
  PyErr_SetObject(type, instance.ptr());
}

// ---------------------------------------------------------------------------
// Logging: worker programs log to stderr (stdout carries the launcher's
// TESSERA_PROGRESS / TESSERA_RESULT lines). Set up once per process, by the
// first Worker; later ones can only raise the level to debug.

void EnsureLogging(const std::string& name, bool debug) {
  static std::once_flag once;
  std::call_once(once, [&] { InitLogging(name.empty() ? "worker" : name, debug); });
  if (debug) spdlog::default_logger()->set_level(spdlog::level::debug);
}

// ---------------------------------------------------------------------------
// Arrays: NumPy arrays, torch tensors (CPU, contiguous) and other buffers

std::string ShapeString(const py::array& a) {
  std::vector<std::string> dims;
  for (py::ssize_t i = 0; i < a.ndim(); ++i) dims.push_back(std::to_string(a.shape(i)));
  return absl::StrCat("(", absl::StrJoin(dims, ", "), a.ndim() == 1 ? ",)" : ")");
}

std::string DtypeString(const py::array& a) { return py::str(a.dtype()).cast<std::string>(); }

bool IsTorchTensor(py::handle obj) {
  // torch can only have made the object if it is imported; never import it here.
  py::dict modules = py::module_::import("sys").attr("modules");
  if (!modules.contains("torch")) return false;
  return py::isinstance(obj, modules["torch"].attr("Tensor"));
}

// `obj` as a NumPy array over the same memory. Torch tensors must be on the
// CPU and contiguous; they are viewed through Tensor.numpy() (shared memory;
// the array keeps the tensor alive). With `writable`, the memory must be
// writable and shared with `obj` (a result array); otherwise any object
// numpy.asarray takes is accepted (a list is converted).
py::array AsArray(py::handle obj, const char* what, bool writable) {
  if (obj.is_none()) ThrowInvalid(absl::StrCat(what, " is None"));
  if (py::isinstance<py::array>(obj)) return py::reinterpret_borrow<py::array>(obj);
  if (IsTorchTensor(obj)) {
    const std::string device = py::str(obj.attr("device").attr("type")).cast<std::string>();
    if (device != "cpu") {
      ThrowInvalid(absl::StrCat(what, " must be a CPU tensor, got one on ", device, " (call .cpu() first)"));
    }
    if (!obj.attr("is_contiguous")().cast<bool>()) {
      ThrowInvalid(absl::StrCat(what, " must be a contiguous tensor (call .contiguous() first)"));
    }
    // detach(): a tensor that requires grad refuses numpy(); same memory.
    return obj.attr("detach")().attr("numpy")().cast<py::array>();
  }
  if (writable) {
    if (!PyObject_CheckBuffer(obj.ptr())) {
      ThrowInvalid(absl::StrCat(what, " must be a NumPy array, a CPU torch tensor or a writable buffer, got ",
                                py::str(py::type::of(obj)).cast<std::string>()));
    }
    return py::array(py::reinterpret_borrow<py::buffer>(obj));  // shares the buffer's memory
  }
  return py::module_::import("numpy").attr("asarray")(obj).cast<py::array>();
}

// Keys: a 1-D uint64 array, or a non-negative int64 one (torch's ids)
// reinterpreted in place. Returns the span; `holder` keeps the memory alive.
std::span<const Key> KeysOf(py::handle obj, py::array& holder) {
  holder = AsArray(obj, "keys", /*writable=*/false);
  const bool is_u64 = py::array_t<uint64_t>::check_(holder);
  const bool is_i64 = py::array_t<int64_t>::check_(holder);
  if (!is_u64 && !is_i64) {
    ThrowInvalid(absl::StrCat("keys must be uint64 (or non-negative int64), got ", DtypeString(holder)));
  }
  if (holder.ndim() != 1) ThrowInvalid(absl::StrCat("keys must be 1-D, got shape ", ShapeString(holder)));
  if (!(holder.flags() & py::array::c_style)) ThrowInvalid("keys must be C-contiguous");
  const size_t n = static_cast<size_t>(holder.size());
  if (is_i64) {
    const int64_t* k = static_cast<const int64_t*>(holder.data());
    for (size_t i = 0; i < n; ++i) {
      if (k[i] < 0) ThrowInvalid(absl::StrCat("keys must be non-negative, got ", k[i], " at position ", i));
    }
  }
  return {static_cast<const Key*>(holder.data()), n};
}

// Rows of `width` floats for `n` keys: float32, C-contiguous, shape (n, width)
// or flat (n * width,).
py::array RowsOf(py::handle obj, const char* what, size_t n, uint32_t width, bool writable) {
  py::array a = AsArray(obj, what, writable);
  auto expected = [&] {
    return absl::StrCat(what, " must be float32 C-contiguous of shape (n, width) = (", n, ", ", width,
                        ") or flat (", n * width, ",) for ", n, " keys of width ", width, ", got ",
                        DtypeString(a), " of shape ", ShapeString(a));
  };
  if (!py::array_t<float>::check_(a)) ThrowInvalid(expected());
  const bool flat = a.ndim() == 1 && static_cast<size_t>(a.shape(0)) == n * width;
  const bool rows = a.ndim() == 2 && static_cast<size_t>(a.shape(0)) == n && static_cast<size_t>(a.shape(1)) == width;
  if (!flat && !rows) ThrowInvalid(expected());
  if (!(a.flags() & py::array::c_style)) ThrowInvalid(absl::StrCat(what, " must be C-contiguous"));
  if (writable && !a.writeable()) ThrowInvalid(absl::StrCat(what, " must be writable"));
  return a;
}

std::span<const float> ConstFloats(const py::array& a) {
  return {static_cast<const float*>(a.data()), static_cast<size_t>(a.size())};
}
std::span<float> MutableFloats(py::array& a) {
  return {static_cast<float*>(a.mutable_data()), static_cast<size_t>(a.size())};
}

py::array NewRows(size_t n, uint32_t width) {
  return py::array_t<float>({static_cast<py::ssize_t>(n), static_cast<py::ssize_t>(width)});
}

// ---------------------------------------------------------------------------
// TableOptions from keyword arguments: ONE table of fields. To expose a new
// TableOptions field, add one line to TableFields(); enum names come from the
// proto enum itself (lower-cased), so new enum values appear by themselves.

template <typename T>
T ParseUnsigned(py::handle v, const std::string& name, uint64_t max, uint64_t min) {
  if (!PyLong_Check(v.ptr()) || PyBool_Check(v.ptr())) {
    ThrowInvalid(absl::StrCat("table option ", name, " must be an int, got ", py::repr(v).cast<std::string>()));
  }
  const long long signed_value = PyLong_AsLongLong(v.ptr());
  unsigned long long value = 0;
  if (signed_value == -1 && PyErr_Occurred()) {  // too large for long long
    PyErr_Clear();
    value = PyLong_AsUnsignedLongLong(v.ptr());
    if (PyErr_Occurred()) {
      PyErr_Clear();
      ThrowInvalid(absl::StrCat("table option ", name, " must be in [", min, ", ", max, "], got ",
                                py::repr(v).cast<std::string>()));
    }
  } else if (signed_value < 0) {
    ThrowInvalid(absl::StrCat("table option ", name, " must be in [", min, ", ", max, "], got ", signed_value));
  } else {
    value = static_cast<unsigned long long>(signed_value);
  }
  if (value < min || value > max) {
    ThrowInvalid(absl::StrCat("table option ", name, " must be in [", min, ", ", max, "], got ", value));
  }
  return static_cast<T>(value);
}

template <typename T>
TableField UnsignedField(const char* name, T TableOptions::*member, uint64_t min = 0) {
  const uint64_t max = std::numeric_limits<T>::max();
  return {name, min > 0 ? absl::StrCat("int >= ", min) : "int >= 0",
          [=](TableOptions& o, py::handle v) { o.*member = ParseUnsigned<T>(v, name, max, min); },
          [=](const TableOptions& o) { return py::int_(o.*member); }};
}

template <typename T>
TableField FloatField(const char* name, T TableOptions::*member) {
  return {name, "float",
          [=](TableOptions& o, py::handle v) {
            if (PyBool_Check(v.ptr()) || (!PyFloat_Check(v.ptr()) && !PyLong_Check(v.ptr()))) {
              ThrowInvalid(absl::StrCat("table option ", name, " must be a number, got ",
                                        py::repr(v).cast<std::string>()));
            }
            o.*member = static_cast<T>(v.cast<double>());
          },
          [=](const TableOptions& o) {  // as written in the header: 0.01, not 0.009999999776
            return py::float_(std::stod(absl::StrFormat("%.7g", static_cast<double>(o.*member))));
          }};
}

TableField BoolField(const char* name, bool TableOptions::*member) {
  return {name, "bool",
          [=](TableOptions& o, py::handle v) {
            if (!PyBool_Check(v.ptr())) {
              ThrowInvalid(absl::StrCat("table option ", name, " must be True or False, got ",
                                        py::repr(v).cast<std::string>()));
            }
            o.*member = v.cast<bool>();
          },
          [=](const TableOptions& o) { return py::bool_(o.*member); }};
}

TableField StringField(const char* name, std::string TableOptions::*member) {
  return {name, "str",
          [=](TableOptions& o, py::handle v) {
            if (!PyUnicode_Check(v.ptr())) {
              ThrowInvalid(absl::StrCat("table option ", name, " must be a str, got ", py::repr(v).cast<std::string>()));
            }
            o.*member = v.cast<std::string>();
          },
          [=](const TableOptions& o) { return py::str(o.*member); }};
}

// A proto enum field, by the lower-cased names of the enum's values.
template <typename E>
TableField EnumField(const char* name, E TableOptions::*member) {
  const google::protobuf::EnumDescriptor* d = google::protobuf::GetEnumDescriptor<E>();
  std::vector<std::pair<std::string, E>> values;
  for (int i = 0; i < d->value_count(); ++i) {
    values.emplace_back(absl::AsciiStrToLower(d->value(i)->name()), static_cast<E>(d->value(i)->number()));
  }
  std::vector<std::string> quoted;
  for (const auto& [n, e] : values) quoted.push_back(absl::StrCat("'", n, "'"));
  const std::string valid = absl::StrJoin(quoted, ", ");
  return {name, absl::StrCat("one of ", valid),
          [=](TableOptions& o, py::handle v) {
            if (PyUnicode_Check(v.ptr())) {
              const std::string s = absl::AsciiStrToLower(v.cast<std::string>());
              for (const auto& [n, e] : values) {
                if (n == s) {
                  o.*member = e;
                  return;
                }
              }
            }
            ThrowInvalid(absl::StrCat("table option ", name, " must be one of ", valid, ", got ",
                                      py::repr(v).cast<std::string>()));
          },
          [=](const TableOptions& o) {
            for (const auto& [n, e] : values) {
              if (e == o.*member) return py::object(py::str(n));
            }
            return py::object(py::int_(static_cast<int>(o.*member)));
          }};
}

// Every TableOptions field a Python program may set, in the order of
// worker/worker.h. Add new fields here (one line each).
const std::vector<TableField>& TableFields() {
  static const std::vector<TableField>* fields = new std::vector<TableField>{
      UnsignedField("id", &TableOptions::id),
      StringField("name", &TableOptions::name),
      UnsignedField("width", &TableOptions::width, 1),
      EnumField("kind", &TableOptions::kind),
      UnsignedField("dense_rows", &TableOptions::dense_rows),
      EnumField("optimizer", &TableOptions::optimizer),
      FloatField("learning_rate", &TableOptions::learning_rate),
      FloatField("momentum", &TableOptions::momentum),
      FloatField("beta1", &TableOptions::beta1),
      FloatField("beta2", &TableOptions::beta2),
      FloatField("epsilon", &TableOptions::epsilon),
      FloatField("initial_accumulator", &TableOptions::initial_accumulator),
      FloatField("ftrl_beta", &TableOptions::ftrl_beta),
      FloatField("l1", &TableOptions::l1),
      FloatField("l2", &TableOptions::l2),
      UnsignedField("admit_after", &TableOptions::admit_after),
      UnsignedField("admission_sketch_width", &TableOptions::admission_sketch_width),
      UnsignedField("evict_after_clocks", &TableOptions::evict_after_clocks),
      UnsignedField("memory_budget_bytes", &TableOptions::memory_budget_bytes),
      BoolField("disk_tier", &TableOptions::disk_tier),
      EnumField("init", &TableOptions::init),
      FloatField("init_scale", &TableOptions::init_scale),
      UnsignedField("init_seed", &TableOptions::init_seed),
      EnumField("consistency", &TableOptions::consistency),
      UnsignedField("staleness", &TableOptions::staleness),
      StringField("compression", &TableOptions::compression),
      StringField("pull_compression", &TableOptions::pull_compression),
  };
  return *fields;
}

std::string TableFieldNames() {
  std::vector<std::string> names;
  for (const TableField& f : TableFields()) names.push_back(f.name);
  return absl::StrJoin(names, ", ");
}

void SetTableOption(TableOptions& o, const std::string& name, py::handle value) {
  for (const TableField& f : TableFields()) {
    if (f.name == name) {
      f.set(o, value);
      return;
    }
  }
  ThrowInvalid(absl::StrCat("unknown table option '", name, "'; valid options: ", TableFieldNames()));
}

TableOptions MakeTableOptions(py::handle id, py::handle width, const py::kwargs& options) {
  TableOptions o;
  SetTableOption(o, "id", id);
  SetTableOption(o, "width", width);
  for (const auto& [key, value] : options) {
    const std::string name = py::str(key).cast<std::string>();
    if (name == "id" || name == "width") ThrowInvalid(absl::StrCat("table option ", name, " given twice"));
    SetTableOption(o, name, value);
  }
  return o;
}

std::string TableOptionsDoc() {
  const TableOptions defaults;
  std::string doc;
  for (const TableField& f : TableFields()) {
    if (f.name == "id" || f.name == "width") continue;
    absl::StrAppend(&doc, "    ", f.name, " (", f.type, "): default ",
                    py::repr(f.get(defaults)).cast<std::string>(), "\n");
  }
  return doc;
}

// ---------------------------------------------------------------------------
// Future

}  // namespace tessera::python
