#include "common/env.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

std::string Contents(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::vector<std::string> Names(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  return out;
}

class EnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("tessera-env-test-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(dir_, ec);
  }
  fs::path dir_;
};

TEST_F(EnvTest, AWriteLandsComplete) {
  const std::string path = (dir_ / "state").string();
  std::string bytes(3 << 20, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7 + i / 4096);
  ASSERT_TRUE(WriteFileAtomically(path, bytes).ok());
  EXPECT_EQ(Contents(path), bytes);
  EXPECT_EQ(Names(dir_), std::vector<std::string>{"state"}) << "the temporary is gone";
}

TEST_F(EnvTest, AnEmptyWriteLeavesAnEmptyFile) {
  const std::string path = (dir_ / "empty").string();
  ASSERT_TRUE(WriteFileAtomically(path, "").ok());
  EXPECT_TRUE(fs::exists(path));
  EXPECT_EQ(fs::file_size(path), 0u);
}

TEST_F(EnvTest, AWriteReplacesAnExistingFile) {
  const std::string path = (dir_ / "summary.json").string();
  ASSERT_TRUE(WriteFileAtomically(path, "a longer first version\n").ok());
  ASSERT_TRUE(WriteFileAtomically(path, "second\n").ok());
  EXPECT_EQ(Contents(path), "second\n");
  EXPECT_EQ(Names(dir_), std::vector<std::string>{"summary.json"});
}

TEST_F(EnvTest, ABareFileNameIsWrittenInTheWorkingDirectory) {
  const fs::path before = fs::current_path();
  fs::current_path(dir_);
  const absl::Status s = WriteFileAtomically("bare", "x");
  fs::current_path(before);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(Contents(dir_ / "bare"), "x");
}

TEST_F(EnvTest, AWriteIntoAMissingDirectoryFailsNamingThePath) {
  const std::string path = (dir_ / "missing" / "state").string();
  const absl::Status s = WriteFileAtomically(path, "bytes");
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.message(), path)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "No such file or directory")) << s;
  EXPECT_FALSE(fs::exists(path));
  EXPECT_TRUE(Names(dir_).empty());
}

TEST_F(EnvTest, AWriteUnderAFileFailsNamingThePath) {
  ASSERT_TRUE(WriteFileAtomically((dir_ / "file").string(), "x").ok());
  const std::string path = (dir_ / "file" / "state").string();
  const absl::Status s = WriteFileAtomically(path, "bytes");
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.message(), path)) << s;
  EXPECT_EQ(Names(dir_), std::vector<std::string>{"file"});
}

// The directory is not writable: the write fails, names the path, and leaves
// the old file and nothing else. Root writes anywhere, so as root the write
// is made by a child process that has given up root.
TEST_F(EnvTest, AWriteIntoADirectoryNotWritableFailsAndLeavesTheOldFile) {
  const std::string path = (dir_ / "state").string();
  ASSERT_TRUE(WriteFileAtomically(path, "old").ok());
  fs::permissions(dir_, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                            fs::perms::others_read | fs::perms::others_exec,
                  fs::perm_options::replace);
  if (::geteuid() != 0) fs::permissions(dir_, fs::perms::owner_write, fs::perm_options::remove);
  // Returns what went wrong, empty when all is as promised.
  auto attempt = [&]() -> std::string {
    const absl::Status s = WriteFileAtomically(path, "new");
    if (s.ok()) return "the write succeeded";
    if (!absl::StrContains(s.message(), path)) return "the error does not name the path: " + s.ToString();
    if (!absl::StrContains(s.message(), "Permission denied")) return "not EACCES: " + s.ToString();
    if (Contents(path) != "old") return "the old file changed";
    if (Names(dir_) != std::vector<std::string>{"state"}) return "something was left beside the file";
    return "";
  };
  if (::geteuid() != 0) {
    EXPECT_EQ(attempt(), "");
    return;
  }
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        constexpr uid_t kNobody = 65534;
        if (::setgid(kNobody) != 0 || ::setuid(kNobody) != 0) {
          std::fprintf(stderr, "cannot give up root\n");
          std::_Exit(2);
        }
        const std::string problem = attempt();
        std::fprintf(stderr, "%s\n", problem.empty() ? "as promised" : problem.c_str());
        std::_Exit(problem.empty() ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "as promised");
}

TEST_F(EnvTest, AFailedRenameRemovesTheTemporaryAndKeepsWhatWasThere) {
  // A directory under the final name: the temporary is written, the rename
  // fails (EISDIR), and nothing but that directory is left. Works as root.
  const fs::path path = dir_ / "taken";
  fs::create_directories(path / "inside");
  const absl::Status s = WriteFileAtomically(path.string(), "bytes");
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.message(), path.string())) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "rename")) << s;
  EXPECT_TRUE(fs::is_directory(path / "inside"));
  EXPECT_EQ(Names(dir_), std::vector<std::string>{"taken"}) << "no temporary left behind";
}

TEST_F(EnvTest, SyncDirectory) {
  EXPECT_TRUE(SyncDirectory(dir_.string()).ok());
  const std::string missing = (dir_ / "missing").string();
  const absl::Status s = SyncDirectory(missing);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.message(), missing)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "No such file or directory")) << s;
}

TEST_F(EnvTest, SyncDirectoryOfAFileFails) {
  const std::string file = (dir_ / "file").string();
  ASSERT_TRUE(WriteFileAtomically(file, "x").ok());
  const absl::Status s = SyncDirectory(file);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.message(), file)) << s;
}

}  // namespace
}  // namespace tessera
