#include "node/session_core.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

constexpr Nanos kMs = kMillis;
constexpr uint64_t kBit = SessionCore::kSessionRequestBit;

SessionCoreOptions Options() {
  SessionCoreOptions o;
  o.role = proto::SERVER;
  o.rank = 2;
  o.connect_timeout = 30 * kSeconds;
  o.heartbeat_interval = 1 * kSeconds;
  o.lease = 5 * kSeconds;
  o.register_retry = 500 * kMs;
  o.coordinator = "tcp://coord:7000";
  return o;
}

Message RegisterReply(uint32_t node_id, uint32_t rank, uint64_t heartbeat_interval_ms = 0) {
  Message m;
  m.header.set_request_id(kBit | 1);
  auto* r = m.header.mutable_register_reply();
  r->mutable_self()->set_node_id(node_id);
  r->mutable_self()->set_rank(rank);
  r->mutable_self()->set_role(proto::SERVER);
  r->set_heartbeat_interval_ms(heartbeat_interval_ms);
  return m;
}

Message JobReady(uint64_t epoch) {
  Message m;
  m.header.mutable_job_ready()->mutable_shard_map()->set_epoch(epoch);
  return m;
}

Message HeartbeatAck() {
  Message m;
  m.header.mutable_heartbeat_ack();
  return m;
}

Message Shutdown(bool ok, const std::string& reason = "") {
  Message m;
  m.header.mutable_shutdown()->set_ok(ok);
  m.header.mutable_shutdown()->set_reason(reason);
  return m;
}

Message Release(const std::string& name) {
  Message m;
  m.header.mutable_barrier_release()->set_name(name);
  return m;
}

Message Ack(uint64_t request_id) {
  Message m;
  m.header.set_request_id(request_id);
  m.header.mutable_ack();
  return m;
}

Message Error(uint64_t request_id, absl::StatusCode code, const std::string& message) {
  Message m;
  m.header.set_request_id(request_id);
  m.header.mutable_error()->set_code(static_cast<int>(code));
  m.header.mutable_error()->set_message(message);
  return m;
}

// The envelopes of one kind.
std::vector<proto::Envelope> Of(const std::vector<proto::Envelope>& out, proto::Envelope::BodyCase kind) {
  std::vector<proto::Envelope> r;
  for (const proto::Envelope& h : out)
    if (h.body_case() == kind) r.push_back(h);
  return r;
}
size_t Registrations(const std::vector<proto::Envelope>& out) {
  return Of(out, proto::Envelope::kRegisterRequest).size();
}
size_t Heartbeats(const std::vector<proto::Envelope>& out) { return Of(out, proto::Envelope::kHeartbeat).size(); }

// Every envelope a session produces: the session bit, and `sender`.
void ExpectStamped(const std::vector<proto::Envelope>& out, uint32_t sender) {
  for (const proto::Envelope& h : out) {
    EXPECT_NE(h.request_id() & kBit, 0u) << h.DebugString();
    EXPECT_NE(h.request_id() & ~kBit, 0u) << h.DebugString();
    EXPECT_EQ(h.sender_id(), sender) << h.DebugString();
  }
}

// A core registered at `at` as node 7 (rank 3), the job ready with map epoch `epoch`.
SessionCore Running(SessionCoreOptions o, Nanos at, uint64_t epoch = 1) {
  SessionCore core(std::move(o));
  core.StartJoin(at, at + core.options().connect_timeout);
  core.Tick(at);
  EXPECT_TRUE(core.Handle(RegisterReply(7, 3), at));
  EXPECT_TRUE(core.Handle(JobReady(epoch), at));
  return core;
}

TEST(SessionCoreTest, SendsNothingBeforeJoin) {
  SessionCore core(Options());
  EXPECT_TRUE(core.Tick(0).empty());
  EXPECT_TRUE(core.Tick(10 * kSeconds).empty());
  EXPECT_FALSE(core.NextTickAt().has_value());
  EXPECT_FALSE(core.registered());
  EXPECT_EQ(core.self().node_id(), 0u);
}

TEST(SessionCoreTest, RegistersAtOnceAndEveryRetryUntilAnswered) {
  SessionCore core(Options());
  const Nanos t0 = 100 * kSeconds;
  core.StartJoin(t0, t0 + 30 * kSeconds);
  EXPECT_EQ(core.NextTickAt(), t0);

  auto out = core.Tick(t0);
  ASSERT_EQ(out.size(), 1u);
  ASSERT_TRUE(out[0].has_register_request());
  EXPECT_EQ(out[0].register_request().role(), proto::SERVER);
  EXPECT_EQ(out[0].register_request().rank(), 2);
  ExpectStamped(out, 0);
  const uint64_t first_id = out[0].request_id();

  EXPECT_EQ(core.NextTickAt(), t0 + 500 * kMs);
  EXPECT_TRUE(core.Tick(t0 + 499 * kMs).empty());
  out = core.Tick(t0 + 500 * kMs);
  ASSERT_EQ(Registrations(out), 1u);
  EXPECT_EQ(out[0].register_request().rank(), 2);
  EXPECT_NE(out[0].request_id(), first_id);  // a fresh id each time
  ExpectStamped(out, 0);
  EXPECT_EQ(Registrations(core.Tick(t0 + 999 * kMs)), 0u);
  EXPECT_EQ(Registrations(core.Tick(t0 + 1000 * kMs)), 1u);
  EXPECT_FALSE(core.JoinResult(t0 + 1000 * kMs).has_value());  // still open

  // No heartbeats before the reply.
  EXPECT_EQ(Heartbeats(core.Tick(t0 + 5 * kSeconds)), 0u);
}

// The RegisterReply was lost but the JobReady came: the node still does not
// know its node id, so it keeps registering until the reply comes.
TEST(SessionCoreTest, AJobReadyWithoutTheRegisterReplyKeepsRegistering) {
  SessionCore core(Options());
  const Nanos t0 = 100 * kSeconds;
  core.StartJoin(t0, t0 + 30 * kSeconds);
  ASSERT_EQ(Registrations(core.Tick(t0)), 1u);
  ASSERT_TRUE(core.Handle(JobReady(1), t0 + 10 * kMs));
  EXPECT_FALSE(core.JoinResult(t0 + 10 * kMs).has_value());  // not registered: no result yet
  EXPECT_EQ(Registrations(core.Tick(t0 + 500 * kMs)), 1u);
  ASSERT_TRUE(core.Handle(RegisterReply(7, 2), t0 + 510 * kMs));
  auto result = core.JoinResult(t0 + 510 * kMs);
  ASSERT_TRUE(result.has_value());
  ASSERT_TRUE(result->ok());
  EXPECT_EQ(core.self().node_id(), 7u);
  EXPECT_EQ(Registrations(core.Tick(t0 + 5 * kSeconds)), 0u);  // both in: done registering
}

TEST(SessionCoreTest, RegistersAgainEveryFourRetriesWithTheAssignedRankUntilJobReady) {
  SessionCoreOptions o = Options();
  o.heartbeat_interval = 60 * kSeconds;  // out of the way
  o.lease = 600 * kSeconds;
  SessionCore core(o);
  core.StartJoin(0, 30 * kSeconds);
  EXPECT_EQ(Registrations(core.Tick(0)), 1u);
  EXPECT_TRUE(core.Handle(RegisterReply(7, 3), 300 * kMs));
  EXPECT_TRUE(core.registered());
  EXPECT_EQ(core.self().node_id(), 7u);
  EXPECT_EQ(core.last_heard(), 300 * kMs);

  // The first heartbeat at once, no registration: the retry is now 4 * 500 ms from the reply.
  auto out = core.Tick(300 * kMs);
  EXPECT_EQ(Heartbeats(out), 1u);
  EXPECT_EQ(Registrations(out), 0u);
  EXPECT_EQ(Registrations(core.Tick(500 * kMs)), 0u);
  EXPECT_EQ(Registrations(core.Tick(2299 * kMs)), 0u);
  out = core.Tick(2300 * kMs);
  auto regs = Of(out, proto::Envelope::kRegisterRequest);
  ASSERT_EQ(regs.size(), 1u);
  EXPECT_EQ(regs[0].register_request().rank(), 3);  // the assigned rank now
  EXPECT_EQ(regs[0].register_request().role(), proto::SERVER);
  ExpectStamped(out, 7);
  EXPECT_EQ(Registrations(core.Tick(4299 * kMs)), 0u);
  EXPECT_EQ(Registrations(core.Tick(4300 * kMs)), 1u);
  EXPECT_FALSE(core.JoinResult(4300 * kMs).has_value());

  // A repeated reply changes nothing.
  EXPECT_TRUE(core.Handle(RegisterReply(9, 5), 4400 * kMs));
  EXPECT_EQ(core.self().node_id(), 7u);

  EXPECT_TRUE(core.Handle(JobReady(4), 5 * kSeconds));
  EXPECT_EQ(Registrations(core.Tick(20 * kSeconds)), 0u);
  auto result = core.JoinResult(5 * kSeconds);
  ASSERT_TRUE(result.has_value());
  ASSERT_TRUE(result->ok()) << result->status();
  EXPECT_EQ((*result)->shard_map().epoch(), 4u);
  EXPECT_EQ(core.map_epoch(), 4u);
}

TEST(SessionCoreTest, RegistrationStopsAtTheDeadlineAndNamesTheCoordinator) {
  SessionCoreOptions o = Options();
  o.connect_timeout = 2 * kSeconds;
  SessionCore core(o);
  core.StartJoin(0, 2 * kSeconds);
  size_t sent = 0;
  for (Nanos t = 0; t <= 3 * kSeconds; t += 100 * kMs) sent += Registrations(core.Tick(t));
  EXPECT_EQ(sent, 4u);  // 0, 0.5, 1, 1.5 s
  EXPECT_FALSE(core.NextTickAt().has_value());
  EXPECT_FALSE(core.JoinResult(1999 * kMs).has_value());
  auto result = core.JoinResult(2 * kSeconds);
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(result->status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(result->status().message(), "coordinator at tcp://coord:7000 did not answer within 2 s");

  // A reply after that starts nothing.
  EXPECT_TRUE(core.Handle(RegisterReply(7, 3), 3 * kSeconds));
  EXPECT_FALSE(core.registered());
  EXPECT_TRUE(core.Tick(4 * kSeconds).empty());
}

TEST(SessionCoreTest, TheJobThatDoesNotAssembleSaysSo) {
  SessionCoreOptions o = Options();
  o.connect_timeout = 3 * kSeconds;
  SessionCore core(o);
  core.set_coordinator("tcp://leader:7001");  // as resolved from etcd
  core.StartJoin(0, 3 * kSeconds);
  core.Tick(0);
  core.Handle(RegisterReply(7, 3), 100 * kMs);
  EXPECT_FALSE(core.JoinResult(2999 * kMs).has_value());
  auto result = core.JoinResult(3 * kSeconds);
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(result->status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(result->status().message(),
            "the job did not assemble within 3 s (coordinator at tcp://leader:7001 did not send the shard map)");
  // No more registrations after the deadline; heartbeats go on.
  auto out = core.Tick(3 * kSeconds);
  EXPECT_EQ(Registrations(out), 0u);
  EXPECT_EQ(Heartbeats(out), 1u);
}

TEST(SessionCoreTest, AnErrorBeforeRegistrationFailsTheJoin) {
  SessionCore core(Options());
  core.StartJoin(0, 30 * kSeconds);
  auto out = core.Tick(0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(core.Handle(Error(out[0].request_id(), absl::StatusCode::kAlreadyExists, "rank 2 is taken"), 50 * kMs));
  ASSERT_TRUE(core.register_error().has_value());
  EXPECT_EQ(core.register_error()->code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(core.register_error()->message(), "coordinator: rank 2 is taken");
  auto result = core.JoinResult(60 * kMs);
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(result->status(), *core.register_error());
  EXPECT_TRUE(core.Tick(1 * kSeconds).empty());
  EXPECT_FALSE(core.NextTickAt().has_value());
  // A reply after the error starts nothing.
  EXPECT_TRUE(core.Handle(RegisterReply(7, 3), 2 * kSeconds));
  EXPECT_FALSE(core.registered());
  EXPECT_TRUE(core.Tick(3 * kSeconds).empty());
}

// Unavailable is "not yet" (a replacement whose predecessor's lease has not
// run out): registration goes on, and a join that runs out of time says the
// last refusal.
TEST(SessionCoreTest, AnUnavailableAnswerBeforeRegistrationIsRetried) {
  SessionCoreOptions o = Options();
  o.connect_timeout = 2 * kSeconds;
  SessionCore core(o);
  core.StartJoin(0, 2 * kSeconds);
  auto out = core.Tick(0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(core.Handle(Error(out[0].request_id(), absl::StatusCode::kUnavailable, "worker 2 is held"), 50 * kMs));
  EXPECT_FALSE(core.register_error().has_value());
  EXPECT_FALSE(core.JoinResult(100 * kMs).has_value());
  EXPECT_EQ(Registrations(core.Tick(500 * kMs)), 1u);  // again after register_retry
  for (Nanos t = 600 * kMs; t <= 2 * kSeconds; t += 100 * kMs) core.Tick(t);
  auto result = core.JoinResult(2 * kSeconds);
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(result->status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(result->status().message(),
              HasSubstr("refused to register this node until the 2 s deadline; last: coordinator: worker 2 is held"));

  // And a later reply registers it, when it comes in time.
  SessionCore again(o);
  again.StartJoin(0, 2 * kSeconds);
  out = again.Tick(0);
  again.Handle(Error(out[0].request_id(), absl::StatusCode::kUnavailable, "not yet"), 50 * kMs);
  again.Tick(500 * kMs);
  EXPECT_TRUE(again.Handle(RegisterReply(7, 3), 600 * kMs));
  EXPECT_TRUE(again.registered());
}

TEST(SessionCoreTest, HeartbeatsEveryInterval) {
  SessionCore core = Running(Options(), 0);
  std::vector<Nanos> at;
  for (Nanos t = 0; t <= 4 * kSeconds; t += 100 * kMs) {
    auto out = core.Tick(t);
    ExpectStamped(out, 7);
    for (size_t i = 0; i < Heartbeats(out); ++i) at.push_back(t);
    core.Handle(HeartbeatAck(), t);
  }
  EXPECT_EQ(at, (std::vector<Nanos>{0, 1 * kSeconds, 2 * kSeconds, 3 * kSeconds, 4 * kSeconds}));
  EXPECT_EQ(core.NextTickAt(), 5 * kSeconds);
  EXPECT_EQ(core.heartbeat_interval(), 1 * kSeconds);
}

TEST(SessionCoreTest, TheJobsShorterIntervalWins) {
  SessionCore core(Options());
  core.StartJoin(0, 30 * kSeconds);
  core.Tick(0);
  core.Handle(RegisterReply(7, 3, /*heartbeat_interval_ms=*/200), 0);
  EXPECT_EQ(core.heartbeat_interval(), 200 * kMs);
  size_t beats = 0;
  for (Nanos t = 0; t < 1 * kSeconds; t += 50 * kMs) beats += Heartbeats(core.Tick(t));
  EXPECT_EQ(beats, 5u);  // 0, 0.2, 0.4, 0.6, 0.8 s

  // A longer job interval does not lengthen the node's own.
  SessionCore slow(Options());
  slow.StartJoin(0, 30 * kSeconds);
  slow.Tick(0);
  slow.Handle(RegisterReply(8, 4, /*heartbeat_interval_ms=*/3000), 0);
  EXPECT_EQ(slow.heartbeat_interval(), 1 * kSeconds);
}

TEST(SessionCoreTest, HeartbeatsCarryTheMapEpochWhichOnlyRises) {
  SessionCore core = Running(Options(), 0, /*epoch=*/5);
  int filled = 0;
  core.set_heartbeat_filler([&](proto::Heartbeat* hb) {
    ++filled;
    hb->add_vshards(11);
    hb->add_applied(42);
  });
  auto beats = Of(core.Tick(0), proto::Envelope::kHeartbeat);
  ASSERT_EQ(beats.size(), 1u);
  EXPECT_EQ(beats[0].epoch(), 5u);
  EXPECT_EQ(filled, 1);
  ASSERT_EQ(beats[0].heartbeat().vshards_size(), 1);
  EXPECT_EQ(beats[0].heartbeat().applied(0), 42u);

  core.set_map_epoch(3);  // older: ignored
  core.Handle(HeartbeatAck(), 500 * kMs);
  beats = Of(core.Tick(1 * kSeconds), proto::Envelope::kHeartbeat);
  ASSERT_EQ(beats.size(), 1u);
  EXPECT_EQ(beats[0].epoch(), 5u);

  core.set_map_epoch(9);
  core.Handle(JobReady(2), 1500 * kMs);  // a repeated JobReady does not lower it either
  beats = Of(core.Tick(2 * kSeconds), proto::Envelope::kHeartbeat);
  ASSERT_EQ(beats.size(), 1u);
  EXPECT_EQ(beats[0].epoch(), 9u);
  EXPECT_EQ(core.map_epoch(), 9u);
}

TEST(SessionCoreTest, TheJobReadyRaisesTheEpochSetEarlier) {
  SessionCore core(Options());
  core.set_map_epoch(2);
  core.Handle(JobReady(6), 0);
  EXPECT_EQ(core.map_epoch(), 6u);
  SessionCore ahead(Options());
  ahead.set_map_epoch(8);
  ahead.Handle(JobReady(6), 0);
  EXPECT_EQ(ahead.map_epoch(), 8u);
}

TEST(SessionCoreTest, ASilentCoordinatorIsWaitedForUntilGiveUp) {
  SessionCoreOptions o = Options();
  o.coordinator_note = " (job j1 in etcd at http://e:2379)";
  o.give_up = 20 * kSeconds;
  SessionCore core = Running(o, 0);
  core.Tick(0);
  EXPECT_TRUE(core.Handle(HeartbeatAck(), 1200 * kMs));
  EXPECT_EQ(core.last_heard(), 1200 * kMs);
  for (Nanos t = 1 * kSeconds; t <= 6 * kSeconds; t += kSeconds) {
    EXPECT_EQ(Heartbeats(core.Tick(t)), 1u) << t;  // 4.8 s of silence at 6 s: not yet
  }
  EXPECT_FALSE(core.silent_since().has_value());
  // Checked when the heartbeat falls due: 5.8 s of silence at 7 s. The node
  // says so and goes on heartbeating: the coordinator may come back.
  EXPECT_TRUE(core.Tick(6500 * kMs).empty());
  EXPECT_EQ(Heartbeats(core.Tick(7 * kSeconds)), 1u);
  ASSERT_TRUE(core.silent_since().has_value());
  EXPECT_EQ(*core.silent_since(), 1200 * kMs);
  EXPECT_FALSE(core.ended().has_value());
  for (Nanos t = 8 * kSeconds; t <= 21 * kSeconds; t += kSeconds) {
    EXPECT_EQ(Heartbeats(core.Tick(t)), 1u) << t;  // 19.8 s at 21 s: not yet given up
  }
  EXPECT_FALSE(core.ended().has_value());
  EXPECT_TRUE(core.Tick(22 * kSeconds).empty());
  ASSERT_TRUE(core.ended().has_value());
  EXPECT_EQ(core.ended()->code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(core.ended()->message(),
            "lost the coordinator at tcp://coord:7000 (job j1 in etcd at http://e:2379): no answer for 20.8 s");
  // Final: nothing more, and a late Shutdown does not change it.
  EXPECT_TRUE(core.Tick(23 * kSeconds).empty());
  EXPECT_FALSE(core.NextTickAt().has_value());
  core.Handle(Shutdown(true), 24 * kSeconds);
  EXPECT_EQ(core.ended()->code(), absl::StatusCode::kUnavailable);
}

TEST(SessionCoreTest, ACoordinatorThatAnswersAgainEndsTheSilence) {
  SessionCoreOptions o = Options();
  o.give_up = 20 * kSeconds;
  SessionCore core = Running(o, 0);
  core.Tick(0);
  for (Nanos t = 1 * kSeconds; t <= 12 * kSeconds; t += kSeconds) core.Tick(t);
  ASSERT_TRUE(core.silent_since().has_value());
  EXPECT_TRUE(core.Handle(HeartbeatAck(), 12500 * kMs));  // the cut healed
  EXPECT_FALSE(core.silent_since().has_value());
  for (Nanos t = 13 * kSeconds; t <= 30 * kSeconds; t += kSeconds) {
    core.Tick(t);
    if (t <= 17 * kSeconds) {
      EXPECT_FALSE(core.silent_since().has_value()) << t;
    }
  }
  EXPECT_FALSE(core.ended().has_value()) << "a whole give_up from the last answer";
  core.Tick(33 * kSeconds);
  EXPECT_TRUE(core.ended().has_value());
}

TEST(SessionCoreTest, AGiveUpShorterThanTheLeaseIsTheLease) {
  SessionCoreOptions o = Options();
  o.give_up = 1 * kSeconds;
  SessionCore core = Running(o, 0);
  for (Nanos t = 0; t <= 4 * kSeconds; t += kSeconds) core.Tick(t);
  EXPECT_FALSE(core.ended().has_value());
  core.Tick(5 * kSeconds);
  EXPECT_TRUE(core.ended().has_value());
}

TEST(SessionCoreTest, ANewLeaderGetsAWholeLease) {
  SessionCoreOptions o = Options();
  o.give_up = o.lease;
  SessionCore core = Running(o, 0);
  core.Tick(0);
  for (Nanos t = 1 * kSeconds; t <= 4 * kSeconds; t += kSeconds) core.Tick(t);
  core.set_coordinator("tcp://standby:7000");
  core.ResetLease(4500 * kMs);
  for (Nanos t = 5 * kSeconds; t <= 9 * kSeconds; t += kSeconds) EXPECT_EQ(Heartbeats(core.Tick(t)), 1u) << t;
  EXPECT_FALSE(core.ended().has_value());
  core.Tick(10 * kSeconds);
  ASSERT_TRUE(core.ended().has_value());
  EXPECT_THAT(std::string(core.ended()->message()),
              HasSubstr("lost the coordinator at tcp://standby:7000: no answer for 5.5 s"));
}

// A server the coordinator declared lost while it was cut off registers
// again for its rank and becomes a new node of the job.
TEST(SessionCoreTest, RejoinRegistersAgainForTheSameRank) {
  SessionCoreOptions o = Options();
  o.rank = -1;  // the first join let the coordinator choose
  SessionCore core(o);
  core.StartJoin(0, 30 * kSeconds);
  core.Tick(0);
  core.Handle(RegisterReply(5, 1), 10 * kMs);
  core.Handle(JobReady(3), 20 * kMs);
  ASSERT_TRUE(core.JoinResult(20 * kMs).has_value());
  core.StartRejoin(2 * kSeconds, 32 * kSeconds);
  EXPECT_FALSE(core.registered());
  EXPECT_FALSE(core.JoinResult(2 * kSeconds).has_value()) << "the join is open again";
  auto out = core.Tick(2 * kSeconds);
  auto registers = Of(out, proto::Envelope::kRegisterRequest);
  ASSERT_EQ(registers.size(), 1u);
  EXPECT_EQ(registers[0].register_request().rank(), 1) << "the rank it had";
  EXPECT_EQ(Heartbeats(out), 0u) << "no heartbeats as the node it was";
  core.Handle(RegisterReply(9, 1), 2100 * kMs);
  EXPECT_EQ(core.self().node_id(), 9u);
  core.Handle(JobReady(7), 2200 * kMs);
  auto result = core.JoinResult(2200 * kMs);
  ASSERT_TRUE(result.has_value() && result->ok());
  EXPECT_EQ((*result)->shard_map().epoch(), 7u);
  EXPECT_EQ(core.map_epoch(), 7u);
}

TEST(SessionCoreTest, ShutdownEndsTheJob) {
  SessionCore ok = Running(Options(), 0);
  EXPECT_TRUE(ok.Handle(Shutdown(true), 1 * kSeconds));
  ASSERT_TRUE(ok.ended().has_value());
  EXPECT_TRUE(ok.ended()->ok());
  EXPECT_TRUE(ok.Tick(2 * kSeconds).empty());

  SessionCore failed = Running(Options(), 0);
  EXPECT_TRUE(failed.Handle(Shutdown(false, "lost server 1 (a): no heartbeat for 5.0 s"), 1 * kSeconds));
  ASSERT_TRUE(failed.ended().has_value());
  EXPECT_EQ(failed.ended()->code(), absl::StatusCode::kAborted);
  EXPECT_EQ(failed.ended()->message(), "job failed: lost server 1 (a): no heartbeat for 5.0 s");
  EXPECT_TRUE(failed.Handle(Shutdown(true), 2 * kSeconds));  // the end is final
  EXPECT_EQ(failed.ended()->code(), absl::StatusCode::kAborted);
}

TEST(SessionCoreTest, AnEndBeforeTheJobStartedFailsTheJoin) {
  SessionCore core(Options());
  core.StartJoin(0, 30 * kSeconds);
  core.Tick(0);
  core.Handle(Shutdown(true), 100 * kMs);
  auto result = core.JoinResult(100 * kMs);
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(result->status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(result->status().message(), "job ended before it started");

  SessionCore failed(Options());
  failed.StartJoin(0, 30 * kSeconds);
  failed.Tick(0);
  failed.Handle(RegisterReply(7, 3), 50 * kMs);
  failed.Handle(Shutdown(false, "job did not assemble within 30 s: missing server 1"), 100 * kMs);
  result = failed.JoinResult(100 * kMs);
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(result->status().message(), "job failed: job did not assemble within 30 s: missing server 1");
}

TEST(SessionCoreTest, TheDoneReportGoesAgainUntilAcknowledged) {
  SessionCoreOptions o = Options();
  o.heartbeat_interval = 60 * kSeconds;
  o.lease = 600 * kSeconds;
  SessionCore core = Running(o, 0);
  core.Tick(0);
  proto::WorkerDone report;
  report.set_steps(17);
  const proto::Envelope first = core.ReportDone(report, 10 * kSeconds, 20 * kSeconds);
  ASSERT_TRUE(first.has_worker_done());
  EXPECT_EQ(first.worker_done().steps(), 17u);
  ExpectStamped({first}, 7);
  const uint64_t id = first.request_id();
  EXPECT_FALSE(core.done_acknowledged());
  EXPECT_EQ(core.NextTickAt(), 10500 * kMs);

  EXPECT_TRUE(core.Tick(10499 * kMs).empty());
  auto out = core.Tick(10500 * kMs);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].request_id(), id);  // the same report
  EXPECT_EQ(out[0].worker_done().steps(), 17u);
  ExpectStamped(out, 7);
  EXPECT_EQ(core.Tick(11 * kSeconds).size(), 1u);

  EXPECT_TRUE(core.Handle(Ack(id), 11200 * kMs));
  EXPECT_TRUE(core.done_acknowledged());
  ASSERT_TRUE(core.done_reply(id).has_value());
  EXPECT_TRUE(core.done_reply(id)->ok());
  EXPECT_TRUE(core.Tick(11500 * kMs).empty());
  EXPECT_TRUE(core.Tick(15 * kSeconds).empty());
}

TEST(SessionCoreTest, TheDoneReportStopsAtItsDeadlineOrAnError) {
  SessionCoreOptions o = Options();
  o.heartbeat_interval = 60 * kSeconds;
  o.lease = 600 * kSeconds;
  SessionCore core = Running(o, 0);
  core.Tick(0);
  const uint64_t id = core.ReportDone(proto::WorkerDone(), 1 * kSeconds, 2 * kSeconds).request_id();
  size_t sent = 0;
  for (Nanos t = 1 * kSeconds; t <= 4 * kSeconds; t += 100 * kMs) sent += core.Tick(t).size();
  EXPECT_EQ(sent, 1u);  // at 1.5 s; the first went with ReportDone; none at 2 s
  EXPECT_FALSE(core.done_reply(id).has_value());
  EXPECT_FALSE(core.NextTickAt().has_value() && *core.NextTickAt() < 60 * kSeconds);

  const uint64_t refused = core.ReportDone(proto::WorkerDone(), 5 * kSeconds, 20 * kSeconds).request_id();
  EXPECT_TRUE(core.Handle(Error(refused, absl::StatusCode::kFailedPrecondition, "not a worker"), 5100 * kMs));
  ASSERT_TRUE(core.done_reply(refused).has_value());
  EXPECT_EQ(core.done_reply(refused)->code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(core.done_reply(refused)->message(), "coordinator: not a worker");
  EXPECT_TRUE(core.Tick(6 * kSeconds).empty());
  core.ForgetDone(refused);
  EXPECT_FALSE(core.done_reply(refused).has_value());
}

TEST(SessionCoreTest, ABarrierRequestGoesAgainUntilReleased) {
  SessionCore core = Running(Options(), 0);
  const Nanos retry = Options().register_retry;
  const proto::Envelope request = core.Barrier("epoch-1");
  auto barrier_requests = [](const std::vector<proto::Envelope>& out) {
    std::vector<proto::Envelope> found;
    for (const auto& h : out)
      if (h.has_barrier_request()) found.push_back(h);
    return found;
  };
  EXPECT_TRUE(barrier_requests(core.Tick(1 * kSeconds)).empty()) << "the caller sent it: its timer starts";
  EXPECT_TRUE(barrier_requests(core.Tick(1 * kSeconds + retry - 1)).empty());
  auto again = barrier_requests(core.Tick(1 * kSeconds + retry));
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].request_id(), request.request_id()) << "the same request";
  EXPECT_EQ(again[0].barrier_request().name(), "epoch-1");
  ASSERT_TRUE(core.NextTickAt().has_value());
  EXPECT_LE(*core.NextTickAt(), 1 * kSeconds + 2 * retry);
  EXPECT_TRUE(core.Handle(Release("epoch-1"), 2 * kSeconds));
  EXPECT_TRUE(barrier_requests(core.Tick(10 * kSeconds)).empty()) << "released: no more";
}

TEST(SessionCoreTest, BarrierReleasedAndRefused) {
  SessionCore core = Running(Options(), 0);
  const proto::Envelope request = core.Barrier("epoch-1");
  ASSERT_TRUE(request.has_barrier_request());
  EXPECT_EQ(request.barrier_request().name(), "epoch-1");
  ExpectStamped({request}, 7);
  EXPECT_FALSE(core.barrier_result("epoch-1").has_value());
  EXPECT_FALSE(core.barrier_released("epoch-1"));

  EXPECT_TRUE(core.Handle(Release("other"), 1 * kSeconds));
  EXPECT_FALSE(core.barrier_result("epoch-1").has_value());
  EXPECT_TRUE(core.Handle(Release("epoch-1"), 2 * kSeconds));
  EXPECT_EQ(core.last_heard(), 2 * kSeconds);
  EXPECT_TRUE(core.barrier_released("epoch-1"));
  ASSERT_TRUE(core.barrier_result("epoch-1").has_value());
  EXPECT_TRUE(core.barrier_result("epoch-1")->ok());
  core.ForgetBarrier("epoch-1");

  // A new request forgets an earlier release of the same name.
  core.Handle(Release("epoch-2"), 3 * kSeconds);
  const proto::Envelope second = core.Barrier("epoch-2");
  EXPECT_NE(second.request_id(), request.request_id());
  EXPECT_FALSE(core.barrier_result("epoch-2").has_value());

  // An Ack does not release it; an error refuses it.
  EXPECT_TRUE(core.Handle(Ack(second.request_id()), 4 * kSeconds));
  EXPECT_FALSE(core.barrier_result("epoch-2").has_value());
  EXPECT_TRUE(core.Handle(Error(second.request_id(), absl::StatusCode::kFailedPrecondition,
                                "only workers take part in barriers"),
                          5 * kSeconds));
  ASSERT_TRUE(core.barrier_result("epoch-2").has_value());
  EXPECT_EQ(core.barrier_result("epoch-2")->code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(core.barrier_result("epoch-2")->message(), "coordinator: only workers take part in barriers");
  // The refusal wins over a release that comes after it.
  core.Handle(Release("epoch-2"), 6 * kSeconds);
  EXPECT_FALSE(core.barrier_result("epoch-2")->ok());
  // Errors after registration are not registration errors.
  EXPECT_FALSE(core.register_error().has_value());
}

TEST(SessionCoreTest, LeavesOtherMessagesAlone) {
  SessionCore core = Running(Options(), 0);
  const Nanos heard = core.last_heard();

  Message ack = Ack(42);  // no session bit: a server's reply to the node's own request
  EXPECT_FALSE(core.Handle(ack, 1 * kSeconds));
  Message error = Error(43, absl::StatusCode::kUnavailable, "busy");
  EXPECT_FALSE(core.Handle(error, 1 * kSeconds));
  Message update;
  update.header.mutable_shard_map_update()->mutable_shard_map()->set_epoch(99);
  EXPECT_FALSE(core.Handle(update, 1 * kSeconds));
  Message push;
  push.header.set_request_id(kBit | 5);
  push.header.mutable_push();
  EXPECT_FALSE(core.Handle(push, 1 * kSeconds));
  Message empty;
  EXPECT_FALSE(core.Handle(empty, 1 * kSeconds));

  EXPECT_EQ(core.last_heard(), heard);
  EXPECT_EQ(core.map_epoch(), 1u);
  EXPECT_FALSE(core.ended().has_value());

  // With the bit it is the session's, even when nobody waits for it.
  EXPECT_TRUE(core.Handle(Ack(kBit | 4242), 2 * kSeconds));
  EXPECT_EQ(core.last_heard(), 2 * kSeconds);
}

TEST(SessionCoreTest, FormatsSecondsAsTheShellDid) {
  EXPECT_EQ(SessionCore::FormatSeconds(30 * kSeconds), "30 s");
  EXPECT_EQ(SessionCore::FormatSeconds(5800 * kMs), "5.8 s");
  EXPECT_EQ(SessionCore::FormatSeconds(250 * kMs + 999), "0.25 s");
}

}  // namespace
}  // namespace tessera
