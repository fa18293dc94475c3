#include "tests/integration/postgres_environment.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "tests/support/ledger_store_args.h"

namespace tally::testing {

namespace {

struct Shared {
  std::unique_ptr<PostgresServer> server;
  std::mutex mu;
  std::map<std::string, std::string> conninfo_by_data_dir;
  int databases = 0;
};

Shared& shared() {
  static Shared instance;
  return instance;
}

class PostgresEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    // fsync off: these tests kill ledgers, never the server, and PostgreSQL's own crash safety
    // is not under test; every commit still waits for PostgreSQL's WAL write (synchronous_commit).
    Result<std::unique_ptr<PostgresServer>> started =
        PostgresServer::start(PostgresServerOptions{.fsync = false});
    if (!started.isOk()) {
      std::cerr << "cannot start PostgreSQL: " << started.status().toString() << std::endl;
      std::exit(1);
    }
    shared().server = std::move(started).value();
    setLedgerStoreArgsProvider([](const std::string& data_dir) {
      return std::vector<std::string>{"--store", "postgres", "--postgres", conninfoFor(data_dir)};
    });
  }

  void TearDown() override {
    setLedgerStoreArgsProvider(nullptr);
    if (Status stopped = shared().server->stop(); !stopped.isOk()) {
      std::cerr << stopped.toString() << std::endl;
    }
    shared().server.reset();
  }
};

}  // namespace

PostgresServer& sharedPostgres() { return *shared().server; }

std::string conninfoFor(const std::string& data_dir) {
  Shared& state = shared();
  std::lock_guard lock(state.mu);
  auto found = state.conninfo_by_data_dir.find(data_dir);
  if (found != state.conninfo_by_data_dir.end()) return found->second;
  const std::string name = "ledger_" + std::to_string(++state.databases);
  if (Status created = state.server->createDatabase(name); !created.isOk()) {
    ADD_FAILURE() << created.toString();
  }
  std::string conninfo = state.server->conninfo(name);
  state.conninfo_by_data_dir[data_dir] = conninfo;
  return conninfo;
}

void assignConninfo(const std::string& data_dir, const std::string& conninfo) {
  Shared& state = shared();
  std::lock_guard lock(state.mu);
  state.conninfo_by_data_dir[data_dir] = conninfo;
}

}  // namespace tally::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new tally::testing::PostgresEnvironment);
  return RUN_ALL_TESTS();
}
