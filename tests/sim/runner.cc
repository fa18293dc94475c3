#include "tests/sim/runner.h"

#include <algorithm>
#include <deque>
#include <memory>
#include <variant>

#include "tests/core/fake_shard_crypto.h"
#include "tests/sim/agent_client.h"
#include "tests/sim/clock.h"
#include "tests/sim/describe.h"
#include "tests/sim/network.h"
#include "tests/sim/workload.h"
#include "wire/frame.h"

namespace tally::sim {
namespace {

// 2023-11-14T22:13:20Z, plus up to ~2 years chosen by the seed.
constexpr uint64_t kEpochMs = 1'700'000'000'000;
// At the end: how long after the last shard expiry the operator writes off unreported ones, and
// the agents' timer period while time runs.
constexpr uint64_t kWriteOffAfterMs = 30'000;
constexpr uint64_t kAgentTimerMs = 5'000;
constexpr uint64_t kPumpIntervalMs = 100;
constexpr uint64_t kMaintainIntervalMs = 250;
constexpr size_t kReplayableFrames = 16;
// In the finish phase, each round runs this long past its next event (see finish()).
constexpr uint64_t kFinishWindowMs = 50;

struct AgentTimers {
  uint64_t pump_at_ms = 0;
  uint64_t maintain_at_ms = 0;
};

struct Knobs {
  uint64_t steps = 0;
  uint64_t gateways = 0;
  uint64_t crash_permille = 0;  // of the fault events
  uint64_t partition_permille = 0;
  uint64_t disk_full_permille = 0;
  uint64_t agents = 0;
};

class Run {
 public:
  explicit Run(const RunOptions& options)
      : options_(options),
        root_(options.seed),
        workload_rng_(root_.fork()),
        workload_(makeWorkload(&workload_rng_)),
        clock_(kEpochMs + root_.below(uint64_t{1} << 36)),
        trace_(options.trace, clock_.nowMs()),
        network_(root_.fork(), networkConfig(&root_)),
        node_(root_.fork(), ledgerOptions(&root_), &network_, &trace_),
        checker_(&trace_),
        events_(root_.fork()) {
    knobs_.steps = events_.range(100, 400);
    knobs_.gateways = events_.range(2, 4);
    knobs_.crash_permille = events_.chance(200) ? 0 : events_.range(50, 300);
    knobs_.partition_permille = events_.chance(300) ? 0 : events_.range(50, 300);
    knobs_.disk_full_permille = events_.chance(500) ? 0 : events_.range(20, 150);
    for (uint64_t g = 1; g <= knobs_.gateways; ++g) {
      gateways_.push_back(std::make_unique<Gateway>(static_cast<NodeId>(g), root_.fork(),
                                                    &workload_, &network_, &checker_, &trace_));
    }
    operator_ = static_cast<NodeId>(knobs_.gateways + 1);
    rogue_ = operator_ + 1;
    knobs_.agents = events_.range(1, 2);
    node_.setShardCrypto(&crypto_);
    for (uint32_t a = 0; a < knobs_.agents; ++a) {
      agents_.push_back(std::make_unique<AgentNode>(rogue_ + 1 + a, a + 1, root_.fork(), &crypto_,
                                                    &network_, &trace_,
                                                    [this] { return node_.up(); }));
      node_.bindGateway(agents_.back()->id(), agents_.back()->gatewayName());
      clients_.push_back(std::make_unique<AgentClient>(a + 1, root_.fork(), &workload_, &trace_));
      if (workload_.fair.has_value()) agents_.back()->configureFair(*workload_.fair);
      // Most agents are configured to keep shards of some emergency routes from the start;
      // the rest learn them from central admissions.
      if (events_.chance(700)) {
        std::vector<SubjectRoute> accounts;
        for (const Budget& b : workload_.budgets) {
          if (b.emergency.enabled && b.subject_pattern.find('*') == std::string::npos &&
              events_.chance(600)) {
            accounts.push_back({b.subject_pattern, b.route});
          }
        }
        agents_.back()->configureAccounts(std::move(accounts));
      }
    }
    shard_ttl_ms_max_ = workload_.shard_ttl_ms_max;
    timers_.resize(agents_.size());
    hold_ttl_ms_max_ = workload_.hold_ttl_ms_max;
    hard_limit_ms_max_ = workload_.hard_limit_ms_max;
#ifdef TALLY_TEST_FAULTS
    node_.setFaults(options.node_faults);
    for (auto& gateway : gateways_) gateway->setFaults(options.gateway_faults);
    for (auto& agent : agents_) agent->setFaults(options.agent_faults);
#endif
  }

  RunResult run() {
    RunResult result;
    result.seed = options_.seed;
    if (trace_.on()) {
      trace_.add(now(), "seed " + std::to_string(options_.seed) + ": " +
                            std::to_string(knobs_.gateways) + " gateways, " +
                            std::to_string(workload_.budgets.size()) + " budgets, " +
                            std::to_string(knobs_.steps) + " steps");
    }
    node_.applyLocal(wire::PublishPolicyRequest{.budgets = workload_.budgets}, now());
    for (auto& agent : agents_) {
      node_.applyLocal(wire::EnrollGatewayRequest{.gateway_name = agent->gatewayName(),
                                                  .public_key = agent->gatewayKey()},
                       now());
    }
    commit();
    for (size_t a = 0; a < agents_.size(); ++a) startAgent(a);
    uint64_t step = 0;
    for (; step < knobs_.steps && !checker_.failed(); ++step) {
      oneStep();
      check();
    }
    if (!checker_.failed()) finish();
    result.steps = step;
    result.findings = checker_.findings();
    result.failed = checker_.failedChecks();
    result.convergence_ms = checker_.convergenceMs();
    result.trace = trace_.lines();
    result.crashes = node_.crashes();
    result.messages = network_.stats().sent;
    result.closed_periods_checked = checker_.periodsChecked();
    result.shard_admissions = checker_.shardAdmissions();
    for (const auto& agent : agents_) result.agent_restarts += agent->bootEpoch() - 1;
    for (const auto& agent : agents_) {
      for (const auto& [tenant, fairness] : agent->fairness()) result.fairness.push_back(fairness);
    }
    return result;
  }

 private:
  static NetworkConfig networkConfig(Rng* rng) {
    NetworkConfig config;
    config.delay_ms_max = rng->range(1, 200);
    config.drop_permille = rng->chance(300) ? 0 : rng->range(1, 150);
    config.duplicate_permille = rng->chance(300) ? 0 : rng->range(1, 80);
    return config;
  }
  static LedgerOptions ledgerOptions(Rng* rng) {
    LedgerOptions options;
    // Sometimes a short idempotency window, so that compaction happens within a run.
    if (rng->chance(200)) options.retention_ms = rng->range(5'000, 120'000);
    return options;
  }

  uint64_t now() const { return clock_.nowMs(); }

  void oneStep() {
    agentTimers();
    const uint64_t pick = events_.below(100);
    if (pick < 28) {
      deliverOne();
    } else if (pick < 46) {
      gateways_[events_.below(gateways_.size())]->act(now());
    } else if (pick < 56) {
      const size_t a = events_.below(agents_.size());
      toAgent(a, clients_[a]->act(now()));
    } else if (pick < 62) {
      const size_t a = events_.below(agents_.size());
      toAgent(a, clients_[a]->act(now()));
    } else if (pick < 72) {
      const uint64_t max = events_.chance(50) ? hold_ttl_ms_max_ * 2 : 200;
      clock_.advance(events_.range(1, std::min<uint64_t>(max, 3'600'000)));
    } else if (pick < 86) {
      tick();
      commit();
    } else {
      fault();
    }
  }

  void tick() {
    if (node_.up()) checker_.beforeTick(node_.ledger(), now(), node_.options().retention_ms);
    node_.tick(now());
  }

  void deliverOne() {
    std::optional<Envelope> envelope = network_.takeDue(now());
    if (!envelope.has_value()) {
      const std::optional<uint64_t> next = network_.nextDueMs();
      if (next.has_value() && *next > now()) clock_.advance(*next - now());
      return;
    }
    deliver(*envelope);
  }

  void deliver(const Envelope& envelope) {
    if (envelope.to == kLedgerNode) {
      if (envelope.from > rogue_) rememberAgentFrame(envelope.frame);
      node_.receive(envelope, now());
    } else if (envelope.to == operator_) {
      operatorReply(envelope);
    } else if (envelope.to > rogue_) {
      const size_t a = envelope.to - rogue_ - 1;
      agents_[a]->onFrame(envelope.frame, now());
      afterAgent(a);
    } else if (envelope.to != rogue_) {
      gateways_[envelope.to - 1]->onFrame(envelope.frame, now());
    }
  }

  void operatorReply(const Envelope& envelope) {
    wire::FrameDecoder decoder;
    std::vector<wire::Frame> frames;
    if (!decoder.feed(envelope.frame, &frames).isOk()) return;
    for (const wire::Frame& frame : frames) {
      Result<wire::Response> response = wire::decodeResponse(frame);
      if (!response.isOk()) continue;
      if (const auto* audit = std::get_if<AuditReport>(&response.value().body)) {
        if (!audit->conserved) {
          checker_.fail(Check::kConservation,
                        "the audit the operator asked for is not conserved: " +
                            (audit->violations.empty() ? std::string() : audit->violations[0]),
                        now());
        }
      }
      if (const auto* answer = std::get_if<wire::PolicyAnswer>(&response.value().body)) {
        if (answer->reply.code == ReplyCode::kOk) {
          for (auto& gateway : gateways_) gateway->setGenerationHint(answer->reply.generation);
        }
      }
    }
  }

  void commit() {
    for (const CommittedReply& reply : node_.commit(now())) checker_.onCommitted(reply, now());
    checker_.onCompacted(node_.store().takeDeleted());
    checker_.onCompactedShards(node_.store().takeDeletedShards());
    // The live-against-durable comparison, on 2% of the commits after a change of the ledger
    // (a commit that follows none compares the same two states as the commit before it).
    const bool changed = node_.version() != committed_version_;
    committed_version_ = node_.version();
    if (node_.up() && changed && events_.chance(20)) {
      checker_.checkDurable(node_.ledger(), &node_.store(), node_.options(), now());
    }
  }

  void send(NodeId from, wire::RequestBody body) {
    Result<std::vector<uint8_t>> frame =
        wire::encodeRequestFrame(wire::Request{.request_id = ++operator_requests_, .body = body});
    if (frame.isOk()) network_.send(from, kLedgerNode, std::move(frame).value(), now());
  }

  void fault() {
    const uint64_t pick = events_.below(1000);
    // A gateway or an agent: partitions cut either from the ledger.
    const uint64_t peer = events_.range(1, gateways_.size() + agents_.size());
    const NodeId gateway = peer <= gateways_.size() ? static_cast<NodeId>(peer)
                                                    : agents_[peer - gateways_.size() - 1]->id();
    if (events_.chance(400)) {
      agentFault();
    } else if (!node_.up()) {
      if (events_.chance(600)) restart();
    } else if (pick < knobs_.crash_permille) {
      node_.crash(now());
    } else if (pick < 400) {
      if (events_.chance(knobs_.partition_permille)) {
        const bool both = events_.chance(500);
        const bool inbound = events_.chance(500);
        if (both || inbound) network_.partition(gateway, kLedgerNode);
        if (both || !inbound) network_.partition(kLedgerNode, gateway);
        if (trace_.on()) {
          trace_.add(now(), "network: partition gateway " + std::to_string(gateway) +
                                (both      ? " both ways"
                                 : inbound ? " → ledger"
                                           : " ← ledger"));
        }
      } else {
        network_.heal(gateway, kLedgerNode);
        network_.heal(kLedgerNode, gateway);
        if (trace_.on()) trace_.add(now(), "network: heal gateway " + std::to_string(gateway));
      }
    } else if (pick < 450) {
      if (events_.chance(knobs_.disk_full_permille * 4)) {
        node_.store().failCommits(events_.range(1, 2));
        if (trace_.on()) trace_.add(now(), "disk: full for the next commits");
      }
    } else if (pick < 550) {
      std::vector<Budget> budgets = changedBudgets(workload_.budgets, &events_);
      hold_ttl_ms_max_ = std::max(hold_ttl_ms_max_, holdTtlMsMax(budgets));
      hard_limit_ms_max_ = std::max(hard_limit_ms_max_, hardLimitMsMax(budgets));
      shard_ttl_ms_max_ = std::max(shard_ttl_ms_max_, shardTtlMsMax(budgets));
      if (trace_.on()) trace_.add(now(), "operator: publishes a changed policy");
      send(operator_, wire::PublishPolicyRequest{.budgets = std::move(budgets)});
    } else if (pick < 600) {
      if (trace_.on()) trace_.add(now(), "operator: rolls the policy back");
      send(operator_, wire::RollbackPolicyRequest{});
    } else if (pick < 800) {
      splitExpiry();
    } else if (pick < 900) {
      rogueFrame();
    } else if (pick < 930) {
      if (trace_.on()) trace_.add(now(), "operator: audits");
      send(operator_, AuditRequest{});
    } else if (pick < 950) {
      send(operator_, HealthRequest{});
    } else {
      shardOperator();
    }
  }

  void restart() {
    std::string error;
    if (!node_.restart(now(), &error)) {
      checker_.fail(Check::kLostAcknowledged, "the ledger cannot restart: " + error, now());
    }
    checker_.onLedgerRestarted();
  }

  // Begins the expiry of a due RESERVED reservation, or completes one begun earlier.
  void splitExpiry() {
    if (!expiring_.empty() && events_.chance(500)) {
      const size_t index = events_.below(expiring_.size());
      (void)node_.completeExpiry(expiring_[index], now());
      expiring_.erase(expiring_.begin() + static_cast<std::ptrdiff_t>(index));
      return;
    }
    std::vector<std::string> due;
    // RESERVED ones are live (the archive holds only receipts of terminal ones).
    node_.ledger().forEachLiveReservation([&](const Reservation& r) {
      if (r.state == ReservationState::kReserved && r.expires_at_ms <= now()) {
        due.push_back(r.reservation_id);
      }
    });
    if (due.empty()) return;
    std::sort(due.begin(), due.end());  // the table's order is not the seed's
    const std::string& id = due[events_.below(due.size())];
    if (node_.beginExpiry(id, now())) expiring_.push_back(id);
  }

  // What a replay sends again: the last kReplayableFrames frames agents sent the ledger.
  void rememberAgentFrame(const std::vector<uint8_t>& frame) {
    if (agent_frames_.size() == kReplayableFrames) agent_frames_.pop_front();
    agent_frames_.push_back(frame);
  }

  // Malformed and oversized frames from a peer that is not a gateway, or an agent's earlier
  // frame replayed: the ledger answers or closes, and nothing else changes.
  void rogueFrame() {
    std::vector<uint8_t> bytes;
    const uint64_t kind = events_.below(5);
    if (kind == 4) {
      // A replay: a frame an agent sent the ledger earlier (a reserve, a follow-up, a shard
      // issue or report), sent again from elsewhere, perhaps after the agent restarted and its
      // shards were reconciled: signed and well formed, and stale.
      if (agent_frames_.empty()) return;
      bytes = agent_frames_[events_.below(agent_frames_.size())];
      if (trace_.on()) trace_.add(now(), "rogue: replays an agent's earlier frame");
      network_.send(rogue_, kLedgerNode, std::move(bytes), now());
      return;
    }
    if (kind == 0) {  // garbage under a valid length
      const uint32_t length = static_cast<uint32_t>(events_.range(1, 64));
      for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<uint8_t>(length >> (8 * i)));
      for (uint32_t i = 0; i < length; ++i) bytes.push_back(static_cast<uint8_t>(events_.next()));
    } else if (kind == 1) {  // a length above the frame limit
      const uint32_t length = static_cast<uint32_t>(limits::kFrameBytesMaxDefault + 1);
      for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<uint8_t>(length >> (8 * i)));
    } else if (kind == 2) {  // a zero length
      bytes = {0, 0, 0, 0};
    } else {  // a real request with bytes flipped in its body
      Result<std::vector<uint8_t>> frame =
          wire::encodeRequestFrame(wire::Request{.request_id = 7, .body = QueryRequest{"g1-j0"}});
      if (!frame.isOk()) return;
      bytes = std::move(frame).value();
      for (int i = 0; i < 3; ++i) {
        bytes[4 + events_.below(bytes.size() - 4)] ^= static_cast<uint8_t>(events_.range(1, 255));
      }
    }
    if (trace_.on())
      trace_.add(now(), "rogue: sends a malformed frame (kind " + std::to_string(kind) + ")");
    network_.send(rogue_, kLedgerNode, std::move(bytes), now());
  }

  // --- agents ------------------------------------------------------------------------------

  void startAgent(size_t a) {
    std::string error;
    if (!agents_[a]->start(now(), &error)) {
      checker_.fail(Check::kLostAcknowledged, "an agent cannot restart: " + error, now());
    }
    afterAgent(a);
  }

  void toAgent(size_t a, std::vector<AgentClient::Request> requests) {
    // Nothing reached the agent since its last check (every entry point is followed by one).
    if (requests.empty()) return;
    for (auto& [tag, body] : requests) {
      if (trace_.on()) trace_.add(now(), "client " + std::to_string(a + 1) + ": " + describe(body));
      agents_[a]->request(tag, body, now());
    }
    afterAgent(a);
  }

  // A reply an agent's gateway accepts that is the ledger's word (a central receipt, passed on
  // or resolved by the agent): what it says must hold in the ledger from now on, as a direct
  // gateway's. Shard and shadow admissions (origin set) and the agent's own refusals are not
  // the ledger's; QUEUED follow-ups are checked by their delivery (outboxesUndrained, the sums).
  void acknowledgedThroughAgent(const wire::ResponseBody& body) {
    const auto* reply = std::get_if<ReservationReply>(&body);
    if (reply == nullptr || reply->code != ReplyCode::kOk || !reply->receipt.origin.empty() ||
        reply->receipt.reservation_id.empty() ||
        reply->receipt.state == ReservationState::kRejected) {
      return;
    }
    const bool actual_known =
        reply->receipt.state == ReservationState::kSettled && !reply->receipt.closed_by_hard_limit;
    checker_.onAcknowledged(reply->receipt.reservation_id, *reply, actual_known, now());
  }

  // The agent's answers to its gateway, then the checks of the agent's state.
  void afterAgent(size_t a) {
    for (;;) {
      std::vector<AgentNode::Reply> replies = agents_[a]->takeReplies();
      if (replies.empty()) break;
      for (auto& [tag, body] : replies) {
        acknowledgedThroughAgent(body);
        clients_[a]->onReply(tag, body, now());
      }
    }
    AgentNode& agent = *agents_[a];
    // A stale shard report (superseded by a later one), replayed now and then by a rogue.
    for (std::vector<uint8_t>& report : agent.takeStaleReports()) {
      if (!events_.chance(250)) continue;
      if (trace_.on()) trace_.add(now(), "rogue: replays a superseded shard report");
      network_.send(rogue_, kLedgerNode, std::move(report), now());
    }
    for (FairViolation& v : agent.takeFairViolations()) {
      checker_.fail(v.over_budget ? Check::kFairnessOverBudget : Check::kFairScheduling, v.detail,
                    now());
    }
    if (agent.up() && !checker_.failed()) {
      checker_.afterAgentStep(agent.gatewayName(), agent.bootEpoch(), agent.book(), now());
    }
  }

  // The agents' timers, as they fall due on the simulated clock: the pump (local expiry,
  // outbox, policy, the link's timeouts) and the shard keeper's maintain.
  void agentTimers() {
    for (size_t a = 0; a < agents_.size(); ++a) {
      AgentTimers& timers = timers_[a];
      if (now() >= timers.pump_at_ms) {
        agents_[a]->pump(now());
        timers.pump_at_ms = now() + kPumpIntervalMs;
        afterAgent(a);
      }
      if (now() >= timers.maintain_at_ms) {
        agents_[a]->maintain(now());
        timers.maintain_at_ms = now() + kMaintainIntervalMs;
        afterAgent(a);
      }
    }
  }

  // A crash or restart of an agent, or a full disk under it.
  void agentFault() {
    const size_t a = events_.below(agents_.size());
    AgentNode& agent = *agents_[a];
    if (events_.chance(500)) {  // the agent's link: cut both ways (emergency mode) or healed
      const bool cut = !network_.partitioned(agent.id(), kLedgerNode);
      if (cut) {
        network_.partition(agent.id(), kLedgerNode);
        network_.partition(kLedgerNode, agent.id());
      } else {
        network_.heal(agent.id(), kLedgerNode);
        network_.heal(kLedgerNode, agent.id());
      }
      if (trace_.on()) {
        trace_.add(now(), "network: " + std::string(cut ? "partition " : "heal ") +
                              agent.gatewayName() + (cut ? " both ways" : ""));
      }
    } else if (!agent.up()) {
      startAgent(a);
    } else if (events_.chance(knobs_.crash_permille + 100)) {
      agent.crash(now());
      afterAgent(a);
    } else if (events_.chance(knobs_.disk_full_permille * 4)) {
      agent.failWrites(events_.range(1, 2));
      if (trace_.on()) trace_.add(now(), agent.gatewayName() + ": disk full for the next writes");
    }
  }

  // The operator revokes an agent's shards, or writes off an expired shard never reported.
  void shardOperator() {
    if (events_.chance(500)) {
      const AgentNode& agent = *agents_[events_.below(agents_.size())];
      if (trace_.on()) trace_.add(now(), "operator: revokes the shards of " + agent.gatewayName());
      send(operator_, RevokeShardsRequest{.gateway_name = agent.gatewayName()});
      return;
    }
    if (!node_.up()) return;
    std::vector<std::string> expired;
    for (const ShardLedgerView& view : node_.ledger().listShards("", std::nullopt).shards) {
      if (!view.reported && view.grant.expires_at_ms <= now()) {
        expired.push_back(view.grant.shard_id);
      }
    }
    if (expired.empty()) return;
    const std::string& id = expired[events_.below(expired.size())];
    if (trace_.on()) trace_.add(now(), "operator: writes off shard " + id);
    send(operator_, WriteOffShardRequest{.shard_id = id});
  }

  void check() {
    if (!node_.up()) return;
    if (node_.version() != checked_version_) {
      checker_.afterStep(node_.ledger(), now());
      checked_version_ = node_.version();
    } else {
      checker_.afterAcknowledgements(node_.ledger(), now());
    }
  }

  // Heal everything, restart the ledger and every agent, let every job finish and time pass
  // beyond every hold TTL, hard limit and shard lifetime (the operator writes off what was
  // never reported); then the end-state checks.
  void finish() {
    if (trace_.on()) trace_.add(now(), "--- heal: every link, no more drops; time passes ---");
    network_.calm();
    node_.store().failCommits(0);
    if (!node_.up()) restart();
    // Configured accounts keep shards on hand for ever: the operator removes them from each
    // agent's configuration and restarts it (its shards close at boot and are reported).
    for (size_t a = 0; a < agents_.size(); ++a) {
      agents_[a]->failWrites(0);
      agents_[a]->configureAccounts({});
      agents_[a]->crash(now());
      afterAgent(a);
      startAgent(a);
    }
    const uint64_t shards_done_at = now() + kAccountIdleMs + shard_ttl_ms_max_ + kWriteOffAfterMs;
    const uint64_t deadline =
        std::max(now() + hold_ttl_ms_max_ + hard_limit_ms_max_ * 3 + 60'000, shards_done_at);
    bool written_off = false;
    for (int round = 0; round < 100'000 && !checker_.failed() && node_.up(); ++round) {
      while (std::optional<Envelope> envelope = network_.takeDue(now())) deliver(*envelope);
      tick();
      commit();
      for (auto& gateway : gateways_) gateway->settleDown(now());
      for (size_t a = 0; a < agents_.size(); ++a) toAgent(a, clients_[a]->settleDown(now()));
      // The agents' timers as they fall due (the rounds are at most kAgentTimerMs apart while
      // an agent has work), as in the steps before.
      agentTimers();
      if (!written_off && now() >= shards_done_at) {
        writeOffUnreported();
        written_off = true;
      }
      check();
      const bool agents_idle =
          std::all_of(clients_.begin(), clients_.end(), [](const auto& c) { return c->idle(); }) &&
          std::all_of(agents_.begin(), agents_.end(), [this](const auto& a) {
            if (!a->up()) return true;
            if (a->busy() || a->outboxDepth() != 0) return false;
            // A report the ledger can no longer take (its shard compacted) is not waited for.
            const std::vector<std::string> owed = a->book().shardsNeedingReport();
            return std::all_of(owed.begin(), owed.end(), [this](const std::string& id) {
              return checker_.shardCompacted(id);
            });
          });
      const bool idle =
          network_.inFlight() == 0 && !node_.hasUncommitted() && agents_idle &&
          std::all_of(gateways_.begin(), gateways_.end(), [](const auto& g) { return g->idle(); });
      const std::optional<uint64_t> close = nextUnknownCloseMs();
      if (idle && !close.has_value() && now() >= deadline && written_off) break;
      // Straight to the next thing that can happen: a delivery, a gateway's timer, a hard
      // limit; agents' timers at least every kAgentTimerMs while they have work.
      // Past the deadline (waiting for the last deliveries or an agent's work), the agents'
      // timer paces the rounds: a deadline already passed is no next event.
      uint64_t next = deadline > now() ? deadline : now() + kAgentTimerMs;
      if (std::optional<uint64_t> due = network_.nextDueMs()) next = std::min(next, *due);
      for (auto& gateway : gateways_) {
        if (std::optional<uint64_t> wake = gateway->nextWakeMs()) next = std::min(next, *wake);
      }
      for (auto& client : clients_) {
        if (std::optional<uint64_t> wake = client->nextWakeMs()) next = std::min(next, *wake);
      }
      if (!written_off) next = std::min(next, shards_done_at);
      if (!agents_idle || now() < shards_done_at) next = std::min(next, now() + kAgentTimerMs);
      if (close.has_value()) next = std::min(next, *close);
      // kFinishWindowMs past it: what falls due together (a reply and the timer it wakes, a
      // burst of deliveries) is handled, and checked, in one round rather than one round each.
      clock_.advance((next > now() ? next - now() : 0) + kFinishWindowMs);
    }
    if (node_.up() && !checker_.failed()) {
      checker_.atEnd(node_.ledger(), now());
      for (const auto& agent : agents_) {
        if (!agent->up()) continue;
        checker_.atEndAgent(agent->gatewayName(), agent->book(), agent->outboxDepth(),
                            agent->outboxRows(), now());
      }
      checker_.checkDurable(node_.ledger(), &node_.store(), node_.options(), now());
    }
  }

  // The operator's runbook for a shard whose agent never reported it (its issue answer was
  // lost and the agent restarted under a new boot epoch, say): write it off once expired.
  void writeOffUnreported() {
    for (const ShardLedgerView& view : node_.ledger().listShards("", std::nullopt).shards) {
      if (view.reported || view.grant.expires_at_ms > now() ||
          (view.state != ShardState::kIssued && view.state != ShardState::kRevoked)) {
        continue;
      }
      if (trace_.on()) trace_.add(now(), "operator: writes off unreported " + view.grant.shard_id);
      send(operator_, WriteOffShardRequest{.shard_id = view.grant.shard_id});
    }
  }

  // When the earliest USAGE_UNKNOWN reaches its hard execution limit, if any is left.
  std::optional<uint64_t> nextUnknownCloseMs() const {
    // The count by state costs O(live reservations); the scan below decodes every receipt.
    const uint64_t unknown =
        node_.ledger()
            .reservationCountsByState()[static_cast<size_t>(ReservationState::kUsageUnknown)];
    if (unknown == 0) return std::nullopt;
    std::optional<uint64_t> earliest;
    auto visit = [&](const Reservation& r) {
      if (r.state != ReservationState::kUsageUnknown) return false;
      const AccountEntry* entry =
          node_.ledger().accounts().find(r.subject, r.route, r.policy_generation);
      const uint64_t at =
          r.started_at_ms + (entry != nullptr ? entry->budget.hard_execution_limit_ms : 0);
      earliest = std::min(earliest.value_or(at), at);
      return true;
    };
    // The checker's USAGE_UNKNOWN sightings name them all, unless one appeared since its last
    // look: then every reservation is visited.
    uint64_t found = 0;
    for (const auto& [id, since_ms] : checker_.unknownSince()) {
      const Reservation* r = node_.ledger().findReservation(id);
      if (r != nullptr && visit(*r)) ++found;
    }
    if (found == unknown) return earliest;
    earliest.reset();  // USAGE_UNKNOWN is never a receipt: the live table holds them all
    node_.ledger().forEachLiveReservation([&](const Reservation& r) { (void)visit(r); });
    return earliest;
  }

  RunOptions options_;
  Rng root_;
  Rng workload_rng_;
  Workload workload_;
  SimClock clock_;
  Trace trace_;
  Network network_;
  LedgerNode node_;
  Checker checker_;
  Rng events_;
  Knobs knobs_;
  std::vector<std::unique_ptr<Gateway>> gateways_;
  NodeId operator_ = 0;
  NodeId rogue_ = 0;
  std::deque<std::vector<uint8_t>> agent_frames_;  // rememberAgentFrame
  uint64_t operator_requests_ = 0;
  uint64_t hold_ttl_ms_max_ = 0;
  uint64_t hard_limit_ms_max_ = 0;
  std::vector<std::string> expiring_;
  uint64_t shard_ttl_ms_max_ = 0;
  testing::KeyedFakeShardCrypto crypto_;
  std::vector<std::unique_ptr<AgentNode>> agents_;
  std::vector<std::unique_ptr<AgentClient>> clients_;
  std::vector<AgentTimers> timers_;
  uint64_t checked_version_ = ~uint64_t{0};
  uint64_t committed_version_ = ~uint64_t{0};  // the ledger's version after the last commit
};

}  // namespace

RunResult runOne(const RunOptions& options) { return Run(options).run(); }

}  // namespace tally::sim
