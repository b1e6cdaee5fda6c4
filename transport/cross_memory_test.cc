#include "transport/cross_memory.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <vector>

namespace tessera::xmem {
namespace {

// A child process holding `bytes` (a pattern) until the test closes `hold`;
// it tells the parent where they lie through a pipe.
struct Child {
  pid_t pid = -1;
  uint64_t address = 0;
  int hold = -1;  // write end: closing it lets the child exit

  static Child Start(size_t bytes) {
    int where[2], hold[2];
    EXPECT_EQ(::pipe(where), 0);
    EXPECT_EQ(::pipe(hold), 0);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(where[0]);
      ::close(hold[1]);
      std::vector<uint8_t> v(bytes);
      for (size_t i = 0; i < bytes; ++i) v[i] = static_cast<uint8_t>(i * 7 + 3);
      const uint64_t a = reinterpret_cast<uint64_t>(v.data());
      if (::write(where[1], &a, sizeof(a)) != sizeof(a)) ::_exit(2);
      char c;
      while (::read(hold[0], &c, 1) > 0) {
      }
      ::_exit(0);
    }
    ::close(where[1]);
    ::close(hold[0]);
    Child child;
    child.pid = pid;
    child.hold = hold[1];
    EXPECT_EQ(::read(where[0], &child.address, sizeof(child.address)), static_cast<ssize_t>(sizeof(child.address)));
    ::close(where[0]);
    return child;
  }
  void Kill() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
      pid = -1;
    }
    if (hold >= 0) ::close(hold), hold = -1;
  }
  ~Child() { Kill(); }
};

TEST(CrossMemoryTest, SelfIdentityIsStableAndNonZero) {
  const SelfIdentity a = Self();
  EXPECT_EQ(a.pid, static_cast<uint32_t>(::getpid()));
  EXPECT_NE(a.token, 0u);
  EXPECT_NE(a.probe_address, 0u);
  EXPECT_NE(a.pid_namespace, 0u);
  uint64_t at_probe;
  std::memcpy(&at_probe, reinterpret_cast<const void*>(a.probe_address), sizeof(at_probe));
  EXPECT_EQ(at_probe, a.token);
  EXPECT_EQ(Self().token, a.token);
  EXPECT_EQ(Self().probe_address, a.probe_address);
}

TEST(CrossMemoryTest, ReadsAnotherProcessScatteredIntoRanges) {
  Self();  // so the child, a fork, has the same token at the same address
  Child child = Child::Start(1 << 20);
  auto handle = ProcessHandle::Open(static_cast<uint32_t>(child.pid));
  ASSERT_TRUE(handle.ok()) << handle.status();
  EXPECT_FALSE((*handle)->Exited());
  ASSERT_TRUE((*handle)->Verify(Self().probe_address, Self().token).ok());
  EXPECT_EQ((*handle)->Verify(Self().probe_address, Self().token + 1).code(), absl::StatusCode::kFailedPrecondition)
      << "a token that differs is another process";
  // 1500 ranges: more than one process_vm_readv call can take.
  std::vector<uint8_t> out(3000);
  std::vector<CopyRange> ranges;
  for (size_t i = 0; i < 1500; ++i) ranges.push_back(CopyRange{i * 600, &out[i * 2], 2});
  ASSERT_TRUE((*handle)->Read(child.address, ranges).ok());
  for (size_t i = 0; i < 1500; ++i) {
    ASSERT_EQ(out[2 * i], static_cast<uint8_t>(i * 600 * 7 + 3)) << i;
    ASSERT_EQ(out[2 * i + 1], static_cast<uint8_t>((i * 600 + 1) * 7 + 3)) << i;
  }
  std::vector<uint8_t> all(1 << 20);
  const CopyRange whole{0, all.data(), all.size()};
  ASSERT_TRUE((*handle)->Read(child.address, {&whole, 1}).ok());
  EXPECT_EQ(all[12345], static_cast<uint8_t>(12345 * 7 + 3));
  // An address the child does not map: an error, not data.
  const CopyRange bad{0, all.data(), 16};
  EXPECT_EQ((*handle)->Read(8, {&bad, 1}).code(), absl::StatusCode::kInternal);
}

TEST(CrossMemoryTest, AProcessThatEndedIsUnavailableEvenIfItsPidComesBack) {
  Child child = Child::Start(4096);
  const uint32_t pid = static_cast<uint32_t>(child.pid);
  auto handle = ProcessHandle::Open(pid);
  ASSERT_TRUE(handle.ok()) << handle.status();
  child.Kill();
  EXPECT_TRUE((*handle)->Exited());
  uint8_t b[8];
  const CopyRange r{0, b, sizeof(b)};
  EXPECT_EQ((*handle)->Read(child.address, {&r, 1}).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ((*handle)->Verify(Self().probe_address, Self().token).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ProcessHandle::Open(pid).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ProcessHandle::Open(0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CrossMemoryTest, LendBookKeepsFramesUntilReleasedAndBoundsBytes) {
  LendBook book;
  auto released = std::make_shared<int>(0);
  auto frame = [&](size_t n) {
    std::shared_ptr<void> owner(std::malloc(n), [released](void* p) {
      std::free(p);
      ++*released;
    });
    void* data = owner.get();
    return Buffer::Adopt(std::move(owner), data, n);
  };
  EXPECT_TRUE(book.Fits(100, 100));
  const uint64_t a = 7, b = 8;
  book.Lend(a, {frame(60), frame(10)});
  EXPECT_EQ(book.lent_bytes(), 70u);
  EXPECT_FALSE(book.Fits(31, 100));
  EXPECT_TRUE(book.Fits(30, 100));
  book.Lend(b, {frame(30)});
  EXPECT_EQ(*released, 0) << "lent frames are kept";
  EXPECT_EQ(book.Release(a), 70u);
  EXPECT_EQ(*released, 2);
  EXPECT_EQ(book.Release(a), 0u) << "twice";
  EXPECT_EQ(book.Release(12345), 0u) << "never lent";
  EXPECT_EQ(book.lent_bytes(), 30u);
  book.Lend(9, {frame(5)});
  EXPECT_EQ(book.ReleaseAll(), 2u);
  EXPECT_EQ(*released, 4);
  EXPECT_EQ(book.lent_bytes(), 0u);
  EXPECT_EQ(book.lends(), 0u);
}

}  // namespace
}  // namespace tessera::xmem
