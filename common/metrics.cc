#include "common/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"

namespace tessera::metrics {
namespace {

bool ValidName(const std::string& s, bool colon) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon && c == ':') ||
                    (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

std::string Escape(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::abs(v) < 1e15) return absl::StrFormat("%.0f", v);
  return absl::StrFormat("%.17g", v);
}

// {a="1",b="2"}, with `extra` (e.g. le="0.5") appended; "" when empty.
std::string LabelText(const Labels& labels, const std::string& extra = "") {
  if (labels.empty() && extra.empty()) return "";
  std::string s = "{";
  for (size_t i = 0; i < labels.size(); ++i) {
    absl::StrAppend(&s, i ? "," : "", labels[i].first, "=\"", Escape(labels[i].second), "\"");
  }
  if (!extra.empty()) absl::StrAppend(&s, labels.empty() ? "" : ",", extra);
  return s + "}";
}

}  // namespace

void Counter::Add(double v) {
  if (!(v >= 0)) {
    if (rejected_) rejected_->fetch_add(1, std::memory_order_relaxed);
    return;
  }
  value_.fetch_add(v, std::memory_order_relaxed);
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), buckets_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0);
}

void Histogram::Observe(double v) {
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();  // v <= bound
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

std::vector<uint64_t> Histogram::counts() const {
  std::vector<uint64_t> c(bounds_.size() + 1);
  for (size_t i = 0; i < c.size(); ++i) c[i] = buckets_[i].load(std::memory_order_relaxed);
  return c;
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> b;
  for (int i = 0; i < count; ++i, start *= factor) b.push_back(start);
  return b;
}

Registry::Registry() = default;

Registry& Registry::Default() {
  static Registry* r = new Registry();
  return *r;
}

absl::StatusOr<Registry::Family*> Registry::FamilyFor(const std::string& name, const std::string& help, Type type,
                                                      Labels& labels) {
  if (!ValidName(name, true)) return absl::InvalidArgumentError(absl::StrCat("bad metric name \"", name, "\""));
  for (const auto& [k, v] : labels) {
    if (!ValidName(k, false) || k == "le") {
      return absl::InvalidArgumentError(absl::StrCat("bad label name \"", k, "\" of metric ", name));
    }
  }
  std::sort(labels.begin(), labels.end());
  auto [it, inserted] = families_.try_emplace(name, Family{type, help, {}, {}, {}});
  if (!inserted && it->second.type != type) {
    return absl::AlreadyExistsError(absl::StrCat("metric ", name, " exists with another type"));
  }
  return &it->second;
}

absl::StatusOr<Counter*> Registry::GetCounter(const std::string& name, const std::string& help, Labels labels) {
  std::lock_guard lock(mu_);
  auto f = FamilyFor(name, help, Type::kCounter, labels);
  if (!f.ok()) return f.status();
  auto& slot = (*f)->counters[labels];
  if (!slot) {
    slot = std::make_unique<Counter>();
    slot->rejected_ = &rejected_;
  }
  return slot.get();
}

absl::StatusOr<Gauge*> Registry::GetGauge(const std::string& name, const std::string& help, Labels labels) {
  std::lock_guard lock(mu_);
  auto f = FamilyFor(name, help, Type::kGauge, labels);
  if (!f.ok()) return f.status();
  auto& slot = (*f)->gauges[labels];
  if (!slot) slot = std::make_unique<Gauge>();
  return slot.get();
}

absl::StatusOr<Histogram*> Registry::GetHistogram(const std::string& name, const std::string& help,
                                                  std::vector<double> bounds, Labels labels) {
  for (size_t i = 1; i < bounds.size(); ++i) {
    if (!(bounds[i] > bounds[i - 1])) {
      return absl::InvalidArgumentError(absl::StrCat("histogram ", name, ": bucket bounds must increase"));
    }
  }
  std::lock_guard lock(mu_);
  auto f = FamilyFor(name, help, Type::kHistogram, labels);
  if (!f.ok()) return f.status();
  auto& slot = (*f)->histograms[labels];
  if (!slot) slot = std::make_unique<Histogram>(std::move(bounds));
  return slot.get();
}

TextWriter& TextWriter::Counter(const std::string& name, const std::string& help, double value,
                                const Labels& labels) {
  absl::StrAppend(&text_, "# HELP ", name, " ", help, "\n# TYPE ", name, " counter\n", name, LabelText(labels), " ",
                  FormatValue(value), "\n");
  return *this;
}

TextWriter& TextWriter::Gauge(const std::string& name, const std::string& help, double value, const Labels& labels) {
  absl::StrAppend(&text_, "# HELP ", name, " ", help, "\n# TYPE ", name, " gauge\n", name, LabelText(labels), " ",
                  FormatValue(value), "\n");
  return *this;
}

namespace {
void AppendSeries(std::string& text, const std::string& name, const std::string& help, const char* type,
                  const TextWriter::Series& series) {
  if (series.empty()) return;
  absl::StrAppend(&text, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
  for (const auto& [labels, value] : series)
    absl::StrAppend(&text, name, LabelText(labels), " ", FormatValue(value), "\n");
}
}  // namespace

TextWriter& TextWriter::Counters(const std::string& name, const std::string& help, const Series& series) {
  AppendSeries(text_, name, help, "counter", series);
  return *this;
}

TextWriter& TextWriter::Gauges(const std::string& name, const std::string& help, const Series& series) {
  AppendSeries(text_, name, help, "gauge", series);
  return *this;
}

TextWriter& TextWriter::Histogram(const std::string& name, const std::string& help, const std::vector<double>& bounds,
                                  const std::vector<uint64_t>& counts, double sum, const Labels& labels) {
  absl::StrAppend(&text_, "# HELP ", name, " ", help, "\n# TYPE ", name, " histogram\n");
  uint64_t cumulative = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    cumulative += counts[i];
    const std::string le = i < bounds.size() ? FormatValue(bounds[i]) : "+Inf";
    absl::StrAppend(&text_, name, "_bucket", LabelText(labels, absl::StrCat("le=\"", le, "\"")), " ", cumulative,
                    "\n");
  }
  absl::StrAppend(&text_, name, "_sum", LabelText(labels), " ", FormatValue(sum), "\n", name, "_count",
                  LabelText(labels), " ", cumulative, "\n");
  return *this;
}

std::string Registry::Render() const {
  std::lock_guard lock(mu_);
  std::string out;
  for (const auto& [name, f] : families_) {
    const char* type = f.type == Type::kCounter ? "counter" : f.type == Type::kGauge ? "gauge" : "histogram";
    absl::StrAppend(&out, "# HELP ", name, " ", f.help, "\n# TYPE ", name, " ", type, "\n");
    for (const auto& [labels, c] : f.counters) absl::StrAppend(&out, name, LabelText(labels), " ", FormatValue(c->value()), "\n");
    for (const auto& [labels, g] : f.gauges) absl::StrAppend(&out, name, LabelText(labels), " ", FormatValue(g->value()), "\n");
    for (const auto& [labels, h] : f.histograms) {
      const std::vector<uint64_t> counts = h->counts();
      uint64_t cumulative = 0;
      for (size_t i = 0; i < counts.size(); ++i) {
        cumulative += counts[i];
        const std::string le = i < h->bounds().size() ? FormatValue(h->bounds()[i]) : "+Inf";
        absl::StrAppend(&out, name, "_bucket", LabelText(labels, absl::StrCat("le=\"", le, "\"")), " ", cumulative,
                        "\n");
      }
      absl::StrAppend(&out, name, "_sum", LabelText(labels), " ", FormatValue(h->sum()), "\n");
      absl::StrAppend(&out, name, "_count", LabelText(labels), " ", cumulative, "\n");
    }
  }
  absl::StrAppend(&out, "# HELP tessera_metrics_rejected_total Negative counter increments ignored\n",
                  "# TYPE tessera_metrics_rejected_total counter\n", "tessera_metrics_rejected_total ",
                  FormatValue(rejected_.load()), "\n");
  return out;
}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(const std::string& host, uint16_t port,
                                                                            std::function<std::string()> render) {
  const std::string where = absl::StrCat(host, ":", port);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("metrics: \"", host, "\" is not an IPv4 address"));
  }
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("metrics: socket: ", std::strerror(errno)));
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || listen(fd, 16) != 0) {
    const int e = errno;
    close(fd);
    return absl::UnavailableError(absl::StrCat("metrics: cannot listen on ", where, ": ", std::strerror(e)));
  }
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  return std::unique_ptr<MetricsHttpServer>(new MetricsHttpServer(fd, ntohs(addr.sin_port), std::move(render)));
}

MetricsHttpServer::MetricsHttpServer(int fd, uint16_t port, std::function<std::string()> render)
    : fd_(fd), port_(port), render_(std::move(render)) {
  thread_ = std::thread([this] { Loop(); });
}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

void MetricsHttpServer::Stop() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  if (fd_ >= 0) {
    close(fd_);
    fd_ = -1;
  }
}

void MetricsHttpServer::Loop() {
  while (!stop_.load()) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    const int c = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) continue;
    timeval tv{1, 0};  // a client that sends nothing does not block the server for long
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    std::string request;
    char buf[2048];
    while (request.find("\r\n\r\n") == std::string::npos && request.size() < 16384) {
      const ssize_t n = recv(c, buf, sizeof buf, 0);
      if (n <= 0) break;
      request.append(buf, static_cast<size_t>(n));
    }
    std::string status = "404 Not Found", body = "not found; metrics are at /metrics\n";
    const size_t eol = request.find("\r\n");
    const std::string line = request.substr(0, eol);
    if (line.rfind("GET /metrics ", 0) == 0 || line.rfind("GET /metrics?", 0) == 0) {
      status = "200 OK";
      body = render_();
    } else if (line.rfind("GET ", 0) != 0) {
      status = "405 Method Not Allowed";
      body = "only GET\n";
    }
    const std::string response =
        absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n",
                     "Content-Length: ", body.size(), "\r\nConnection: close\r\n\r\n", body);
    size_t sent = 0;
    while (sent < response.size()) {
      const ssize_t n = send(c, response.data() + sent, response.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += static_cast<size_t>(n);
    }
    close(c);
  }
}

bool ServeIfAsked(const std::string& host, int port, std::function<std::string()> render,
                  std::unique_ptr<MetricsHttpServer>* server) {
  server->reset();
  if (port < 0) return true;
  auto started = MetricsHttpServer::Start(host, static_cast<uint16_t>(port), std::move(render));
  if (!started.ok()) {
    TLOG_ERROR("{}", started.status().message());
    return false;
  }
  *server = std::move(*started);
  TLOG_INFO("metrics at http://{}:{}/metrics", host, (*server)->port());
  return true;
}

}  // namespace tessera::metrics
