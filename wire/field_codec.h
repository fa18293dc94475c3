#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <capnp/blob.h>
#include <kj/exception.h>

#include "core/limits.h"
#include "core/status.h"
#include "wire/enum_mapping.h"

// Field readers and writers shared by the codec's translation units (codec.cc, shard_codec.cc).
// Internal to wire/: the readers may throw kj::Exception on malformed bytes, and only the public
// entry points (toCore, decode*) catch it, through catchDecodeErrors().

#define TALLY_WIRE_RETURN_IF_ERROR(expr)            \
  do {                                              \
    if (Status status_ = (expr); !status_.isOk()) { \
      return status_;                               \
    }                                               \
  } while (false)

namespace tally::wire::field {

template <typename F>
auto catchDecodeErrors(F&& read) -> decltype(read()) {
  try {
    return read();
  } catch (const kj::Exception& exception) {
    return Status::corruption(std::string("malformed message: ") +
                              exception.getDescription().cStr());
  }
}

// Prefixes the field path of an invalid-argument status ("receipts[3]" + "." + "state: …").
inline Status withContext(Status status, std::string_view context) {
  if (status.code() != StatusCode::kInvalidArgument) return status;
  return Status::invalidArgument(std::string(context) + "." + status.message());
}

inline Status readText(capnp::Text::Reader text, uint64_t bytes_max, const char* field,
                       std::string* out) {
  if (text.size() > bytes_max) {
    return Status::invalidArgument(std::string(field) + ": " + std::to_string(text.size()) +
                                   " bytes, at most " + std::to_string(bytes_max) + " allowed");
  }
  out->assign(text.begin(), text.size());
  return Status::ok();
}

// Exactly N bytes (digests, public keys, signatures).
template <size_t N>
Status readBytes(capnp::Data::Reader data, const char* field, std::array<uint8_t, N>* out) {
  if (data.size() != N) {
    return Status::invalidArgument(std::string(field) + ": " + std::to_string(data.size()) +
                                   " bytes, exactly " + std::to_string(N) + " required");
  }
  std::memcpy(out->data(), data.begin(), N);
  return Status::ok();
}

template <typename Core, typename Wire>
Status readEnum(Wire value, const char* field, Core* out) {
  std::optional<Core> core = enumToCore(value);
  if (!core) {
    return Status::invalidArgument(std::string(field) + ": unknown value " +
                                   std::to_string(static_cast<uint16_t>(value)));
  }
  *out = *core;
  return Status::ok();
}

// A unit count from outside (core/limits.h kUnitsPerRequestMax unless the caller names another
// bound): a value above it is refused, so balances built from it stay far from 2^64.
inline Status readUnits(uint64_t value, const char* field, uint64_t* out,
                        uint64_t units_max = limits::kUnitsPerRequestMax) {
  if (value > units_max) {
    return Status::invalidArgument(std::string(field) + ": " + std::to_string(value) +
                                   " units, at most " + std::to_string(units_max) + " allowed");
  }
  *out = value;
  return Status::ok();
}

// The unit counts of a receipt received from a peer, each within the request maximum.
template <typename Receipt>
Status checkReceiptUnits(const Receipt& receipt) {
  uint64_t ignored = 0;
  TALLY_WIRE_RETURN_IF_ERROR(readUnits(receipt.reserved_units, "reservedUnits", &ignored));
  TALLY_WIRE_RETURN_IF_ERROR(readUnits(receipt.actual_units, "actualUnits", &ignored));
  TALLY_WIRE_RETURN_IF_ERROR(readUnits(receipt.refunded_units, "refundedUnits", &ignored));
  return readUnits(receipt.debt_units, "debtUnits", &ignored);
}

inline Status checkListSize(uint64_t size, uint64_t size_max, const char* field) {
  if (size > size_max) {
    return Status::invalidArgument(std::string(field) + ": " + std::to_string(size) +
                                   " entries, at most " + std::to_string(size_max) + " allowed");
  }
  return Status::ok();
}

// Each item of a list from outside, read by `read` (a Result<T>); at most size_max of them. An
// item's invalid-argument status names its index ("gateways[3].publicKey: …").
template <typename Reader, typename T, typename Read>
Status readList(Reader list, uint64_t size_max, const char* name, Read read, std::vector<T>* out) {
  TALLY_WIRE_RETURN_IF_ERROR(checkListSize(list.size(), size_max, name));
  out->reserve(list.size());
  for (uint32_t i = 0; i < list.size(); ++i) {
    Result<T> item = read(list[i]);
    if (!item.isOk()) {
      return withContext(item.status(), std::string(name) + "[" + std::to_string(i) + "]");
    }
    out->push_back(std::move(item).value());
  }
  return Status::ok();
}

inline capnp::Text::Reader textOf(const std::string& value) {
  return capnp::Text::Reader(value.data(), value.size());
}

template <size_t N>
capnp::Data::Reader dataOf(const std::array<uint8_t, N>& bytes) {
  return capnp::Data::Reader(bytes.data(), bytes.size());
}

}  // namespace tally::wire::field
