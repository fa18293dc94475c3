#include "ctl/render_periods.h"

#include <optional>
#include <string>

#include "ctl/json.h"
#include "ctl/render.h"

namespace tally::ctl {
namespace {

void balancesJson(JsonWriter& w, const Balances& b) {
  w.beginObject();
  balanceFields(w, b);
  w.endObject();
}

void snapshotJson(JsonWriter& w, const PeriodSnapshot& s) {
  w.beginObject();
  w.field("subject", s.key.subject);
  w.field("route", s.key.route);
  w.field("policyGeneration", s.key.generation);
  w.field("accountingEpoch", epochPeriodName(s.epoch_period));
  w.field("epochFirst", s.epoch_first);
  w.field("epochLast", s.epoch_last);
  timeField(w, "openedAt", s.opened_at_ms);
  timeField(w, "closedAt", s.closed_at_ms);
  w.field("conserved", s.conserved);
  w.key("opening");
  balancesJson(w, s.opening);
  w.key("closing");
  balancesJson(w, s.closing);
  // Absent only for a snapshot whose cumulative balances went down (then conserved is false).
  if (const std::optional<PeriodActivity> a = periodActivity(s.opening, s.closing)) {
    w.key("activity").beginObject();
    w.field("opened", a->opened);
    w.field("minted", a->minted);
    w.field("spent", a->spent);
    w.field("debtIssued", a->debt_issued);
    w.field("debtRepaid", a->debt_repaid);
    w.field("transferredOut", a->transferred_out);
    w.endObject();
  }
  w.field("debtOpening", debtOf(s.opening));
  w.field("debtClosing", debtOf(s.closing));
  w.endObject();
}

std::string epochsText(uint64_t first, uint64_t last) {
  return first == last ? "epoch " + std::to_string(first)
                       : "epochs " + std::to_string(first) + ".." + std::to_string(last);
}

std::string snapshotHuman(const PeriodSnapshot& s) {
  std::string out = "  " + s.key.subject + " " + s.key.route + " gen " +
                    std::to_string(s.key.generation) + "  " + epochPeriodName(s.epoch_period) +
                    " " + epochsText(s.epoch_first, s.epoch_last) + "  " +
                    timeText(s.opened_at_ms) + " .. " + timeText(s.closed_at_ms) + "  " +
                    (s.conserved ? "conserved" : "NOT CONSERVED") + "\n";
  out += "    stock " + std::to_string(stockOf(s.opening)) + " -> " +
         std::to_string(stockOf(s.closing)) + " (available " + std::to_string(s.closing.available) +
         ", reserved " + std::to_string(s.closing.reserved) + ", retired " +
         std::to_string(s.closing.retired_for_emergency) + ")  debt " +
         std::to_string(debtOf(s.opening)) + " -> " + std::to_string(debtOf(s.closing)) + "\n";
  if (const std::optional<PeriodActivity> a = periodActivity(s.opening, s.closing)) {
    out += "    opened " + std::to_string(a->opened) + "  minted " + std::to_string(a->minted) +
           "  spent " + std::to_string(a->spent) + "  debt issued " +
           std::to_string(a->debt_issued) + "  repaid " + std::to_string(a->debt_repaid) +
           "  transferred out " + std::to_string(a->transferred_out) + "\n";
  }
  return out;
}

}  // namespace

std::string renderPeriodAudit(const AuditReport& report, bool json) {
  const bool conserved = auditConserved(report);
  if (json) {
    JsonWriter w;
    w.beginObject();
    w.field("conservation", conserved);
    timeField(w, "asOf", report.as_of_ms);
    if (report.period_epoch) {
      w.field("period", *report.period_epoch);
      w.key("periodSnapshots").beginArray();
      for (const PeriodSnapshot& snapshot : report.period_snapshots) snapshotJson(w, snapshot);
      w.endArray();
    }
    w.key("closedPeriods").beginArray();
    for (const PeriodSpan& span : report.closed_periods) {
      w.beginObject();
      w.field("accountingEpoch", epochPeriodName(span.epoch_period));
      w.field("epochFirst", span.epoch_first);
      w.field("epochLast", span.epoch_last);
      w.field("accounts", span.accounts);
      w.field("conserved", span.conserved);
      w.endObject();
    }
    w.endArray();
    w.key("violations").beginArray();
    for (const std::string& violation : report.violations) w.value(violation);
    w.endArray();
    w.endObject();
    return w.take() + "\n";
  }
  std::string out;
  if (report.period_epoch) {
    out += "period " + std::to_string(*report.period_epoch) + ": " +
           (conserved ? "conserved" : "FAILED") + " (" +
           std::to_string(report.period_snapshots.size()) +
           (report.period_snapshots.size() == 1 ? " account)\n" : " accounts)\n");
    for (const PeriodSnapshot& snapshot : report.period_snapshots) out += snapshotHuman(snapshot);
  }
  if (!report.period_epoch || !report.closed_periods.empty()) {
    out +=
        std::to_string(report.closed_periods.size()) +
        (report.closed_periods.size() == 1 ? " closed period kept:\n" : " closed periods kept:\n");
  }
  for (const PeriodSpan& span : report.closed_periods) {
    out += "  " + std::string(epochPeriodName(span.epoch_period)) + " " +
           epochsText(span.epoch_first, span.epoch_last) + "  " + std::to_string(span.accounts) +
           (span.accounts == 1 ? " account  " : " accounts  ") +
           (span.conserved ? "conserved" : "NOT CONSERVED") + "\n";
  }
  for (const std::string& violation : report.violations) out += "violation: " + violation + "\n";
  return out;
}

}  // namespace tally::ctl
