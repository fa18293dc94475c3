#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

// The ledger's commit log: a directory of segment files holding one checksummed record per
// committed batch, appended with one pwrite and made durable with one fdatasync. It replaces a
// SQLite table as the log because a commit then writes only its own bytes once: no B-tree pages,
// no WAL frames, no checkpoint copying them again, no freeing of overflow pages when folded rows
// go (docs/PERFORMANCE.md, "Where the commit goes").
//
// Layout. DIR holds segments named by the seq of their first record, 20 decimal digits:
// 00000000000000000001.log, ... A segment is a run of records:
//
//   offset 0  u32 magic "TLG1"   u32 crc32 (zlib) of bytes 8..24 and of the body
//   offset 8  i64 seq            u32 body_bytes       u32 zero
//   offset 24 body (body_bytes)
//
// all little-endian, each record right after the one before. A segment named N holds seqs N,
// N+1, ... in order; a reader stops at the first record that is not exactly the next seq with a
// matching checksum. What follows it is the tail of an interrupted write, zeros, or records of
// the segment's earlier life (see recycling), whose seqs are all lower than N. So a sound record
// with a higher seq anywhere after the first bad one in the last segment means the bad one was
// damaged after it was written (not torn by a crash): open() reports it as kCorruption rather
// than end the log there and drop what follows.
//
// Segments. append() starts a segment when the current one would pass segment_bytes (a record
// larger than that gets a segment to itself). Records that the caller has release()d (folded
// into tables.db) are never read again: a segment all of whose records are released is
// recycled by the next segment start (renamed to its new name, then the directory fsynced,
// before any record goes into it), so that commits keep overwriting blocks that are already
// allocated and written, and fdatasync has no file metadata to write. One more released
// segment is kept for the start after (releases come in bursts: often two segments at once,
// then none); further ones are deleted. On disk: the unreleased records' segments, plus the
// current one, plus at most one released segment waiting to be recycled.
//
// Crash safety. A record is durable when append() returns; append() returns only after its
// fdatasync. A crash during an append leaves at most that record torn at the end of the last
// segment, which open() treats as the end of the log (its commit was never acknowledged).
// Renames and deletions are of released segments only, so losing one in a crash loses nothing
// the caller needs.
//
// Threads. One thread appends and releases (the commit path). read() may be called from any
// thread, for a record that is appended and not released; the index it uses is under mu_.
//
// Errors. kIoError when the file system fails (after which durability is unknown: the log
// refuses every later append with kFailedPrecondition); kResourceExhausted when the disk is full
// or the body is larger than record_bytes_max (nothing was appended; a later append may
// succeed); kCorruption when open() finds a record the caller needs missing or damaged;
// kInvalidArgument from open() for options out of range or a negative released seq.

namespace tally::ledger {

struct CommitLogOptions {
  // A segment is started once the current one would pass this many bytes.
  uint64_t segment_bytes = uint64_t{32} << 20;
  // Largest record body append() accepts and open() reads before calling the record damaged.
  uint64_t record_bytes_max = uint64_t{256} << 20;
};

struct CommitLogStats {
  uint64_t records_appended = 0;
  uint64_t bytes_appended = 0;  // headers included
  uint64_t segments_created = 0;
  uint64_t segments_recycled = 0;
  uint64_t segments_deleted = 0;
};

class CommitLog {
 public:
  static constexpr uint32_t kRecordMagic = 0x31474c54;  // "TLG1" little-endian
  static constexpr uint64_t kRecordHeaderBytes = 24;
  static constexpr const char* kSegmentSuffix = ".log";

  // Opens the log in `dir` (creating the directory, mode 0750, when missing) and reads every
  // segment. `released_seq`: the caller already holds every record up to it elsewhere (the
  // folded tables), so records <= it need not be readable. The log must hold every record
  // after it up to its end, contiguously: kCorruption names the first one missing or damaged.
  // A log with no segments is empty; it is kCorruption only when `require_segments` (the
  // caller knows it appended before).
  static Result<std::unique_ptr<CommitLog>> open(const std::string& dir, int64_t released_seq,
                                                 bool require_segments,
                                                 CommitLogOptions options = {});

  ~CommitLog();
  CommitLog(const CommitLog&) = delete;
  CommitLog& operator=(const CommitLog&) = delete;

  // The last record's seq (records are contiguous); for a log with no records, the seq before
  // the first it will take (released_seq, which an empty current segment's name must be one
  // above).
  int64_t lastSeq() const { return last_seq_; }
  bool hasSegments() const { return !segments_.empty(); }

  // Appends the record `seq` (== lastSeq() + 1) and makes it durable before returning.
  [[nodiscard]] Status append(int64_t seq, std::span<const uint8_t> body);
  // As append() but without the fdatasync: durable only after a later sync() returns OK (bulk
  // copies: migration, backup).
  [[nodiscard]] Status appendUnsynced(int64_t seq, std::span<const uint8_t> body);
  [[nodiscard]] Status sync();
  // Starts the first segment of an empty log (named lastSeq() + 1), so that the log records its
  // position on disk before any record is appended. No effect when a segment exists.
  [[nodiscard]] Status ensureSegment();

  // Records <= seq will not be read again: their segments may be recycled or deleted.
  void release(int64_t seq);

  // Copies the body of record `seq` into *body. The record must be appended and not released
  // (kFailedPrecondition otherwise). Safe on any thread, concurrently with append().
  [[nodiscard]] Status read(int64_t seq, std::vector<uint8_t>* body) const;
  // The same, into the buffer `allocate(bytes)` returns (at least `bytes` long), so a caller
  // reads a body straight into memory of its own kind.
  [[nodiscard]] Status read(int64_t seq,
                            const std::function<std::span<uint8_t>(size_t bytes)>& allocate) const;

  // Records appended and not released.
  uint64_t unreleasedRecords() const;
  size_t segmentCount() const { return segments_.size(); }
  // Bytes the segment files take on disk: their allocated blocks (a new segment is allocated
  // whole, segment_bytes; a recycled one keeps what it had).
  uint64_t diskBytes() const;
  const std::string& dir() const { return dir_; }
  CommitLogStats stats() const { return stats_; }

  static std::string segmentName(int64_t first_seq);

  // Copies the records of the log in the existing directory `from_dir` into a new log in
  // `to_dir` (removed first, whatever it holds; it must not be `from_dir`), without taking
  // anything from a ledger that may be appending and recycling meanwhile:
  // segments are read in order, and where a segment's records stop short of the next segment
  // (it was recycled while being read: all its records were released) the copy starts over
  // from the next one. The copy is a contiguous run of records ending at the last one complete
  // when its segment was read; durable when this returns (the caller syncs `to_dir`'s parent).
  // A record damaged on disk cannot be told from a recycled segment here: the copy then starts
  // after it (or, in the last segment, ends before it); opening the copy refuses it when the
  // records lost are not in the tables. Returns the seq of that last record (or of the
  // position of an empty log); kNotFound when `from_dir` holds no segment.
  static Result<int64_t> copyLog(const std::string& from_dir, const std::string& to_dir,
                                 CommitLogOptions options = {});

 private:
  struct Segment;
  struct Entry {
    std::shared_ptr<const Segment> segment;
    uint64_t offset = 0;  // of the body
    uint32_t bytes = 0;
  };
  struct Key {
    explicit Key() = default;
  };

 public:
  CommitLog(Key, std::string dir, int dir_fd, CommitLogOptions options);

 private:
  Status scan(int64_t released_seq, bool require_segments);
  Status write(int64_t seq, std::span<const uint8_t> body);
  Status startSegment(int64_t first_seq);
  Status fail(Status status);

  const std::string dir_;
  const int dir_fd_;
  const CommitLogOptions options_;

  // Appending thread only.
  std::vector<std::shared_ptr<Segment>> segments_;  // by first seq; the last is current
  uint64_t write_offset_ = 0;                       // in the current segment
  int64_t last_seq_ = 0;
  int64_t released_seq_ = 0;
  bool unsynced_ = false;  // records written since the last fdatasync
  Status failed_;          // sticky: OK until a write or sync failed
  CommitLogStats stats_;

  // The index of unreleased records, shared with read().
  mutable std::mutex mu_;
  std::deque<Entry> index_;  // index_[i] is record index_first_seq_ + i
  int64_t index_first_seq_ = 1;
};

}  // namespace tally::ledger
