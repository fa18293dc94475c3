#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

// A throwaway PostgreSQL server for tests: initdb into a fresh directory under /tmp, started
// with pg_ctl on a Unix socket in that directory only (listen_addresses = ''; no TCP), trust
// authentication for the superuser `postgres`. Every wait is bounded and explicit: pg_ctl -w
// (which waits for the server to accept connections), then pg_isready. Stopped by the destructor
// (pg_ctl stop -m fast; SIGKILL of the postmaster's pid if that does not finish in time), and the
// directory removed.
//
// PostgreSQL refuses to run as root: when the tests run as root, initdb, pg_ctl and the server
// run as the `postgres` user Debian's postgresql package creates (`nobody` without it), through
// runuser, and the directory is given to that user. Binaries come from $TALLY_PG_BINDIR, else the
// newest /usr/lib/postgresql/*/bin (Debian's layout).

namespace tally::testing {

struct PostgresServerOptions {
  // fsync = off for tests that do not kill the server itself (PostgreSQL's own crash safety is
  // not what they test); the commit path still waits for the WAL write either way.
  bool fsync = true;
  uint64_t start_timeout_ms = 60'000;
  // A primary's `synchronous_standby_names` (e.g. "standby1"): every commit then waits until
  // that standby has flushed it. Empty: no synchronous standby.
  std::string synchronous_standby_names;
};

class PostgresServer {
 public:
  // initdb, configure, start, wait until it accepts connections. kUnavailable with the server's
  // log when any step fails or times out; kNotFound when PostgreSQL is not installed.
  static Result<std::unique_ptr<PostgresServer>> start(PostgresServerOptions options = {});
  // A streaming-replication standby of `primary` (pg_basebackup over its socket, then started
  // in standby mode, connecting as `application_name`), ready once it accepts read-only
  // connections. It has no synchronous standby of its own, so it commits alone once promoted.
  static Result<std::unique_ptr<PostgresServer>> startStandby(const PostgresServer& primary,
                                                              const std::string& application_name,
                                                              PostgresServerOptions options = {});
  ~PostgresServer();
  PostgresServer(const PostgresServer&) = delete;
  PostgresServer& operator=(const PostgresServer&) = delete;

  // The libpq connection string of database `dbname` as the superuser.
  std::string conninfo(const std::string& dbname) const;
  // CREATE DATABASE `name` (a plain identifier).
  [[nodiscard]] Status createDatabase(const std::string& name);
  // Runs `sql` with psql -At on `dbname`; its output (rows as `a|b` lines), or the error.
  Result<std::string> psql(const std::string& dbname, const std::string& sql);
  // Stops the server (fast shutdown), bounded; the destructor does it if not done before.
  [[nodiscard]] Status stop();
  // SIGKILL of the postmaster (its backends exit once they see it gone): the host dying.
  void kill9();
  // pg_ctl promote -w: a standby becomes a primary (what Patroni does on failover).
  [[nodiscard]] Status promote();

  pid_t pid() const { return pid_; }
  const std::string& socketDir() const { return dir_; }
  std::string log() const;

 private:
  PostgresServer(std::string dir, std::string bin_dir);
  // A fresh directory for a cluster, owned by the server's user when running as root.
  static Result<std::unique_ptr<PostgresServer>> prepare();
  // Appends our settings to DATA/postgresql.conf, starts the server, waits until it is ready.
  [[nodiscard]] Status configureAndStart(const PostgresServerOptions& options,
                                         const std::string& extra_conf);
  // Runs BIN_DIR/`tool` `args` (as the server's user when `as_server_user`), output appended
  // to `log_path`; its exit status, or -1 on timeout.
  int run(const std::string& tool, const std::vector<std::string>& args, bool as_server_user,
          const std::string& log_path, uint64_t timeout_ms);

  std::string dir_;  // the socket dir; the cluster is dir_/data
  std::string bin_dir_;
  std::string run_as_;  // "" when not root
  pid_t pid_ = -1;
  bool running_ = false;
  int psql_calls_ = 0;
};

}  // namespace tally::testing
