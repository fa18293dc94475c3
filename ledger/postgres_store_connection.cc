#include "ledger/postgres_store_connection.h"

#include <libpq-fe.h>

#include <cstring>
#include <utility>

namespace tally::ledger::pg {

namespace {

void appendUint32(std::string* out, uint32_t value) {
  const char bytes[4] = {static_cast<char>(value >> 24), static_cast<char>(value >> 16),
                         static_cast<char>(value >> 8), static_cast<char>(value)};
  out->append(bytes, 4);
}

void appendUint64(std::string* out, uint64_t value) {
  appendUint32(out, static_cast<uint32_t>(value >> 32));
  appendUint32(out, static_cast<uint32_t>(value));
}

std::string trimmed(const char* message) {
  std::string text = message != nullptr ? message : "";
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

// RAII for one PGresult while a caller inspects it.
struct ResultHolder {
  PGresult* result;
  ~ResultHolder() { PQclear(result); }
};

}  // namespace

// --- Parameters ---------------------------------------------------------------------------------

void ArrayParam::add(std::string_view bytes) {
  appendUint32(&elements_, static_cast<uint32_t>(bytes.size()));
  elements_.append(bytes);
  ++count_;
}

void ArrayParam::add(std::span<const uint8_t> bytes) {
  add(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

void ArrayParam::addInt8(int64_t value) {
  appendUint32(&elements_, 8);
  appendUint64(&elements_, static_cast<uint64_t>(value));
  ++count_;
}

void ArrayParam::addNull() {
  appendUint32(&elements_, 0xffffffffu);  // length -1
  ++count_;
}

std::string ArrayParam::finish() const {
  std::string out;
  out.reserve(20 + elements_.size());
  appendUint32(&out, 1);  // dimensions
  appendUint32(&out, 1);  // may hold NULLs (PostgreSQL accepts the flag either way)
  appendUint32(&out, element_oid_);
  appendUint32(&out, count_);
  appendUint32(&out, 1);  // lower bound
  out += elements_;
  return out;
}

std::string int8Param(int64_t value) {
  std::string out;
  appendUint64(&out, static_cast<uint64_t>(value));
  return out;
}

// --- Rows ---------------------------------------------------------------------------------------

Rows::Rows(pg_result* result) : result_(result) {}
Rows::~Rows() { PQclear(result_); }
Rows::Rows(Rows&& other) noexcept : result_(std::exchange(other.result_, nullptr)) {}

int Rows::count() const { return PQntuples(result_); }

bool Rows::isNull(int row, int column) const { return PQgetisnull(result_, row, column) != 0; }

std::span<const uint8_t> Rows::bytes(int row, int column) const {
  const auto* data = reinterpret_cast<const uint8_t*>(PQgetvalue(result_, row, column));
  return {data, static_cast<size_t>(PQgetlength(result_, row, column))};
}

std::string Rows::text(int row, int column) const {
  return std::string(PQgetvalue(result_, row, column),
                     static_cast<size_t>(PQgetlength(result_, row, column)));
}

Status Rows::int8(int row, int column, int64_t* value) const {
  std::span<const uint8_t> data = bytes(row, column);
  if (data.size() != 8 || isNull(row, column)) {
    return Status::corruption(std::string("column ") + PQfname(result_, column) +
                              " is not an int8");
  }
  uint64_t out = 0;
  for (uint8_t byte : data) out = (out << 8) | byte;
  *value = static_cast<int64_t>(out);
  return Status::ok();
}

// --- Connection ---------------------------------------------------------------------------------

Result<std::unique_ptr<Connection>> Connection::open(const std::string& conninfo,
                                                     const char* application_name) {
  const char* keys[] = {"dbname", "fallback_application_name", nullptr};
  const char* values[] = {conninfo.c_str(), application_name, nullptr};
  PGconn* conn = PQconnectdbParams(keys, values, /*expand_dbname=*/1);
  if (conn == nullptr) return Status::resourceExhausted("postgres: out of memory connecting");
  if (PQstatus(conn) != CONNECTION_OK) {
    std::string message = trimmed(PQerrorMessage(conn));
    PQfinish(conn);
    return Status::failedPrecondition("postgres: connect: " + message);
  }
  return std::unique_ptr<Connection>(new Connection(conn));
}

Connection::~Connection() { PQfinish(conn_); }

bool Connection::broken() const { return PQstatus(conn_) != CONNECTION_OK; }

std::string Connection::describe() const {
  const char* host = PQhost(conn_);
  const char* port = PQport(conn_);
  const char* db = PQdb(conn_);
  return std::string("host=") + (host != nullptr ? host : "") +
         " port=" + (port != nullptr ? port : "") + " dbname=" + (db != nullptr ? db : "");
}

Status Connection::resultStatus(pg_result* result, const char* op) const {
  if (result == nullptr) {
    return Status::ioError(std::string("postgres: ") + op + ": " + trimmed(PQerrorMessage(conn_)));
  }
  const ExecStatusType status = PQresultStatus(result);
  if (status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK || status == PGRES_PIPELINE_SYNC) {
    return Status::ok();
  }
  std::string message = std::string("postgres: ") + op + ": ";
  if (status == PGRES_PIPELINE_ABORTED) return Status::ioError(message + "pipeline aborted");
  const char* sqlstate = PQresultErrorField(result, PG_DIAG_SQLSTATE);
  message += trimmed(PQresultErrorMessage(result));
  if (sqlstate != nullptr) message += std::string(" (SQLSTATE ") + sqlstate + ")";
  if (sqlstate != nullptr && std::strncmp(sqlstate, "53", 2) == 0) {
    return Status::resourceExhausted(message);
  }
  return Status::ioError(message);
}

Status Connection::exec(const std::string& sql, const char* op) {
  ResultHolder holder{PQexec(conn_, sql.c_str())};
  return resultStatus(holder.result, op);
}

Status Connection::prepare(const char* name, const std::string& sql, const char* op) {
  ResultHolder holder{PQprepare(conn_, name, sql.c_str(), 0, nullptr)};
  return resultStatus(holder.result, op);
}

namespace {

struct BinaryParams {
  std::vector<const char*> values;
  std::vector<int> lengths;
  std::vector<int> formats;

  explicit BinaryParams(const std::vector<std::string>& params) {
    for (const std::string& param : params) {
      values.push_back(param.data());
      lengths.push_back(static_cast<int>(param.size()));
      formats.push_back(1);
    }
  }
  int count() const { return static_cast<int>(values.size()); }
};

}  // namespace

Result<Rows> Connection::query(const std::string& sql, const std::vector<std::string>& params,
                               const char* op) {
  const BinaryParams binary(params);
  PGresult* result = PQexecParams(conn_, sql.c_str(), binary.count(), nullptr, binary.values.data(),
                                  binary.lengths.data(), binary.formats.data(), /*resultFormat=*/1);
  Rows rows(result);
  if (Status status = resultStatus(result, op); !status.isOk()) return status;
  return rows;
}

Status Connection::pipeline(std::span<const Step> steps, const char* op) {
  const std::string where = std::string("postgres: ") + op + ": ";
  if (PQenterPipelineMode(conn_) != 1) {
    return Status::ioError(where + "enter pipeline mode: " + trimmed(PQerrorMessage(conn_)));
  }
  Status status;
  size_t sent = 0;
  for (const Step& step : steps) {
    const BinaryParams binary(step.params);
    if (PQsendQueryPrepared(conn_, step.statement, binary.count(), binary.values.data(),
                            binary.lengths.data(), binary.formats.data(), 1) != 1) {
      status =
          Status::ioError(where + "send " + step.statement + ": " + trimmed(PQerrorMessage(conn_)));
      break;
    }
    ++sent;
  }
  if (PQpipelineSync(conn_) != 1 && status.isOk()) {
    status = Status::ioError(where + "sync: " + trimmed(PQerrorMessage(conn_)));
  }
  // Every sent step has one result followed by a null, then the Sync has its own result. On a
  // broken connection PQgetResult returns null at once: stop reading.
  bool synced = false;
  for (size_t i = 0; i <= sent && !broken(); ++i) {
    PGresult* result = PQgetResult(conn_);
    if (result == nullptr) break;
    const bool is_sync = PQresultStatus(result) == PGRES_PIPELINE_SYNC;
    if (Status step_status = resultStatus(result, i < sent ? steps[i].statement : "pipeline sync");
        !step_status.isOk() && status.isOk()) {
      status = step_status;
    }
    PQclear(result);
    if (is_sync) {
      synced = true;
      break;
    }
    PGresult* end = PQgetResult(conn_);  // the null that ends this step's results
    PQclear(end);
  }
  if (!synced && status.isOk()) {
    status =
        Status::ioError(where + "no answer to the pipeline: " + trimmed(PQerrorMessage(conn_)));
  }
  if (!broken() && PQexitPipelineMode(conn_) != 1 && status.isOk()) {
    status = Status::ioError(where + "exit pipeline mode: " + trimmed(PQerrorMessage(conn_)));
  }
  return status;
}

}  // namespace tally::ledger::pg
