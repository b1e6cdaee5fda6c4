// Runs the tessera-doctor-probe binary (path from the build) and checks its
// one-line JSON against what this process sees itself.
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "rdma/doctor_probe_json.h"
#include "rdma/rdma_devices.h"
#include "rdma/rdma_transport.h"

#ifndef TESSERA_DOCTOR_PROBE_PATH
#error "TESSERA_DOCTOR_PROBE_PATH must name the probe binary"
#endif

namespace tessera::rdma {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// A running probe with its stdout on a pipe.
struct Probe {
  pid_t pid = -1;
  int out = -1;

  explicit Probe(const std::vector<std::string>& args) {
    int fds[2];
    if (pipe(fds) != 0) return;
    pid = fork();
    if (pid == 0) {
      dup2(fds[1], STDOUT_FILENO);
      close(fds[0]);
      close(fds[1]);
      std::vector<char*> argv;
      std::string path = TESSERA_DOCTOR_PROBE_PATH;
      argv.push_back(path.data());
      std::vector<std::string> copy = args;
      for (std::string& a : copy) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(path.c_str(), argv.data());
      _exit(127);
    }
    close(fds[1]);
    out = fds[0];
  }
  ~Probe() {
    if (out >= 0) close(out);
    if (pid > 0) Wait();
  }
  // Reads up to and including the first newline (or EOF).
  std::string ReadLine() {
    std::string line;
    char c;
    while (read(out, &c, 1) == 1) {
      line += c;
      if (c == '\n') break;
    }
    return line;
  }
  std::string ReadAll() {
    std::string all;
    char buf[4096];
    ssize_t n;
    while ((n = read(out, buf, sizeof(buf))) > 0) all.append(buf, static_cast<size_t>(n));
    return all;
  }
  int Wait() {
    int status = 0;
    waitpid(pid, &status, 0);
    pid = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
};

// A strict validator for the JSON subset the probe writes.
class JsonChecker {
 public:
  explicit JsonChecker(const std::string& s) : s_(s) {}
  bool Valid() {
    Ws();
    if (!Value()) return false;
    Ws();
    return i_ == s_.size();
  }

 private:
  void Ws() {
    while (i_ < s_.size() && (s_[i_] == ' ')) ++i_;
  }
  bool Lit(const char* w) {
    const size_t n = std::strlen(w);
    if (s_.compare(i_, n, w) != 0) return false;
    i_ += n;
    return true;
  }
  bool String() {
    if (i_ >= s_.size() || s_[i_] != '"') return false;
    for (++i_; i_ < s_.size(); ++i_) {
      const unsigned char c = static_cast<unsigned char>(s_[i_]);
      if (c == '"') {
        ++i_;
        return true;
      }
      if (c < 0x20) return false;
      if (c == '\\') {
        if (++i_ >= s_.size()) return false;
        if (s_[i_] == 'u') {
          for (int k = 0; k < 4; ++k) {
            if (++i_ >= s_.size() || !std::isxdigit(static_cast<unsigned char>(s_[i_]))) return false;
          }
        } else if (std::strchr("\"\\/bfnrt", s_[i_]) == nullptr) {
          return false;
        }
      }
    }
    return false;
  }
  bool Number() {
    const size_t start = i_;
    if (i_ < s_.size() && s_[i_] == '-') ++i_;
    while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
    return i_ > start && std::isdigit(static_cast<unsigned char>(s_[i_ - 1]));
  }
  bool Value() {
    Ws();
    if (i_ >= s_.size()) return false;
    const char c = s_[i_];
    if (c == '{') return Container('}', true);
    if (c == '[') return Container(']', false);
    if (c == '"') return String();
    if (c == 't') return Lit("true");
    if (c == 'f') return Lit("false");
    return Number();
  }
  bool Container(char close, bool object) {
    ++i_;
    Ws();
    if (i_ < s_.size() && s_[i_] == close) {
      ++i_;
      return true;
    }
    for (;;) {
      Ws();
      if (object) {
        if (!String()) return false;
        Ws();
        if (!Lit(":")) return false;
      }
      if (!Value()) return false;
      Ws();
      if (i_ < s_.size() && s_[i_] == ',') {
        ++i_;
        continue;
      }
      if (i_ < s_.size() && s_[i_] == close) {
        ++i_;
        return true;
      }
      return false;
    }
  }
  const std::string& s_;
  size_t i_ = 0;
};

// The text after `"key": ` up to the next ',' or '}' (numbers, booleans) or the quoted string.
std::optional<std::string> Field(const std::string& json, const std::string& key) {
  const std::string needle = "\"" + key + "\": ";
  const size_t at = json.find(needle);
  if (at == std::string::npos) return std::nullopt;
  size_t i = at + needle.size();
  if (json[i] == '"') {
    std::string out;
    for (++i; i < json.size() && json[i] != '"'; ++i) {
      if (json[i] == '\\') ++i;
      out += json[i];
    }
    return out;
  }
  const size_t end = json.find_first_of(",}]", i);
  return json.substr(i, end - i);
}

TEST(probeDoctorTest, PrintsOneValidJsonLineAndExitsZero) {
  Probe probe({});
  const std::string all = probe.ReadAll();
  EXPECT_EQ(probe.Wait(), 0);
  ASSERT_FALSE(all.empty());
  EXPECT_EQ(all.back(), '\n');
  EXPECT_EQ(std::count(all.begin(), all.end(), '\n'), 1) << all;
  const std::string line = all.substr(0, all.size() - 1);
  EXPECT_TRUE(JsonChecker(line).Valid()) << line;
  EXPECT_THAT(line, StartsWith("{\"host\": \""));
  EXPECT_EQ(line.find("\"listen\""), std::string::npos);

  // RDMA: the same verdict as the library, word for word.
  const absl::Status usable = Usable();
  EXPECT_EQ(Field(line, "usable"), usable.ok() ? "true" : "false");
  if (!usable.ok()) {
    EXPECT_EQ(Field(line, "reason"), std::string(usable.message()));
    if (BuiltWithVerbs() && !ListRdmaDevices().ok()) {
      EXPECT_THAT(*Field(line, "reason"), HasSubstr("ibv_get_device_list"));
      EXPECT_THAT(line, HasSubstr("\"devices\": [], \"test_registration\": {\"ok\": false, \"bytes\": 67108864, "
                                  "\"error\": \"no device\"}"));
      EXPECT_THAT(line, HasSubstr("\"gpudirect\": {\"available\": false"));
    }
  }

  // memlock: the limits this process has (the child inherits them).
  rlimit limit{};
  ASSERT_EQ(getrlimit(RLIMIT_MEMLOCK, &limit), 0);
  auto expect = [](rlim_t v) { return v == RLIM_INFINITY ? std::string("-1") : std::to_string(v); };
  EXPECT_EQ(Field(line, "soft"), expect(limit.rlim_cur));
  EXPECT_EQ(Field(line, "hard"), expect(limit.rlim_max));
  EXPECT_EQ(Field(line, "unlimited"), limit.rlim_cur == RLIM_INFINITY ? "true" : "false");

  // CUDA: no driver library here means "not available" with that reason.
  void* cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (cuda == nullptr) {
    EXPECT_THAT(line, HasSubstr("\"cuda\": {\"available\": false, \"devices\": [], \"error\": \"libcuda.so.1 not found\"}"));
  } else {
    dlclose(cuda);
    EXPECT_TRUE(Field(line, "available").has_value());
  }
}

TEST(probeDoctorTest, PoolBytesIsWhatItTriesToRegister) {
  Probe probe({"--pool-bytes", "4096"});
  const std::string line = probe.ReadLine();
  EXPECT_EQ(probe.Wait(), 0);
  EXPECT_EQ(Field(line, "bytes"), "4096");
  Probe equals({"--pool-bytes=8192"});
  EXPECT_EQ(Field(equals.ReadLine(), "bytes"), "8192");
}

TEST(probeDoctorTest, ListenReportsAConnectablePortThatAnswersTheBanner) {
  const auto start = std::chrono::steady_clock::now();
  Probe probe({"--listen", "127.0.0.1", "--listen-seconds", "3"});
  const std::string line = probe.ReadLine();
  ASSERT_TRUE(JsonChecker(line.substr(0, line.size() - 1)).Valid()) << line;
  EXPECT_THAT(line, HasSubstr("\"listen\": {\"host\": \"127.0.0.1\", \"port\": "));
  std::optional<std::string> port_text = Field(line, "port");
  ASSERT_TRUE(port_text.has_value());
  const int port = std::stoi(*port_text);
  ASSERT_GT(port, 0);
  ASSERT_LT(port, 65536);
  for (int i = 0; i < 2; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << std::strerror(errno);
    std::string banner;
    char buf[64];
    ssize_t n;
    while ((n = read(fd, buf, sizeof(buf))) > 0) banner.append(buf, static_cast<size_t>(n));
    close(fd);
    EXPECT_EQ(banner, "tessera-doctor-probe\n");
  }
  EXPECT_EQ(probe.Wait(), 0);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(seconds, 2.5) << "stopped listening early";
  EXPECT_LT(seconds, 30.0);
}

TEST(probeDoctorTest, ListenFailureIsReportedNotFatal) {
  Probe probe({"--listen", "203.0.113.77", "--listen-seconds", "1"});  // an address this host does not have
  const std::string line = probe.ReadLine();
  EXPECT_EQ(probe.Wait(), 0);
  EXPECT_THAT(line, HasSubstr("\"listen\": {\"host\": \"203.0.113.77\", \"port\": 0, \"error\": \"cannot listen"));
}

TEST(probeDoctorTest, HelpAndBadArguments) {
  Probe help({"--help"});
  EXPECT_THAT(help.ReadAll(), HasSubstr("usage: tessera-doctor-probe"));
  EXPECT_EQ(help.Wait(), 0);
  for (std::vector<std::string> bad : std::vector<std::vector<std::string>>{
           {"--bogus"}, {"--pool-bytes"}, {"--pool-bytes", "lots"}, {"--listen-seconds", "-1"}}) {
    Probe p(bad);
    EXPECT_EQ(p.ReadAll(), "") << bad[0];
    EXPECT_EQ(p.Wait(), 2) << bad[0];
  }
}

TEST(probeDoctorTest, JsonStringsAreEscaped) {
  EXPECT_EQ(JsonQuote("plain"), "\"plain\"");
  EXPECT_EQ(JsonQuote("a\"b\\c"), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(JsonQuote("line\nnext\ttab\r"), "\"line\\nnext\\ttab\\r\"");
  EXPECT_EQ(JsonQuote(std::string("nul\0x", 5)), "\"nul\\u0000x\"");
  EXPECT_EQ(JsonQuote("\x01\x1f"), "\"\\u0001\\u001f\"");
  EXPECT_EQ(JsonQuote("caf\xc3\xa9"), "\"caf\xc3\xa9\"");  // UTF-8 passes through
  JsonLine j;
  j.BeginObject().String("k", "v\"").BeginArray("a").BeginObject().Int("n", -1).EndObject().EndArray().Bool("b", true).EndObject();
  EXPECT_EQ(j.text(), "{\"k\": \"v\\\"\", \"a\": [{\"n\": -1}], \"b\": true}");
  EXPECT_TRUE(JsonChecker(j.text()).Valid());
}

}  // namespace
}  // namespace tessera::rdma
