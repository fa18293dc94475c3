#include "core/agent_core.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "tests/core/fake_shard_crypto.h"

// The agent's whole decision logic for gateway requests (AgentCore) alone: no sockets, files or
// clocks. A time is a number, the link's answers and the store's outcome are arguments — as a
// simulator drives it.

namespace tally {
namespace {

constexpr uint64_t kT0 = 1'800'000'000'000;
const AgentLinkState kUp{.connected = true, .health = LinkHealth::kHealthy};
const AgentLinkState kPartitioned{.connected = true, .health = LinkHealth::kPartitioned};
const AgentLinkState kDown{.connected = false, .health = LinkHealth::kPartitioned};

template <typename T, typename Effects>
std::vector<T> only(const Effects& effects) {
  std::vector<T> found;
  for (const auto& effect : effects) {
    if (const T* value = std::get_if<T>(&effect)) found.push_back(*value);
  }
  return found;
}

ReserveRequest reserveOf(const std::string& id, Units units = 5) {
  return {.reservation_id = id, .subject = "tenant-a", .route = "chat", .units = units};
}

AgentLedgerAnswer answeredWith(ReplyCode code, ReservationState state) {
  ReservationReply reply;
  reply.code = code;
  reply.receipt.state = state;
  return {.outcome = LinkOutcome::kAnswered,
          .reservation = reply,
          .label = code == ReplyCode::kOk ? "ok" : replyCodeName(code)};
}

AgentLedgerAnswer lost() {
  return {.outcome = LinkOutcome::kLost,
          .error = "timed out",
          .error_detail = "UNAVAILABLE: timed out"};
}

class AgentCoreTest : public ::testing::Test {
 protected:
  AgentCoreTest()
      : core_(
            AgentCoreOptions{.ledger_window_max = 2},
            [this](uint64_t token) { return !gone_.contains(token); }, nullptr) {
    core_.start({}, kT0);
    (void)core_.takeEffects();
  }

  uint64_t request(const AgentRequest& request, const AgentLinkState& link, uint64_t now_ms = kT0) {
    const uint64_t token = core_.newToken();
    core_.onRequest(token, request, link, now_ms);
    return token;
  }

  // The one call (of type T) the effects ask for.
  template <typename T>
  uint64_t expectCall(const AgentCoreEffects& effects) {
    for (const AgentCall& call : only<AgentCall>(effects)) {
      if (std::holds_alternative<T>(call.body)) return call.call;
    }
    ADD_FAILURE() << "no call of the expected kind";
    return 0;
  }

  std::set<uint64_t> gone_;
  AgentCore core_;
};

// Enforce, link usable: the reserve is sent as is and the ledger's answer passed on.
TEST_F(AgentCoreTest, AReserveIsForwardedAndTheLedgersAnswerPassedOn) {
  const uint64_t token = request(reserveOf("r1"), kUp);
  AgentCoreEffects effects = core_.takeEffects();
  ASSERT_EQ(only<AgentSend>(effects).size(), 1u);
  EXPECT_EQ(only<AgentSend>(effects)[0].token, token);
  core_.onAnswer(token, answeredWith(ReplyCode::kOk, ReservationState::kReserved), kUp, kT0, 0);
  effects = core_.takeEffects();
  ASSERT_EQ(only<AgentReplyLedgerAnswer>(effects).size(), 1u);
  EXPECT_EQ(only<AgentReplyLedgerAnswer>(effects)[0].token, token);
}

// Extend of a ledger reservation: forwarded while the link is usable and the ledger's answer
// passed on; a lost answer, a partition or no link is UNAVAILABLE, never a local guess.
TEST_F(AgentCoreTest, AnExtendIsForwardedOnlyOverAUsableLink) {
  const ExtendRequest extend{
      .reservation_id = "r1", .operation_id = "op", .reserved_units_total = 900};
  const uint64_t token = request(extend, kUp);
  AgentCoreEffects effects = core_.takeEffects();
  ASSERT_EQ(only<AgentSend>(effects).size(), 1u);
  EXPECT_EQ(only<AgentSend>(effects)[0].token, token);
  core_.onAnswer(token, answeredWith(ReplyCode::kRejected, ReservationState::kStarted), kUp, kT0,
                 0);
  effects = core_.takeEffects();
  ASSERT_EQ(only<AgentReplyLedgerAnswer>(effects).size(), 1u);
  EXPECT_EQ(only<AgentReplyLedgerAnswer>(effects)[0].token, token);

  const uint64_t lost_one = request(extend, kUp, kT0 + 1);
  (void)core_.takeEffects();
  core_.onAnswer(lost_one, lost(), kUp, kT0 + 2, 0);
  effects = core_.takeEffects();
  ASSERT_EQ(only<AgentReplyUnavailable>(effects).size(), 1u);
  EXPECT_EQ(only<AgentReplyUnavailable>(effects)[0].token, lost_one);
  EXPECT_FALSE(core_.unknown().contains("r1"));  // not a reserve: nothing to resolve

  for (const AgentLinkState& link : {kPartitioned, kDown}) {
    const uint64_t refused = request(extend, link, kT0 + 3);
    effects = core_.takeEffects();
    EXPECT_TRUE(only<AgentSend>(effects).empty());
    ASSERT_EQ(only<AgentReplyUnavailable>(effects).size(), 1u);
    EXPECT_EQ(only<AgentReplyUnavailable>(effects)[0].token, refused);
  }
}

// A lost answer is RESERVATION_UNKNOWN; the retry with the same id waits for the resolution:
// a query with the same id, and (the ledger never saw it) the same reserve again.
TEST_F(AgentCoreTest, ALostReserveIsResolvedByQueryThenTheSameReserve) {
  const uint64_t first = request(reserveOf("r1"), kUp);
  (void)core_.takeEffects();
  core_.onAnswer(first, lost(), kUp, kT0 + 1, 0);
  AgentCoreEffects effects = core_.takeEffects();
  ASSERT_EQ(only<AgentReplyUnavailable>(effects).size(), 1u);
  EXPECT_EQ(only<AgentReplyUnavailable>(effects)[0].message, kAgentOutcomeUnknown);
  EXPECT_TRUE(core_.unknown().contains("r1"));

  const uint64_t retry = request(reserveOf("r1"), kUp, kT0 + 2);
  effects = core_.takeEffects();
  EXPECT_TRUE(only<AgentSend>(effects).empty()) << "never sent as a new reserve";
  const uint64_t query = expectCall<QueryRequest>(effects);
  EXPECT_EQ(std::get<QueryRequest>(only<AgentCall>(effects)[0].body).reservation_id, "r1");

  core_.onAnswer(query, answeredWith(ReplyCode::kNotFound, ReservationState::kRequested), kUp,
                 kT0 + 3, 0);
  effects = core_.takeEffects();
  const uint64_t resend = expectCall<ReserveRequest>(effects);
  EXPECT_EQ(std::get<ReserveRequest>(only<AgentCall>(effects)[0].body).reservation_id, "r1");

  core_.onAnswer(resend, answeredWith(ReplyCode::kOk, ReservationState::kReserved), kUp, kT0 + 4,
                 0);
  effects = core_.takeEffects();
  ASSERT_EQ(only<AgentReplyLedgerAnswer>(effects).size(), 1u);
  EXPECT_EQ(only<AgentReplyLedgerAnswer>(effects)[0].token, retry);
  EXPECT_FALSE(core_.unknown().contains("r1"));
}

// Partitioned: a settle is queued durably (QUEUED only after the write), delivered on
// reconnect, and removed from the store once the ledger answered.
TEST_F(AgentCoreTest, APartitionQueuesFollowUpsDurablyAndDeliversThemOnReconnect) {
  const uint64_t token = request(
      SettleRequest{.reservation_id = "r1", .operation_id = "op", .actual_units = 3}, kPartitioned);
  EXPECT_TRUE(only<AgentReplyQueued>(core_.takeEffects()).empty()) << "not durable yet";
  core_.onIterationEnd(kT0);
  AgentCoreEffects effects = core_.takeEffects();
  ASSERT_EQ(only<AgentPersist>(effects).size(), 1u);
  core_.persisted(true, "", kT0);
  effects = core_.takeEffects();
  ASSERT_EQ(only<AgentReplyQueued>(effects).size(), 1u);
  EXPECT_EQ(only<AgentReplyQueued>(effects)[0].token, token);

  // Behind a non-empty outbox, a later follow-up queues too even though the link is back.
  (void)request(ReleaseRequest{.reservation_id = "r2"}, kUp);
  EXPECT_TRUE(only<AgentSend>(core_.takeEffects()).empty()) << "never overtakes the outbox";

  core_.onConnected(kUp, kT0 + 10);
  effects = core_.takeEffects();
  const uint64_t delivery = expectCall<OutboxEntry>(effects);
  core_.onAnswer(delivery, answeredWith(ReplyCode::kOk, ReservationState::kSettled), kUp, kT0 + 11,
                 0);
  effects = core_.takeEffects();
  ASSERT_EQ(only<AgentRemoveDelivered>(effects).size(), 1u);
  EXPECT_EQ(only<AgentRemoveDelivered>(effects)[0].seq, 1u);
}

// A forwarded settle whose answer is lost goes to the outbox (exactly once, later).
TEST_F(AgentCoreTest, AForwardedFollowUpWhoseAnswerIsLostIsQueued) {
  const uint64_t token =
      request(SettleRequest{.reservation_id = "r1", .operation_id = "op", .actual_units = 3}, kUp);
  ASSERT_EQ(only<AgentSend>(core_.takeEffects()).size(), 1u);
  core_.onAnswer(token, lost(), kUp, kT0 + 1, 0);
  AgentCoreEffects effects = core_.takeEffects();
  bool logged = false;
  for (const ShardNote& note : only<ShardNote>(effects))
    logged |= note.event == "queued_after_link_failure";
  EXPECT_TRUE(logged);
  core_.onIterationEnd(kT0 + 1);
  ASSERT_EQ(only<AgentPersist>(core_.takeEffects()).size(), 1u);
  core_.persisted(true, "", kT0 + 1);
  effects = core_.takeEffects();
  ASSERT_EQ(only<AgentReplyQueued>(effects).size(), 1u);
  EXPECT_EQ(only<AgentReplyQueued>(effects)[0].token, token);
}

// Partitioned, no shards: reserve is REJECTED ledger-unavailable; start is kUnavailable; an id
// sent to the ledger before is never admitted on the agent's own.
TEST_F(AgentCoreTest, APartitionRejectsReservesAndStarts) {
  (void)request(reserveOf("r1"), kPartitioned);
  AgentCoreEffects effects = core_.takeEffects();
  ASSERT_EQ(only<AgentReplyReservation>(effects).size(), 1u);
  EXPECT_EQ(only<AgentReplyReservation>(effects)[0].reply.receipt.limiting_dimension,
            LimitingDimension::kLedgerUnavailable);
  (void)request(StartRequest{.reservation_id = "r1", .operation_id = "op"}, kPartitioned);
  EXPECT_EQ(only<AgentReplyUnavailable>(core_.takeEffects()).size(), 1u);
}

// The window: at most ledger_window_max sent; a waiting request whose requester is gone when
// its turn comes is dropped, never sent.
TEST_F(AgentCoreTest, AWaitingRequestWhoseRequesterIsGoneIsDroppedUnsent) {
  const uint64_t a = request(reserveOf("a"), kUp);
  (void)request(reserveOf("b"), kUp);
  const uint64_t c = request(reserveOf("c"), kUp);
  EXPECT_EQ(only<AgentSend>(core_.takeEffects()).size(), 2u);
  gone_.insert(c);
  core_.onAnswer(a, answeredWith(ReplyCode::kOk, ReservationState::kReserved), kUp, kT0, 0);
  (void)core_.takeEffects();
  core_.onIterationEnd(kT0);
  AgentCoreEffects effects = core_.takeEffects();
  ASSERT_EQ(only<AgentDrop>(effects).size(), 1u);
  EXPECT_EQ(only<AgentDrop>(effects)[0].token, c);
  EXPECT_TRUE(only<AgentSend>(effects).empty());
}

// Shadow mode (policy fetched on connect): what the ledger refused is admitted locally and the
// decision counted; later operations on it are answered locally.
TEST_F(AgentCoreTest, ShadowAdmitsLocallyWhatTheLedgerRefused) {
  core_.onConnected(kUp, kT0);
  const uint64_t show = expectCall<AgentShowPolicy>(core_.takeEffects());
  Budget budget{.subject_pattern = "tenant-*", .route = "chat"};
  budget.rollout.mode = RolloutMode::kShadow;
  core_.onAnswer(show,
                 {.outcome = LinkOutcome::kAnswered,
                  .policy_reply = PolicyReply{.code = ReplyCode::kOk, .generation = 4},
                  .policy = Policy{.generation = 4, .budgets = {budget}}},
                 kUp, kT0, 0);
  (void)core_.takeEffects();
  EXPECT_EQ(core_.policy().mode("tenant-a", "chat"), RolloutMode::kShadow);

  const uint64_t token = request(reserveOf("r1"), kUp);
  ASSERT_EQ(only<AgentSend>(core_.takeEffects()).size(), 1u) << "shadow asks the ledger";
  core_.onAnswer(token, answeredWith(ReplyCode::kRejected, ReservationState::kRejected), kUp, kT0,
                 0);
  AgentCoreEffects effects = core_.takeEffects();
  ASSERT_EQ(only<AgentCountShadow>(effects).size(), 1u);
  EXPECT_STREQ(only<AgentCountShadow>(effects)[0].decision.outcome, "rejected");
  ASSERT_EQ(only<AgentReplyReservation>(effects).size(), 1u);
  EXPECT_EQ(only<AgentReplyReservation>(effects)[0].reply.receipt.origin, kOriginShadow);
  EXPECT_TRUE(core_.local().contains("r1"));
  (void)request(StartRequest{.reservation_id = "r1", .operation_id = "op"}, kUp);
  effects = core_.takeEffects();
  EXPECT_TRUE(only<AgentSend>(effects).empty());
  ASSERT_EQ(only<AgentReplyReservation>(effects).size(), 1u) << "answered locally";
}

// Shutdown at once: a sent follow-up is queued durably, everything else hears "retry with the
// same id"; nothing is queued after that write.
TEST_F(AgentCoreTest, ShutdownAnswersEveryoneStillWaiting) {
  const uint64_t settle =
      request(SettleRequest{.reservation_id = "r1", .operation_id = "op", .actual_units = 3}, kUp);
  const uint64_t reserve = request(reserveOf("r2"), kUp);
  (void)core_.takeEffects();
  core_.beginShutdown(0, kT0);
  AgentCoreEffects effects = core_.takeEffects();
  ASSERT_EQ(only<AgentShutdownAnswering>(effects).size(), 1u);
  ASSERT_EQ(only<AgentReplyUnavailable>(effects).size(), 1u);
  EXPECT_EQ(only<AgentReplyUnavailable>(effects)[0].token, reserve);
  ASSERT_EQ(only<AgentPersist>(effects).size(), 1u);
  core_.persisted(true, "", kT0);
  effects = core_.takeEffects();
  ASSERT_EQ(only<AgentReplyQueued>(effects).size(), 1u);
  EXPECT_EQ(only<AgentReplyQueued>(effects)[0].token, settle);
  core_.onAnswer(settle, answeredWith(ReplyCode::kOk, ReservationState::kSettled), kUp, kT0, 0);
  EXPECT_TRUE(core_.takeEffects().empty()) << "a late answer changes nothing";
}

// With shards: a partition-time reserve is handed to ShardKeeping (answered after its commit);
// an id sent to the ledger before the partition is never admitted from a shard.
TEST(AgentCoreShardsTest, APartitionAdmitsFromAShardButNeverAnIdSentToTheLedger) {
  class Store : public ShardBookStore {
   public:
    Status commit(const ShardBook&, const ShardBookChanges&) override { return Status::ok(); }
  } store;
  testing::KeyedFakeShardCrypto crypto;
  PublicKey gateway{};
  gateway.fill(1);
  ShardKeeping keeping(
      {.gateway_id = gateway, .boot_epoch = 7, .crypto = &crypto, .hold_ttl_ms = 30'000},
      {.gateway_name = "gw-1", .gateway_id = gateway, .boot_epoch = 7}, &store);
  ShardGrant grant{.shard_id = "s1",
                   .subject = "tenant-a",
                   .route = "chat",
                   .policy_generation = 1,
                   .gateway_id = gateway,
                   .gateway_name = "gw-1",
                   .gateway_boot_epoch = 7,
                   .fence = 1,
                   .allocated_units = 100,
                   .issued_at_ms = kT0,
                   .expires_at_ms = kT0 + 600'000};
  crypto.signGrant(&grant);
  ASSERT_EQ(keeping.bookForRestore()->addShard(grant, kT0), ShardAddCode::kOk);

  AgentCore core(AgentCoreOptions{}, nullptr, &keeping);
  core.start({}, kT0);
  const uint64_t sent = core.newToken();
  core.onRequest(sent, reserveOf("r-sent"), kUp, kT0);
  ASSERT_EQ(only<AgentSend>(core.takeEffects()).size(), 1u);
  core.onAnswer(sent, answeredWith(ReplyCode::kRejected, ReservationState::kRejected), kUp, kT0, 0);
  (void)core.takeEffects();

  const uint64_t again = core.newToken();
  core.onRequest(again, reserveOf("r-sent"), kPartitioned, kT0 + 1);
  AgentCoreEffects effects = core.takeEffects();
  EXPECT_TRUE(only<AgentToShards>(effects).empty()) << "the ledger may hold it: never a shard";
  ASSERT_EQ(only<AgentReplyUnavailable>(effects).size(), 1u);
  EXPECT_NE(only<AgentReplyUnavailable>(effects)[0].message.find("was sent to the ledger"),
            std::string::npos);

  const uint64_t fresh = core.newToken();
  core.onRequest(fresh, reserveOf("r-new", 10), kPartitioned, kT0 + 2);
  effects = core.takeEffects();
  ASSERT_EQ(only<AgentToShards>(effects).size(), 1u);
  EXPECT_EQ(only<AgentToShards>(effects)[0].token, fresh);
  keeping.commit();
  const std::vector<ShardGatewayAnswer> answers = only<ShardGatewayAnswer>(keeping.takeEffects());
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_EQ(answers[0].token, fresh);
  ASSERT_TRUE(answers[0].reply.has_value());
  EXPECT_EQ(answers[0].reply->receipt.origin, "s1");
}

}  // namespace
}  // namespace tally

namespace tally {
namespace {

// Random runs over a flaky link and a flaky store (a small simulator): every gateway request
// gets exactly one answer (a reply or a drop) by the end of the shutdown, none before its
// requests were sent or queued durably, and a pass-through answer only while a ledger answer is
// being fed.
TEST(AgentCoreRandomTest, EveryRequestIsAnsweredExactlyOnceThroughShutdown) {
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    std::mt19937_64 rng(seed);
    auto chance = [&rng](int percent) { return static_cast<int>(rng() % 100) < percent; };
    std::set<uint64_t> gone;
    AgentCore core(
        AgentCoreOptions{
            .outbox_entries_max = 8, .unknown_max = 8, .ledger_window_max = 3, .waiting_max = 6},
        [&gone](uint64_t token) { return !gone.contains(token); }, nullptr);
    core.start({}, kT0);
    std::map<uint64_t, int> answers;  // by requester token
    std::vector<uint64_t> requesters;
    std::vector<uint64_t> in_flight;  // sent tokens and call ids awaiting the ledger
    bool feeding = false;
    std::optional<AgentPersist> persist;
    auto absorb = [&](AgentCoreEffects effects) {
      for (AgentCoreEffect& effect : effects) {
        std::visit(
            [&](auto& value) {
              using T = std::decay_t<decltype(value)>;
              if constexpr (std::is_same_v<T, AgentSend>) {
                in_flight.push_back(value.token);
              } else if constexpr (std::is_same_v<T, AgentCall>) {
                in_flight.push_back(value.call);
              } else if constexpr (std::is_same_v<T, AgentPersist>) {
                persist = value;
              } else if constexpr (std::is_same_v<T, AgentReplyLedgerAnswer>) {
                ASSERT_TRUE(feeding) << "seed " << seed;
                ++answers[value.token];
              } else if constexpr (std::is_same_v<T, AgentDrop> ||
                                   std::is_same_v<T, AgentReplyUnavailable> ||
                                   std::is_same_v<T, AgentReplyQueued> ||
                                   std::is_same_v<T, AgentReplyReservation>) {
                ++answers[value.token];
              }
            },
            effect);
      }
    };
    uint64_t now = kT0;
    AgentLinkState link = kUp;
    for (int step = 0; step < 300; ++step) {
      now += rng() % 50;
      const int what = static_cast<int>(rng() % 10);
      if (what < 4) {
        const uint64_t token = core.newToken();
        requesters.push_back(token);
        const std::string id = "r" + std::to_string(rng() % 12);
        AgentRequest request;
        switch (rng() % 5) {
          case 0: request = reserveOf(id); break;
          case 1: request = StartRequest{.reservation_id = id, .operation_id = "op"}; break;
          case 2:
            request = SettleRequest{.reservation_id = id, .operation_id = "op", .actual_units = 1};
            break;
          case 3: request = QueryRequest{.reservation_id = id}; break;
          default: request = AgentOtherRequest{}; break;
        }
        core.onRequest(token, request, link, now);
        if (chance(15)) gone.insert(token);
      } else if (what < 7 && !in_flight.empty()) {
        const size_t at = rng() % in_flight.size();
        const uint64_t call = in_flight[at];
        in_flight.erase(in_flight.begin() + static_cast<ptrdiff_t>(at));
        AgentLedgerAnswer answer =
            chance(30)   ? lost()
            : chance(30) ? answeredWith(ReplyCode::kNotFound, ReservationState::kRequested)
                         : answeredWith(ReplyCode::kOk, ReservationState::kReserved);
        feeding = true;
        core.onAnswer(call, answer, link, now, static_cast<uint32_t>(rng() % 1001));
        absorb(core.takeEffects());
        feeding = false;
      } else if (what < 8) {
        link = chance(50) ? kUp : (chance(50) ? kPartitioned : kDown);
        if (link.connected && chance(50)) core.onConnected(link, now);
      } else if (what < 9) {
        core.onTick(link, now);
      } else {
        core.onIterationEnd(now);
      }
      absorb(core.takeEffects());
      if (persist.has_value()) {
        persist.reset();
        core.persisted(!chance(20), "disk full", now);
        absorb(core.takeEffects());
      }
    }
    core.beginShutdown(0, now);
    absorb(core.takeEffects());
    while (persist.has_value()) {
      persist.reset();
      core.persisted(!chance(20), "disk full", now);
      absorb(core.takeEffects());
    }
    for (uint64_t token : requesters) {
      EXPECT_EQ(answers[token], 1) << "seed " << seed << " token " << token;
    }
    EXPECT_TRUE(core.machine().closed()) << "seed " << seed;
  }
}

}  // namespace
}  // namespace tally
