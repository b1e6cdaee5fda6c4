#pragma once
// What the Python binding's parts share (python/py_support.cc): absl::Status
// errors on their way to Python, the process's logging, arrays and tensors
// as spans over the callers' memory (never copied; python/tessera_module.cc
// states the zero-copy contract), and TableOptions from keyword arguments.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/keys.h"
#include "worker/worker.h"

namespace tessera::python {

namespace py = pybind11;

// A failed absl::Status on its way to Python (see the translator below).
class StatusError : public std::exception {
 public:
  explicit StatusError(absl::Status status) : status_(std::move(status)), text_(status_.ToString()) {}
  const absl::Status& status() const { return status_; }
  const char* what() const noexcept override { return text_.c_str(); }

 private:
  absl::Status status_;
  std::string text_;
};

// Throws StatusError for a failed `s` (the module's translator raises it).
void ThrowIfError(const absl::Status& s);
[[noreturn]] void ThrowInvalid(const std::string& message);

// The exception types, created once at import (module state lives for the
// life of the process, as the module itself).
struct ExceptionTypes {
  PyObject* error = nullptr;             // tessera.Error(RuntimeError)
  PyObject* invalid_argument = nullptr;  // tessera.InvalidArgumentError(Error, ValueError)
  PyObject* deadline = nullptr;          // tessera.DeadlineExceededError(Error, TimeoutError)
};
extern ExceptionTypes exception_types;

// Raises `s` as the matching tessera exception (the translator's body).
void RaiseStatus(const absl::Status& s);

// Worker programs log to stderr; set up once per process (the first Worker).
void EnsureLogging(const std::string& name, bool debug);

// Arrays: NumPy arrays, torch tensors (CPU, contiguous) and other buffers.
std::string ShapeString(const py::array& a);
// `obj` as an array over its own memory (refused, not copied, when it cannot be).
py::array AsArray(py::handle obj, const char* what, bool writable);
// Keys: 1-D uint64 (or non-negative int64, reinterpreted in place); `holder` keeps the array.
std::span<const Key> KeysOf(py::handle obj, py::array& holder);
// Rows: float32, C-contiguous, n rows of `width` (shape (n, width) or flat).
py::array RowsOf(py::handle obj, const char* what, size_t n, uint32_t width, bool writable);
std::span<const float> ConstFloats(const py::array& a);
std::span<float> MutableFloats(py::array& a);
py::array NewRows(size_t n, uint32_t width);

// TableOptions from keyword arguments: one table of fields (TableFields()).
struct TableField {
  std::string name;
  std::string type;  // for errors and docs, e.g. "int >= 0", "one of 'sgd', 'accumulate'"
  std::function<void(TableOptions&, py::handle)> set;
  std::function<py::object(const TableOptions&)> get;  // the default, for docs
};
const std::vector<TableField>& TableFields();
TableOptions MakeTableOptions(py::handle id, py::handle width, const py::kwargs& options);
// One line per option with its type and default, for the docstring.
std::string TableOptionsDoc();

}  // namespace tessera::python
