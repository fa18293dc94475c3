#pragma once

#include <gtest/gtest.h>

#include <iostream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "central-client/blocking_client.h"
#include "tests/integration/ledger_harness.h"
#include "tests/support/temp_dir.h"

// The fixture of every tally-ledger integration test: a TempDir holding the data dir and the
// ledger's log, one LedgerInstance on it, and `client_`, a connection to the running ledger.
// On failure the ledger's log (every start of it) is printed.

namespace tally::testing {

class LedgerServiceTest : public ::testing::Test {
 protected:
  LedgerServiceTest() : ledger_(dir_.file("data"), dir_.file("ledger.log")) {}

  void TearDown() override {
    if (HasFailure()) {
      std::cout << "---- tally-ledger log (" << dir_.file("ledger.log") << ") ----\n"
                << ledger_.log() << "---- end of log ----" << std::endl;
    }
  }

  // Starts (or restarts) the ledger on the data dir and connects `client_`.
  void startLedger() {
    client_.reset();
    const Status started = ledger_.start();
    ASSERT_TRUE(started.isOk()) << started.toString();
    TALLY_ASSIGN_OR_FAIL(client_, ledger_.connect());
  }

  void publish(std::vector<Budget> budgets, Generation* generation = nullptr) {
    TALLY_ASSIGN_OR_FAIL(PolicyReply reply, publishPolicy(*client_, std::move(budgets)));
    ASSERT_EQ(reply.code, ReplyCode::kOk) << reply.message;
    if (generation != nullptr) *generation = reply.generation;
  }

  // The audit, asserted to conserve.
  void auditConserved(AuditReport* report) {
    TALLY_ASSIGN_OR_FAIL(*report, auditLedger(*client_));
    ASSERT_TRUE(report->conserved) << describe(*report);
    for (const AccountView& view : report->accounts) {
      ASSERT_TRUE(view.conserved) << describe(*report);
    }
  }

  std::unique_ptr<client::BlockingClient> connect() {
    Result<std::unique_ptr<client::BlockingClient>> connected = ledger_.connect();
    EXPECT_TRUE(connected.isOk()) << connected.status().toString();
    return connected.isOk() ? std::move(connected).value() : nullptr;
  }

  TempDir dir_;
  LedgerInstance ledger_;
  std::unique_ptr<client::BlockingClient> client_;
};

}  // namespace tally::testing
