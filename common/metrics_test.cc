#include "common/metrics.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

namespace tessera::metrics {
namespace {

TEST(MetricsTest, RendersCountersGaugesAndHistogramsInTheTextFormat) {
  Registry r;
  auto pushes = r.GetCounter("tessera_pushes_total", "Pushes sent", {{"table", "0"}});
  ASSERT_TRUE(pushes.ok());
  (*pushes)->Add();
  (*pushes)->Add(2);
  (*pushes)->Add(-5);  // ignored
  ASSERT_EQ(*r.GetCounter("tessera_pushes_total", "Pushes sent", {{"table", "0"}}), *pushes) << "same series";
  auto g = r.GetGauge("tessera_queue_depth", "Queued requests");
  ASSERT_TRUE(g.ok());
  (*g)->Set(4);
  auto h = r.GetHistogram("tessera_latency_seconds", "Latency", {0.001, 0.01}, {{"op", "pu\"ll"}});
  ASSERT_TRUE(h.ok());
  (*h)->Observe(0.0005);
  (*h)->Observe(0.005);
  (*h)->Observe(0.005);
  (*h)->Observe(3);
  const std::string text = r.Render();
  EXPECT_NE(text.find("# TYPE tessera_pushes_total counter\ntessera_pushes_total{table=\"0\"} 3\n"),
            std::string::npos) << text;
  EXPECT_NE(text.find("tessera_queue_depth 4\n"), std::string::npos) << text;
  EXPECT_NE(text.find("tessera_latency_seconds_bucket{op=\"pu\\\"ll\",le=\"0.001\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("tessera_latency_seconds_bucket{op=\"pu\\\"ll\",le=\"0.01\"} 3\n"), std::string::npos) << text;
  EXPECT_NE(text.find("tessera_latency_seconds_bucket{op=\"pu\\\"ll\",le=\"+Inf\"} 4\n"), std::string::npos) << text;
  EXPECT_NE(text.find("tessera_latency_seconds_count{op=\"pu\\\"ll\"} 4\n"), std::string::npos) << text;
  EXPECT_NE(text.find("tessera_metrics_rejected_total 1\n"), std::string::npos) << text;
}

TEST(MetricsTest, TextWriterWritesSeriesFromPlainValues) {
  TextWriter w;
  w.Counter("tessera_a_total", "A", 3, {{"role", "server"}})
      .Gauge("tessera_b", "B", 1.5)
      .Histogram("tessera_c", "C", {0, 1}, {2, 0, 1}, 7);
  const std::string& t = w.text();
  EXPECT_NE(t.find("# TYPE tessera_a_total counter\ntessera_a_total{role=\"server\"} 3\n"), std::string::npos) << t;
  EXPECT_NE(t.find("tessera_b 1.5\n"), std::string::npos) << t;
  EXPECT_NE(t.find("tessera_c_bucket{le=\"1\"} 2\ntessera_c_bucket{le=\"+Inf\"} 3\n"), std::string::npos) << t;
  EXPECT_NE(t.find("tessera_c_count 3\n"), std::string::npos) << t;
}

TEST(MetricsTest, TextWriterWritesSeveralSeriesOfOneNameUnderOneHeader) {
  TextWriter w;
  w.Counters("tessera_rows_total", "Rows", {{{{"table", "1"}}, 4}, {{{"table", "2"}}, 5}})
      .Gauges("tessera_empty", "Nothing", {});
  const std::string& t = w.text();
  EXPECT_EQ(t,
            "# HELP tessera_rows_total Rows\n# TYPE tessera_rows_total counter\n"
            "tessera_rows_total{table=\"1\"} 4\ntessera_rows_total{table=\"2\"} 5\n");
}

TEST(MetricsTest, RejectsBadNamesAndTypeClashes) {
  Registry r;
  EXPECT_FALSE(r.GetCounter("9lives", "x").ok());
  EXPECT_FALSE(r.GetCounter("a-b", "x").ok());
  EXPECT_FALSE(r.GetCounter("ok", "x", {{"bad-label", "v"}}).ok());
  EXPECT_FALSE(r.GetCounter("ok", "x", {{"le", "v"}}).ok());
  ASSERT_TRUE(r.GetCounter("ok", "x").ok());
  EXPECT_FALSE(r.GetGauge("ok", "x").ok());
  EXPECT_FALSE(r.GetHistogram("h", "x", {1, 1}).ok());
}

std::string Get(uint16_t port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return "connect failed";
  }
  const std::string req = "GET " + path + " HTTP/1.1\r\nHost: x\r\n\r\n";
  (void)send(fd, req.data(), req.size(), 0);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof buf, 0)) > 0) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out;
}

TEST(MetricsTest, ServesMetricsOverHttpWithIncreasingCounters) {
  Registry r;
  Counter* c = *r.GetCounter("tessera_things_total", "Things");
  auto server = MetricsHttpServer::Start("127.0.0.1", 0, [&] { return r.Render(); });
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_NE((*server)->port(), 0);
  c->Add(5);
  std::string first = Get((*server)->port(), "/metrics");
  EXPECT_EQ(first.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << first;
  EXPECT_NE(first.find("tessera_things_total 5\n"), std::string::npos) << first;
  c->Add(2);
  EXPECT_NE(Get((*server)->port(), "/metrics").find("tessera_things_total 7\n"), std::string::npos);
  EXPECT_EQ(Get((*server)->port(), "/other").rfind("HTTP/1.1 404", 0), 0u);
  (*server)->Stop();
  EXPECT_EQ(Get((*server)->port(), "/metrics"), "connect failed");
  EXPECT_FALSE(MetricsHttpServer::Start("not-an-ip", 0, [] { return std::string(); }).ok());
}

}  // namespace
}  // namespace tessera::metrics
