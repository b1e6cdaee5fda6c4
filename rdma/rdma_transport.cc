#include "rdma/rdma_transport.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "rdma/rdma_devices.h"
#include "rdma/rdma_protocol.h"
#include "rdma/rdma_wire.h"

#if defined(TESSERA_RDMA_HAVE_VERBS)
#include <arpa/inet.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <netdb.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "common/logging.h"
#endif

namespace tessera::rdma {
namespace {

// Slot size of the eager pool: the largest eager SEND and the staging chunk.
constexpr size_t kSlotBytes = 8192;

ProtocolConfig ConfigFor(const Options& options, std::string local_address) {
  ProtocolConfig c;
  c.local_address = std::move(local_address);
  c.slot_bytes = kSlotBytes;
  c.credits = options.credits;
  c.rendezvous_threshold = options.rendezvous_threshold;
  c.max_pinned_bytes = options.max_pinned_bytes;
  c.rendezvous_timeout_ticks = 10'000;  // ms
  c.connect_timeout_ticks = 10'000;     // ms (also the time a peer has to prove it holds the job key)
  c.auth_secret_key = options.auth_secret_key;
  return c;
}

}  // namespace

absl::Status ValidateOptions(const Options& options) {
  absl::StatusOr<HostPort> bind = ParseRdmaAddress(options.bind, /*allow_tcp=*/true, /*allow_port_zero=*/true);
  if (!bind.ok()) return absl::InvalidArgumentError(absl::StrCat("RDMA bind: ", bind.status().message()));
  if (options.rendezvous_threshold < 1) return absl::InvalidArgumentError("RDMA options: rendezvous_threshold must be positive");
  if (options.max_pinned_bytes < kSlotBytes) {
    return absl::InvalidArgumentError("RDMA options: max_pinned_bytes is smaller than one slot");
  }
  return EndpointCore::Validate(ConfigFor(options, "rdma://validate:1"), options.pool_bytes);
}

absl::Status Usable() {
  if (!BuiltWithVerbs()) return absl::UnavailableError("built without libibverbs");
  absl::StatusOr<std::vector<RdmaDeviceInfo>> devices = ListRdmaDevices();
  if (!devices.ok()) return devices.status();
  if (devices->empty()) return absl::UnavailableError("no RDMA device (ibv_get_device_list found none)");
  std::string seen;
  for (const RdmaDeviceInfo& d : *devices) {
    for (const RdmaPortInfo& p : d.ports) {
      if (p.state == "ACTIVE") return RdmaCmAvailable();
      absl::StrAppend(&seen, seen.empty() ? "" : ", ", d.name, " port ", p.port, " ", p.state);
    }
    if (d.ports.empty()) absl::StrAppend(&seen, seen.empty() ? "" : ", ", d.name, d.error.empty() ? " no ports" : " " + d.error);
  }
  return absl::UnavailableError(absl::StrCat("no ACTIVE RDMA port (", seen, ")"));
}

#if !defined(TESSERA_RDMA_HAVE_VERBS)

absl::StatusOr<std::unique_ptr<Transport>> MakeRdmaTransport(Options options) {
  if (absl::Status s = ValidateOptions(options); !s.ok()) return s;
  return absl::UnavailableError("built without libibverbs");
}

#else

namespace {

thread_local const void* tls_delivering_transport = nullptr;

std::string Hostname() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

bool IsWildcardHost(const std::string& host) {
  return host == "*" || host == "0.0.0.0" || host == "::" || host == "::0";
}

absl::Status Errno(absl::string_view what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

// ibv_reg_mr / ibv_dereg_mr on one protection domain.
class VerbsRegistrar final : public Registrar {
 public:
  explicit VerbsRegistrar(ibv_pd* pd) : pd_(pd) {}
  absl::StatusOr<MemoryRegistration> Register(uintptr_t address, size_t length) override {
    ibv_mr* mr = ibv_reg_mr(pd_, reinterpret_cast<void*>(address), length,
                            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (mr == nullptr) {
      const int err = errno;
      return absl::ResourceExhaustedError(
          absl::StrCat("ibv_reg_mr of ", length, " bytes: ", std::strerror(err),
                       err == ENOMEM ? " (locked-memory limit, ulimit -l?)" : ""));
    }
    return MemoryRegistration{reinterpret_cast<uint64_t>(mr), mr->lkey, mr->rkey};
  }
  void Deregister(const MemoryRegistration& registration) override {
    ibv_dereg_mr(reinterpret_cast<ibv_mr*>(registration.handle));
  }

 private:
  ibv_pd* const pd_;
};

class RdmaTransport final : public Transport {
 public:
  explicit RdmaTransport(Options options) : impl_(std::make_shared<Impl>(std::move(options))) {}
  ~RdmaTransport() override { impl_->Stop(); }
  RdmaTransport(const RdmaTransport&) = delete;
  RdmaTransport& operator=(const RdmaTransport&) = delete;

  absl::Status Start(Handler handler) override { return impl_->Start(impl_, std::move(handler)); }
  const std::string& address() const override { return impl_->address(); }
  absl::Status Send(const std::string& to, Message message) override { return impl_->Send(to, std::move(message)); }
  void Stop() override { impl_->Stop(); }
  TransportStats stats() const override { return impl_->stats(); }
  bool PlacesInto(const std::string& /*from*/) const override { return impl_->running(); }
  absl::Status PostDestination(const std::string& from, uint64_t request_id, uint32_t frame_index,
                               Buffer destination) override {
    return impl_->PostDestination(from, request_id, frame_index, std::move(destination));
  }
  bool CancelDestination(const std::string& /*from*/, uint64_t request_id, uint32_t frame_index) override {
    return impl_->CancelDestination(request_id, frame_index);
  }

 private:
  class Impl {
   public:
    explicit Impl(Options options) : options_(std::move(options)) {}
    ~Impl() { Finish(); }

    absl::Status Start(std::shared_ptr<Impl> self, Handler handler);
    absl::Status Send(const std::string& to, Message message);
    void Stop();
    TransportStats stats() const;
    const std::string& address() const { return address_; }
    bool running() const { return state_.load(std::memory_order_acquire) == kRunning; }
    // Posted destinations (transport/transport.h) are the core's
    // (EndpointCore::PostDestination), matched by request id and frame
    // index: request ids are the poster's own, so only replies carry them.
    absl::Status PostDestination(const std::string& from, uint64_t request_id, uint32_t frame_index,
                                 Buffer destination);
    bool CancelDestination(uint64_t request_id, uint32_t frame_index);

   private:
    enum State : int { kNew, kRunning, kStopping };
    // One rdma_cm id (one queue pair once created) per connection.
    struct Link {
      ConnectionId connection = 0;
      rdma_cm_id* id = nullptr;
      bool connected = false;
    };

    absl::Status Open();
    void Loop();
    void Execute(Actions& actions, std::vector<Message>& deliveries) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
    void StartConnect(ConnectionId connection, const std::string& address, Actions& more)
        ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
    absl::Status CreateQueuePair(rdma_cm_id* id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
    // An rdma_cm event, copied out so that the event can be acknowledged
    // first (rdma_destroy_id waits for the acknowledgement of its events).
    struct CmEvent {
      rdma_cm_event_type type;
      rdma_cm_id* id;
      int status;
      std::vector<std::byte> private_data;
    };
    void HandleCmEvent(const CmEvent& event, Actions& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
    absl::Status AcceptOrConnect(rdma_cm_id* id, ConnectionId connection, bool accept, Actions& out)
        ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
    void TearDown(ConnectionId connection, const absl::Status& reason, Actions& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
    void PollCompletions(Actions& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
    Link* LinkOf(ConnectionId connection) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
    uint64_t NowMs() const;
    // Stops the delivery thread (unless called on it), then Release().
    void Finish();
    // Destroys every verbs object in reverse order of creation. The delivery
    // thread must not be running.
    void Release();

    const Options options_;
    std::string address_;  // written once in Start, before state_ becomes kRunning
    Handler handler_;      // written once in Start, then only called by the thread
    std::atomic<int> state_{kNew};
    const std::chrono::steady_clock::time_point epoch_ = std::chrono::steady_clock::now();

    std::mutex lifecycle_mu_;
    std::thread thread_ ABSL_GUARDED_BY(lifecycle_mu_);

    // Invariants: the verbs objects are created by Open (before the thread)
    // and destroyed by Finish (after it), in reverse order; core_ is destroyed
    // before the protection domain (it deregisters the cache's memory).
    mutable std::mutex mu_;
    EndpointStats final_stats_ ABSL_GUARDED_BY(mu_);  // the counters, kept when core_ goes at Stop
    rdma_event_channel* cm_channel_ = nullptr;
    rdma_cm_id* listener_ = nullptr;
    ibv_context* verbs_ = nullptr;
    ibv_pd* pd_ = nullptr;
    ibv_comp_channel* completion_channel_ = nullptr;
    ibv_cq* cq_ = nullptr;
    int cq_entries_ = 0;
    std::byte* pool_memory_ = nullptr;
    ibv_mr* pool_mr_ = nullptr;
    int wake_fd_ = -1;
    std::unique_ptr<VerbsRegistrar> registrar_;
    std::unique_ptr<EndpointCore> core_ ABSL_GUARDED_BY(mu_);
    absl::flat_hash_map<ConnectionId, Link> links_ ABSL_GUARDED_BY(mu_);
  };

  std::shared_ptr<Impl> impl_;
};

uint64_t RdmaTransport::Impl::NowMs() const {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - epoch_).count());
}

absl::Status RdmaTransport::Impl::Open() {
  absl::StatusOr<HostPort> bind = ParseRdmaAddress(options_.bind, true, true);
  if (!bind.ok()) return bind.status();
  cm_channel_ = rdma_create_event_channel();
  if (cm_channel_ == nullptr) return Errno("rdma_create_event_channel");
  if (rdma_create_id(cm_channel_, &listener_, nullptr, RDMA_PS_TCP) != 0) return Errno("rdma_create_id");
  addrinfo hints{};
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string host = IsWildcardHost(bind->host) ? "" : bind->host;
  const std::string port = std::to_string(bind->port);
  if (int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat("RDMA bind ", options_.bind, ": ", gai_strerror(rc)));
  }
  const int bound = rdma_bind_addr(listener_, found->ai_addr);
  freeaddrinfo(found);
  if (bound != 0) return Errno(absl::StrCat("rdma_bind_addr ", options_.bind));
  if (rdma_listen(listener_, 128) != 0) return Errno(absl::StrCat("rdma_listen ", options_.bind));
  const uint16_t actual_port = ntohs(rdma_get_src_port(listener_));

  verbs_ = listener_->verbs;
  if (verbs_ == nullptr) {  // wildcard bind: use the first device
    int n = 0;
    ibv_context** contexts = rdma_get_devices(&n);
    if (contexts != nullptr && n > 0) verbs_ = contexts[0];
    if (contexts != nullptr) rdma_free_devices(contexts);
  }
  if (verbs_ == nullptr) return absl::UnavailableError("no RDMA device behind the bind address");
  pd_ = ibv_alloc_pd(verbs_);
  if (pd_ == nullptr) return Errno("ibv_alloc_pd");
  completion_channel_ = ibv_create_comp_channel(verbs_);
  if (completion_channel_ == nullptr) return Errno("ibv_create_comp_channel");
  ibv_device_attr attr{};
  if (ibv_query_device(verbs_, &attr) != 0) return Errno("ibv_query_device");
  cq_entries_ = std::min(attr.max_cqe, 65536);
  cq_ = ibv_create_cq(verbs_, cq_entries_, nullptr, completion_channel_, 0);
  if (cq_ == nullptr) return Errno("ibv_create_cq");
  if (ibv_req_notify_cq(cq_, 0) != 0) return Errno("ibv_req_notify_cq");
  pool_memory_ = static_cast<std::byte*>(std::aligned_alloc(4096, (options_.pool_bytes + 4095) / 4096 * 4096));
  if (pool_memory_ == nullptr) return absl::ResourceExhaustedError("cannot allocate the RDMA buffer pool");
  pool_mr_ = ibv_reg_mr(pd_, pool_memory_, options_.pool_bytes, IBV_ACCESS_LOCAL_WRITE);
  if (pool_mr_ == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("ibv_reg_mr of the ", options_.pool_bytes,
                                                     "-byte buffer pool: ", std::strerror(errno),
                                                     " (locked-memory limit, ulimit -l?)"));
  }
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return Errno("eventfd");
  for (int fd : {cm_channel_->fd, completion_channel_->fd}) {
    if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) != 0) return Errno("fcntl");
  }
  address_ = FormatRdmaAddress(IsWildcardHost(bind->host) ? Hostname() : bind->host, actual_port);
  registrar_ = std::make_unique<VerbsRegistrar>(pd_);
  std::lock_guard lock(mu_);
  core_ = std::make_unique<EndpointCore>(ConfigFor(options_, address_),
                                         std::span<std::byte>(pool_memory_, options_.pool_bytes), pool_mr_->lkey,
                                         *registrar_);
  return absl::OkStatus();
}

absl::Status RdmaTransport::Impl::Start(std::shared_ptr<Impl> self, Handler handler) {
  std::lock_guard lock(lifecycle_mu_);
  if (state_.load() != kNew) return absl::FailedPreconditionError("transport already started or stopped");
  if (absl::Status s = Open(); !s.ok()) {
    Release();  // leaves nothing behind; a later Start may try again
    return s;
  }
  handler_ = std::move(handler);
  state_.store(kRunning, std::memory_order_release);
  thread_ = std::thread([self = std::move(self)] { self->Loop(); });
  if (options_.auth_secret_key.empty()) {
    TLOG_WARN("RDMA transport listening at {} (pool {} bytes) with authentication off: any process that can reach "
              "it can connect and read or write what it serves (no job key; docs/security.md)",
              address_, options_.pool_bytes);
  } else {
    TLOG_INFO("RDMA transport listening at {} (pool {} bytes); only holders of the job key get in", address_,
              options_.pool_bytes);
  }
  return absl::OkStatus();
}

absl::Status RdmaTransport::Impl::Send(const std::string& to, Message message) {
  const int state = state_.load(std::memory_order_acquire);
  if (state != kRunning) {
    return absl::FailedPreconditionError(state == kNew ? "transport not started" : "transport was stopped");
  }
  std::vector<Message> none;
  std::lock_guard lock(mu_);
  if (core_ == nullptr) return absl::FailedPreconditionError("transport was stopped");
  Actions actions;
  absl::Status s = core_->Send(to, std::move(message), actions);
  Execute(actions, none);  // a Send never delivers
  return s;
}

absl::Status RdmaTransport::Impl::PostDestination(const std::string& from, uint64_t request_id,
                                                  uint32_t frame_index, Buffer destination) {
  if (destination.remote()) {
    return absl::InvalidArgumentError("a posted destination must be local memory (it is written by RDMA)");
  }
  std::lock_guard lock(mu_);
  if (!running() || core_ == nullptr) return absl::FailedPreconditionError("transport not running");
  absl::Status s = core_->PostDestination(request_id, frame_index, std::move(destination));
  if (absl::IsAlreadyExists(s)) return absl::AlreadyExistsError(absl::StrCat(s.message(), " (from ", from, ")"));
  return s;
}

bool RdmaTransport::Impl::CancelDestination(uint64_t request_id, uint32_t frame_index) {
  std::lock_guard lock(mu_);
  if (core_ == nullptr) return false;  // stopped: every queue pair is gone
  Actions actions;
  const EndpointCore::CancelResult result = core_->CancelDestination(request_id, frame_index, actions);
  // A rendezvous that had named this memory to its peer: the connection
  // goes now, queue pair first, so that no write lands after we return.
  Actions more;
  for (Action& a : actions) {
    auto* x = std::get_if<DisconnectAction>(&a);
    if (x == nullptr) {
      more.push_back(std::move(a));
      continue;
    }
    if (x->log) TLOG_WARN("RDMA {}: {}", address_, x->reason.message());
    if (Link* link = LinkOf(x->connection); link != nullptr && link->connected) rdma_disconnect(link->id);
    TearDown(x->connection, x->reason, more);
  }
  std::vector<Message> deliveries;
  Execute(more, deliveries);
  for (Message& m : deliveries) {  // none expected: a cancel completes no message
    TLOG_WARN("RDMA {}: a message completed while cancelling a destination was dropped (request {})", address_,
              m.header.request_id());
  }
  return result == EndpointCore::CancelResult::kCancelled;
}

RdmaTransport::Impl::Link* RdmaTransport::Impl::LinkOf(ConnectionId connection) {
  auto it = links_.find(connection);
  return it == links_.end() ? nullptr : &it->second;
}

absl::Status RdmaTransport::Impl::CreateQueuePair(rdma_cm_id* id) {
  if (id->verbs != verbs_) {
    return absl::UnavailableError("the peer is reachable only through another RDMA device than the one bound");
  }
  const uint32_t receives = options_.credits + CreditWindow::kReservedSlots;
  const uint32_t sends = core_->config().send_queue_depth;
  if (static_cast<int64_t>(links_.size() + 1) * (receives + sends) > cq_entries_) {
    return absl::ResourceExhaustedError("too many RDMA connections for the completion queue");
  }
  ibv_qp_init_attr attr{};
  attr.send_cq = cq_;
  attr.recv_cq = cq_;
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = sends;
  attr.cap.max_recv_wr = receives;
  attr.cap.max_send_sge = 1;
  attr.cap.max_recv_sge = 1;
  if (rdma_create_qp(id, pd_, &attr) != 0) return Errno("rdma_create_qp");
  return absl::OkStatus();
}

void RdmaTransport::Impl::StartConnect(ConnectionId connection, const std::string& address, Actions& more) {
  absl::StatusOr<HostPort> hp = ParseRdmaAddress(address, false, false);
  rdma_cm_id* id = nullptr;
  absl::Status status;
  addrinfo* found = nullptr;
  if (!hp.ok()) {
    status = hp.status();
  } else if (rdma_create_id(cm_channel_, &id, nullptr, RDMA_PS_TCP) != 0) {
    status = Errno("rdma_create_id");
  } else {
    addrinfo hints{};
    hints.ai_flags = AI_NUMERICSERV;
    hints.ai_socktype = SOCK_STREAM;
    const std::string port = std::to_string(hp->port);
    if (int rc = getaddrinfo(hp->host.c_str(), port.c_str(), &hints, &found); rc != 0) {
      status = absl::UnavailableError(absl::StrCat("cannot resolve ", hp->host, ": ", gai_strerror(rc)));
    } else if (rdma_resolve_addr(id, nullptr, found->ai_addr, 2000) != 0) {
      status = Errno("rdma_resolve_addr");
    }
    if (found != nullptr) freeaddrinfo(found);
  }
  if (!status.ok()) {
    if (id != nullptr) rdma_destroy_id(id);
    core_->OnConnectionLost(connection, status, more);
    return;
  }
  links_[connection] = Link{connection, id, false};
  id->context = reinterpret_cast<void*>(static_cast<uintptr_t>(connection));
}

void RdmaTransport::Impl::TearDown(ConnectionId connection, const absl::Status& reason, Actions& out) {
  Link* link = LinkOf(connection);
  if (link != nullptr) {
    rdma_cm_id* id = link->id;
    links_.erase(connection);
    if (id->qp != nullptr) rdma_destroy_qp(id);  // no DMA after this: the core may release everything
    rdma_destroy_id(id);
  }
  core_->OnConnectionLost(connection, reason, out);
}

void RdmaTransport::Impl::Execute(Actions& actions, std::vector<Message>& deliveries) {
  // New actions produced while executing (a failed post, a failed connect) run after the current batch.
  for (size_t i = 0; i < actions.size(); ++i) {
    Actions more;
    Action& a = actions[i];
    if (auto* c = std::get_if<ConnectAction>(&a)) {
      StartConnect(c->connection, c->address, more);
    } else if (auto* r = std::get_if<PostReceiveAction>(&a)) {
      Link* link = LinkOf(r->connection);
      ibv_sge sge{r->address, r->length, r->lkey};
      ibv_recv_wr wr{};
      ibv_recv_wr* bad = nullptr;
      wr.wr_id = r->wr_id;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      if (link == nullptr || link->id->qp == nullptr || ibv_post_recv(link->id->qp, &wr, &bad) != 0) {
        core_->OnWorkFailed(r->wr_id, absl::UnavailableError("ibv_post_recv failed"), more);
      }
    } else if (auto* s = std::get_if<PostSendAction>(&a)) {
      Link* link = LinkOf(s->connection);
      ibv_sge sge{s->address, s->length, s->lkey};
      ibv_send_wr wr{};
      ibv_send_wr* bad = nullptr;
      wr.wr_id = s->wr_id;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.opcode = IBV_WR_SEND;
      wr.send_flags = IBV_SEND_SIGNALED;
      if (link == nullptr || link->id->qp == nullptr || ibv_post_send(link->id->qp, &wr, &bad) != 0) {
        core_->OnWorkFailed(s->wr_id, absl::UnavailableError("ibv_post_send failed"), more);
      }
    } else if (auto* w = std::get_if<PostWriteAction>(&a)) {
      Link* link = LinkOf(w->connection);
      ibv_sge sge{w->local_address, w->length, w->lkey};
      ibv_send_wr wr{};
      ibv_send_wr* bad = nullptr;
      wr.wr_id = w->wr_id;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.opcode = w->with_immediate ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
      wr.send_flags = IBV_SEND_SIGNALED;
      wr.imm_data = htonl(w->immediate);
      wr.wr.rdma.remote_addr = w->remote_address;
      wr.wr.rdma.rkey = w->rkey;
      if (link == nullptr || link->id->qp == nullptr || ibv_post_send(link->id->qp, &wr, &bad) != 0) {
        core_->OnWorkFailed(w->wr_id, absl::UnavailableError("ibv_post_send (write) failed"), more);
      }
    } else if (auto* d = std::get_if<DeliverAction>(&a)) {
      deliveries.push_back(std::move(d->message));
    } else if (auto* x = std::get_if<DisconnectAction>(&a)) {
      if (x->log) TLOG_WARN("RDMA {}: {}", address_, x->reason.message());
      Link* link = LinkOf(x->connection);
      if (link != nullptr && link->connected) {
        rdma_disconnect(link->id);  // the DISCONNECTED event tears it down
      } else {
        TearDown(x->connection, x->reason, more);
      }
    } else if (auto* p = std::get_if<ProblemAction>(&a)) {
      TLOG_WARN("RDMA {}: {}", address_, p->status.message());
    }
    for (Action& m : more) actions.push_back(std::move(m));
  }
  actions.clear();
}

absl::Status RdmaTransport::Impl::AcceptOrConnect(rdma_cm_id* id, ConnectionId connection, bool accept,
                                                  Actions& out) {
  absl::Status s = CreateQueuePair(id);
  if (s.ok()) s = core_->OnQueuePairReady(connection, out);
  if (!s.ok()) return s;
  std::vector<Message> none;
  Execute(out, none);  // the receives are posted before the peer can send
  std::vector<std::byte> mine = core_->LocalHandshake();
  rdma_conn_param param{};
  param.private_data = mine.data();
  param.private_data_len = static_cast<uint8_t>(mine.size());
  param.retry_count = 7;
  param.rnr_retry_count = 7;  // receives never run dry (credits), so an RNR would be a bug: retry
  if (accept ? rdma_accept(id, &param) != 0 : rdma_connect(id, &param) != 0) {
    return Errno(accept ? "rdma_accept" : "rdma_connect");
  }
  return absl::OkStatus();
}

void RdmaTransport::Impl::HandleCmEvent(const CmEvent& event, Actions& out) {
  rdma_cm_id* id = event.id;
  const ConnectionId connection = static_cast<ConnectionId>(reinterpret_cast<uintptr_t>(id->context));
  switch (event.type) {
    case RDMA_CM_EVENT_CONNECT_REQUEST: {
      // A refused request is reported (rate-limited) by the core in `out`.
      absl::StatusOr<ConnectionId> accepted = core_->OnConnectRequest(event.private_data, out);
      absl::Status s = accepted.status();
      if (accepted.ok()) {
        id->context = reinterpret_cast<void*>(static_cast<uintptr_t>(*accepted));
        links_[*accepted] = Link{*accepted, id, false};
        s = AcceptOrConnect(id, *accepted, /*accept=*/true, out);
        if (!s.ok()) TLOG_WARN("RDMA {}: refused a connection: {}", address_, s.message());
      }
      if (!s.ok()) {
        rdma_reject(id, nullptr, 0);
        if (accepted.ok()) {
          TearDown(*accepted, s, out);
        } else {
          rdma_destroy_id(id);
        }
      }
      return;
    }
    case RDMA_CM_EVENT_ADDR_RESOLVED:
      if (rdma_resolve_route(id, 2000) != 0) TearDown(connection, Errno("rdma_resolve_route"), out);
      return;
    case RDMA_CM_EVENT_ROUTE_RESOLVED:
      if (absl::Status s = AcceptOrConnect(id, connection, /*accept=*/false, out); !s.ok()) {
        TearDown(connection, s, out);
      }
      return;
    case RDMA_CM_EVENT_ESTABLISHED: {
      Link* link = LinkOf(connection);
      if (link == nullptr) return;
      link->connected = true;
      (void)core_->OnEstablished(connection, event.private_data, out);  // failures come back as actions
      return;
    }
    case RDMA_CM_EVENT_ADDR_ERROR:
    case RDMA_CM_EVENT_ROUTE_ERROR:
    case RDMA_CM_EVENT_CONNECT_ERROR:
    case RDMA_CM_EVENT_UNREACHABLE:
    case RDMA_CM_EVENT_REJECTED:
    case RDMA_CM_EVENT_DISCONNECTED:
    case RDMA_CM_EVENT_DEVICE_REMOVAL:
      if (LinkOf(connection) != nullptr) {
        TearDown(connection,
                 absl::UnavailableError(absl::StrCat(rdma_event_str(event.type), " (status ", event.status, ")")),
                 out);
      }
      return;
    default:
      return;
  }
}

void RdmaTransport::Impl::PollCompletions(Actions& out) {
  ibv_wc wc[32];
  for (;;) {
    const int n = ibv_poll_cq(cq_, 32, wc);
    if (n <= 0) return;
    for (int i = 0; i < n; ++i) {
      const ibv_wc& c = wc[i];
      if (c.status != IBV_WC_SUCCESS) {
        core_->OnWorkFailed(c.wr_id,
                            absl::UnavailableError(absl::StrCat("completion error: ", ibv_wc_status_str(c.status))),
                            out);
      } else if (c.opcode == IBV_WC_RECV) {
        core_->OnReceiveCompleted(c.wr_id, c.byte_len, std::nullopt, out);
      } else if (c.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
        core_->OnReceiveCompleted(c.wr_id, c.byte_len, ntohl(c.imm_data), out);
      } else {
        core_->OnSendCompleted(c.wr_id, out);
      }
    }
  }
}

void RdmaTransport::Impl::Loop() {
  tls_delivering_transport = this;
  std::vector<Message> deliveries;
  while (state_.load(std::memory_order_acquire) == kRunning) {
    pollfd fds[3] = {{cm_channel_->fd, POLLIN, 0}, {completion_channel_->fd, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    const int ready = poll(fds, 3, 50);
    if (ready < 0 && errno != EINTR) {
      TLOG_ERROR("RDMA {}: poll failed, delivery stops: {}", address_, std::strerror(errno));
      break;
    }
    if (state_.load(std::memory_order_acquire) != kRunning) break;
    {
      std::lock_guard lock(mu_);
      Actions actions;
      rdma_cm_event* event = nullptr;
      while (rdma_get_cm_event(cm_channel_, &event) == 0) {
        CmEvent copy{event->event, event->id, event->status, {}};
        if (event->param.conn.private_data != nullptr) {
          const auto* p = static_cast<const std::byte*>(event->param.conn.private_data);
          copy.private_data.assign(p, p + event->param.conn.private_data_len);
        }
        rdma_ack_cm_event(event);
        HandleCmEvent(copy, actions);
        Execute(actions, deliveries);
      }
      ibv_cq* cq = nullptr;
      void* cq_context = nullptr;
      if (ibv_get_cq_event(completion_channel_, &cq, &cq_context) == 0) {
        ibv_ack_cq_events(cq, 1);
        ibv_req_notify_cq(cq_, 0);  // re-arm, then drain (nothing is missed in between)
      }
      PollCompletions(actions);
      core_->Tick(NowMs(), actions);
      Execute(actions, deliveries);
    }
    for (Message& m : deliveries) {
      if (state_.load(std::memory_order_acquire) != kRunning) break;
      try {
        handler_(std::move(m));
      } catch (const std::exception& e) {
        TLOG_ERROR("RDMA {}: message handler threw: {}", address_, e.what());
      } catch (...) {
        TLOG_ERROR("RDMA {}: message handler threw a non-standard exception", address_);
      }
    }
    deliveries.clear();
  }
  tls_delivering_transport = nullptr;
}

void RdmaTransport::Impl::Stop() {
  state_.store(kStopping, std::memory_order_release);
  if (tls_delivering_transport == this) {
    // Inside the handler: the loop ends when the handler returns; Finish (a
    // later Stop or the destructor) releases the rest.
    return;
  }
  Finish();
}

void RdmaTransport::Impl::Finish() {
  std::lock_guard lifecycle(lifecycle_mu_);
  state_.store(kStopping, std::memory_order_release);
  if (wake_fd_ >= 0) {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }
  if (thread_.joinable()) {
    if (thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach();  // the last owner let go inside the handler
    } else {
      thread_.join();
    }
  }
  Release();
}

void RdmaTransport::Impl::Release() {
  std::lock_guard lock(mu_);
  for (auto& [connection, link] : links_) {
    if (link.connected) rdma_disconnect(link.id);
    if (link.id->qp != nullptr) rdma_destroy_qp(link.id);
    rdma_destroy_id(link.id);
  }
  links_.clear();
  if (core_ != nullptr) final_stats_ = core_->stats();
  core_.reset();  // deregisters the cache's memory (every queue pair is gone)
  registrar_.reset();
  if (pool_mr_ != nullptr) ibv_dereg_mr(pool_mr_);
  pool_mr_ = nullptr;
  std::free(pool_memory_);
  pool_memory_ = nullptr;
  if (cq_ != nullptr) ibv_destroy_cq(cq_);
  cq_ = nullptr;
  if (completion_channel_ != nullptr) ibv_destroy_comp_channel(completion_channel_);
  completion_channel_ = nullptr;
  if (pd_ != nullptr) ibv_dealloc_pd(pd_);
  pd_ = nullptr;
  verbs_ = nullptr;
  if (listener_ != nullptr) rdma_destroy_id(listener_);
  listener_ = nullptr;
  if (cm_channel_ != nullptr) rdma_destroy_event_channel(cm_channel_);
  cm_channel_ = nullptr;
  if (wake_fd_ >= 0) close(wake_fd_);
  wake_fd_ = -1;
}

TransportStats RdmaTransport::Impl::stats() const {
  TransportStats s;
  std::lock_guard lock(mu_);
  const EndpointStats& e = core_ != nullptr ? core_->stats() : final_stats_;
  s.messages_sent = e.messages_sent;
  s.messages_received = e.messages_received;
  s.bytes_sent = e.bytes_sent;
  s.bytes_received = e.bytes_received;
  s.malformed_received = e.malformed_received;
  s.auth_rejected = e.auth_rejected;
  return s;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Transport>> MakeRdmaTransport(Options options) {
  if (absl::Status s = ValidateOptions(options); !s.ok()) return s;
  if (absl::Status s = Usable(); !s.ok()) return s;
  return std::unique_ptr<Transport>(std::make_unique<RdmaTransport>(std::move(options)));
}

#endif

}  // namespace tessera::rdma
