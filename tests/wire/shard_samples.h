#pragma once

#include <cstdint>

#include "core/ledger_types.h"
#include "core/shard_types.h"
#include "wire/digest.h"

// Shard messages with every field set away from its default, for codec and crypto tests.

namespace tally::wire::test {

inline PublicKey bytePattern32(uint8_t first) {
  PublicKey key{};
  for (size_t i = 0; i < key.size(); ++i) key[i] = static_cast<uint8_t>(first + i);
  return key;
}

inline Signature bytePattern64(uint8_t first) {
  Signature signature{};
  for (size_t i = 0; i < signature.size(); ++i) signature[i] = static_cast<uint8_t>(first + 3 * i);
  return signature;
}

inline ShardGrant sampleGrant() {
  return ShardGrant{.shard_id = "shard-17",
                    .subject = "tenant-7",
                    .route = "/v1/chat",
                    .policy_generation = 9,
                    .accounting_epoch_ms = 1'700'000'000'000,
                    .gateway_id = bytePattern32(1),
                    .gateway_name = "gw-eu-1",
                    .gateway_boot_epoch = 4,
                    .fence = 3,
                    .allocated_units = 500,
                    .issued_at_ms = 1'700'000'001'000,
                    .expires_at_ms = 1'700'000'121'000,
                    .ledger_key_id = "0123456789abcdef",
                    .signature = bytePattern64(7)};
}

inline ShardIssueRequest sampleIssueRequest() {
  return ShardIssueRequest{.request_id = "issue-5-1",
                           .gateway_name = "gw-eu-1",
                           .gateway_id = bytePattern32(1),
                           .gateway_boot_epoch = 4,
                           .subject = "tenant-7",
                           .route = "/v1/chat",
                           .signature = bytePattern64(9)};
}

inline Reservation sampleShardReceipt(const std::string& id, ReservationState state) {
  Reservation r;
  r.reservation_id = id;
  r.request_digest = sha256(id);
  r.subject = "tenant-7";
  r.route = "/v1/chat";
  r.policy_generation = 9;
  r.accounting_epoch_ms = 1'700'000'000'000;
  r.reserved_units = 100;
  r.actual_units = state == ReservationState::kSettled ? 80 : 0;
  r.refunded_units = state == ReservationState::kSettled ? 20 : 0;
  r.operation_id = "op-" + id;
  r.created_at_ms = 1'700'000'002'000;
  r.expires_at_ms = 1'700'000'032'000;
  r.started_at_ms = 1'700'000'002'500;
  r.closed_at_ms = state == ReservationState::kSettled ? 1'700'000'003'000 : 0;
  r.state = state;
  r.origin = "shard-17";
  return r;
}

inline ShardReport sampleReport() {
  ShardReport report;
  report.shard = sampleGrant();
  report.balances = {.allocated = 500,
                     .local_available = 0,
                     .local_reserved = 100,
                     .local_spent = 80,
                     .local_retired = 320,
                     .overspent = 5};
  report.receipts = {sampleShardReceipt("r-1", ReservationState::kSettled),
                     sampleShardReceipt("r-2", ReservationState::kStarted)};
  report.gateway_boot_epoch = 5;
  report.reported_at_ms = 1'700'000'050'000;
  report.signature = bytePattern64(11);
  return report;
}

inline ShardLedgerView sampleLedgerView() {
  ShardLedgerView view;
  view.grant = sampleGrant();
  view.state = ShardState::kReconciling;
  view.current_fence = 4;
  view.spent_units = 80;
  view.reminted_units = 300;
  view.retired_units = 120;
  view.debt_units = 5;
  view.written_off = false;
  view.conserved = true;
  view.reported = true;
  view.last_reported = sampleReport().balances;
  return view;
}

inline GatewayRecord sampleGateway() {
  return GatewayRecord{.gateway_name = "gw-eu-1",
                       .public_key = bytePattern32(1),
                       .enabled = false,
                       .enrolled_at_ms = 1'700'000'000'500};
}

}  // namespace tally::wire::test
