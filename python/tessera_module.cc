// _tessera: the Python binding of tessera_worker (worker/worker.h).
//
// A thin shell: it checks Python arguments, turns them into spans over the
// callers' own memory, and calls the C++ Worker with the GIL released.
//
// Zero-copy contract (worker/worker.h: "the caller keeps keys, values and
// out valid and unchanged until the returned Future is ready"): arrays are
// never copied here; every Python object whose memory a request reads or
// writes is referenced by that request's Future until the request is
// complete, and a Future that is dropped while its request is in flight
// waits for it first (GIL released), so memory is never freed under a
// request. Inputs the Worker cannot take as they are (wrong dtype, not
// C-contiguous, a non-CPU tensor) are refused with a ValueError rather than
// copied behind the caller's back. The one conversion: int64 keys (NumPy or
// torch) are checked to be non-negative and reinterpreted as uint64 in place.
//
// Errors: every absl::Status failure becomes a tessera.Error (a
// RuntimeError) carrying the status message, with `code` set to the status
// code's name; InvalidArgument and OutOfRange raise tessera.InvalidArgumentError
// (also a ValueError), DeadlineExceeded raises tessera.DeadlineExceededError
// (also a TimeoutError).
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
#include "python/py_support.h"

namespace py = pybind11;

namespace tessera::python {
namespace {

// One request in flight, with the Python objects whose memory it uses.
class PyFuture {
 public:
  PyFuture(Future future, std::vector<py::object> keep_alive, py::object result)
      : future_(std::move(future)), keep_alive_(std::move(keep_alive)), result_(std::move(result)) {}

  // In flight: wait, so that no buffer is freed under the request.
  ~PyFuture() {
    if (!future_.ready()) {
      py::gil_scoped_release release;
      future_.Wait().IgnoreError();
    }
  }
  PyFuture(const PyFuture&) = delete;
  PyFuture& operator=(const PyFuture&) = delete;

  py::object Wait(std::optional<double> timeout) {
    absl::Status s;
    {
      py::gil_scoped_release release;
      if (timeout.has_value()) {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(*timeout);
        auto pause = std::chrono::microseconds(20);
        while (!future_.ready()) {
          if (std::chrono::steady_clock::now() >= deadline) {
            s = absl::DeadlineExceededError(absl::StrCat("request not complete after ", *timeout, " s"));
            break;
          }
          std::this_thread::sleep_for(pause);
          pause = std::min(pause * 2, std::chrono::microseconds(2000));
        }
      }
      if (s.ok()) s = future_.Wait();
    }
    ThrowIfError(s);
    return result_;
  }

  bool Ready() const { return future_.ready(); }

 private:
  Future future_;
  std::vector<py::object> keep_alive_;
  py::object result_;
};

// ---------------------------------------------------------------------------
// Worker

class PyWorker {
 public:
  explicit PyWorker(std::unique_ptr<Worker> worker) : worker_(std::move(worker)) {}
  ~PyWorker() { Close(); }

  static std::unique_ptr<PyWorker> Connect(const WorkerOptions& options, bool debug) {
    EnsureLogging(options.name, debug);
    absl::StatusOr<std::unique_ptr<Worker>> w;
    {
      py::gil_scoped_release release;
      w = Worker::Connect(options);
    }
    ThrowIfError(w.status());
    return std::make_unique<PyWorker>(std::move(*w));
  }

  // The Worker, or an error once closed. Callers hold the returned pointer
  // while the GIL is released, so close() from another thread cannot free
  // it under them.
  std::shared_ptr<Worker> Get() const {
    std::lock_guard lock(mu_);
    if (!worker_) throw StatusError(absl::FailedPreconditionError("the worker is closed"));
    return worker_;
  }

  void Close() {
    std::shared_ptr<Worker> w;
    {
      std::lock_guard lock(mu_);
      w = std::move(worker_);
    }
    py::gil_scoped_release release;
    w.reset();
  }

  uint32_t Width(uint32_t table) const {
    std::lock_guard lock(mu_);
    auto it = widths_.find(table);
    if (it == widths_.end()) {
      throw StatusError(absl::NotFoundError(
          absl::StrCat("table ", table, " was not created by this worker (call create_table first)")));
    }
    return it->second;
  }

  void CreateTable(const TableOptions& options) {
    auto w = Get();
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = w->CreateTable(options);
    }
    ThrowIfError(s);
    std::lock_guard lock(mu_);
    widths_[options.id] = options.width;
  }

  std::unique_ptr<PyFuture> PushAsync(uint32_t table, py::handle keys, py::handle values,
                                      int32_t priority = Worker::kDefaultPriority) {
    auto w = Get();
    py::array key_array;
    std::span<const Key> k = KeysOf(keys, key_array);
    py::array value_array = RowsOf(values, "values", k.size(), Width(table), /*writable=*/false);
    Future f;
    {
      py::gil_scoped_release release;
      f = w->Push(table, k, ConstFloats(value_array), priority);
    }
    return std::make_unique<PyFuture>(std::move(f), std::vector<py::object>{key_array, value_array}, py::none());
  }

  std::unique_ptr<PyFuture> PullAsync(uint32_t table, py::handle keys, py::object out,
                                      int32_t priority = Worker::kDefaultPriority) {
    auto w = Get();
    py::array key_array;
    std::span<const Key> k = KeysOf(keys, key_array);
    const uint32_t width = Width(table);
    py::array out_array = out.is_none() ? NewRows(k.size(), width) : RowsOf(out, "out", k.size(), width, true);
    py::object result = out.is_none() ? py::object(out_array) : out;
    Future f;
    {
      py::gil_scoped_release release;
      f = w->Pull(table, k, MutableFloats(out_array), priority);
    }
    return std::make_unique<PyFuture>(std::move(f), std::vector<py::object>{key_array, out_array}, result);
  }

  // Pulls each distinct key once and expands the rows to every position
  // (Worker::PullDeduplicated).
  std::unique_ptr<PyFuture> PullUniqueAsync(uint32_t table, py::handle keys, py::object out) {
    auto w = Get();
    py::array key_array;
    std::span<const Key> k = KeysOf(keys, key_array);
    const uint32_t width = Width(table);
    py::array out_array = out.is_none() ? NewRows(k.size(), width) : RowsOf(out, "out", k.size(), width, true);
    py::object result = out.is_none() ? py::object(out_array) : out;
    Future f;
    {
      py::gil_scoped_release release;
      f = w->PullDeduplicated(table, k, MutableFloats(out_array));
    }
    return std::make_unique<PyFuture>(std::move(f), std::vector<py::object>{key_array, out_array}, result);
  }

  // Sums the rows of duplicate keys on the worker and pushes one row per key
  // (Worker::PushAggregated: the sums are the request's own, so the Future
  // keeps nothing of the caller's alive).
  std::unique_ptr<PyFuture> PushAggregatedAsync(uint32_t table, py::handle keys, py::handle values) {
    auto w = Get();
    py::array key_array;
    std::span<const Key> k = KeysOf(keys, key_array);
    py::array value_array = RowsOf(values, "values", k.size(), Width(table), /*writable=*/false);
    Future f;
    {
      py::gil_scoped_release release;
      f = w->PushAggregated(table, k, ConstFloats(value_array));
    }
    return std::make_unique<PyFuture>(std::move(f), std::vector<py::object>{}, py::none());
  }

  template <typename F>
  void Blocking(F&& f) {
    auto w = Get();
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = f(*w);
    }
    ThrowIfError(s);
  }

 private:
  mutable std::mutex mu_;
  std::shared_ptr<Worker> worker_;                     // null once closed
  absl::flat_hash_map<uint32_t, uint32_t> widths_;     // table id -> width, of tables created here
};

WorkerOptions OptionsFrom(const std::string& coordinator, int rank, const std::string& name, const std::string& bind,
                          double connect_timeout, double request_timeout, int metrics_port,
                          const std::string& metrics_host, int64_t part_bytes, int64_t row_piece_bytes,
                          int64_t max_bytes_in_flight_per_server, const std::string& job_keys) {
  if (coordinator.empty()) ThrowInvalid("coordinator is empty (e.g. tcp://127.0.0.1:5000)");
  if (connect_timeout <= 0 || request_timeout <= 0) ThrowInvalid("timeouts must be positive");
  if (part_bytes < 0 || row_piece_bytes < 0 || max_bytes_in_flight_per_server < 0) {
    ThrowInvalid("part_bytes, row_piece_bytes and max_bytes_in_flight_per_server are bytes, 0 (off) or more");
  }
  WorkerProcessFlags flags;
  flags.coordinator = coordinator;
  flags.rank = rank;
  flags.name = name.empty() ? (rank >= 0 ? absl::StrCat("worker-", rank) : "worker") : name;
  flags.bind = bind;
  flags.connect_timeout_seconds = connect_timeout;
  flags.request_timeout_seconds = request_timeout;
  flags.metrics_port = metrics_port;
  flags.metrics_host = metrics_host;
  flags.transfer_part_bytes = part_bytes;
  flags.transfer_row_piece_bytes = row_piece_bytes;
  flags.transfer_max_bytes_in_flight_per_server = max_bytes_in_flight_per_server;
  WorkerOptions options = flags.ToOptions();
  options.transport.job_keys = job_keys;  // the other transport settings: their defaults
  return options;
}

// Worker.from_args: the launcher's process-contract flags (worker_flags.h,
// the same definitions the C++ programs use) out of argv; the rest is
// returned in order for the program's own parser.
py::tuple FromArgs(py::object argv) {
  std::vector<std::string> args;
  if (argv.is_none()) {
    py::list sys_argv = py::module_::import("sys").attr("argv");
    for (size_t i = 1; i < sys_argv.size(); ++i) args.push_back(py::str(sys_argv[i]).cast<std::string>());
  } else {
    for (py::handle a : argv) args.push_back(py::str(a).cast<std::string>());
  }
  WorkerProcessFlags flags;
  CLI::App app{"tessera worker process flags"};
  app.set_help_flag();  // --help belongs to the program's own parser
  app.allow_extras();
  flags.AddTo(app);
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 parses a reversed vector
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    ThrowInvalid(absl::StrCat("worker flags: ", e.what()));
  }
  std::vector<std::string> remaining = app.remaining();
  if (flags.name.empty()) flags.name = flags.rank >= 0 ? absl::StrCat("worker-", flags.rank) : "worker";
  EnsureLogging(flags.name, flags.debug);
  WarnAboutOldTransportVariables();  // this is the program's start (transport/transport_flags.h)
  std::unique_ptr<PyWorker> worker = PyWorker::Connect(flags.ToOptions(), flags.debug);
  return py::make_tuple(py::cast(std::move(worker)), py::cast(remaining));
}

py::object ParseJson(const std::string& text) { return py::module_::import("json").attr("loads")(text); }

// ---------------------------------------------------------------------------
// SparseBatch

py::array BatchRows(py::handle obj, const char* what, size_t rows, std::optional<uint32_t> width_arg,
                    uint32_t& width) {
  py::array a = AsArray(obj, what, false);
  if (width_arg) {
    width = *width_arg;
  } else if (a.ndim() == 2) {
    width = static_cast<uint32_t>(a.shape(1));
  } else if (rows > 0 && a.ndim() == 1 && static_cast<size_t>(a.size()) % rows == 0) {
    width = static_cast<uint32_t>(static_cast<size_t>(a.size()) / rows);
  } else {
    ThrowInvalid(absl::StrCat(what, ": cannot tell the row width from shape ", ShapeString(a), " for ", rows,
                              " rows; pass width="));
  }
  if (width == 0) ThrowInvalid(absl::StrCat(what, ": width must be >= 1"));
  return RowsOf(a, what, rows, width, false);
}

void BindErrors(py::module_& m) {
  exception_types.error = PyErr_NewExceptionWithDoc(
      "tessera.Error", "A Tessera request failed; `code` names the absl status code.", PyExc_RuntimeError, nullptr);
  py::tuple invalid_bases = py::make_tuple(py::handle(exception_types.error), py::handle(PyExc_ValueError));
  exception_types.invalid_argument = PyErr_NewExceptionWithDoc(
      "tessera.InvalidArgumentError", "Bad arguments: wrong dtype, shape or option (also a ValueError).",
      invalid_bases.ptr(), nullptr);
  py::tuple deadline_bases = py::make_tuple(py::handle(exception_types.error), py::handle(PyExc_TimeoutError));
  exception_types.deadline = PyErr_NewExceptionWithDoc(
      "tessera.DeadlineExceededError", "A request or wait ran out of time (also a TimeoutError).",
      deadline_bases.ptr(), nullptr);
  m.attr("Error") = py::handle(exception_types.error);
  m.attr("InvalidArgumentError") = py::handle(exception_types.invalid_argument);
  m.attr("DeadlineExceededError") = py::handle(exception_types.deadline);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      RaiseStatus(e.status());
    }
  });

}

void BindFuture(py::module_& m) {
  py::class_<PyFuture>(m, "Future",
                       "The completion of one push or pull. Holds the arrays the request reads or writes until it "
                       "completes; dropping an unfinished Future waits for it.")
      .def("wait", &PyFuture::Wait, py::arg("timeout") = py::none(),
           "Blocks until the request completes (GIL released) and returns its result: the pulled array for a "
           "pull (the `out` passed, or the new one), None for a push. Raises tessera.Error (with the status "
           "message) if the request failed, tessera.DeadlineExceededError if `timeout` seconds pass first. "
           "May be called again: returns or raises the same.")
      .def("ready", &PyFuture::Ready, "True once the request completed (successfully or not).");

}

// Worker: connecting and what it is; requests; the end and what it counted.
void BindWorkerSetup(py::class_<PyWorker>& cls) {
  cls
      .def_static(
          "connect",
          [](const std::string& coordinator, int rank, const std::string& name, const std::string& bind,
             double connect_timeout, double request_timeout, int metrics_port, const std::string& metrics_host,
             bool debug, int64_t part_bytes, int64_t row_piece_bytes, int64_t max_bytes_in_flight_per_server,
             const std::string& job_keys) {
            return PyWorker::Connect(OptionsFrom(coordinator, rank, name, bind, connect_timeout, request_timeout,
                                                 metrics_port, metrics_host, part_bytes, row_piece_bytes,
                                                 max_bytes_in_flight_per_server, job_keys),
                                     debug);
          },
          py::arg("coordinator"), py::arg("rank") = -1, py::arg("name") = "", py::arg("bind") = "tcp://127.0.0.1:0",
          py::arg("connect_timeout") = 30.0, py::arg("request_timeout") = 60.0, py::arg("metrics_port") = -1,
          py::arg("metrics_host") = "127.0.0.1", py::arg("debug") = false, py::arg("part_bytes") = 0,
          py::arg("row_piece_bytes") = static_cast<int64_t>(kDefaultRowPieceBytes),
          py::arg("max_bytes_in_flight_per_server") = 0, py::arg("job_keys") = "",
          "Joins the job whose coordinator is at `coordinator` (e.g. 'tcp://127.0.0.1:5000') and returns once the "
          "whole job has assembled. rank: the worker rank to take (-1: the coordinator assigns one). name: for log "
          "lines (default worker-RANK). bind: where replies arrive. Timeouts in seconds: connect_timeout for "
          "registration and assembly, request_timeout for every push, pull and table creation. metrics_port: serve "
          "Prometheus metrics (0: any free port, -1: off). Transfer scheduling (docs/design.md): part_bytes splits "
          "each server's share of a push or pull into parts of at most that many value bytes; with part_bytes 0, "
          "a pushed row wider than row_piece_bytes goes in pieces of that size to a server reached over the "
          "network (whole over the same-host path; 0: rows whole; --transfer_row_piece_bytes), and "
          "max_bytes_in_flight_per_server holds parts back, highest priority first (0: off). job_keys: the job's key "
          "file where the job authenticates (tessera-launch's RUN/job.keys; --job_keys). Logs go to stderr. "
          "Raises tessera.Error naming the coordinator if it does not answer.")
      .def_static("from_args", &FromArgs, py::arg("argv") = py::none(),
                  "Connects with the flags tessera-launch passes to every worker program (--coordinator, --rank, "
                  "--name, --bind, --metrics_port, --metrics_host, --connect_timeout_seconds, "
                  "--request_timeout_seconds, --debug, the transfer and resend flags, and the transport's --transport, --shm*, "
                  "--coalesce*, --job_keys, --faults, --host_id; worker/worker_flags.h) taken from `argv` (default "
                  "sys.argv[1:]). Returns (worker, remaining_args): the other arguments, in order, for the "
                  "program's own argparse. Raises tessera.InvalidArgumentError for a missing --coordinator or a "
                  "bad value.")
      .def_property_readonly("rank", [](const PyWorker& w) { return w.Get()->rank(); }, "This worker's rank.")
      .def_property_readonly("incarnation", [](const PyWorker& w) { return w.Get()->incarnation(); },
                             "0, or n for the n-th process that replaced a lost worker of this rank.")
      .def_property_readonly("num_workers", [](const PyWorker& w) { return w.Get()->num_workers(); },
                             "Workers in the job.")
      .def_property_readonly("num_servers", [](const PyWorker& w) { return w.Get()->num_servers(); },
                             "Servers in the job.")
      .def_property_readonly("node_id", [](const PyWorker& w) { return w.Get()->node_id(); },
                             "This process's node id in the job.")
      .def_property_readonly("current_clock", [](const PyWorker& w) { return w.Get()->clock(); },
                             "This worker's clock: the number of clock() calls completed (pushes and pulls are "
                             "stamped with it).")
      .def(
          "create_table",
          [](PyWorker& self, py::handle id, py::handle width, const py::kwargs& options) {
            self.CreateTable(MakeTableOptions(id, width, options));
          },
          py::arg("id"), py::arg("width"),
          ("Creates table `id` with rows of `width` floats on every server, or checks that it exists with equal "
           "options (every worker creates the tables it uses, with the same options). Blocks until every server "
           "answered. Keyword options (worker/worker.h TableOptions):\n" +
           TableOptionsDoc() +
           "Unknown options or values raise tessera.InvalidArgumentError listing the valid ones.")
              .c_str());
}

void BindWorkerRequests(py::class_<PyWorker>& cls) {
  cls
      .def("push", [](PyWorker& self, uint32_t table, py::handle keys, py::handle values,
                      int32_t priority) { self.PushAsync(table, keys, values, priority)->Wait(std::nullopt); },
           py::arg("table"), py::arg("keys"), py::arg("values"), py::kw_only(), py::arg("priority") = 0,
           "Pushes `values` (row i for keys[i]; gradients, applied by the table's server-side optimizer) and "
           "waits until every server acknowledged. Duplicate keys are applied once per occurrence.")
      .def("pull",
           [](PyWorker& self, uint32_t table, py::handle keys, py::object out, int32_t priority) {
             return self.PullAsync(table, keys, std::move(out), priority)->Wait(std::nullopt);
           },
           py::arg("table"), py::arg("keys"), py::arg("out") = py::none(), py::kw_only(), py::arg("priority") = 0,
           "Pulls the rows of `keys` and returns them: written straight into `out` (a float32 array or CPU tensor "
           "of shape (n, width) or flat, returned as given) or, without `out`, into a new (n, width) array.")
      .def("push_async", &PyWorker::PushAsync, py::arg("table"), py::arg("keys"), py::arg("values"),
           py::kw_only(), py::arg("priority") = 0,
           "push() without waiting: returns a Future. `keys` and `values` must stay unchanged until it is "
           "ready (the Future keeps them alive). priority (push, pull and their _async forms): lower numbers go "
           "first when Worker.connect set max_bytes_in_flight_per_server (e.g. a layer's index); else ignored.")
      .def("pull_async", &PyWorker::PullAsync, py::arg("table"), py::arg("keys"), py::arg("out") = py::none(),
           py::kw_only(), py::arg("priority") = 0,
           "pull() without waiting: returns a Future whose wait() returns the array. Do not touch `out` "
           "until the Future is ready.")
      .def(
          "pull_unique",
          [](PyWorker& self, uint32_t table, py::handle keys, py::object out) {
            return self.PullUniqueAsync(table, keys, std::move(out))->Wait(std::nullopt);
          },
          py::arg("table"), py::arg("keys"), py::arg("out") = py::none(),
          "pull() that sends each distinct key once (deduplicated on the worker, Worker::PullDeduplicated) and "
          "expands the rows to every position. Same result as pull().")
      .def("pull_unique_async", &PyWorker::PullUniqueAsync, py::arg("table"), py::arg("keys"),
           py::arg("out") = py::none(),
           "pull_unique() without waiting: returns a Future whose wait() returns the array (the rows are "
           "copied to every position in the first wait() or ready() that finds the pull done). Do not touch "
           "`out` until then.")
      .def(
          "push_aggregated",
          [](PyWorker& self, uint32_t table, py::handle keys, py::handle values) {
            self.PushAggregatedAsync(table, keys, values)->Wait(std::nullopt);
          },
          py::arg("table"), py::arg("keys"), py::arg("values"),
          "push() that first sums the rows of duplicate keys on the worker (Worker::PushAggregated) and sends "
          "one row per distinct key. For SGD this equals push() up to rounding; optimizers that are not "
          "linear in the gradient apply the sum once instead of each row.")
      .def("push_aggregated_async", &PyWorker::PushAggregatedAsync, py::arg("table"), py::arg("keys"),
           py::arg("values"),
           "push_aggregated() without waiting: returns a Future. The sums are made before it returns, so "
           "`keys` and `values` may change at once.");
}

void BindWorkerEnd(py::class_<PyWorker>& cls) {
  cls
      .def(
          "clock", [](PyWorker& self) { self.Blocking([](Worker& w) { return w.Clock(); }); },
          "Ends this worker's current clock (after the pushes issued before it are acknowledged), and blocks "
          "while this worker is more than the strictest table's staleness ahead of the slowest live worker.")
      .def(
          "barrier",
          [](PyWorker& self, const std::string& name) { self.Blocking([&](Worker& w) { return w.Barrier(name); }); },
          py::arg("name"), "Blocks until every worker reached the barrier of this name.")
      .def(
          "finish",
          [](PyWorker& self, uint64_t steps, double final_loss, py::object report) {
            std::string json = PyUnicode_Check(report.ptr())
                                   ? report.cast<std::string>()
                                   : py::module_::import("json").attr("dumps")(report).cast<std::string>();
            auto w = self.Get();
            const proto::WorkerDone done = MakeWorkerDone(w->stats(), steps, final_loss, json);
            self.Blocking([&](Worker& x) { return x.Finish(done); });
          },
          py::arg("steps"), py::arg("final_loss"), py::arg("report_json") = "{}",
          "Reports this worker's final numbers (steps, final loss, byte counts, and `report_json`: a JSON object "
          "as a str, or a dict) to the coordinator, then waits until the coordinator ends the job.")
      .def(
          "stats", [](const PyWorker& self) { return ParseJson(StatsJson(self.Get()->stats())); },
          "This worker's counters as a dict: pushes, pulls, bytes_pushed, bytes_pulled, clocks, "
          "clock_wait_seconds, pull_held_seconds, staleness_histogram, wire_bytes_*, resends.")
      .def(
          "transport_stats",
          [](const PyWorker& self) {
            const TransportStats t = self.Get()->transport_stats();
            py::dict d;
            d["messages_sent"] = t.messages_sent;
            d["messages_received"] = t.messages_received;
            d["bytes_sent"] = t.bytes_sent;
            d["bytes_received"] = t.bytes_received;
            d["zmq_parts_sent"] = t.zmq_parts_sent;
            d["zmq_parts_received"] = t.zmq_parts_received;
            d["malformed_received"] = t.malformed_received;
            d["auth_rejected"] = t.auth_rejected;
            return d;
          },
          "What this worker's transport counted (coordinator traffic included), as a dict.")
      .def("close", &PyWorker::Close,
           "Leaves the job without waiting (prefer finish()); pending requests fail with CANCELLED. Later calls "
           "raise tessera.Error.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyWorker& self, py::args) { self.Close(); });
}

void BindWorker(py::module_& m) {
  py::class_<PyWorker> cls(m, "Worker",
                       "A worker process's connection to a Tessera job (worker/worker.h).\n\n"
                       "Create with Worker.connect(...) or Worker.from_args(). All methods may be called from "
                       "several threads; blocking calls release the GIL. Keys are 1-D uint64 arrays (non-negative "
                       "int64, e.g. torch ids, are reinterpreted in place); values are float32, C-contiguous, of "
                       "shape (n, width) or flat. NumPy arrays and CPU torch tensors are used in place, never "
                       "copied. Usable as a context manager (close() at exit).");
  BindWorkerSetup(cls);
  BindWorkerRequests(cls);
  BindWorkerEnd(cls);
}

void BindSparseBatch(py::module_& m) {
  py::class_<SparseBatch>(m, "SparseBatch",
                          "The distinct keys of a batch (first-occurrence order) and, per position, the index of "
                          "its key among them (common/sparse_batch.h). Dedups a lookup on the worker.")
      .def(py::init([](py::handle keys) {
             py::array holder;
             std::span<const Key> k = KeysOf(keys, holder);
             absl::StatusOr<SparseBatch> b;
             {
               py::gil_scoped_release release;
               b = SparseBatch::Build(k);
             }
             ThrowIfError(b.status());
             return std::move(*b);
           }),
           py::arg("keys"), "Builds the batch from 1-D uint64 (or non-negative int64) keys.")
      .def_property_readonly(
          "unique",
          [](py::object self) {
            const auto& b = self.cast<const SparseBatch&>();
            py::array_t<uint64_t> a({static_cast<py::ssize_t>(b.unique().size())}, {sizeof(uint64_t)},
                                    b.unique().data(), self);
            a.attr("setflags")(py::arg("write") = false);
            return a;
          },
          "The distinct keys (uint64, a read-only view into the batch).")
      .def_property_readonly(
          "inverse",
          [](py::object self) {
            const auto& b = self.cast<const SparseBatch&>();
            py::array_t<uint32_t> a({static_cast<py::ssize_t>(b.inverse().size())}, {sizeof(uint32_t)},
                                    b.inverse().data(), self);
            a.attr("setflags")(py::arg("write") = false);
            return a;
          },
          "Per position, the index of its key in `unique` (uint32, a read-only view into the batch).")
      .def("__len__", [](const SparseBatch& b) { return b.positions(); })
      .def(
          "gather",
          [](const SparseBatch& b, py::handle unique_rows, std::optional<uint32_t> width, py::object out) {
            uint32_t w = 0;
            py::array rows = BatchRows(unique_rows, "unique_rows", b.unique().size(), width, w);
            py::array o = out.is_none() ? NewRows(b.positions(), w) : RowsOf(out, "out", b.positions(), w, true);
            ThrowIfError(b.Gather(ConstFloats(rows), w, MutableFloats(o)));
            return out.is_none() ? py::object(o) : out;
          },
          py::arg("unique_rows"), py::arg("width") = py::none(), py::arg("out") = py::none(),
          "Expands rows of the unique keys (float32, (len(unique), width)) to every position: returns "
          "(positions, width), or writes `out`.")
      .def(
          "scatter_add",
          [](const SparseBatch& b, py::handle grads, std::optional<uint32_t> width, py::object out) {
            uint32_t w = 0;
            py::array g = BatchRows(grads, "grads", b.positions(), width, w);
            py::array o = out.is_none() ? NewRows(b.unique().size(), w) : RowsOf(out, "out", b.unique().size(), w, true);
            ThrowIfError(b.ScatterAdd(ConstFloats(g), w, MutableFloats(o)));
            return out.is_none() ? py::object(o) : out;
          },
          py::arg("grads"), py::arg("width") = py::none(), py::arg("out") = py::none(),
          "Sums per-position rows (float32, (positions, width)) into one row per unique key: returns "
          "(len(unique), width), or overwrites `out`.");

}

}  // namespace

void BindData(py::module_& m);  // data_bindings.cc

}  // namespace tessera::python

PYBIND11_MODULE(_tessera, m) {
  using namespace tessera;          // NOLINT: the binding names every type of both
  using namespace tessera::python;  // NOLINT
  m.doc() =
      "Tessera's worker library (the parameter-server client) for Python.\n\n"
      "Use the `tessera` package, which re-exports this module: tessera.Worker.connect(...) or\n"
      "tessera.Worker.from_args() in a program started by tessera-launch.";

  BindErrors(m);
  BindFuture(m);
  BindWorker(m);
  BindSparseBatch(m);

  py::dict defaults;
  const TableOptions d;
  for (const TableField& f : TableFields()) defaults[py::str(f.name)] = f.get(d);
  m.attr("TABLE_OPTION_DEFAULTS") = defaults;
  BindData(m);
}
