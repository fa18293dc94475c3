#include "wire/period_codec.h"

#include <string>

#include "core/limits.h"
#include "wire/field_codec.h"

namespace tally::wire {
namespace {

using field::readEnum;
using field::readText;
using field::withContext;

capnp::Text::Reader textOf(const std::string& value) {
  return capnp::Text::Reader(value.data(), value.size());
}

}  // namespace

void fromCore(const Balances& b, schema::BalancesV1::Builder builder) {
  builder.setOpening(b.opening);
  builder.setMinted(b.minted);
  builder.setOverdraftIssued(b.overdraft_issued);
  builder.setAvailable(b.available);
  builder.setReserved(b.reserved);
  builder.setSpent(b.spent);
  builder.setRetiredForEmergency(b.retired_for_emergency);
  builder.setOverdraftRepaid(b.overdraft_repaid);
  builder.setTransferredOut(b.transferred_out);
}

void fromCore(const PeriodSnapshot& snapshot, schema::PeriodSnapshotV1::Builder builder) {
  builder.setSubject(textOf(snapshot.key.subject));
  builder.setRoute(textOf(snapshot.key.route));
  builder.setPolicyGeneration(snapshot.key.generation);
  builder.setAccountingEpoch(enumFromCore(snapshot.epoch_period));
  builder.setEpochFirst(snapshot.epoch_first);
  builder.setEpochLast(snapshot.epoch_last);
  builder.setOpenedAtMs(snapshot.opened_at_ms);
  builder.setClosedAtMs(snapshot.closed_at_ms);
  fromCore(snapshot.opening, builder.initOpening());
  fromCore(snapshot.closing, builder.initClosing());
  builder.setConserved(snapshot.conserved);
}

void fromCore(const PeriodSpan& span, schema::ClosedPeriodV1::Builder builder) {
  builder.setAccountingEpoch(enumFromCore(span.epoch_period));
  builder.setEpochFirst(span.epoch_first);
  builder.setEpochLast(span.epoch_last);
  builder.setAccounts(span.accounts);
  builder.setConserved(span.conserved);
}

Status readBalances(schema::BalancesV1::Reader reader, Balances* out) {
  *out = Balances{.opening = reader.getOpening(),
                  .minted = reader.getMinted(),
                  .overdraft_issued = reader.getOverdraftIssued(),
                  .available = reader.getAvailable(),
                  .reserved = reader.getReserved(),
                  .spent = reader.getSpent(),
                  .retired_for_emergency = reader.getRetiredForEmergency(),
                  .overdraft_repaid = reader.getOverdraftRepaid(),
                  .transferred_out = reader.getTransferredOut()};
  if (const std::vector<BalanceField> above = balancesAboveBound(*out); !above.empty()) {
    return Status::invalidArgument(std::string(above.front().name) + ": " +
                                   std::to_string(above.front().value) + " above the bound " +
                                   std::to_string(limits::kBalanceUnitsMax));
  }
  return Status::ok();
}

Status readPeriodSnapshot(schema::PeriodSnapshotV1::Reader reader, PeriodSnapshot* out) {
  TALLY_WIRE_RETURN_IF_ERROR(
      readText(reader.getSubject(), limits::kSubjectBytesMax, "subject", &out->key.subject));
  TALLY_WIRE_RETURN_IF_ERROR(
      readText(reader.getRoute(), limits::kRouteBytesMax, "route", &out->key.route));
  out->key.generation = reader.getPolicyGeneration();
  TALLY_WIRE_RETURN_IF_ERROR(
      readEnum(reader.getAccountingEpoch(), "accountingEpoch", &out->epoch_period));
  out->epoch_first = reader.getEpochFirst();
  out->epoch_last = reader.getEpochLast();
  if (out->epoch_first > out->epoch_last) {
    return Status::invalidArgument("epochFirst " + std::to_string(out->epoch_first) +
                                   " is after epochLast " + std::to_string(out->epoch_last));
  }
  out->opened_at_ms = reader.getOpenedAtMs();
  out->closed_at_ms = reader.getClosedAtMs();
  TALLY_WIRE_RETURN_IF_ERROR(
      withContext(readBalances(reader.getOpening(), &out->opening), "opening"));
  TALLY_WIRE_RETURN_IF_ERROR(
      withContext(readBalances(reader.getClosing(), &out->closing), "closing"));
  out->conserved = reader.getConserved();
  return Status::ok();
}

Status readClosedPeriod(schema::ClosedPeriodV1::Reader reader, PeriodSpan* out) {
  TALLY_WIRE_RETURN_IF_ERROR(
      readEnum(reader.getAccountingEpoch(), "accountingEpoch", &out->epoch_period));
  out->epoch_first = reader.getEpochFirst();
  out->epoch_last = reader.getEpochLast();
  out->accounts = reader.getAccounts();
  out->conserved = reader.getConserved();
  return Status::ok();
}

}  // namespace tally::wire
