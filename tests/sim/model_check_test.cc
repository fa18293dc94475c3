// A small exhaustive model check of the reservation and shard state machines (issue 10),
// complementing the random simulation: every interleaving of two or three actors, each running
// one of a few short programs, by bounded enumeration. Each interleaving replays from scratch
// on the real machines (core's Ledger, and a ShardBook holding a shard the Ledger issued), with
// the checks after every operation:
//  * the ledger's audit conserves (and, for shards, the book's audit is clean);
//  * every reservation only moves along the transition table (canTransition, closed), and a
//    reply never contradicts an earlier one about the same id;
//  * no reservation is refunded more than it reserved, and USAGE_UNKNOWN refunds nothing;
//  * a closed shard admits nothing; at the end, the book's report is accepted by the ledger,
//    which then reminted at most what the receipts proved unused.

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/ledger.h"
#include "core/reservation.h"
#include "core/shard_book.h"
#include "tests/core/fake_shard_crypto.h"
#include "tests/sim/checks.h"
#include "wire/digest.h"

namespace tally::sim {
namespace {

constexpr uint64_t kT0 = 1'700'000'000'000;
constexpr const char* kSubject = "tenant";
constexpr const char* kRoute = "route";

enum class Op : uint8_t { kReserve, kStart, kSettle, kRelease, kMarkUnknown, kReport, kTime };
struct Step {
  Op op;
  std::string id;   // reservation id (unused for kTime)
  Units units = 0;  // reserve: units; settle/report: actual; kTime: ms to advance
};
using Program = std::vector<Step>;

// Every way to interleave `programs` (each keeps its own order): calls `run` with the order
// as a list of actor indices. Returns how many.
uint64_t forEachInterleaving(const std::vector<Program>& programs,
                             const std::function<void(const std::vector<size_t>&)>& run) {
  std::vector<size_t> left(programs.size());
  size_t total = 0;
  for (size_t i = 0; i < programs.size(); ++i) {
    left[i] = programs[i].size();
    total += left[i];
  }
  std::vector<size_t> order;
  uint64_t count = 0;
  std::function<void()> rec = [&] {
    if (order.size() == total) {
      run(order);
      ++count;
      return;
    }
    for (size_t i = 0; i < programs.size(); ++i) {
      if (left[i] == 0) continue;
      --left[i];
      order.push_back(i);
      rec();
      order.pop_back();
      ++left[i];
    }
  };
  rec();
  return count;
}

Budget budget(bool emergency) {
  Budget b;
  b.subject_pattern = kSubject;
  b.route = kRoute;
  b.unit = "tokens";
  b.burst = 10;
  b.refill_per_second = 0;
  b.max_single_reservation = 10;
  b.hold_ttl_ms = 100;
  b.hard_execution_limit_ms = 1'000;
  b.max_overdraft = 5;
  if (emergency) b.emergency = {.enabled = true, .shard_units = 8, .shard_ttl_ms = 10'000};
  return b;
}

ReserveRequest reserveRequest(const std::string& id, Units units) {
  ReserveRequest r{.reservation_id = id, .subject = kSubject, .route = kRoute, .units = units};
  r.request_digest = wire::canonicalRequestDigest(r);
  return r;
}

// What the checks remember about one id across an interleaving.
struct Seen {
  ReservationState state = ReservationState::kRequested;
  Units refunded = 0;
  Units reserved = 0;
};

// Checks one reply about `id` against what was seen before; returns an error or "".
std::string checkReply(const ReservationReply& reply, const std::string& id, Op op,
                       std::map<std::string, Seen>* seen) {
  if (reply.code != ReplyCode::kOk && reply.code != ReplyCode::kExpired &&
      reply.code != ReplyCode::kInvalidState && reply.code != ReplyCode::kRejected &&
      reply.code != ReplyCode::kNotFound) {
    return id + ": unexpected " + replyCodeName(reply.code);
  }
  if (reply.receipt.reservation_id.empty()) return "";
  Seen& s = (*seen)[id];
  if (!reachable(s.state, reply.receipt.state)) {
    return id + ": " + reservationStateName(s.state) + " then " +
           reservationStateName(reply.receipt.state);
  }
  s.state = reply.receipt.state;
  s.reserved = std::max(s.reserved, reply.receipt.reserved_units);
  s.refunded += reply.refunded_units;
  if (s.refunded > s.reserved) return id + ": refunded more than it reserved";
  if (op == Op::kMarkUnknown && reply.refunded_units > 0) return id + ": markUnknown refunded";
  return "";
}

std::string describeOrder(const std::vector<Program>& programs, const std::vector<size_t>& order) {
  std::vector<size_t> next(programs.size(), 0);
  std::string out;
  for (size_t actor : order) {
    const Step& step = programs[actor][next[actor]++];
    static const char* kNames[] = {"reserve",     "start",  "settle", "release",
                                   "markUnknown", "report", "time"};
    out += std::string(out.empty() ? "" : ", ") + kNames[static_cast<int>(step.op)] + " " +
           (step.op == Op::kTime ? std::to_string(step.units) + "ms" : step.id);
  }
  return out;
}

// --- the reservation machine (central) ---------------------------------------------------------

std::string runLedger(const std::vector<Program>& programs, const std::vector<size_t>& order) {
  Ledger ledger;
  uint64_t now = kT0;
  if (ledger.publishPolicy(Policy{.budgets = {budget(false)}}, now).code != ReplyCode::kOk) {
    return "policy refused";
  }
  std::map<std::string, Seen> seen;
  std::vector<size_t> next(programs.size(), 0);
  for (size_t actor : order) {
    const Step& step = programs[actor][next[actor]++];
    const std::string op_id = "op-" + step.id;
    std::optional<ReservationReply> reply;
    switch (step.op) {
      case Op::kReserve: reply = ledger.reserve(reserveRequest(step.id, step.units), now); break;
      case Op::kStart:
        reply = ledger.start({.reservation_id = step.id, .operation_id = op_id}, now);
        break;
      case Op::kSettle:
        reply = ledger.settle(
            {.reservation_id = step.id, .operation_id = op_id, .actual_units = step.units}, now);
        break;
      case Op::kRelease: reply = ledger.release({.reservation_id = step.id}, now); break;
      case Op::kMarkUnknown:
        reply = ledger.markUnknown({.reservation_id = step.id, .operation_id = op_id}, now);
        break;
      case Op::kReport:
        reply = ledger.reportOperation(
            {.reservation_id = step.id, .operation_id = op_id, .actual_units = step.units}, now);
        break;
      case Op::kTime:
        now += step.units;
        (void)ledger.tick(now);
        break;
    }
    if (reply.has_value()) {
      if (std::string error = checkReply(*reply, step.id, step.op, &seen); !error.empty()) {
        return error;
      }
    }
    const AuditReport audit = ledger.audit(now);
    if (!audit.conserved) return "audit: " + audit.violations.front();
    // The ledger's own view of every id agrees with the transition table too.
    for (auto& [id, s] : seen) {
      const Reservation* r = ledger.findReservation(id);
      if (r == nullptr) continue;
      if (!reachable(s.state, r->state)) {
        return id + ": seen " + std::string(reservationStateName(s.state)) + ", ledger holds " +
               reservationStateName(r->state);
      }
      s.state = r->state;
      if ((r->state == ReservationState::kUsageUnknown || r->closed_by_hard_limit) &&
          r->refunded_units > 0) {
        return id + ": USAGE_UNKNOWN refunded";
      }
    }
  }
  return "";
}

TEST(ModelCheck, EveryInterleavingOfTheReservationMachine) {
  const std::vector<Program> a_programs = {
      {{Op::kReserve, "a", 5}, {Op::kStart, "a"}, {Op::kSettle, "a", 3}},
      {{Op::kReserve, "a", 5}, {Op::kStart, "a"}, {Op::kMarkUnknown, "a"}, {Op::kReport, "a", 7}},
      {{Op::kReserve, "a", 5},
       {Op::kReserve, "a", 5},
       {Op::kStart, "a"},
       {Op::kStart, "a"},
       {Op::kSettle, "a", 9}},
  };
  const std::vector<Program> b_programs = {
      {{Op::kReserve, "b", 6}, {Op::kRelease, "b"}, {Op::kRelease, "b"}},
      {{Op::kReserve, "b", 6}, {Op::kStart, "b"}, {Op::kSettle, "b", 6}},
      {{Op::kReserve, "b", 6}, {Op::kStart, "b"}, {Op::kMarkUnknown, "b"}},
  };
  // The clock: before the hold TTL, past it, past the hard execution limit.
  const Program clock = {{Op::kTime, "", 60}, {Op::kTime, "", 60}, {Op::kTime, "", 2'000}};
  uint64_t interleavings = 0;
  for (const Program& a : a_programs) {
    for (const Program& b : b_programs) {
      const std::vector<Program> programs = {a, b, clock};
      interleavings += forEachInterleaving(programs, [&](const std::vector<size_t>& order) {
        const std::string error = runLedger(programs, order);
        ASSERT_EQ(error, "") << describeOrder(programs, order);
      });
    }
  }
  std::printf("reservation machine: %llu interleavings checked\n",
              static_cast<unsigned long long>(interleavings));
  EXPECT_GT(interleavings, 10'000u);
}

// --- the shard machine (agent book and ledger registry) ----------------------------------------

enum class ShardOp : uint8_t { kReserve, kStart, kSettle, kRelease, kClose, kTime };
struct ShardStep {
  ShardOp op;
  std::string id;
  Units units = 0;
};
using ShardProgram = std::vector<ShardStep>;

std::string runShard(const std::vector<ShardProgram>& programs, const std::vector<size_t>& order) {
  static const testing::KeyedFakeShardCrypto crypto;
  uint64_t now = kT0;
  Ledger ledger;
  ledger.setShardCrypto(&crypto);
  PublicKey key{};
  key.fill(7);
  if (ledger.publishPolicy(Policy{.budgets = {budget(true)}}, now).code != ReplyCode::kOk) {
    return "policy refused";
  }
  (void)ledger.enrollGateway("gw", key, now);
  ShardReply issued = ledger.issueShard({.request_id = "issue-1",
                                         .gateway_name = "gw",
                                         .gateway_id = key,
                                         .gateway_boot_epoch = 1,
                                         .subject = kSubject,
                                         .route = kRoute},
                                        now);
  if (issued.code != ReplyCode::kOk || issued.shards.empty()) return "issue: " + issued.message;
  const ShardGrant grant = issued.shards.front().grant;
  ShardBook book(
      ShardBookOptions{.gateway_id = key, .boot_epoch = 1, .crypto = &crypto, .hold_ttl_ms = 100});
  if (book.addShard(grant, now) != ShardAddCode::kOk) return "addShard refused";
  bool closed = false;
  std::map<std::string, Seen> seen;
  std::vector<size_t> next(programs.size(), 0);
  for (size_t actor : order) {
    const ShardStep& step = programs[actor][next[actor]++];
    const std::string op_id = "op-" + step.id;
    std::optional<ReservationReply> reply;
    switch (step.op) {
      case ShardOp::kReserve: {
        reply = book.reserve(reserveRequest(step.id, step.units), now);
        if (closed && reply.has_value() && reply->code == ReplyCode::kOk && !reply->duplicate) {
          return step.id + ": admitted from a closed shard";
        }
        break;
      }
      case ShardOp::kStart:
        if (book.ownsReservation(step.id)) {
          reply = book.start({.reservation_id = step.id, .operation_id = op_id}, now);
        }
        break;
      case ShardOp::kSettle:
        if (book.ownsReservation(step.id)) {
          reply = book.settle(
              {.reservation_id = step.id, .operation_id = op_id, .actual_units = step.units}, now);
        }
        break;
      case ShardOp::kRelease:
        if (book.ownsReservation(step.id)) reply = book.release({.reservation_id = step.id}, now);
        break;
      case ShardOp::kClose:
        closed = true;
        (void)book.close(grant.shard_id, ShardCloseReason::kReconnect, now);
        break;
      case ShardOp::kTime:
        now += step.units;
        (void)book.tick(now);
        break;
    }
    if (reply.has_value()) {
      if (std::string error = checkReply(*reply, step.id, Op::kReserve, &seen); !error.empty()) {
        return error;
      }
    }
    if (std::vector<std::string> violations = book.audit(); !violations.empty()) {
      return "book: " + violations.front();
    }
  }
  // The agent's final word: close (if not yet), report; the ledger must accept it, conserve,
  // and remint no more than what the receipts proved unused.
  (void)book.close(grant.shard_id, ShardCloseReason::kReconnect, now);
  std::optional<ShardReport> report = book.buildReport(grant.shard_id, now);
  if (!report.has_value()) return "no report";
  ShardReply answer = ledger.reportShard(*report, now);
  if (answer.code != ReplyCode::kOk || answer.shards.empty()) {
    return std::string("report refused: ") + replyCodeName(answer.code) + " " + answer.message;
  }
  const ShardLedgerView& view = answer.shards.front();
  const AuditReport audit = ledger.audit(now);
  if (!audit.conserved) return "ledger audit: " + audit.violations.front();
  if (view.state != ShardState::kConflict &&
      view.reminted_units + view.spent_units + report->balances.local_reserved >
          grant.allocated_units) {
    return "reminted " + std::to_string(view.reminted_units) + " while receipts hold " +
           std::to_string(report->balances.local_reserved);
  }
  return "";
}

TEST(ModelCheck, EveryInterleavingOfTheShardMachine) {
  const std::vector<ShardProgram> a_programs = {
      {{ShardOp::kReserve, "a", 4}, {ShardOp::kStart, "a"}, {ShardOp::kSettle, "a", 3}},
      {{ShardOp::kReserve, "a", 4}, {ShardOp::kStart, "a"}, {ShardOp::kSettle, "a", 6}},
      {{ShardOp::kReserve, "a", 4}, {ShardOp::kReserve, "a", 4}, {ShardOp::kRelease, "a"}},
  };
  const std::vector<ShardProgram> b_programs = {
      {{ShardOp::kReserve, "b", 5}, {ShardOp::kRelease, "b"}, {ShardOp::kRelease, "b"}},
      {{ShardOp::kReserve, "b", 3}, {ShardOp::kStart, "b"}, {ShardOp::kSettle, "b", 3}},
  };
  // The environment: time passes (local hold expiry), the link comes back (the shard closes).
  const ShardProgram environment = {
      {ShardOp::kTime, "", 60}, {ShardOp::kClose, ""}, {ShardOp::kTime, "", 200}};
  uint64_t interleavings = 0;
  for (const ShardProgram& a : a_programs) {
    for (const ShardProgram& b : b_programs) {
      const std::vector<ShardProgram> programs = {a, b, environment};
      interleavings += forEachInterleaving(
          {Program(a.size()), Program(b.size()), Program(environment.size())},
          [&](const std::vector<size_t>& order) {
            const std::string error = runShard(programs, order);
            ASSERT_EQ(error, "") << "order of actors: " << ::testing::PrintToString(order);
          });
    }
  }
  std::printf("shard machine: %llu interleavings checked\n",
              static_cast<unsigned long long>(interleavings));
  EXPECT_GT(interleavings, 5'000u);
}

}  // namespace
}  // namespace tally::sim
