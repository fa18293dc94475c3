#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

// A thin shell over one libpq connection for the PostgreSQL store (ledger/postgres_store.h):
// connecting, simple commands, prepared statements with binary parameters and binary results,
// and a pipeline that sends several prepared statements and one Sync in one round trip. No
// policy here: the store decides what runs and in which transaction.
//
// Parameters and results are always in binary format: a text value is its bytes, a bytea its
// bytes, an int8 8 bytes big-endian, an array PostgreSQL's binary array (ArrayParam builds one).
//
// Errors are Statuses naming the operation and PostgreSQL's message: kResourceExhausted for
// SQLSTATE class 53 (disk full, out of memory, too many connections), kFailedPrecondition for a
// refused connection, kIoError for everything else, including a connection that broke
// (broken() then says so: durability of what was in flight is unknown).

// Returns `expr`'s Status from the enclosing function unless it is OK.
#define TALLY_PG_RETURN_IF_ERROR(expr)                                         \
  do {                                                                         \
    if (::tally::Status tally_pg_status_ = (expr); !tally_pg_status_.isOk()) { \
      return tally_pg_status_;                                                 \
    }                                                                          \
  } while (false)

struct pg_conn;
struct pg_result;

namespace tally::ledger::pg {

inline constexpr uint32_t kOidBytea = 17;
inline constexpr uint32_t kOidInt8 = 20;
inline constexpr uint32_t kOidText = 25;

// A one-dimensional binary array of `element_oid`, NULL elements allowed.
class ArrayParam {
 public:
  explicit ArrayParam(uint32_t element_oid) : element_oid_(element_oid) {}
  void add(std::string_view bytes);  // text or bytea
  void add(std::span<const uint8_t> bytes);
  void addInt8(int64_t value);
  void addNull();
  size_t size() const { return count_; }
  // The array in PostgreSQL's binary format.
  std::string finish() const;

 private:
  uint32_t element_oid_;
  uint32_t count_ = 0;
  std::string elements_;
};

std::string int8Param(int64_t value);

// One prepared statement's execution: its name and its binary parameters.
struct Step {
  const char* statement = nullptr;
  std::vector<std::string> params;
};

// A query's rows, binary format. Owns its PGresult.
class Rows {
 public:
  explicit Rows(pg_result* result);
  ~Rows();
  Rows(Rows&& other) noexcept;
  Rows& operator=(Rows&&) = delete;
  Rows(const Rows&) = delete;

  int count() const;
  bool isNull(int row, int column) const;
  std::span<const uint8_t> bytes(int row, int column) const;
  std::string text(int row, int column) const;
  // kCorruption unless the column holds 8 bytes.
  Status int8(int row, int column, int64_t* value) const;

 private:
  pg_result* result_;
};

class Connection {
 public:
  // Connects with `conninfo` (a libpq connection string or URI), fallback_application_name
  // `application_name`.
  static Result<std::unique_ptr<Connection>> open(const std::string& conninfo,
                                                  const char* application_name);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // One or more SQL commands without parameters or results.
  [[nodiscard]] Status exec(const std::string& sql, const char* op);
  [[nodiscard]] Status prepare(const char* name, const std::string& sql, const char* op);
  // Runs prepared `statement` (or, if `sql` is given instead, that text) and returns its rows.
  [[nodiscard]] Result<Rows> query(const std::string& sql, const std::vector<std::string>& params,
                                   const char* op);
  // Sends every step, then one Sync, and reads every result: one round trip. Stops at the
  // first failed step (PostgreSQL skips the rest of the pipeline and rolls its transaction
  // back).
  [[nodiscard]] Status pipeline(std::span<const Step> steps, const char* op);

  // True once the connection is no longer usable.
  bool broken() const;
  // "host=... port=... dbname=..." of where it is connected (for logs).
  std::string describe() const;

 private:
  explicit Connection(pg_conn* conn) : conn_(conn) {}
  Status resultStatus(pg_result* result, const char* op) const;

  pg_conn* conn_;
};

}  // namespace tally::ledger::pg
