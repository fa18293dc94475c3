#include "tests/support/postgres_server.h"

#include <pwd.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "tests/support/process.h"

namespace tally::testing {

namespace {

constexpr const char* kPort = "5432";  // its socket lives in our own directory: no clash
constexpr const char* kRunuser = "/usr/sbin/runuser";
constexpr uint64_t kToolTimeoutMs = 60'000;

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// $TALLY_PG_BINDIR, else the newest /usr/lib/postgresql/N/bin holding initdb; "" if none.
std::string findBinDir() {
  if (const char* env = std::getenv("TALLY_PG_BINDIR"); env != nullptr && *env != '\0') {
    return env;
  }
  std::error_code error;
  int best = -1;
  std::string best_dir;
  for (std::filesystem::directory_iterator it("/usr/lib/postgresql", error), end;
       !error && it != end; it.increment(error)) {
    const std::string name = it->path().filename().string();
    const int version = std::atoi(name.c_str());
    const std::string bin = it->path().string() + "/bin";
    if (version > best && std::filesystem::exists(bin + "/initdb")) {
      best = version;
      best_dir = bin;
    }
  }
  return best_dir;
}

}  // namespace

PostgresServer::PostgresServer(std::string dir, std::string bin_dir)
    : dir_(std::move(dir)), bin_dir_(std::move(bin_dir)) {}

int PostgresServer::run(const std::string& tool, const std::vector<std::string>& args,
                        bool as_server_user, const std::string& log_path, uint64_t timeout_ms) {
  std::vector<std::string> argv;
  std::string binary = bin_dir_ + "/" + tool;
  if (as_server_user && !run_as_.empty()) {
    argv = {"-u", run_as_, "--", binary};
    binary = kRunuser;
  }
  argv.insert(argv.end(), args.begin(), args.end());
  Process process(binary, argv, log_path, /*ready_fd=*/false);
  const int status = process.waitExit(timeout_ms);
  if (status < 0) process.kill9();
  return status;
}

Result<std::unique_ptr<PostgresServer>> PostgresServer::prepare() {
  const std::string bin_dir = findBinDir();
  if (bin_dir.empty()) {
    return Status::notFound("PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb)");
  }
  char pattern[] = "/tmp/tally-pg-XXXXXX";
  if (::mkdtemp(pattern) == nullptr) return Status::ioError("mkdtemp failed");
  auto server = std::unique_ptr<PostgresServer>(new PostgresServer(pattern, bin_dir));
  if (::geteuid() == 0) {
    const passwd* user = ::getpwnam("postgres");
    if (user == nullptr) user = ::getpwnam("nobody");
    if (user == nullptr) return Status::notFound("running as root, and no postgres user");
    server->run_as_ = user->pw_name;
    if (::chown(server->dir_.c_str(), user->pw_uid, user->pw_gid) != 0) {
      return Status::ioError("chown " + server->dir_ + " failed");
    }
  }
  return server;
}

Result<std::unique_ptr<PostgresServer>> PostgresServer::start(PostgresServerOptions options) {
  Result<std::unique_ptr<PostgresServer>> prepared = prepare();
  if (!prepared.isOk()) return prepared.status();
  std::unique_ptr<PostgresServer> server = std::move(prepared).value();
  const std::string log_path = server->dir_ + "/setup.log";
  if (server->run("initdb",
                  {"-D", server->dir_ + "/data", "-U", "postgres", "--auth=trust", "-E", "UTF8",
                   "--locale=C", "--no-sync"},
                  true, log_path, kToolTimeoutMs) != 0) {
    return Status::unavailable("initdb failed:\n" + readFile(log_path));
  }
  std::string extra;
  if (!options.synchronous_standby_names.empty()) {
    extra = "synchronous_standby_names = '" + options.synchronous_standby_names + "'\n";
  }
  if (Status started = server->configureAndStart(options, extra); !started.isOk()) return started;
  return server;
}

Result<std::unique_ptr<PostgresServer>> PostgresServer::startStandby(
    const PostgresServer& primary, const std::string& application_name,
    PostgresServerOptions options) {
  Result<std::unique_ptr<PostgresServer>> prepared = prepare();
  if (!prepared.isOk()) return prepared.status();
  std::unique_ptr<PostgresServer> server = std::move(prepared).value();
  const std::string log_path = server->dir_ + "/setup.log";
  // initdb --auth=trust allows `local replication all`: the base backup and the WAL stream use
  // the primary's socket as the superuser.
  if (server->run("pg_basebackup",
                  {"-D", server->dir_ + "/data", "-h", primary.dir_, "-p", kPort, "-U", "postgres",
                   "-X", "stream", "-c", "fast", "--no-sync"},
                  true, log_path, kToolTimeoutMs) != 0) {
    return Status::unavailable("pg_basebackup failed:\n" + readFile(log_path));
  }
  {
    std::ofstream signal_file(server->dir_ + "/data/standby.signal");
    if (!signal_file) return Status::ioError("cannot write standby.signal");
  }
  // Appended after the primary's copied settings, so these win: its own socket, no synchronous
  // standby of its own (a promoted server would otherwise wait for one forever).
  options.synchronous_standby_names.clear();
  const std::string standby_conf =
      "synchronous_standby_names = ''\nprimary_conninfo = 'host=" + primary.dir_ +
      " port=" + kPort + " user=postgres application_name=" + application_name + "'\n";
  if (Status started = server->configureAndStart(options, standby_conf); !started.isOk()) {
    return started;
  }
  return server;
}

Status PostgresServer::configureAndStart(const PostgresServerOptions& options,
                                         const std::string& extra_conf) {
  const std::string data = dir_ + "/data";
  const std::string log_path = dir_ + "/setup.log";
  // Unix socket in our directory only; small, quiet, and (optionally) without fsync.
  {
    std::ofstream conf(data + "/postgresql.conf", std::ios::app);
    conf << "listen_addresses = ''\n"
         << "unix_socket_directories = '" << dir_ << "'\n"
         << "port = " << kPort << "\n"
         << "max_connections = 30\n"
         << "shared_buffers = 32MB\n"
         << "fsync = " << (options.fsync ? "on" : "off") << "\n"
         << "synchronous_commit = off\n"  // the server default: the ledger turns it on itself
         << "log_min_messages = warning\n"
         << extra_conf;
    if (!conf) return Status::ioError("cannot write " + data + "/postgresql.conf");
  }
  const std::string server_log = dir_ + "/server.log";
  const std::string timeout_s =
      std::to_string(std::max<uint64_t>(1, options.start_timeout_ms / 1000));
  // pg_ctl -w returns once the server accepts connections (or fails, or times out).
  const int started = run("pg_ctl", {"-D", data, "-l", server_log, "-w", "-t", timeout_s, "start"},
                          true, log_path, options.start_timeout_ms + 5'000);
  // The postmaster's pid, from the first line of postmaster.pid (present once it runs).
  {
    std::ifstream pid_file(data + "/postmaster.pid");
    long pid = -1;
    if (pid_file >> pid && pid > 0) {
      pid_ = static_cast<pid_t>(pid);
      running_ = true;
    }
  }
  if (started != 0 || !running_) {
    return Status::unavailable("pg_ctl start failed:\n" + readFile(log_path) + "\n" +
                               readFile(server_log));
  }
  if (run("pg_isready", {"-h", dir_, "-p", kPort, "-t", "10"}, false, log_path, 15'000) != 0) {
    return Status::unavailable("pg_isready: not ready:\n" + readFile(log_path));
  }
  return Status::ok();
}

void PostgresServer::kill9() {
  if (!running_) return;
  running_ = false;
  if (pid_ > 0) ::kill(pid_, SIGKILL);
}

Status PostgresServer::promote() {
  const std::string log_path = dir_ + "/setup.log";
  if (run("pg_ctl", {"-D", dir_ + "/data", "-w", "-t", "30", "promote"}, true, log_path, 35'000) !=
      0) {
    return Status::unavailable("pg_ctl promote failed:\n" + readFile(log_path));
  }
  return Status::ok();
}

Status PostgresServer::stop() {
  if (!running_) return Status::ok();
  running_ = false;
  const std::string log_path = dir_ + "/setup.log";
  if (run("pg_ctl", {"-D", dir_ + "/data", "-m", "fast", "-w", "-t", "20", "stop"}, true, log_path,
          25'000) == 0) {
    return Status::ok();
  }
  if (pid_ > 0) ::kill(pid_, SIGKILL);  // its children exit once the postmaster is gone
  return Status::unavailable("pg_ctl stop did not finish; the postmaster was killed:\n" +
                             readFile(log_path));
}

PostgresServer::~PostgresServer() {
  (void)stop();
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

std::string PostgresServer::conninfo(const std::string& dbname) const {
  return "host=" + dir_ + " port=" + kPort + " user=postgres dbname=" + dbname;
}

Status PostgresServer::createDatabase(const std::string& name) {
  Result<std::string> out = psql("postgres", "CREATE DATABASE " + name);
  return out.isOk() ? Status::ok() : out.status();
}

Result<std::string> PostgresServer::psql(const std::string& dbname, const std::string& sql) {
  const std::string log_path = dir_ + "/psql-" + std::to_string(++psql_calls_) + ".out";
  const int status =
      run("psql", {"-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-d", conninfo(dbname), "-c", sql},
          false, log_path, kToolTimeoutMs);
  std::string out = readFile(log_path);
  std::error_code ignored;
  std::filesystem::remove(log_path, ignored);
  if (status != 0) return Status::unavailable("psql: " + sql + ": " + out);
  return out;
}

std::string PostgresServer::log() const { return readFile(dir_ + "/server.log"); }

}  // namespace tally::testing
