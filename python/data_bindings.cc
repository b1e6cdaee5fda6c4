// Python bindings of the synthetic recommender data (examples/criteo_synth.h)
// and the exact AUC (examples/synthetic_clicklog.h), for the examples and
// tests: tessera.CriteoSynth, tessera.auc. Part of the _tessera module
// (BindData is called from its PYBIND11_MODULE).
//
// Zero-copy: a batch's arrays are NumPy views of the generator's own
// vectors, which a capsule keeps alive as long as any view exists.
#include <memory>
#include <string>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "examples/criteo_synth.h"
#include "examples/synthetic_clicklog.h"

namespace py = pybind11;

namespace tessera::python {
namespace {

// A NumPy array over `v` (kept alive by `owner`), shaped (rows, cols) or
// (rows,) when cols == 0.
template <typename T>
py::array View(std::vector<T>& v, size_t rows, size_t cols, const py::capsule& owner) {
  if (cols == 0) return py::array_t<T>({rows}, {sizeof(T)}, v.data(), owner);
  return py::array_t<T>({rows, cols}, {cols * sizeof(T), sizeof(T)}, v.data(), owner);
}

py::dict ToDict(examples::CriteoBatch&& batch) {
  auto* owned = new examples::CriteoBatch(std::move(batch));
  py::capsule owner(owned, [](void* p) { delete static_cast<examples::CriteoBatch*>(p); });
  const size_t n = owned->size();
  py::dict d;
  d["dense"] = View(owned->dense, n, owned->dense_fields, owner);
  d["keys"] = View(owned->keys, n, owned->categorical_fields, owner);
  d["labels"] = View(owned->labels, n, 0, owner);
  d["truth_logits"] = View(owned->truth_logits, n, 0, owner);
  return d;
}

template <typename T>
T Unwrap(absl::StatusOr<T> v) {
  if (!v.ok()) throw py::value_error(std::string(v.status().message()));
  return std::move(*v);
}

}  // namespace

void BindData(py::module_& m) {
  py::class_<examples::CriteoSynth>(m, "CriteoSynth", R"doc(
A seeded Criteo-like click log (examples/criteo_synth.h): per example
`dense_fields` log1p counts and one id per categorical field (Zipf over
log-spaced cardinalities from tens to millions), labelled by a hidden model
with per-id weights and field-pair interactions. Example i of a stream
depends only on the options and i. Batches are dicts of NumPy arrays:
dense (n, dense_fields) float32, keys (n, categorical_fields) uint64 (the
parameter-server keys, distinct across fields), labels (n,) float32 0/1,
truth_logits (n,) float32 (the hidden model's score, for the truth AUC).)doc")
      .def(py::init([](uint32_t dense_fields, uint32_t categorical_fields, std::vector<uint64_t> cardinalities,
                       uint64_t min_cardinality, uint64_t max_cardinality, double zipf, uint64_t seed,
                       double logit_stddev, double truth_bias, double dense_share, double interaction_share,
                       uint32_t interaction_pairs) {
             examples::CriteoSynthOptions o;
             o.dense_fields = dense_fields;
             o.categorical_fields = categorical_fields;
             o.cardinalities = std::move(cardinalities);
             o.min_cardinality = min_cardinality;
             o.max_cardinality = max_cardinality;
             o.zipf = zipf;
             o.seed = seed;
             o.logit_stddev = logit_stddev;
             o.truth_bias = truth_bias;
             o.dense_share = dense_share;
             o.interaction_share = interaction_share;
             o.interaction_pairs = interaction_pairs;
             return Unwrap(examples::CriteoSynth::Create(o));
           }),
           py::kw_only(), py::arg("dense_fields") = 13, py::arg("categorical_fields") = 26,
           py::arg("cardinalities") = std::vector<uint64_t>{}, py::arg("min_cardinality") = 10,
           py::arg("max_cardinality") = 1'000'000, py::arg("zipf") = 1.1, py::arg("seed") = 7,
           py::arg("logit_stddev") = 1.2, py::arg("truth_bias") = -1.3, py::arg("dense_share") = 0.2,
           py::arg("interaction_share") = 0.3, py::arg("interaction_pairs") = 8)
      .def(
          "train_range",
          [](const examples::CriteoSynth& g, uint64_t begin, uint64_t end) {
            if (end < begin) throw py::value_error("train_range: end < begin");
            examples::CriteoBatch b;
            {
              py::gil_scoped_release release;
              b = g.TrainRange(begin, end);
            }
            return ToDict(std::move(b));
          },
          py::arg("begin"), py::arg("end"), "Examples [begin, end) of the train stream.")
      .def(
          "train_partition",
          [](const examples::CriteoSynth& g, uint32_t part, uint32_t num_parts, uint64_t total) {
            if (part >= num_parts) throw py::value_error("train_partition: part must be < num_parts");
            examples::CriteoBatch b;
            {
              py::gil_scoped_release release;
              b = g.TrainPartition(part, num_parts, total);
            }
            return ToDict(std::move(b));
          },
          py::arg("part"), py::arg("num_parts"), py::arg("total"),
          "Partition `part` of `num_parts` of a train set of `total` examples: indices "
          "[part*total/num_parts, (part+1)*total/num_parts).")
      .def(
          "test_set",
          [](const examples::CriteoSynth& g, uint64_t count) {
            examples::CriteoBatch b;
            {
              py::gil_scoped_release release;
              b = g.TestSet(count);
            }
            return ToDict(std::move(b));
          },
          py::arg("count"), "The first `count` examples of the held-out stream (the same for every worker).")
      .def("cardinality", &examples::CriteoSynth::cardinality, py::arg("field"), "Ids of categorical field `field`.")
      .def_property_readonly("dense_fields", [](const examples::CriteoSynth& g) { return g.options().dense_fields; })
      .def_property_readonly("categorical_fields",
                             [](const examples::CriteoSynth& g) { return g.options().categorical_fields; });

  m.def(
      "auc",
      [](py::array_t<float, py::array::c_style | py::array::forcecast> scores,
         py::array_t<float, py::array::c_style | py::array::forcecast> labels) {
        std::span<const float> s(scores.data(), static_cast<size_t>(scores.size()));
        std::span<const float> l(labels.data(), static_cast<size_t>(labels.size()));
        return Unwrap(examples::Auc(s, l));
      },
      py::arg("scores"), py::arg("labels"),
      "Exact area under the ROC curve of scores against 0/1 labels (ties count one half).");
}

}  // namespace tessera::python
