#include "tests/integration/cycle_load.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <unordered_map>
#include <utility>
#include <variant>

#include "tests/integration/ledger_harness.h"
#include "wire/digest.h"

namespace tally::testing {
namespace {

// How far a reservation's state has come along reserve → start → settle.
Step progressOf(ReservationState state) {
  switch (state) {
    case ReservationState::kReserved:
    case ReservationState::kExpiring:
    case ReservationState::kExpired: return Step::kReserve;
    case ReservationState::kStarted:
    case ReservationState::kUsageUnknown: return Step::kStart;
    case ReservationState::kSettled:
    case ReservationState::kSettledWithDebt: return Step::kSettle;
    default: return Step::kNone;
  }
}

std::string recordName(const CycleRecord& record) {
  return "'" + record.reservation_id + "' (units " + std::to_string(record.units) + ", actual " +
         std::to_string(record.actual) + ", sent " + stepName(record.sent) + ", acked " +
         stepName(record.acked) + ")";
}

ReserveRequest reserveOf(const CycleRecord& record) {
  return ReserveRequest{.reservation_id = record.reservation_id,
                        .request_digest = record.digest,
                        .subject = record.subject,
                        .route = record.route,
                        .units = record.units};
}

// Collects failures of one verification pass, reporting the first few in full.
class FailureLog {
 public:
  void add(const std::string& what) {
    if (++count_ <= kReportedMax) ADD_FAILURE() << what;
  }
  ~FailureLog() {
    if (count_ > kReportedMax) ADD_FAILURE() << count_ << " durability failures in total";
  }

 private:
  static constexpr uint64_t kReportedMax = 20;
  uint64_t count_ = 0;
};

}  // namespace

const char* stepName(Step step) {
  switch (step) {
    case Step::kNone: return "none";
    case Step::kReserve: return "reserve";
    case Step::kStart: return "start";
    case Step::kSettle: return "settle";
  }
  return "?";
}

CycleLoad::CycleLoad(client::Endpoint endpoint, CycleLoadOptions options)
    : endpoint_(std::move(endpoint)), options_(std::move(options)), clients_(options_.clients) {
  for (int i = 0; i < options_.clients; ++i) clients_[i].index = i;
}

CycleLoad::~CycleLoad() {
  stop();
  join();
}

void CycleLoad::start() {
  running_ = options_.clients;
  for (Client& client : clients_) client.thread = std::thread([this, &client] { run(&client); });
}

bool CycleLoad::waitForAcks(uint64_t acks, uint64_t timeout_ms) {
  std::unique_lock lock(mutex_);
  progress_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                     [&] { return acks_.load() >= acks || running_.load() == 0; });
  return acks_.load() >= acks;
}

void CycleLoad::stop() { stop_ = true; }

void CycleLoad::join() {
  for (Client& client : clients_) {
    if (client.thread.joinable()) client.thread.join();
  }
}

std::vector<CycleRecord> CycleLoad::records() const {
  std::vector<CycleRecord> all;
  for (const Client& client : clients_)
    all.insert(all.end(), client.records.begin(), client.records.end());
  return all;
}

std::vector<std::string> CycleLoad::unexpected() const {
  std::lock_guard lock(mutex_);
  return unexpected_;
}

void CycleLoad::noteUnexpected(std::string what) {
  std::lock_guard lock(mutex_);
  unexpected_.push_back(std::move(what));
}

void CycleLoad::noteAck() {
  {
    std::lock_guard lock(mutex_);
    ++acks_;
  }
  progress_.notify_all();
}

void CycleLoad::run(Client* client) {
  std::mt19937_64 rng(options_.seed * 1'000'003 + static_cast<uint64_t>(client->index));
  Result<std::unique_ptr<client::BlockingClient>> connected =
      client::BlockingClient::connect(endpoint_, options_.call_timeout_ms);
  if (connected.isOk()) {
    client::BlockingClient& connection = *connected.value();
    uint64_t cycles = 0;
    while (!stop_) {
      const uint64_t left = options_.cycles_per_client_max == 0
                                ? uint64_t(options_.window)
                                : options_.cycles_per_client_max - cycles;
      if (left == 0) break;
      std::vector<CycleRecord*> batch;
      for (uint64_t i = 0; i < std::min<uint64_t>(left, uint64_t(options_.window)); ++i) {
        CycleRecord& record = client->records.emplace_back();
        record.subject = options_.subject;
        record.route = options_.route;
        record.reservation_id = options_.id_prefix + "-c" + std::to_string(client->index) + "-" +
                                std::to_string(cycles + i);
        record.operation_id = "op-" + record.reservation_id;
        record.units = 1 + rng() % options_.units_max;
        // Now and then the operation uses more than it reserved (available covers it).
        record.actual =
            rng() % 10 == 0 ? record.units + 1 + rng() % 10 : rng() % (record.units + 1);
        record.digest = wire::canonicalRequestDigest(reserveOf(record));
        batch.push_back(&record);
      }
      cycles += batch.size();
      if (!runStep(connection, batch, Step::kReserve) ||
          !runStep(connection, batch, Step::kStart) || !runStep(connection, batch, Step::kSettle)) {
        break;
      }
    }
  }
  // A client that cannot connect contributes no acknowledgements: waitForAcks() and the
  // tests' record counts notice, so a connect failure is not an error by itself (the ledger
  // may have been killed before a late client connected).
  {
    std::lock_guard lock(mutex_);
    --running_;
  }
  progress_.notify_all();
}

bool CycleLoad::runStep(client::BlockingClient& connection, std::vector<CycleRecord*>& batch,
                        Step step) {
  const Step previous = static_cast<Step>(static_cast<uint8_t>(step) - 1);
  std::unordered_map<uint64_t, CycleRecord*> pending;
  bool healthy = true;
  for (CycleRecord* record : batch) {
    if (record->acked != previous) continue;
    wire::RequestBody body;
    switch (step) {
      case Step::kReserve: body = reserveOf(*record); break;
      case Step::kStart:
        body = StartRequest{.reservation_id = record->reservation_id,
                            .operation_id = record->operation_id};
        break;
      default:
        body = SettleRequest{.reservation_id = record->reservation_id,
                             .operation_id = record->operation_id,
                             .actual_units = record->actual};
        break;
    }
    // Recorded before the first byte leaves: from here on the ledger may have applied it.
    record->sent = step;
    if (step == Step::kReserve) record->reserve_sent_at = std::chrono::steady_clock::now();
    Result<uint64_t> id = connection.send(body, options_.call_timeout_ms);
    if (!id.isOk()) {
      // The connection is going away: still collect the replies to what was sent before.
      healthy = false;
      break;
    }
    pending.emplace(id.value(), record);
  }
  while (!pending.empty()) {
    Result<wire::Response> response = connection.receive(options_.call_timeout_ms);
    if (!response.isOk()) return false;
    auto it = pending.find(response.value().request_id);
    if (it == pending.end()) {
      noteUnexpected("reply to an unknown request: " + wire::describe(response.value().body));
      return false;
    }
    CycleRecord* record = it->second;
    pending.erase(it);
    Result<ReservationReply> reply = reservationOf(std::move(response));
    if (!reply.isOk()) {
      noteUnexpected(std::string(stepName(step)) + " of " + recordName(*record) + ": " +
                     reply.status().toString());
      return false;
    }
    if (!checkReply(*record, step, reply.value())) return false;
    record->acked = step;
    if (step == Step::kReserve) record->generation = reply.value().receipt.policy_generation;
    noteAck();
  }
  return healthy;
}

bool CycleLoad::checkReply(const CycleRecord& record, Step step, const ReservationReply& reply) {
  const Reservation& receipt = reply.receipt;
  bool ok = reply.code == ReplyCode::kOk && !reply.duplicate &&
            receipt.reservation_id == record.reservation_id &&
            receipt.reserved_units == record.units && progressOf(receipt.state) == step;
  if (ok && step != Step::kReserve) ok = receipt.operation_id == record.operation_id;
  if (ok && step == Step::kReserve) ok = receipt.state == ReservationState::kReserved;
  if (ok && step == Step::kSettle) {
    const bool over = record.actual > record.units;
    ok =
        receipt.actual_units == record.actual &&
        receipt.state == (over ? ReservationState::kSettledWithDebt : ReservationState::kSettled) &&
        reply.refunded_units == (over ? 0 : record.units - record.actual);
  }
  if (!ok) {
    noteUnexpected(std::string(stepName(step)) + " of " + recordName(record) + " answered " +
                   describe(reply));
  }
  return ok;
}

DurabilitySummary verifyDurable(client::BlockingClient& connection,
                                const std::vector<CycleRecord>& records) {
  DurabilitySummary summary;
  FailureLog failures;
  std::vector<const CycleRecord*> sent;
  std::vector<wire::RequestBody> queries;
  for (const CycleRecord& record : records) {
    if (record.sent == Step::kNone) continue;
    sent.push_back(&record);
    queries.push_back(QueryRequest{.reservation_id = record.reservation_id});
  }
  const std::vector<Result<ReservationReply>> answers = callPipelined(connection, queries);

  std::vector<const CycleRecord*> known;
  std::vector<Reservation> known_receipts;
  for (size_t i = 0; i < sent.size(); ++i) {
    const CycleRecord& record = *sent[i];
    if (record.acked != Step::kNone) ++summary.acked;
    if (!answers[i].isOk()) {
      failures.add("query of " + recordName(record) + ": " + answers[i].status().toString());
      continue;
    }
    const ReservationReply& reply = answers[i].value();
    if (reply.code == ReplyCode::kNotFound) {
      if (record.acked != Step::kNone) {
        failures.add("acknowledged reservation lost: " + recordName(record));
      }
      continue;
    }
    const Reservation& got = reply.receipt;
    if (reply.code != ReplyCode::kOk || got.request_digest != record.digest ||
        got.reserved_units != record.units) {
      failures.add("query of " + recordName(record) + " answered " + describe(reply));
      continue;
    }
    ++summary.found;
    known.push_back(&record);
    known_receipts.push_back(got);
    const Step progress = progressOf(got.state);
    if (progress == Step::kNone || progress < record.acked || progress > record.sent) {
      failures.add("state of " + recordName(record) + " is " + describe(got) +
                   ": outside [acknowledged, sent]");
      continue;
    }
    if (progress > record.acked) ++summary.applied_unacked;
    if (progress >= Step::kStart && got.operation_id != record.operation_id) {
      failures.add("operation of " + recordName(record) + " is " + describe(got));
    }
    if (progress == Step::kSettle && got.actual_units != record.actual) {
      failures.add("settled actual of " + recordName(record) + " is " + describe(got));
    }
    if (holdsUnits(got.state)) summary.held += got.reserved_units;
    if (progress == Step::kSettle) summary.spent += got.actual_units;
  }

  // Retrying a reserve the ledger knows is a duplicate: same receipt, never a second debit. A
  // settle retried with another actual is a duplicate too: the first result, refunding 0.
  std::vector<wire::RequestBody> retries;
  std::vector<size_t> retried_known;
  for (size_t k = 0; k < known.size(); ++k) {
    retries.push_back(reserveOf(*known[k]));
    retried_known.push_back(k);
    if (progressOf(known_receipts[k].state) == Step::kSettle) {
      retries.push_back(SettleRequest{.reservation_id = known[k]->reservation_id,
                                      .operation_id = known[k]->operation_id,
                                      .actual_units = known[k]->actual + 7});
      retried_known.push_back(k);
    }
  }
  const std::vector<Result<ReservationReply>> retried = callPipelined(connection, retries);
  for (size_t i = 0; i < retries.size(); ++i) {
    const size_t k = retried_known[i];
    const char* kind = std::holds_alternative<SettleRequest>(retries[i]) ? "settle" : "reserve";
    if (!retried[i].isOk()) {
      failures.add(std::string(kind) + " retry of " + recordName(*known[k]) + ": " +
                   retried[i].status().toString());
      continue;
    }
    const ReservationReply& reply = retried[i].value();
    if (reply.code != ReplyCode::kOk || !reply.duplicate || reply.refunded_units != 0 ||
        reply.receipt != known_receipts[k]) {
      failures.add(std::string(kind) + " retry of " + recordName(*known[k]) + " answered " +
                   describe(reply) + " instead of the duplicate of " + describe(known_receipts[k]));
    }
  }
  return summary;
}

void expectAuditMatches(client::BlockingClient& connection, const DurabilitySummary& summary,
                        Units burst) {
  TALLY_ASSIGN_OR_FAIL(AuditReport audit, auditLedger(connection));
  EXPECT_TRUE(audit.conserved) << describe(audit);
  const Balances sum = sumBalances(audit, {"tenant-1", "chat"});
  EXPECT_EQ(sum.reserved, summary.held) << describe(audit);
  EXPECT_EQ(sum.spent, summary.spent) << describe(audit);
  EXPECT_EQ(sum.available + sum.reserved + sum.spent, burst) << describe(audit);
}

}  // namespace tally::testing
