#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "core/assert.h"
#include "core/reservation.h"

// The Ledger's reservations by id, built for millions of rows on the admission path:
//  * records live in fixed-size chunks that never move, and an erased record's slot is reused,
//    so a Record's address is stable from insert() until the erase() of its id;
//  * the index is open-addressed (linear probing, at most half full) over 8-byte entries that
//    hold 32 bits of the id's hash and the record's slot. A lookup reads one index line, then
//    only records whose hash bits match; growing the index never touches a record.
//
// Owns its records. Single-threaded: owned by one Ledger. Bounded by the caller: the Ledger
// refuses new reservations at reservations_max, which must not exceed kRecordsMax.
//
// Invariants: every indexed slot holds a record with a non-empty id and a non-zero serial, and no
// two share an id or a serial; every slot below slots_used_ that is not indexed is on the free
// list and holds an empty record (serial 0). Chunks are freed only with the table, so a Handle's
// slot can always be read.

namespace tally {

class ReservationTable {
 public:
  // A reservation and its owner's per-row flag (the Ledger's "listed as changed"). `serial`
  // and `slot` are the table's: serial numbers every insert (never reused), 0 when empty.
  struct Record {
    uint64_t serial = 0;
    uint64_t slot = 0;
    bool change_pending = false;
    Reservation reservation;
  };

  // Names one stored record (one insert) without its id, e.g. in a deadline queue. It resolves
  // to that record for as long as it is stored, and to nothing once it has been erased, even if
  // its slot (or its id) has been reused since.
  struct Handle {
    uint64_t slot = 0;
    uint64_t serial = 0;
  };

  static constexpr uint64_t kRecordsMax = (uint64_t{1} << 31) - 1;

  ReservationTable() = default;
  ReservationTable(const ReservationTable&) = delete;
  ReservationTable& operator=(const ReservationTable&) = delete;

  // The hash every lookup uses; computed once per request and passed to find/insert.
  static uint64_t hashOf(std::string_view id);

  Record* find(std::string_view id) { return find(id, hashOf(id)); }
  const Record* find(std::string_view id) const { return find(id, hashOf(id)); }
  Record* find(std::string_view id, uint64_t hash);
  const Record* find(std::string_view id, uint64_t hash) const;

  // Stores `reservation`, whose id is non-empty and not present; `hash` is hashOf(its id).
  Record* insert(Reservation reservation, uint64_t hash);
  // Removes the record with this id and frees its slot; false if there is none.
  bool erase(std::string_view id);

  static Handle handleOf(const Record& record) { return {record.slot, record.serial}; }
  // The record `handle` names, or null once that record has been erased. No index lookup: it
  // reads the one slot.
  Record* resolve(Handle handle) {
    TALLY_ASSERT(handle.slot < slots_used_);
    Record& record = recordAt(handle.slot);
    return record.serial == handle.serial ? &record : nullptr;
  }

  size_t size() const { return size_; }

  // Calls fn(const Record&) for every record, in slot order (deterministic for one history).
  template <typename F>
  void forEach(F&& fn) const {
    for (uint64_t slot = 0; slot < slots_used_; ++slot) {
      const Record& record = recordAt(slot);
      if (!record.reservation.reservation_id.empty()) fn(record);
    }
  }

 private:
  static constexpr uint64_t kChunkShift = 8;  // 256 records (about 75 KiB) per chunk
  static constexpr uint64_t kChunkRecords = uint64_t{1} << kChunkShift;
  static constexpr uint64_t kIndexSlotsMin = 16;

  static uint32_t hashBits(uint64_t entry) { return static_cast<uint32_t>(entry >> 32); }
  static uint64_t slotOf(uint64_t entry) { return (entry & 0xffff'ffffu) - 1; }
  static uint64_t entryOf(uint64_t hash, uint64_t slot) {
    return (uint64_t{static_cast<uint32_t>(hash)} << 32) | (slot + 1);
  }

  Record& recordAt(uint64_t slot) {
    return chunks_[slot >> kChunkShift][slot & (kChunkRecords - 1)];
  }
  const Record& recordAt(uint64_t slot) const {
    return chunks_[slot >> kChunkShift][slot & (kChunkRecords - 1)];
  }
  // Index position of the entry for `id`, or index_.size() if absent.
  uint64_t positionOf(std::string_view id, uint64_t hash) const;
  uint64_t allocateSlot();
  void growIndex();

  std::vector<std::unique_ptr<Record[]>> chunks_;
  std::vector<uint64_t> free_slots_;
  uint64_t slots_used_ = 0;  // slots ever handed out (the high-water mark)
  uint64_t next_serial_ = 1;
  std::vector<uint64_t> index_;  // 0: empty; else entryOf(hash, slot); size a power of two
  uint64_t size_ = 0;
};

}  // namespace tally
