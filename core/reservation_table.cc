#include "core/reservation_table.h"

#include <functional>
#include <utility>

#include "core/assert.h"

namespace tally {

uint64_t ReservationTable::hashOf(std::string_view id) { return std::hash<std::string_view>{}(id); }

uint64_t ReservationTable::positionOf(std::string_view id, uint64_t hash) const {
  if (index_.empty()) return 0;
  const uint64_t mask = index_.size() - 1;
  const auto bits = static_cast<uint32_t>(hash);
  for (uint64_t position = bits & mask;; position = (position + 1) & mask) {
    const uint64_t entry = index_[position];
    if (entry == 0) return index_.size();
    if (hashBits(entry) == bits && recordAt(slotOf(entry)).reservation.reservation_id == id) {
      return position;
    }
  }
}

ReservationTable::Record* ReservationTable::find(std::string_view id, uint64_t hash) {
  const uint64_t position = positionOf(id, hash);
  return position >= index_.size() ? nullptr : &recordAt(slotOf(index_[position]));
}

const ReservationTable::Record* ReservationTable::find(std::string_view id, uint64_t hash) const {
  const uint64_t position = positionOf(id, hash);
  return position >= index_.size() ? nullptr : &recordAt(slotOf(index_[position]));
}

uint64_t ReservationTable::allocateSlot() {
  if (!free_slots_.empty()) {
    const uint64_t slot = free_slots_.back();
    free_slots_.pop_back();
    return slot;
  }
  TALLY_ASSERT(slots_used_ < kRecordsMax);  // the Ledger caps reservations below this
  if ((slots_used_ >> kChunkShift) == chunks_.size()) {
    chunks_.push_back(std::make_unique<Record[]>(kChunkRecords));
  }
  return slots_used_++;
}

void ReservationTable::growIndex() {
  const uint64_t capacity = index_.empty() ? kIndexSlotsMin : 2 * index_.size();
  std::vector<uint64_t> grown(capacity, 0);
  const uint64_t mask = capacity - 1;
  for (uint64_t entry : index_) {
    if (entry == 0) continue;
    uint64_t position = hashBits(entry) & mask;
    while (grown[position] != 0) position = (position + 1) & mask;
    grown[position] = entry;
  }
  index_ = std::move(grown);
}

ReservationTable::Record* ReservationTable::insert(Reservation reservation, uint64_t hash) {
  TALLY_ASSERT(!reservation.reservation_id.empty());
  TALLY_ASSERT(hash == hashOf(reservation.reservation_id));
  // At most half full, so that probes stay short and an empty entry always ends them.
  if (2 * (size_ + 1) > index_.size()) growIndex();
  const uint64_t mask = index_.size() - 1;
  const auto bits = static_cast<uint32_t>(hash);
  uint64_t position = bits & mask;
  for (; index_[position] != 0; position = (position + 1) & mask) {
    const uint64_t entry = index_[position];
    TALLY_ASSERT(hashBits(entry) != bits ||
                 recordAt(slotOf(entry)).reservation.reservation_id != reservation.reservation_id);
  }
  const uint64_t slot = allocateSlot();
  Record& record = recordAt(slot);
  TALLY_ASSERT(record.reservation.reservation_id.empty() && record.serial == 0 &&
               !record.change_pending);
  record.serial = next_serial_++;
  record.slot = slot;
  record.reservation = std::move(reservation);
  index_[position] = entryOf(hash, slot);
  ++size_;
  return &record;
}

bool ReservationTable::erase(std::string_view id) {
  uint64_t hole = positionOf(id, hashOf(id));
  if (hole >= index_.size()) return false;
  const uint64_t slot = slotOf(index_[hole]);
  recordAt(slot) = Record{};  // releases the strings; an empty id and serial 0 mark it free
  free_slots_.push_back(slot);
  --size_;
  // Backward-shift deletion: pull later entries of the probe run into the hole whenever their
  // home position does not lie cyclically in (hole, position], so no tombstones are needed.
  const uint64_t mask = index_.size() - 1;
  for (uint64_t position = (hole + 1) & mask; index_[position] != 0;
       position = (position + 1) & mask) {
    const uint64_t home = hashBits(index_[position]) & mask;
    const bool stays =
        hole <= position ? (hole < home && home <= position) : (hole < home || home <= position);
    if (stays) continue;
    index_[hole] = index_[position];
    hole = position;
  }
  index_[hole] = 0;
  return true;
}

}  // namespace tally
