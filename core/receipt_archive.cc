#include "core/receipt_archive.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "core/assert.h"

namespace tally {
namespace {

// Receipt flags (the first varint of an encoding).
constexpr uint64_t kClosedByHardLimit = 1 << 0;
constexpr uint64_t kLateReceiptApplied = 1 << 1;
constexpr uint64_t kOverdraftBreach = 1 << 2;
constexpr uint64_t kRequestFieldsKnown = 1 << 3;
constexpr uint64_t kHasExpiresAt = 1 << 4;
constexpr uint64_t kHasStartedAt = 1 << 5;
constexpr uint64_t kHasClosedAt = 1 << 6;
constexpr uint64_t kHasEpoch = 1 << 7;
constexpr uint64_t kHasGateway = 1 << 8;  // the gateway name follows the requested generation
constexpr uint64_t kFlagsAll = (1 << 9) - 1;

// Header bytes: hash [0, 8), keep-until [8, 16), body length [16, 18), alive [18], state [19].
constexpr uint8_t kGap = 0;  // where a header would begin: nothing more in this chunk
constexpr uint8_t kLive = 1;
constexpr uint8_t kDead = 2;

void putVarint(uint64_t value, std::string* out) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

void putString(const std::string& value, std::string* out) {
  putVarint(value.size(), out);
  out->append(value);
}

// Times relative to createdAt, zigzagged (a restored row may hold any values).
uint64_t zigzag(uint64_t difference) {
  const auto signed_difference = static_cast<int64_t>(difference);
  return (difference << 1) ^ static_cast<uint64_t>(signed_difference >> 63);
}
uint64_t unzigzag(uint64_t value) { return (value >> 1) ^ (~(value & 1) + 1); }

class Reader {
 public:
  explicit Reader(std::string_view bytes) : bytes_(bytes) {}
  bool varint(uint64_t* value) {
    uint64_t result = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (position_ >= bytes_.size()) return false;
      const auto byte = static_cast<uint8_t>(bytes_[position_++]);
      result |= uint64_t{byte & 0x7fu} << shift;
      if ((byte & 0x80) == 0) {
        *value = result;
        return true;
      }
    }
    return false;
  }
  bool string(std::string* value) {
    uint64_t length = 0;
    if (!varint(&length) || length > bytes_.size() - position_) return false;
    value->assign(bytes_.substr(position_, length));
    position_ += length;
    return true;
  }
  bool raw(uint8_t* out, size_t length) {
    if (length > bytes_.size() - position_) return false;
    std::memcpy(out, bytes_.data() + position_, length);
    position_ += length;
    return true;
  }
  bool done() const { return position_ == bytes_.size(); }

 private:
  std::string_view bytes_;
  size_t position_ = 0;
};

uint64_t read64(const uint8_t* at) {
  uint64_t value = 0;
  std::memcpy(&value, at, sizeof(value));
  return value;
}

uint64_t align8(uint64_t bytes) { return (bytes + 7) & ~uint64_t{7}; }

}  // namespace

void ReceiptArchive::encode(const Reservation& r, std::string* out) {
  out->clear();
  const uint64_t flags =
      (r.closed_by_hard_limit ? kClosedByHardLimit : 0) |
      (r.late_receipt_applied ? kLateReceiptApplied : 0) |
      (r.overdraft_breach ? kOverdraftBreach : 0) |
      (r.request_fields_known ? kRequestFieldsKnown : 0) |
      (r.expires_at_ms != 0 ? kHasExpiresAt : 0) | (r.started_at_ms != 0 ? kHasStartedAt : 0) |
      (r.closed_at_ms != 0 ? kHasClosedAt : 0) | (r.accounting_epoch_ms != 0 ? kHasEpoch : 0) |
      (!r.gateway_name.empty() ? kHasGateway : 0);
  putVarint(flags, out);
  out->push_back(static_cast<char>(r.state));
  out->push_back(static_cast<char>(r.limiting_dimension));
  putString(r.reservation_id, out);
  out->append(reinterpret_cast<const char*>(r.request_digest.data()), r.request_digest.size());
  putString(r.subject, out);
  putString(r.route, out);
  putString(r.operation_id, out);
  putString(r.origin, out);
  putString(r.region, out);
  putVarint(r.policy_generation, out);
  putVarint(r.reserved_units, out);
  putVarint(r.actual_units, out);
  putVarint(r.refunded_units, out);
  putVarint(r.debt_units, out);
  putVarint(r.created_at_ms, out);
  for (const uint64_t at :
       {r.expires_at_ms, r.started_at_ms, r.closed_at_ms, r.accounting_epoch_ms}) {
    if (at != 0) putVarint(zigzag(at - r.created_at_ms), out);
  }
  putVarint(zigzag(static_cast<uint64_t>(r.retry_after_ms)), out);
  putVarint(r.priority, out);
  putVarint(r.requested_generation, out);
  if (!r.gateway_name.empty()) putString(r.gateway_name, out);
}

bool ReceiptArchive::decode(std::string_view bytes, Reservation* out) {
  Reader in(bytes);
  Reservation r;
  uint64_t flags = 0;
  uint8_t state = 0;
  uint8_t dimension = 0;
  if (!in.varint(&flags) || (flags & ~kFlagsAll) != 0 || !in.raw(&state, 1) ||
      state >= kReservationStateCount || !in.raw(&dimension, 1) ||
      dimension > static_cast<uint8_t>(LimitingDimension::kLedgerUnavailable)) {
    return false;
  }
  r.state = static_cast<ReservationState>(state);
  r.limiting_dimension = static_cast<LimitingDimension>(dimension);
  r.closed_by_hard_limit = (flags & kClosedByHardLimit) != 0;
  r.late_receipt_applied = (flags & kLateReceiptApplied) != 0;
  r.overdraft_breach = (flags & kOverdraftBreach) != 0;
  r.request_fields_known = (flags & kRequestFieldsKnown) != 0;
  if (!in.string(&r.reservation_id) || !in.raw(r.request_digest.data(), r.request_digest.size()) ||
      !in.string(&r.subject) || !in.string(&r.route) || !in.string(&r.operation_id) ||
      !in.string(&r.origin) || !in.string(&r.region) || !in.varint(&r.policy_generation) ||
      !in.varint(&r.reserved_units) || !in.varint(&r.actual_units) ||
      !in.varint(&r.refunded_units) || !in.varint(&r.debt_units) || !in.varint(&r.created_at_ms)) {
    return false;
  }
  const std::pair<uint64_t, uint64_t*> times[] = {{kHasExpiresAt, &r.expires_at_ms},
                                                  {kHasStartedAt, &r.started_at_ms},
                                                  {kHasClosedAt, &r.closed_at_ms},
                                                  {kHasEpoch, &r.accounting_epoch_ms}};
  for (const auto& [flag, at] : times) {
    if ((flags & flag) == 0) continue;
    uint64_t delta = 0;
    if (!in.varint(&delta)) return false;
    *at = r.created_at_ms + unzigzag(delta);
    if (*at == 0) return false;  // 0 is written as an absent flag
  }
  uint64_t retry_after = 0;
  uint64_t priority = 0;
  if (!in.varint(&retry_after) || !in.varint(&priority) || priority > UINT32_MAX ||
      !in.varint(&r.requested_generation)) {
    return false;
  }
  if ((flags & kHasGateway) != 0 && (!in.string(&r.gateway_name) || r.gateway_name.empty())) {
    return false;
  }
  if (!in.done()) return false;
  r.retry_after_ms = static_cast<int64_t>(unzigzag(retry_after));
  r.priority = static_cast<uint32_t>(priority);
  *out = std::move(r);
  return true;
}

ReceiptArchive::ReceiptArchive(uint64_t bucket_ms) : bucket_ms_(bucket_ms) {
  TALLY_ASSERT(bucket_ms_ > 0);
}

ReceiptArchive::~ReceiptArchive() = default;

uint64_t ReceiptArchive::bytes() const {
  return chunk_count_ * kChunkBytes + index_.size() * sizeof(uint64_t) +
         by_tag_.size() * sizeof(Segment*) + segments_.size() * sizeof(Segment);
}

uint8_t* ReceiptArchive::headerAt(uint64_t entry) const {
  const Segment* segment = by_tag_[tagOf(entry)];
  const uint64_t offset = offsetOf(entry);
  return segment->chunks[offset >> kChunkShift].get() + (offset & (kChunkBytes - 1));
}

uint64_t ReceiptArchive::hashIn(const uint8_t* header) { return read64(header); }

std::string_view ReceiptArchive::idIn(std::string_view body) {
  // The id is the first string, after the flags (a varint), the state and the dimension.
  size_t position = 0;
  while (position < body.size() && (static_cast<uint8_t>(body[position]) & 0x80) != 0) ++position;
  position += 3;
  uint64_t length = 0;
  for (int shift = 0; position < body.size(); shift += 7) {
    const auto byte = static_cast<uint8_t>(body[position++]);
    length |= uint64_t{byte & 0x7fu} << shift;
    if ((byte & 0x80) == 0) break;
  }
  TALLY_ASSERT(length <= body.size() - position);  // written by encode()
  return body.substr(position, length);
}

std::string_view ReceiptArchive::bodyIn(const uint8_t* header) {
  uint16_t length = 0;
  std::memcpy(&length, header + 16, sizeof(length));
  return {reinterpret_cast<const char*>(header + kHeaderBytes), length};
}

uint64_t ReceiptArchive::positionOf(std::string_view id, uint64_t hash) const {
  if (index_.empty()) return 0;
  const uint64_t mask = index_.size() - 1;
  for (uint64_t position = hash & mask;; position = (position + 1) & mask) {
    const uint64_t entry = index_[position];
    if (entry == 0) return index_.size();
    if (!hashMatches(entry, hash)) continue;
    const uint8_t* header = headerAt(entry);
    if (hashIn(header) != hash) continue;
    if (idIn(bodyIn(header)) == id) return position;
  }
}

bool ReceiptArchive::contains(std::string_view id, uint64_t hash) const {
  return positionOf(id, hash) < index_.size();
}

std::optional<std::string_view> ReceiptArchive::findPacked(std::string_view id,
                                                           uint64_t hash) const {
  const uint64_t position = positionOf(id, hash);
  if (position >= index_.size()) return std::nullopt;
  return bodyIn(headerAt(index_[position]));
}

std::optional<Reservation> ReceiptArchive::find(std::string_view id, uint64_t hash) const {
  const std::optional<std::string_view> packed = findPacked(id, hash);
  if (!packed.has_value()) return std::nullopt;
  Reservation out;
  const bool decoded = decode(*packed, &out);
  TALLY_ASSERT(decoded);  // written by encode()
  return out;
}

std::optional<Reservation> ReceiptArchive::take(std::string_view id, uint64_t hash) {
  const uint64_t position = positionOf(id, hash);
  if (position >= index_.size()) return std::nullopt;
  Reservation out;
  const bool decoded = decode(bodyIn(headerAt(index_[position])), &out);
  TALLY_ASSERT(decoded);
  eraseAt(position);
  return out;
}

void ReceiptArchive::growIndex() {
  const uint64_t capacity = index_.empty() ? kIndexSlotsMin : 2 * index_.size();
  std::vector<uint64_t> grown(capacity, 0);
  const uint64_t mask = capacity - 1;
  for (const uint64_t entry : index_) {
    if (entry == 0) continue;
    uint64_t position = hashIn(headerAt(entry)) & mask;
    while (grown[position] != 0) position = (position + 1) & mask;
    grown[position] = entry;
  }
  index_ = std::move(grown);
}

void ReceiptArchive::eraseAt(uint64_t hole) {
  uint8_t* header = headerAt(index_[hole]);
  TALLY_ASSERT(header[18] == kLive);
  header[18] = kDead;
  --counts_by_state_[header[19]];
  --by_tag_[tagOf(index_[hole])]->live;
  --size_;
  ++version_;
  // Backward-shift deletion, as in ReservationTable::erase.
  const uint64_t mask = index_.size() - 1;
  for (uint64_t position = (hole + 1) & mask; index_[position] != 0;
       position = (position + 1) & mask) {
    const uint64_t home = hashIn(headerAt(index_[position])) & mask;
    const bool stays =
        hole <= position ? (hole < home && home <= position) : (hole < home || home <= position);
    if (stays) continue;
    index_[hole] = index_[position];
    hole = position;
  }
  index_[hole] = 0;
}

ReceiptArchive::Segment* ReceiptArchive::segmentFor(uint64_t bucket) {
  auto it = segments_.find(bucket);
  if (it != segments_.end()) return it->second.get();
  // A released tag first, else the next never used (tag 0 is never used: an entry is never 0).
  uint64_t tag = 0;
  if (!free_tags_.empty()) {
    tag = free_tags_.back();
    free_tags_.pop_back();
  } else {
    tag = std::max<uint64_t>(by_tag_.size(), 1);
    if (tag >= kTagsMax) return nullptr;
  }
  auto segment = std::make_unique<Segment>();
  segment->bucket = bucket;
  segment->tag = tag;
  if (by_tag_.size() <= segment->tag) by_tag_.resize(segment->tag + 1, nullptr);
  by_tag_[segment->tag] = segment.get();
  return segments_.emplace(bucket, std::move(segment)).first->second.get();
}

bool ReceiptArchive::add(const Reservation& reservation, uint64_t hash, uint64_t keep_until_ms) {
  TALLY_ASSERT(isTerminal(reservation.state));
  std::string& body = scratch_;
  encode(reservation, &body);
  const uint64_t size = align8(kHeaderBytes + body.size());
  if (body.size() > UINT16_MAX || size > kChunkBytes) return false;
  Segment* segment = segmentFor(keep_until_ms / bucket_ms_);
  if (segment == nullptr) return false;
  uint64_t offset = segment->end;
  if ((offset & (kChunkBytes - 1)) + size > kChunkBytes) {
    // The rest of this chunk stays a gap, marked where the next header would begin (a chunk is
    // not zeroed: in a short segment most of it is never written, nor touched).
    if (kChunkBytes - (offset & (kChunkBytes - 1)) >= kHeaderBytes) {
      segment->chunks[offset >> kChunkShift][(offset & (kChunkBytes - 1)) + 18] = kGap;
    }
    offset = ((offset >> kChunkShift) + 1) << kChunkShift;
  }
  if (((offset + size) >> 3) > UINT32_MAX) return false;  // 32 GiB in one segment
  if (10 * (size_ + 1) > 7 * index_.size()) growIndex();
  const uint64_t chunk = offset >> kChunkShift;
  while (segment->chunks.size() <= chunk) {
    segment->chunks.push_back(std::make_unique_for_overwrite<uint8_t[]>(kChunkBytes));
#ifndef NDEBUG
    // Debug builds (the sanitizer suite) fill a new chunk with what a gap is not, so that a gap
    // left unmarked is read as garbage, never as the zeroes fresh pages happen to hold.
    std::memset(segment->chunks.back().get(), 0xA5, kChunkBytes);
#endif
    ++chunk_count_;
  }
  uint8_t* header = segment->chunks[chunk].get() + (offset & (kChunkBytes - 1));
  std::memcpy(header, &hash, 8);
  std::memcpy(header + 8, &keep_until_ms, 8);
  const auto length = static_cast<uint16_t>(body.size());
  std::memcpy(header + 16, &length, 2);
  header[18] = kLive;
  header[19] = static_cast<uint8_t>(reservation.state);
  std::memcpy(header + kHeaderBytes, body.data(), body.size());
  segment->end = offset + size;
  ++segment->live;
  ++counts_by_state_[header[19]];
  ++size_;
  ++version_;

  const uint64_t mask = index_.size() - 1;
  uint64_t position = hash & mask;
  while (index_[position] != 0) position = (position + 1) & mask;
  index_[position] = entryOf(hash, segment->tag, offset);
  return true;
}

void ReceiptArchive::dropSegment(std::map<uint64_t, std::unique_ptr<Segment>>::iterator it) {
  Segment& segment = *it->second;
  TALLY_ASSERT(segment.live == 0);
  for (const auto& chunk : segment.chunks) {
    if (chunk != nullptr) --chunk_count_;
  }
  by_tag_[segment.tag] = nullptr;
  free_tags_.push_back(static_cast<uint16_t>(segment.tag));
  segments_.erase(it);
}

uint64_t ReceiptArchive::compact(uint64_t now_ms, uint64_t items_max,
                                 std::vector<std::string>* forgotten) {
  uint64_t visited = 0;
  uint64_t count = 0;
  std::string id;
  for (auto it = segments_.begin(); it != segments_.end() && visited < items_max;) {
    Segment& segment = *it->second;
    const uint64_t now_bucket = now_ms / bucket_ms_;
    if (segment.bucket > now_bucket) break;  // this span (and every later one) is ahead
    const bool ended = segment.bucket < now_bucket;
    while (segment.cursor < segment.end && visited < items_max) {
      const uint64_t in_chunk = segment.cursor & (kChunkBytes - 1);
      const uint64_t chunk_index = segment.cursor >> kChunkShift;
      uint8_t* chunk = segment.chunks[chunk_index].get();
      if (kChunkBytes - in_chunk < kHeaderBytes || chunk[in_chunk + 18] == kGap) {
        segment.cursor = (chunk_index + 1) << kChunkShift;
      } else {
        uint8_t* header = chunk + in_chunk;
        const uint64_t keep_until_ms = read64(header + 8);
        if (!ended && keep_until_ms > now_ms) break;  // the front is not due yet
        ++visited;
        if (header[18] == kLive) {
          const uint64_t hash = hashIn(header);
          id = idIn(bodyIn(header));
          const uint64_t position = positionOf(id, hash);
          TALLY_ASSERT(position < index_.size());
          eraseAt(position);
          forgotten->push_back(id);
          ++count;
        }
        segment.cursor += align8(kHeaderBytes + bodyIn(header).size());
      }
      // Return each chunk the front has left (never the one being appended to).
      const uint64_t front_chunk = segment.cursor >> kChunkShift;
      for (uint64_t c = chunk_index; c < front_chunk && c < segment.chunks.size(); ++c) {
        if (segment.chunks[c] != nullptr && (c + 1) << kChunkShift <= segment.end) {
          segment.chunks[c].reset();
          --chunk_count_;
        }
      }
    }
    if (segment.cursor >= segment.end && ended) {
      dropSegment(it++);
      continue;
    }
    if (segment.cursor < segment.end) break;  // the front is not due (or out of visits)
    ++it;
  }
  return count;
}

}  // namespace tally
