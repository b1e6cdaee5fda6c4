// TransportFlags (transport/transport_flags.h): the flags' defaults are
// TransportChoice{}'s, every value parses into its field, each bad value is
// an error naming its flag, and old environment variables are named with
// the flag that replaced them.
#include "transport/transport_flags.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace tessera {
namespace {

using ::testing::HasSubstr;

// Parses `args` (without the program name) with the transport flags alone.
absl::StatusOr<TransportChoice> ParseFlags(std::vector<std::string> args) {
  CLI::App app{"test"};
  TransportFlags flags;
  flags.AddTo(app);
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes them reversed
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    return absl::InvalidArgumentError(e.what());
  }
  return flags.choice();
}

void ExpectSameChoice(const TransportChoice& a, const TransportChoice& b) {
  EXPECT_EQ(a.kind, b.kind);
  EXPECT_EQ(a.rdma_required, b.rdma_required);
  EXPECT_EQ(a.rdma_pool_bytes, b.rdma_pool_bytes);
  EXPECT_EQ(a.rdma_max_pinned_bytes, b.rdma_max_pinned_bytes);
  EXPECT_EQ(a.shm, b.shm);
  EXPECT_EQ(a.shm_options.min_frame_bytes, b.shm_options.min_frame_bytes);
  EXPECT_EQ(a.shm_options.ring_bytes, b.shm_options.ring_bytes);
  EXPECT_EQ(a.shm_options.cross_memory, b.shm_options.cross_memory);
  EXPECT_EQ(a.shm_options.min_lend_bytes, b.shm_options.min_lend_bytes);
  EXPECT_EQ(a.coalesce.enabled, b.coalesce.enabled);
  EXPECT_EQ(a.coalesce.max_message_bytes, b.coalesce.max_message_bytes);
  EXPECT_EQ(a.coalesce.max_batch_bytes, b.coalesce.max_batch_bytes);
  EXPECT_EQ(a.coalesce.max_delay, b.coalesce.max_delay);
  EXPECT_EQ(a.coalesce.hold_requests, b.coalesce.hold_requests);
  EXPECT_EQ(a.host_id, b.host_id);
  EXPECT_EQ(a.job_keys, b.job_keys);
  EXPECT_EQ(a.faults, b.faults);
}

TEST(TransportFlagsTest, WithoutFlagsTheChoiceIsTheStructsDefault) {
  absl::StatusOr<TransportChoice> c = ParseFlags({});
  ASSERT_TRUE(c.ok()) << c.status();
  ExpectSameChoice(*c, TransportChoice{});
}

TEST(TransportFlagsTest, HelpShowsTheStructsDefaults) {
  CLI::App app{"test"};
  TransportFlags flags;
  flags.AddTo(app);
  const std::string help = app.help();
  const TransportChoice d;
  for (const std::string& shown :
       {absl::StrCat("--shm_ring_bytes,--shm-ring-bytes N=", d.shm_options.ring_bytes),
        absl::StrCat("--coalesce_max_delay_us,--coalesce-max-delay-us N=", d.coalesce.max_delay.count()),
        absl::StrCat("--rdma_pool_bytes,--rdma-pool-bytes N=", d.rdma_pool_bytes),
        std::string("--shm 1|0=") + (d.shm ? "1" : "0"), std::string("--transport TEXT=zmq")}) {
    EXPECT_THAT(help, HasSubstr(shown));
  }
}

TEST(TransportFlagsTest, SettingsWithoutAFlagComeFromTheBase) {
  TransportChoice base;
  base.coalesce.hold_requests = true;
  base.shm_options.stuck_ms = 77;
  base.shm_options.ring_bytes = 8u << 20;
  TransportFlags flags(base);
  CLI::App app{"test"};
  flags.AddTo(app);
  std::vector<std::string> args = {"1000", "--coalesce_max_delay_us"};
  app.parse(args);
  EXPECT_TRUE(flags.choice().coalesce.hold_requests);
  EXPECT_EQ(flags.choice().shm_options.stuck_ms, 77);
  EXPECT_EQ(flags.choice().shm_options.ring_bytes, 8u << 20) << "the base's value is the flag's default";
  EXPECT_EQ(flags.choice().coalesce.max_delay, std::chrono::microseconds(1000));
}

TEST(TransportFlagsTest, EveryFlagReachesItsField) {
  absl::StatusOr<TransportChoice> c = ParseFlags(
      {"--transport", "auto", "--rdma_required", "1", "--rdma_pool_bytes", "1048576", "--rdma-max-pinned-bytes",
       "4194304", "--shm", "false", "--shm_min_frame_bytes", "4096", "--shm-ring-bytes", "2097152",
       "--shm_cross_memory", "0", "--shm_min_lend_bytes", "65536", "--coalesce", "0",
       "--coalesce_max_message_bytes", "1000", "--coalesce-max-batch-bytes", "9000", "--coalesce_max_delay_us",
       "250", "--host_id", "rack1-node7", "--job-keys", "/run/job.keys", "--faults", "seed=3,drop=0.01"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->kind, TransportChoice::Kind::kAuto);
  EXPECT_TRUE(c->rdma_required);
  EXPECT_EQ(c->rdma_pool_bytes, 1u << 20);
  EXPECT_EQ(c->rdma_max_pinned_bytes, 4u << 20);
  EXPECT_FALSE(c->shm);
  EXPECT_EQ(c->shm_options.min_frame_bytes, 4096u);
  EXPECT_EQ(c->shm_options.ring_bytes, 2u << 20);
  EXPECT_FALSE(c->shm_options.cross_memory);
  EXPECT_EQ(c->shm_options.min_lend_bytes, 65536u);
  EXPECT_FALSE(c->coalesce.enabled);
  EXPECT_EQ(c->coalesce.max_message_bytes, 1000u);
  EXPECT_EQ(c->coalesce.max_batch_bytes, 9000u);
  EXPECT_EQ(c->coalesce.max_delay, std::chrono::microseconds(250));
  EXPECT_FALSE(c->coalesce.hold_requests) << "the process's own choice, not a flag";
  EXPECT_EQ(c->host_id, "rack1-node7");
  EXPECT_EQ(c->job_keys, "/run/job.keys");
  EXPECT_EQ(c->faults, "seed=3,drop=0.01");
  c = ParseFlags({"--transport", "rdma", "--shm", "true"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->kind, TransportChoice::Kind::kRdma);
  EXPECT_TRUE(c->shm);
}

TEST(TransportFlagsTest, EachBadValueIsAnErrorNamingItsFlag) {
  for (const auto& [flag, value, named] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"--transport", "verbs", "--transport"},
           {"--rdma_required", "yes", "--rdma_required"},
           {"--rdma_pool_bytes", "0", "--rdma_pool_bytes"},
           {"--rdma_max_pinned_bytes", "-5", "--rdma_max_pinned_bytes"},
           {"--shm", "maybe", "--shm"},
           {"--shm_min_frame_bytes", "4k", "--shm_min_frame_bytes"},
           {"--shm_ring_bytes", "12x", "--shm_ring_bytes"},
           {"--shm_ring_bytes", "3000000", "--shm_ring_bytes"},  // not a power of two
           {"--shm_cross_memory", "2", "--shm_cross_memory"},
           {"--shm_min_lend_bytes", "", "--shm_min_lend_bytes"},
           {"--coalesce", "on", "--coalesce"},
           {"--coalesce_max_message_bytes", "100000", "--coalesce_max_batch_bytes"},  // more than a batch
           {"--coalesce_max_batch_bytes", "1.5", "--coalesce_max_batch_bytes"},
           {"--coalesce_max_delay_us", "0", "--coalesce_max_delay_us"},
           {"--coalesce_max_delay_us", "60000001", "--coalesce_max_delay_us"}}) {
    absl::StatusOr<TransportChoice> c = ParseFlags({flag, value});
    ASSERT_FALSE(c.ok()) << flag << " " << value;
    EXPECT_THAT(std::string(c.status().message()), HasSubstr(named)) << flag << " " << value;
  }
}

TEST(TransportFlagsTest, ARingShmTransportRefusesIsAnErrorOnlyWithShmOn) {
  TransportFlags flags;
  ASSERT_TRUE(flags.Parse().ok());
  // A shared-memory ring that ShmTransport refuses is an error only with shm on.
  CLI::App app{"test"};
  flags.AddTo(app);
  std::vector<std::string> args = {"65536", "--shm_ring_bytes"};
  EXPECT_THROW(app.parse(args), CLI::ValidationError);
  CLI::App off{"test"};
  TransportFlags flags_off;
  flags_off.AddTo(off);
  args = {"65536", "--shm_ring_bytes", "0", "--shm"};
  off.parse(args);
  EXPECT_FALSE(flags_off.choice().shm);
  EXPECT_EQ(flags_off.choice().shm_options.ring_bytes, 65536u);
}

TEST(TransportFlagsTest, OldVariablesAreNamedWithTheFlagThatReplacesThem) {
  const char* environment[] = {"PATH=/bin", "TESSERA_SHM=0", "TESSERA_COALESCE_MAX_DELAY_US=5",
                               "TESSERA_SHMX=1", "TESSERA_AUDIT_DIR=/tmp/a", nullptr};
  std::vector<std::string> lines =
      TransportFlags::OldVariableWarnings(environment, {{"TESSERA_AUDIT_DIR", "--audit-dir"}});
  ASSERT_EQ(lines.size(), 3u) << ::testing::PrintToString(lines);
  EXPECT_THAT(lines[0], HasSubstr("TESSERA_SHM is set"));
  EXPECT_THAT(lines[0], HasSubstr("--shm "));
  EXPECT_THAT(lines[1], HasSubstr("TESSERA_COALESCE_MAX_DELAY_US"));
  EXPECT_THAT(lines[1], HasSubstr("--coalesce_max_delay_us"));
  EXPECT_THAT(lines[2], HasSubstr("--audit-dir"));
  const char* clean[] = {"PATH=/bin", "HOME=/root", nullptr};
  EXPECT_TRUE(TransportFlags::OldVariableWarnings(clean).empty());
  // Every flag has its old variable, and each is named once.
  std::vector<std::string> storage;
  for (const TransportFlags::Flag& f : TransportFlags::Flags()) storage.push_back(std::string(f.old_variable) + "=x");
  std::vector<const char*> every;
  for (const std::string& e : storage) every.push_back(e.c_str());
  every.push_back(nullptr);
  EXPECT_EQ(TransportFlags::OldVariableWarnings(every.data()).size(), TransportFlags::Flags().size());
}

}  // namespace
}  // namespace tessera
