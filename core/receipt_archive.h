#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/reservation.h"

// The Ledger's terminal reservations (receipts) during the idempotency window, packed.
//
// A terminal reservation's receipt never changes but for one case (a late receipt after a
// hard-limit close), and every repeat of a request about it is answered from the receipt alone,
// so the Ledger moves it out of its live ReservationTable into this archive once the store has
// its final image (docs/LEDGER.md "Retention"). Here a receipt costs its packed encoding (every
// field of Reservation: varints, times as deltas from createdAt, strings inline; decode(encode(r))
// == r) plus a 20-byte header and one 8-byte index entry; the bench's receipts take ~150 bytes
// in all (~128 packed) against ~580 in the live table.
//
// Layout: receipts are appended to segments, one per `bucket_ms`-wide span of `keep_until_ms`
// (the moment a receipt may be forgotten: closedAt + retention), each a list of 64 KiB chunks.
// compact(now_ms) forgets, in each segment whose span has begun, the receipts from the front
// while they are due, and every receipt of a segment whose span has ended; so a receipt is never
// forgotten before keep_until_ms and at most bucket_ms after it, and memory is returned in whole
// chunks. The index is open-addressed (linear probing, at most 70% full) over 8-byte entries:
// 16 bits of the id's hash, the segment's tag and the receipt's offset.
//
// Owns its memory. Single-threaded: owned by one Ledger. Pure: no I/O, no clock.
//
// Invariants: every indexed entry names a live receipt of its segment whose header carries the
// full hash; no two live receipts share an id; counts_by_state_ and size_ count live receipts.

namespace tally {

class ReceiptArchive {
 public:
  // `bucket_ms` > 0: the width of one segment's span (the Ledger uses retention / 16).
  explicit ReceiptArchive(uint64_t bucket_ms);
  ~ReceiptArchive();
  ReceiptArchive(const ReceiptArchive&) = delete;
  ReceiptArchive& operator=(const ReceiptArchive&) = delete;

  // The packed form (exposed for tests and for sizing).
  static void encode(const Reservation& reservation, std::string* out);
  // False if `bytes` is not an encoding.
  static bool decode(std::string_view bytes, Reservation* out);

  // Keeps a terminal `reservation` (id not present; `hash` is ReservationTable::hashOf(id))
  // until at least `keep_until_ms`. False, with nothing changed, if it cannot be packed (an
  // encoding above one chunk, or a segment or the tag space full): the caller keeps it live.
  bool add(const Reservation& reservation, uint64_t hash, uint64_t keep_until_ms);
  // The receipt with this id, decoded.
  std::optional<Reservation> find(std::string_view id, uint64_t hash) const;
  bool contains(std::string_view id, uint64_t hash) const;
  // The packed form of the receipt with this id (valid until the archive next changes):
  // decode() reads it back. Read-only, for checks that cache by the bytes (the simulator's).
  std::optional<std::string_view> findPacked(std::string_view id, uint64_t hash) const;
  // Removes it and returns it (the Ledger takes it back into its live table), with the moment
  // it was kept until.
  std::optional<Reservation> take(std::string_view id, uint64_t hash);

  // Forgets receipts due by `now_ms` (see the class comment), visiting at most `items_max`;
  // appends each forgotten id to `*forgotten` and returns how many.
  uint64_t compact(uint64_t now_ms, uint64_t items_max, std::vector<std::string>* forgotten);

  size_t size() const { return size_; }
  // Changes whenever a receipt is added or forgotten (taken back or compacted): while it stays
  // the same, forEach visits the same receipts, unchanged, in the same order. Read-only
  // bookkeeping for checks that cache what the receipts contribute (the simulator's).
  uint64_t version() const { return version_; }
  // Bytes held: chunks and index (what receipt_bytes_max bounds).
  uint64_t bytes() const;
  uint64_t countOf(ReservationState state) const {
    return counts_by_state_[static_cast<size_t>(state)];
  }

  // Calls fn(std::string_view packed) for every receipt kept, in forEach's order, undecoded.
  template <typename F>
  void forEachPacked(F&& fn) const {
    for (const auto& [bucket, segment] : segments_) forEachIn(*segment, fn);
  }

  // Calls fn(const Reservation&) for every receipt kept, decoded (O(receipts); tests and
  // checks).
  template <typename F>
  void forEach(F&& fn) const {
    Reservation scratch;
    for (const auto& [bucket, segment] : segments_) {
      forEachIn(*segment, [&](std::string_view body) {
        const bool decoded = decode(body, &scratch);
        (void)decoded;
        fn(static_cast<const Reservation&>(scratch));
      });
    }
  }

 private:
  // One span's receipts, appended to chunks; a receipt never straddles two chunks.
  struct Segment {
    uint64_t bucket = 0;
    uint64_t tag = 0;
    std::vector<std::unique_ptr<uint8_t[]>> chunks;  // null once compaction passed them
    uint64_t end = 0;                                // offset of the next receipt
    uint64_t cursor = 0;  // compaction's front: every receipt before it is forgotten
    uint64_t live = 0;
  };
  static constexpr uint64_t kChunkShift = 16;  // 64 KiB chunks
  static constexpr uint64_t kChunkBytes = uint64_t{1} << kChunkShift;
  static constexpr uint64_t kHeaderBytes = 20;  // hash 8, keep-until 8, body length 2, alive, state
  static constexpr uint64_t kIndexSlotsMin = 16;
  static constexpr uint64_t kTagsMax = 1 << 16;

  // A receipt's place: its segment's tag (never 0) and its offset / 8.
  static uint64_t entryOf(uint64_t hash, uint64_t tag, uint64_t offset) {
    return ((hash >> 48) << 48) | (tag << 32) | (offset >> 3);
  }
  static uint64_t tagOf(uint64_t entry) { return (entry >> 32) & 0xffff; }
  static uint64_t offsetOf(uint64_t entry) { return (entry & 0xffff'ffffu) << 3; }
  static bool hashMatches(uint64_t entry, uint64_t hash) { return (entry >> 48) == (hash >> 48); }

  uint8_t* headerAt(uint64_t entry) const;
  static uint64_t hashIn(const uint8_t* header);
  static std::string_view bodyIn(const uint8_t* header);
  // Index position of the entry for `id`, or index_.size().
  uint64_t positionOf(std::string_view id, uint64_t hash) const;
  void eraseAt(uint64_t position);  // removes the index entry and the receipt it names
  void growIndex();
  Segment* segmentFor(uint64_t bucket);
  void dropSegment(std::map<uint64_t, std::unique_ptr<Segment>>::iterator it);
  static std::string_view idIn(std::string_view body);
  // Calls fn(body) for every live receipt of `segment` from its compaction front.
  template <typename F>
  static void forEachIn(const Segment& segment, F&& fn) {
    uint64_t offset = segment.cursor;
    while (offset < segment.end) {
      const uint64_t in_chunk = offset & (kChunkBytes - 1);
      const uint8_t* chunk = segment.chunks[offset >> kChunkShift].get();
      if (kChunkBytes - in_chunk < kHeaderBytes || chunk[in_chunk + 18] == 0) {
        offset = ((offset >> kChunkShift) + 1) << kChunkShift;  // the rest is a gap
        continue;
      }
      const std::string_view body = bodyIn(chunk + in_chunk);
      if (chunk[in_chunk + 18] == 1) fn(body);  // live
      offset += (kHeaderBytes + body.size() + 7) & ~uint64_t{7};
    }
  }

  const uint64_t bucket_ms_;
  std::map<uint64_t, std::unique_ptr<Segment>> segments_;  // by bucket (keep_until / bucket_ms)
  std::vector<Segment*> by_tag_;                           // [tag], null: free
  std::vector<uint16_t> free_tags_;
  std::vector<uint64_t> index_;  // 0: empty; else entryOf(...); size a power of two
  size_t size_ = 0;
  uint64_t version_ = 0;
  uint64_t chunk_count_ = 0;
  std::array<uint64_t, kReservationStateCount> counts_by_state_{};
  std::string scratch_;  // add()'s encoding, reused
};

}  // namespace tally
