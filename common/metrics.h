#pragma once
// Metrics in the Prometheus text exposition format (version 0.0.4), and a
// small HTTP server that serves them at /metrics.
//
// Registry: named series (counters, gauges, histograms), each with optional
// labels. Get* returns the same object for the same name and labels, so a
// hot path looks a series up once and keeps the reference; updates are
// lock-free atomics. Render() writes every series, grouped by name, with one
// # HELP and # TYPE line per name, names and label sets sorted, so the output
// is deterministic.
//
// Promises:
// - A name must match [a-zA-Z_:][a-zA-Z0-9_:]* and a label name
//   [a-zA-Z_][a-zA-Z0-9_]*; a bad one, or reusing a name with another type,
//   is a programming error reported by Get* as an error status.
// - Counters only go up (Add of a negative amount is ignored and counted in
//   tessera_metrics_rejected_total).
// - Label values are escaped (backslash, double quote, newline).
// - Series live as long as the registry; references stay valid.
//
// MetricsHttpServer: one thread; answers GET /metrics with Render() and any
// other path with 404; one request per connection. Stop() (or the
// destructor) returns within about 100 ms.
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace tessera::metrics {

using Labels = std::vector<std::pair<std::string, std::string>>;

class Counter {
 public:
  void Add(double v = 1.0);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  friend class Registry;
  std::atomic<double> value_{0};
  std::atomic<double>* rejected_ = nullptr;
};

class Gauge {
 public:
  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Add(double v) { value_.fetch_add(v, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Histogram {
 public:
  // `bounds`: strictly increasing upper bounds; +Inf is implied.
  explicit Histogram(std::vector<double> bounds);
  void Observe(double v);
  const std::vector<double>& bounds() const { return bounds_; }
  // Per bucket (not cumulative), the last one being +Inf.
  std::vector<uint64_t> counts() const;
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }
  double sum() const { return sum_.load(std::memory_order_relaxed); }

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;
  std::atomic<uint64_t> count_{0};
  std::atomic<double> sum_{0};
};

// Exponential bucket bounds: start, start*factor, ... (count of them).
std::vector<double> ExponentialBuckets(double start, double factor, int count);

class Registry {
 public:
  Registry();
  absl::StatusOr<Counter*> GetCounter(const std::string& name, const std::string& help, Labels labels = {});
  absl::StatusOr<Gauge*> GetGauge(const std::string& name, const std::string& help, Labels labels = {});
  absl::StatusOr<Histogram*> GetHistogram(const std::string& name, const std::string& help,
                                          std::vector<double> bounds, Labels labels = {});
  std::string Render() const;

  // The process-wide registry the binaries serve.
  static Registry& Default();

 private:
  enum class Type { kCounter, kGauge, kHistogram };
  struct Family {
    Type type;
    std::string help;
    std::map<Labels, std::unique_ptr<Counter>> counters;
    std::map<Labels, std::unique_ptr<Gauge>> gauges;
    std::map<Labels, std::unique_ptr<Histogram>> histograms;
  };
  absl::StatusOr<Family*> FamilyFor(const std::string& name, const std::string& help, Type type, Labels& labels);

  mutable std::mutex mu_;
  std::map<std::string, Family> families_;  // guarded by mu_
  std::atomic<double> rejected_{0};
};

// Writes series from values a component already keeps (its stats struct),
// in the same text format, for a render callback: one # HELP/# TYPE per call.
class TextWriter {
 public:
  TextWriter& Counter(const std::string& name, const std::string& help, double value, const Labels& labels = {});
  TextWriter& Gauge(const std::string& name, const std::string& help, double value, const Labels& labels = {});
  // Several series of one name (one # HELP/# TYPE for all); nothing when
  // `series` is empty.
  using Series = std::vector<std::pair<Labels, double>>;
  TextWriter& Counters(const std::string& name, const std::string& help, const Series& series);
  TextWriter& Gauges(const std::string& name, const std::string& help, const Series& series);
  // counts: per bucket (not cumulative), one more than bounds (the last is +Inf).
  TextWriter& Histogram(const std::string& name, const std::string& help, const std::vector<double>& bounds,
                        const std::vector<uint64_t>& counts, double sum, const Labels& labels = {});
  const std::string& text() const { return text_; }

 private:
  std::string text_;
};

class MetricsHttpServer {
 public:
  // Listens on host:port (port 0: any free port). Errors name the address.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(const std::string& host, uint16_t port,
                                                                  std::function<std::string()> render);
  ~MetricsHttpServer();
  uint16_t port() const { return port_; }
  void Stop();

 private:
  MetricsHttpServer(int fd, uint16_t port, std::function<std::string()> render);
  void Loop();

  int fd_;
  uint16_t port_;
  std::function<std::string()> render_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// For a binary's --metrics-port flag: with port < 0 (off) leaves *server
// null and returns true; else starts the endpoint into *server and logs its
// URL ("metrics at http://HOST:PORT/metrics"), or logs why it could not and
// returns false.
bool ServeIfAsked(const std::string& host, int port, std::function<std::string()> render,
                  std::unique_ptr<MetricsHttpServer>* server);

}  // namespace tessera::metrics
