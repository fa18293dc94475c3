#include "ledger/commit_log.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <sys/stat.h>

#include <gtest/gtest.h>

#include "tests/support/temp_dir.h"

namespace tally::ledger {
namespace {

namespace fs = std::filesystem;

// The body of record `seq`: 0..96 bytes derived from seq alone (empty for multiples of 97).
std::vector<uint8_t> bodyFor(int64_t seq) {
  std::vector<uint8_t> body(static_cast<size_t>((seq * 37) % 97));
  for (size_t i = 0; i < body.size(); ++i) body[i] = static_cast<uint8_t>(seq * 131 + i * 7 + 1);
  return body;
}

std::unique_ptr<CommitLog> openLog(const std::string& dir, int64_t released_seq,
                                   bool require_segments, CommitLogOptions options) {
  Result<std::unique_ptr<CommitLog>> opened =
      CommitLog::open(dir, released_seq, require_segments, options);
  if (!opened.isOk()) {
    ADD_FAILURE() << "open(" << released_seq << "): " << opened.status().toString();
    return nullptr;
  }
  return std::move(opened).value();
}

::testing::AssertionResult appendRange(CommitLog& log, int64_t first, int64_t last) {
  for (int64_t seq = first; seq <= last; ++seq) {
    const Status status = log.append(seq, bodyFor(seq));
    if (!status.isOk()) return ::testing::AssertionFailure() << seq << ": " << status.toString();
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult readsBack(const CommitLog& log, int64_t first, int64_t last) {
  std::vector<uint8_t> body;
  for (int64_t seq = first; seq <= last; ++seq) {
    const Status status = log.read(seq, &body);
    if (!status.isOk()) return ::testing::AssertionFailure() << seq << ": " << status.toString();
    if (body != bodyFor(seq)) return ::testing::AssertionFailure() << seq << ": other bytes";
  }
  return ::testing::AssertionSuccess();
}

// True when `message`, the directory's path taken out, holds `seq` as a whole decimal number
// (not as a digit run inside a zero-padded segment name).
bool namesSeq(std::string message, const std::string& dir, int64_t seq) {
  for (size_t at = message.find(dir); at != std::string::npos; at = message.find(dir)) {
    message.erase(at, dir.size());
  }
  const std::string number = std::to_string(seq);
  const auto is_digit = [](char c) { return c >= '0' && c <= '9'; };
  for (size_t at = message.find(number); at != std::string::npos;
       at = message.find(number, at + 1)) {
    const size_t end = at + number.size();
    if ((at == 0 || !is_digit(message[at - 1])) &&
        (end == message.size() || !is_digit(message[end])))
      return true;
  }
  return false;
}

// --- The on-disk layout, decoded independently of the implementation -----------------------

std::vector<std::string> segmentFiles(const std::string& dir) {
  std::vector<std::string> files;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() == CommitLog::kSegmentSuffix) files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

uint32_t crc32(std::span<const uint8_t> bytes, uint32_t crc = 0) {  // zlib's crc32()
  crc = ~crc;
  for (const uint8_t byte : bytes) {
    crc ^= byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

uint64_t le(const std::vector<uint8_t>& bytes, uint64_t at, int width) {
  uint64_t value = 0;
  for (int i = width - 1; i >= 0; --i) value = (value << 8) | bytes[at + static_cast<uint64_t>(i)];
  return value;
}

std::vector<uint8_t> encodeRecord(int64_t seq, const std::vector<uint8_t>& body) {
  std::vector<uint8_t> record(CommitLog::kRecordHeaderBytes);
  const auto put = [&record](uint64_t at, uint64_t value, int width) {
    for (int i = 0; i < width; ++i)
      record[at + static_cast<uint64_t>(i)] = (value >> (8 * i)) & 0xff;
  };
  put(0, CommitLog::kRecordMagic, 4);
  put(8, static_cast<uint64_t>(seq), 8);
  put(16, body.size(), 4);
  put(4, crc32(body, crc32(std::span(record).subspan(8, 16))), 4);
  record.insert(record.end(), body.begin(), body.end());
  return record;
}

struct DiskRecord {
  int64_t seq = 0;
  uint64_t offset = 0;  // of the header
  uint32_t zero = 0;
  std::vector<uint8_t> body;
};

// The records of one segment, read by the header's rule: from offset 0, each the next seq from
// the segment's name with a matching checksum; the first that is not ends the segment.
std::vector<DiskRecord> scanSegment(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::vector<uint8_t> bytes{std::istreambuf_iterator<char>(in), {}};
  std::vector<DiskRecord> records;
  int64_t next = std::stoll(fs::path(path).stem().string());
  uint64_t at = 0;
  while (at + CommitLog::kRecordHeaderBytes <= bytes.size()) {
    const uint64_t body_bytes = le(bytes, at + 16, 4);
    const uint64_t end = at + CommitLog::kRecordHeaderBytes + body_bytes;
    if (le(bytes, at, 4) != CommitLog::kRecordMagic || le(bytes, at + 8, 8) != uint64_t(next) ||
        end > bytes.size())
      break;
    const std::span<const uint8_t> all(bytes);
    if (crc32(all.subspan(at + 24, body_bytes), crc32(all.subspan(at + 8, 16))) !=
        le(bytes, at + 4, 4))
      break;
    records.push_back({.seq = next,
                       .offset = at,
                       .zero = static_cast<uint32_t>(le(bytes, at + 20, 4)),
                       .body = {bytes.begin() + at + 24, bytes.begin() + end}});
    ++next;
    at = end;
  }
  return records;
}

void overwrite(const std::string& path, uint64_t offset, const std::vector<uint8_t>& bytes) {
  std::fstream file(path, std::ios::binary | std::ios::in | std::ios::out);
  file.seekp(static_cast<std::streamoff>(offset));
  file.write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(file.good()) << path;
}

// The seqs of every record in `dir`'s segments, decoded from the files alone.
std::vector<int64_t> seqsOnDisk(const std::string& dir) {
  std::vector<int64_t> seqs;
  for (const std::string& file : segmentFiles(dir)) {
    for (const DiskRecord& record : scanSegment(file)) seqs.push_back(record.seq);
  }
  return seqs;
}

std::vector<int64_t> seqRange(int64_t first, int64_t last) {
  std::vector<int64_t> seqs;
  for (int64_t seq = first; seq <= last; ++seq) seqs.push_back(seq);
  return seqs;
}

class CommitLogTest : public ::testing::Test {
 protected:
  std::unique_ptr<CommitLog> open(int64_t released_seq, bool require_segments = true) {
    return openLog(dir_, released_seq, require_segments, options_);
  }
  // The copy in `to` holds exactly first..last on disk and opens, from first, as a log that
  // reads them back; returns it (nullptr when it does not open).
  std::unique_ptr<CommitLog> expectCopy(const std::string& to, int64_t first, int64_t last) {
    EXPECT_EQ(seqsOnDisk(to), seqRange(first, last));
    std::unique_ptr<CommitLog> copy = openLog(to, first - 1, true, options_);
    if (copy == nullptr) return nullptr;
    EXPECT_EQ(copy->lastSeq(), last);
    EXPECT_TRUE(readsBack(*copy, first, last));
    return copy;
  }
  // Writes records 1..last into a new log in `dir`, and closes it.
  void writeRecords(const std::string& dir, int64_t last) {
    std::unique_ptr<CommitLog> log = openLog(dir, 0, false, options_);
    ASSERT_NE(log, nullptr);
    ASSERT_TRUE(appendRange(*log, 1, last));
  }
  // writeRecords(); *file is the log's last segment and *record the last record in it, as read
  // from disk.
  void writeLog(const std::string& dir, int64_t last, std::string* file, DiskRecord* record) {
    ASSERT_NO_FATAL_FAILURE(writeRecords(dir, last));
    *file = segmentFiles(dir).back();
    const std::vector<DiskRecord> records = scanSegment(*file);
    ASSERT_FALSE(records.empty());
    ASSERT_EQ(records.back().seq, last);
    *record = records.back();
  }
  // Appends 1..40 and flips the last byte of a record that is neither the first nor the last of
  // a segment in the middle of the log: *damaged is its seq, *segment_last its segment's last.
  void damageAMiddleRecord(int64_t* damaged, int64_t* segment_last) {
    std::unique_ptr<CommitLog> log = open(0, /*require_segments=*/false);
    ASSERT_NE(log, nullptr);
    ASSERT_TRUE(appendRange(*log, 1, 40));
    log.reset();
    const std::vector<std::string> files = segmentFiles(dir_);
    ASSERT_GE(files.size(), 4u);
    for (size_t i = 1; i + 1 < files.size(); ++i) {
      const std::vector<DiskRecord> records = scanSegment(files[i]);
      if (records.size() < 3) continue;
      const DiskRecord& record = records[1];
      const uint64_t end = record.offset + CommitLog::kRecordHeaderBytes + record.body.size();
      const uint8_t last_byte = record.body.empty() ? 0 : record.body.back();  // or zero field's
      ASSERT_NO_FATAL_FAILURE(overwrite(files[i], end - 1, {static_cast<uint8_t>(~last_byte)}));
      *damaged = record.seq;
      *segment_last = records.back().seq;
      return;
    }
    FAIL() << "no middle segment holds three records";
  }

  testing::TempDir tmp_;
  const std::string dir_ = tmp_.path() + "/log";
  CommitLogOptions options_{.segment_bytes = 256};
};

// --- Tests ---------------------------------------------------------------------------------

TEST_F(CommitLogTest, RecordsOfEverySizeReadBackByteForByteAfterReopen) {
  const std::vector<size_t> sizes = {0, 1, 24, 100, 0, 600, 7, 255, 0, 40, 41, 42, 230, 3};
  std::vector<std::vector<uint8_t>> bodies;
  uint64_t bytes = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    bodies.emplace_back(sizes[i]);
    for (size_t j = 0; j < sizes[i]; ++j) bodies[i][j] = static_cast<uint8_t>(i * 29 + j * 3 + 5);
    bytes += CommitLog::kRecordHeaderBytes + sizes[i];
  }
  const auto last = static_cast<int64_t>(bodies.size());
  std::vector<uint8_t> body;
  {
    std::unique_ptr<CommitLog> log = open(0, /*require_segments=*/false);
    ASSERT_NE(log, nullptr);
    EXPECT_EQ(log->lastSeq(), 0);
    EXPECT_FALSE(log->hasSegments());
    for (int64_t seq = 1; seq <= last; ++seq) ASSERT_TRUE(log->append(seq, bodies[seq - 1]).isOk());
    EXPECT_EQ(log->lastSeq(), last);
    EXPECT_EQ(log->stats().records_appended, bodies.size());
    EXPECT_EQ(log->stats().bytes_appended, bytes);
  }
  std::unique_ptr<CommitLog> log = open(0);
  ASSERT_NE(log, nullptr);
  EXPECT_EQ(log->lastSeq(), last);
  for (int64_t seq = 1; seq <= last; ++seq) {
    ASSERT_TRUE(log->read(seq, &body).isOk()) << seq;
    EXPECT_EQ(body, bodies[seq - 1]) << seq;
  }
  EXPECT_GT(log->segmentCount(), 2u);
  EXPECT_EQ(segmentFiles(dir_).size(), log->segmentCount());
  // The 600-byte body (seq 6) has a segment to itself, and record 7 starts the next one.
  const std::vector<DiskRecord> alone = scanSegment(dir_ + "/" + CommitLog::segmentName(6));
  ASSERT_EQ(alone.size(), 1u);
  EXPECT_EQ(alone[0].body, bodies[5]);
  EXPECT_TRUE(fs::exists(dir_ + "/" + CommitLog::segmentName(7)));
}

TEST_F(CommitLogTest, RecordsOnDiskFollowTheDocumentedLayout) {
  // A log positioned at 89 (its first segment is 90), with record 97's body empty.
  std::unique_ptr<CommitLog> log = open(89, /*require_segments=*/false);
  ASSERT_NE(log, nullptr);
  ASSERT_TRUE(appendRange(*log, 90, 110));
  const std::vector<std::string> files = segmentFiles(dir_);
  ASSERT_FALSE(files.empty());
  EXPECT_EQ(fs::path(files[0]).filename(), CommitLog::segmentName(90));
  std::vector<int64_t> seqs;  // decoded from the files alone, by the header's layout
  for (const std::string& file : files) {
    for (const DiskRecord& record : scanSegment(file)) {
      seqs.push_back(record.seq);
      EXPECT_EQ(record.zero, 0u) << record.seq;
      EXPECT_EQ(record.body, bodyFor(record.seq)) << record.seq;
    }
  }
  std::vector<int64_t> appended(21);
  std::iota(appended.begin(), appended.end(), 90);
  EXPECT_EQ(seqs, appended);
}

TEST_F(CommitLogTest, ATornLastRecordEndsTheLogAndItsSeqIsAppendedAgain) {
  constexpr int64_t kLast = 20;
  ASSERT_NO_FATAL_FAILURE(writeRecords(dir_, kLast));
  const std::string file = segmentFiles(dir_).back();
  const std::vector<DiskRecord> records = scanSegment(file);
  ASSERT_FALSE(records.empty());
  const DiskRecord& torn = records.back();
  ASSERT_EQ(torn.seq, kLast);
  fs::resize_file(file, torn.offset + (CommitLog::kRecordHeaderBytes + torn.body.size()) / 2);
  const std::vector<uint8_t> again = {9, 8, 7, 6, 5};
  std::vector<uint8_t> body;
  {
    std::unique_ptr<CommitLog> log = open(0);
    ASSERT_NE(log, nullptr);
    EXPECT_EQ(log->lastSeq(), kLast - 1);
    EXPECT_TRUE(readsBack(*log, 1, kLast - 1));
    EXPECT_EQ(log->read(kLast, &body).code(), StatusCode::kFailedPrecondition);
    ASSERT_TRUE(log->append(kLast, again).isOk());
    ASSERT_TRUE(appendRange(*log, kLast + 1, kLast + 1));
  }
  std::unique_ptr<CommitLog> log = open(0);
  ASSERT_NE(log, nullptr);
  EXPECT_EQ(log->lastSeq(), kLast + 1);
  EXPECT_TRUE(readsBack(*log, 1, kLast - 1));
  ASSERT_TRUE(log->read(kLast, &body).isOk());
  EXPECT_EQ(body, again);
  EXPECT_TRUE(readsBack(*log, kLast + 1, kLast + 1));
}

TEST_F(CommitLogTest, ATornRecordThatStartedItsOwnSegmentEndsTheLog) {
  {
    std::unique_ptr<CommitLog> log = open(0, /*require_segments=*/false);
    ASSERT_NE(log, nullptr);
    ASSERT_TRUE(appendRange(*log, 1, 5));
    ASSERT_TRUE(log->append(6, std::vector<uint8_t>(600, 0xab)).isOk());  // a segment to itself
  }
  const std::string segment = dir_ + "/" + CommitLog::segmentName(6);
  ASSERT_TRUE(fs::exists(segment));
  fs::resize_file(segment, CommitLog::kRecordHeaderBytes + 10);
  {
    std::unique_ptr<CommitLog> log = open(0);
    ASSERT_NE(log, nullptr);
    EXPECT_EQ(log->lastSeq(), 5);
    EXPECT_TRUE(readsBack(*log, 1, 5));
    ASSERT_TRUE(appendRange(*log, 6, 7));
  }
  std::unique_ptr<CommitLog> log = open(0);
  ASSERT_NE(log, nullptr);
  EXPECT_EQ(log->lastSeq(), 7);
  EXPECT_TRUE(readsBack(*log, 1, 7));
}

TEST_F(CommitLogTest, WhatFollowsTheLastRecordIsIgnored) {
  constexpr int64_t kLast = 12;
  std::mt19937 random(20240611);  // fixed seed: the same bytes every run
  std::vector<uint8_t> noise(300);
  for (uint8_t& byte : noise) byte = static_cast<uint8_t>(random());
  const std::vector<std::pair<std::string, std::vector<uint8_t>>> tails = {
      {"zeros", std::vector<uint8_t>(300, 0)},
      {"random bytes", noise},
      {"a sound record of a lower seq", encodeRecord(kLast - 3, bodyFor(kLast - 3))},
  };
  for (size_t i = 0; i < tails.size(); ++i) {
    const auto& [name, tail] = tails[i];
    SCOPED_TRACE(name);
    const std::string dir = tmp_.path() + "/log-" + std::to_string(i);
    std::string file;
    DiskRecord last;
    ASSERT_NO_FATAL_FAILURE(writeLog(dir, kLast, &file, &last));
    const uint64_t end = last.offset + CommitLog::kRecordHeaderBytes + last.body.size();
    ASSERT_NO_FATAL_FAILURE(overwrite(file, end, tail));
    {
      std::unique_ptr<CommitLog> log = openLog(dir, 0, true, options_);
      ASSERT_NE(log, nullptr);
      EXPECT_EQ(log->lastSeq(), kLast);
      EXPECT_TRUE(readsBack(*log, 1, kLast));
      ASSERT_TRUE(appendRange(*log, kLast + 1, kLast + 1));
    }
    std::unique_ptr<CommitLog> log = openLog(dir, 0, true, options_);
    ASSERT_NE(log, nullptr);
    EXPECT_EQ(log->lastSeq(), kLast + 1);
    EXPECT_TRUE(readsBack(*log, 1, kLast + 1));
  }
}

TEST_F(CommitLogTest, ADamagedRecordFollowedBySoundOnesInTheLastSegmentIsCorruption) {
  {
    std::unique_ptr<CommitLog> log = open(0, /*require_segments=*/false);
    ASSERT_NE(log, nullptr);
    ASSERT_TRUE(appendRange(*log, 1, 12));
  }
  // Only the last record can be torn: a bad one with sound ones after it was acknowledged, then
  // damaged, and the log must not silently end before it.
  const std::string file = segmentFiles(dir_).back();
  const std::vector<DiskRecord> records = scanSegment(file);
  ASSERT_GE(records.size(), 2u);
  const DiskRecord& damaged = records[records.size() - 2];
  ASSERT_FALSE(damaged.body.empty());
  ASSERT_NO_FATAL_FAILURE(overwrite(file, damaged.offset + CommitLog::kRecordHeaderBytes,
                                    {static_cast<uint8_t>(~damaged.body[0])}));
  Result<std::unique_ptr<CommitLog>> opened = CommitLog::open(dir_, 0, true, options_);
  ASSERT_FALSE(opened.isOk());
  EXPECT_EQ(opened.status().code(), StatusCode::kCorruption);
  EXPECT_TRUE(namesSeq(opened.status().message(), dir_, damaged.seq)) << opened.status().message();
}

TEST_F(CommitLogTest, ADamagedRecordThatIsNeededIsCorruptionNamingIt) {
  int64_t damaged = 0, segment_last = 0;
  ASSERT_NO_FATAL_FAILURE(damageAMiddleRecord(&damaged, &segment_last));
  for (const int64_t released : {int64_t{0}, damaged - 1, damaged}) {
    SCOPED_TRACE(released);
    const int64_t first_needed = std::max(damaged, released + 1);  // unreadable past the damage
    Result<std::unique_ptr<CommitLog>> opened = CommitLog::open(dir_, released, true, options_);
    ASSERT_FALSE(opened.isOk());
    EXPECT_EQ(opened.status().code(), StatusCode::kCorruption);
    EXPECT_TRUE(namesSeq(opened.status().message(), dir_, first_needed))
        << first_needed << " not in: " << opened.status().message();
  }
}

TEST_F(CommitLogTest, DamageInASegmentThatIsAllReleasedIsAccepted) {
  int64_t damaged = 0, segment_last = 0;
  ASSERT_NO_FATAL_FAILURE(damageAMiddleRecord(&damaged, &segment_last));
  std::unique_ptr<CommitLog> log = open(segment_last);
  ASSERT_NE(log, nullptr);
  EXPECT_EQ(log->lastSeq(), 40);
  EXPECT_TRUE(readsBack(*log, segment_last + 1, 40));
  std::vector<uint8_t> body;
  EXPECT_EQ(log->read(damaged, &body).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(appendRange(*log, 41, 41));
}

TEST_F(CommitLogTest, ReleasedSegmentsAreRecycledAndTheLogStaysBounded) {
  options_.segment_bytes = 1024;  // records are 24..120 bytes: 8 or more to a segment
  constexpr int64_t kRecords = 3000;
  constexpr int64_t kLag = 16;  // the fold releases up to 16 records behind the last
  {
    std::unique_ptr<CommitLog> log = open(0, /*require_segments=*/false);
    ASSERT_NE(log, nullptr);
    size_t segments_max = 0;
    uint64_t disk_bytes_max = 0;
    for (int64_t seq = 1; seq <= kRecords; ++seq) {
      ASSERT_TRUE(log->append(seq, bodyFor(seq)).isOk()) << seq;
      if (seq > kLag) log->release(seq - kLag);
      segments_max = std::max(segments_max, log->segmentCount());
      disk_bytes_max = std::max(disk_bytes_max, log->diskBytes());
    }
    // Unreleased records span at most 3 segments (the current one included), plus 1 waiting.
    EXPECT_LE(segments_max, 4u);
    // A segment takes whole file system blocks (4 KiB here), segment_bytes of them at least.
    EXPECT_LE(disk_bytes_max, 4 * std::max<uint64_t>(options_.segment_bytes, 4096));
    EXPECT_GT(log->stats().segments_recycled, 0u);
    EXPECT_EQ(log->unreleasedRecords(), uint64_t{kLag});
    const std::vector<std::string> files = segmentFiles(dir_);
    EXPECT_EQ(files.size(), log->segmentCount());
    uint64_t allocated_bytes = 0;
    for (const std::string& file : files) {
      struct stat st {};
      ASSERT_EQ(::stat(file.c_str(), &st), 0);
      allocated_bytes += static_cast<uint64_t>(st.st_blocks) * 512;
    }
    EXPECT_EQ(log->diskBytes(), allocated_bytes);
    EXPECT_TRUE(readsBack(*log, kRecords - kLag + 1, kRecords));
  }
  // Recycled segments keep records of their earlier life after their new ones: a reopen must
  // stop at each segment's own records, and the log goes on recycling after it.
  {
    std::unique_ptr<CommitLog> log = open(kRecords - kLag);
    ASSERT_NE(log, nullptr);
    EXPECT_EQ(log->lastSeq(), kRecords);
    EXPECT_TRUE(readsBack(*log, kRecords - kLag + 1, kRecords));
    std::vector<uint8_t> body;
    EXPECT_EQ(log->read(kRecords + 1, &body).code(), StatusCode::kFailedPrecondition);
    const uint64_t recycled = log->stats().segments_recycled;
    size_t segments_max = 0;
    for (int64_t seq = kRecords + 1; seq <= kRecords + 300; ++seq) {
      ASSERT_TRUE(log->append(seq, bodyFor(seq)).isOk()) << seq;
      log->release(seq - kLag);
      segments_max = std::max(segments_max, log->segmentCount());
    }
    EXPECT_LE(segments_max, 4u);
    EXPECT_GT(log->stats().segments_recycled, recycled);
  }
  std::unique_ptr<CommitLog> log = open(kRecords + 300 - kLag);
  ASSERT_NE(log, nullptr);
  EXPECT_EQ(log->lastSeq(), kRecords + 300);
  EXPECT_TRUE(readsBack(*log, kRecords + 300 - kLag + 1, kRecords + 300));
}

TEST_F(CommitLogTest, ReadingAReleasedOrUnappendedSeqIsFailedPrecondition) {
  std::vector<uint8_t> body;
  {
    std::unique_ptr<CommitLog> log = open(0, /*require_segments=*/false);
    ASSERT_NE(log, nullptr);
    EXPECT_EQ(log->read(1, &body).code(), StatusCode::kFailedPrecondition);
    ASSERT_TRUE(appendRange(*log, 1, 10));
    log->release(4);
    EXPECT_EQ(log->unreleasedRecords(), 6u);
    for (const int64_t seq : {0, 1, 4, 11, 1000}) {
      EXPECT_EQ(log->read(seq, &body).code(), StatusCode::kFailedPrecondition) << seq;
    }
    EXPECT_TRUE(readsBack(*log, 5, 10));
  }
  std::unique_ptr<CommitLog> log = open(4);
  ASSERT_NE(log, nullptr);
  EXPECT_EQ(log->read(4, &body).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(log->read(11, &body).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(readsBack(*log, 5, 10));
}

TEST_F(CommitLogTest, AMissingSegmentWhoseRecordsAreNeededIsCorruption) {
  {
    std::unique_ptr<CommitLog> log = open(0, /*require_segments=*/false);
    ASSERT_NE(log, nullptr);
    ASSERT_TRUE(appendRange(*log, 1, 40));
  }
  const std::vector<std::string> files = segmentFiles(dir_);
  ASSERT_GE(files.size(), 4u);
  const int64_t first_missing = std::stoll(fs::path(files[1]).stem().string());
  const int64_t last_missing = std::stoll(fs::path(files[2]).stem().string()) - 1;
  ASSERT_TRUE(fs::remove(files[1]));
  for (const int64_t released : {int64_t{0}, first_missing - 1, last_missing - 1}) {
    SCOPED_TRACE(released);
    const int64_t first_needed = std::max(first_missing, released + 1);
    Result<std::unique_ptr<CommitLog>> opened = CommitLog::open(dir_, released, true, options_);
    ASSERT_FALSE(opened.isOk());
    EXPECT_EQ(opened.status().code(), StatusCode::kCorruption);
    EXPECT_TRUE(namesSeq(opened.status().message(), dir_, first_needed))
        << first_needed << " not in: " << opened.status().message();
  }
  std::unique_ptr<CommitLog> log = open(last_missing);  // the gap is all released
  ASSERT_NE(log, nullptr);
  EXPECT_EQ(log->lastSeq(), 40);
  EXPECT_TRUE(readsBack(*log, last_missing + 1, 40));
}

TEST_F(CommitLogTest, NoSegmentsIsCorruptionOnlyWhenSegmentsAreRequired) {
  constexpr int64_t kReleased = 10;
  {
    std::unique_ptr<CommitLog> log = open(0, /*require_segments=*/false);
    ASSERT_NE(log, nullptr);
    ASSERT_TRUE(appendRange(*log, 1, kReleased));
  }
  for (const std::string& file : segmentFiles(dir_)) ASSERT_TRUE(fs::remove(file));
  Result<std::unique_ptr<CommitLog>> required = CommitLog::open(dir_, kReleased, true, options_);
  ASSERT_FALSE(required.isOk());
  EXPECT_EQ(required.status().code(), StatusCode::kCorruption);
  Result<std::unique_ptr<CommitLog>> never =
      CommitLog::open(tmp_.path() + "/never", 0, true, options_);
  ASSERT_FALSE(never.isOk());
  EXPECT_EQ(never.status().code(), StatusCode::kCorruption);
  {
    std::unique_ptr<CommitLog> log = open(kReleased, /*require_segments=*/false);
    ASSERT_NE(log, nullptr);
    EXPECT_EQ(log->lastSeq(), kReleased);
    EXPECT_FALSE(log->hasSegments());
    ASSERT_TRUE(appendRange(*log, kReleased + 1, kReleased + 1));
    EXPECT_TRUE(fs::exists(dir_ + "/" + CommitLog::segmentName(kReleased + 1)));
  }
  std::unique_ptr<CommitLog> log = open(kReleased);
  ASSERT_NE(log, nullptr);
  EXPECT_EQ(log->lastSeq(), kReleased + 1);
  EXPECT_TRUE(readsBack(*log, kReleased + 1, kReleased + 1));
}

TEST_F(CommitLogTest, EnsureSegmentRecordsThePositionOfAnEmptyLog) {
  EXPECT_EQ(CommitLog::segmentName(1), "00000000000000000001.log");
  EXPECT_EQ(CommitLog::segmentName(1234567), "00000000000001234567.log");
  constexpr int64_t kReleased = 41;
  const std::vector<std::string> only = {dir_ + "/" + CommitLog::segmentName(kReleased + 1)};
  {
    std::unique_ptr<CommitLog> log = open(kReleased, /*require_segments=*/false);
    ASSERT_NE(log, nullptr);
    EXPECT_FALSE(log->hasSegments());
    ASSERT_TRUE(log->ensureSegment().isOk());
    EXPECT_TRUE(log->hasSegments());
    ASSERT_TRUE(log->ensureSegment().isOk());  // no effect the second time
    EXPECT_EQ(log->segmentCount(), 1u);
    EXPECT_EQ(segmentFiles(dir_), only);
  }
  {
    std::unique_ptr<CommitLog> log = open(kReleased);
    ASSERT_NE(log, nullptr);
    EXPECT_EQ(log->lastSeq(), kReleased);
    EXPECT_TRUE(log->hasSegments());
    ASSERT_TRUE(appendRange(*log, kReleased + 1, kReleased + 2));
    EXPECT_EQ(segmentFiles(dir_), only);  // the records went into that segment
  }
  std::unique_ptr<CommitLog> log = open(kReleased);
  ASSERT_NE(log, nullptr);
  EXPECT_EQ(log->lastSeq(), kReleased + 2);
  EXPECT_TRUE(readsBack(*log, kReleased + 1, kReleased + 2));
}

TEST_F(CommitLogTest, UnsyncedAppendsReadBackAfterSyncAndReopen) {
  constexpr int64_t kLast = 50;
  {
    std::unique_ptr<CommitLog> log = open(0, /*require_segments=*/false);
    ASSERT_NE(log, nullptr);
    for (int64_t seq = 1; seq <= kLast; ++seq) {
      ASSERT_TRUE(log->appendUnsynced(seq, bodyFor(seq)).isOk()) << seq;
    }
    EXPECT_EQ(log->lastSeq(), kLast);
    EXPECT_TRUE(readsBack(*log, 1, kLast));
    EXPECT_GT(log->segmentCount(), 1u);
    ASSERT_TRUE(log->sync().isOk());
  }
  std::unique_ptr<CommitLog> log = open(0);
  ASSERT_NE(log, nullptr);
  EXPECT_EQ(log->lastSeq(), kLast);
  EXPECT_TRUE(readsBack(*log, 1, kLast));
  EXPECT_TRUE(appendRange(*log, kLast + 1, kLast + 1));
}

TEST_F(CommitLogTest, ABodyOverRecordBytesMaxIsRefusedAndTheLogStaysUsable) {
  options_ = {.segment_bytes = 1024, .record_bytes_max = 100};  // bodyFor() is at most 96
  const std::vector<uint8_t> too_big(101, 0x5a);
  const std::vector<uint8_t> largest(100, 0xa5);
  {
    std::unique_ptr<CommitLog> log = open(0, /*require_segments=*/false);
    ASSERT_NE(log, nullptr);
    ASSERT_TRUE(appendRange(*log, 1, 3));
    const Status refused = log->append(4, too_big);
    EXPECT_EQ(refused.code(), StatusCode::kResourceExhausted) << refused.toString();
    const Status refused_unsynced = log->appendUnsynced(4, too_big);
    EXPECT_EQ(refused_unsynced.code(), StatusCode::kResourceExhausted)
        << refused_unsynced.toString();
    EXPECT_EQ(log->lastSeq(), 3);
    EXPECT_EQ(log->stats().records_appended, 3u);
    ASSERT_TRUE(log->append(4, largest).isOk());
    ASSERT_TRUE(appendRange(*log, 5, 5));
  }
  std::unique_ptr<CommitLog> log = open(0);
  ASSERT_NE(log, nullptr);
  EXPECT_EQ(log->lastSeq(), 5);
  std::vector<uint8_t> body;
  ASSERT_TRUE(log->read(4, &body).isOk());
  EXPECT_EQ(body, largest);
  EXPECT_TRUE(readsBack(*log, 1, 3));
  EXPECT_TRUE(readsBack(*log, 5, 5));
}

TEST_F(CommitLogTest, ReadsOnAnotherThreadSeeEachRecordAsSoonAsItIsAppended) {
  options_.segment_bytes = 1024;  // many segment starts and recycles under the reader
  constexpr int64_t kRecords = 400;
  std::unique_ptr<CommitLog> log = open(0, /*require_segments=*/false);
  ASSERT_NE(log, nullptr);
  std::atomic<int64_t> appended{0};  // published by the appender after append() returns
  std::atomic<int64_t> verified{0};  // published by the reader; the appender releases up to it
  std::atomic<bool> appender_failed{false};
  std::string reader_error;  // written by the reader only, read after join()
  int64_t released = 0;
  std::thread reader([&log, &appended, &verified, &appender_failed, &reader_error] {
    std::vector<uint8_t> body;
    for (int64_t seq = 1; seq <= kRecords && !appender_failed.load();) {
      if (seq > appended.load(std::memory_order_acquire)) {
        std::this_thread::yield();
        continue;
      }
      const Status status = log->read(seq, &body);
      if (!status.isOk() || body != bodyFor(seq)) {
        reader_error = std::to_string(seq) + ": " + status.toString();
        return;
      }
      verified.store(seq, std::memory_order_release);
      ++seq;
    }
  });
  for (int64_t seq = 1; seq <= kRecords; ++seq) {
    const Status status = log->append(seq, bodyFor(seq));
    if (!status.isOk()) {
      ADD_FAILURE() << seq << ": " << status.toString();
      appender_failed.store(true);
      break;
    }
    appended.store(seq, std::memory_order_release);
    const int64_t done = verified.load(std::memory_order_acquire);
    if (done > released) {
      log->release(done);
      released = done;
    }
  }
  reader.join();
  EXPECT_EQ(reader_error, "");
  EXPECT_EQ(verified.load(), kRecords);
}

// --- copyLog ---------------------------------------------------------------------------------

std::vector<uint8_t> fileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

int64_t firstSeqOf(const std::string& segment_path) {
  return std::stoll(fs::path(segment_path).stem().string());
}

TEST_F(CommitLogTest, CopyLogCopiesEveryRecordFromTheSourcesFirstSegmentOn) {
  constexpr int64_t kLast = 80;
  std::unique_ptr<CommitLog> log = open(0, /*require_segments=*/false);
  ASSERT_NE(log, nullptr);
  ASSERT_TRUE(appendRange(*log, 1, 60));
  log->release(25);
  ASSERT_TRUE(appendRange(*log, 61, kLast));  // recycles and deletes the released segments
  ASSERT_GT(log->stats().segments_recycled, 0u);
  const std::vector<std::string> files = segmentFiles(dir_);
  ASSERT_GE(files.size(), 3u);
  const int64_t first = firstSeqOf(files.front());
  ASSERT_GT(first, 1);  // the source starts mid-way, as after recycling
  std::vector<std::vector<uint8_t>> source_bytes;
  for (const std::string& file : files) source_bytes.push_back(fileBytes(file));

  const std::string to = tmp_.path() + "/copy";
  Result<int64_t> copied = CommitLog::copyLog(dir_, to, options_);
  ASSERT_TRUE(copied.isOk()) << copied.status().toString();
  EXPECT_EQ(copied.value(), kLast);

  // The source is only read.
  EXPECT_EQ(segmentFiles(dir_), files);
  for (size_t i = 0; i < files.size(); ++i) EXPECT_TRUE(fileBytes(files[i]) == source_bytes[i]);
  // The copy's files hold first..kLast, from a segment named first.
  const std::vector<std::string> copy_files = segmentFiles(to);
  ASSERT_FALSE(copy_files.empty());
  EXPECT_EQ(fs::path(copy_files.front()).filename(), CommitLog::segmentName(first));
  std::unique_ptr<CommitLog> copy = expectCopy(to, first, kLast);
  ASSERT_NE(copy, nullptr);
  // The copy is a log that goes on.
  EXPECT_TRUE(appendRange(*copy, kLast + 1, kLast + 1));
  EXPECT_TRUE(readsBack(*log, 26, kLast));  // and the source still reads as before
}

TEST_F(CommitLogTest, CopyLogStartsOverFromTheSegmentAfterOneRecycledUnderIt) {
  options_.segment_bytes = 1024;  // records are 24..120 bytes: 8 or more to a segment
  constexpr int64_t kLast = 60;
  struct Recycled {
    std::string name;
    size_t segment;  // index of the recycled segment in the source
    size_t kept;     // its records read before the recycle overwrote the rest
    bool body_only;  // only the body of the next one was overwritten when it was read
  };
  const std::vector<Recycled> cases = {
      {"the first segment, overwritten from its start", 0, 0, false},
      {"the first segment, overwritten after two of its records", 0, 2, false},
      {"the first segment, its third record's body overwritten", 0, 2, true},
      {"a middle segment, overwritten from its start", 1, 0, false},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const Recycled& recycled = cases[i];
    SCOPED_TRACE(recycled.name);
    const std::string from = tmp_.path() + "/from-" + std::to_string(i);
    const std::string to = tmp_.path() + "/to-" + std::to_string(i);
    ASSERT_NO_FATAL_FAILURE(writeRecords(from, kLast));
    const std::vector<std::string> files = segmentFiles(from);
    ASSERT_GE(files.size(), recycled.segment + 3);  // the recycled one, the next, the current
    const std::vector<DiskRecord> records = scanSegment(files[recycled.segment]);
    ASSERT_GT(records.size(), recycled.kept + 1);
    const DiskRecord& stops = records[recycled.kept];
    if (recycled.body_only) {
      // The copy read this record's header before the recycle overwrote it and its body after.
      ASSERT_FALSE(stops.body.empty());
      std::vector<uint8_t> other(stops.body.size());
      for (size_t b = 0; b < other.size(); ++b) other[b] = static_cast<uint8_t>(~stops.body[b]);
      ASSERT_NO_FATAL_FAILURE(
          overwrite(files[recycled.segment], stops.offset + CommitLog::kRecordHeaderBytes, other));
    } else {
      // What the ledger writes into a recycled segment: records above the log's last, from its
      // start (the copy read `kept` records before that happened).
      std::vector<uint8_t> newer = encodeRecord(kLast + 1, bodyFor(kLast + 1));
      const std::vector<uint8_t> second = encodeRecord(kLast + 2, bodyFor(kLast + 2));
      newer.insert(newer.end(), second.begin(), second.end());
      ASSERT_NO_FATAL_FAILURE(overwrite(files[recycled.segment], stops.offset, newer));
    }
    ASSERT_EQ(scanSegment(files[recycled.segment]).size(), recycled.kept);
    const int64_t first = firstSeqOf(files.front());
    const int64_t restart = firstSeqOf(files[recycled.segment + 1]);

    Result<int64_t> copied = CommitLog::copyLog(from, to, options_);
    ASSERT_TRUE(copied.isOk()) << copied.status().toString();
    EXPECT_EQ(copied.value(), kLast);
    const std::vector<std::string> copy_files = segmentFiles(to);
    ASSERT_FALSE(copy_files.empty());
    EXPECT_EQ(fs::path(copy_files.front()).filename(), CommitLog::segmentName(restart));
    EXPECT_NE(expectCopy(to, restart, kLast), nullptr);
    // Nothing before the restart is in the copy: not the recycled segment's records, and not
    // those of the segments before it either (the copy is contiguous).
    for (const int64_t released :
         {first - 1, firstSeqOf(files[recycled.segment]) - 1, restart - 2}) {
      SCOPED_TRACE(released);
      Result<std::unique_ptr<CommitLog>> opened = CommitLog::open(to, released, true, options_);
      ASSERT_FALSE(opened.isOk());
      EXPECT_EQ(opened.status().code(), StatusCode::kCorruption);
    }
  }
}

TEST_F(CommitLogTest, CopyLogGoesOnPastASegmentGoneBeforeItWasOpened) {
  // A segment listed, then recycled (renamed) or deleted before the copy opens it: a dangling
  // symbolic link under its name is listed like it and fails to open with ENOENT, as it would.
  options_.segment_bytes = 1024;
  constexpr int64_t kLast = 60;
  enum class Gone { kFirst, kMiddle, kLast };
  const std::vector<std::pair<std::string, Gone>> cases = {
      {"the first segment", Gone::kFirst},
      {"a middle segment", Gone::kMiddle},
      {"the last segment", Gone::kLast},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& [name, gone] = cases[i];
    SCOPED_TRACE(name);
    const std::string from = tmp_.path() + "/from-" + std::to_string(i);
    const std::string to = tmp_.path() + "/to-" + std::to_string(i);
    ASSERT_NO_FATAL_FAILURE(writeRecords(from, kLast));
    const std::vector<std::string> files = segmentFiles(from);
    ASSERT_GE(files.size(), 3u);
    const size_t index = gone == Gone::kFirst ? 0 : gone == Gone::kMiddle ? 1 : files.size() - 1;
    ASSERT_TRUE(fs::remove(files[index]));
    fs::create_symlink(tmp_.path() + "/nowhere", files[index]);
    ASSERT_EQ(segmentFiles(from), files);  // still listed
    // The copy starts over after the gone segment, or ends before it when it was the last.
    const int64_t first = gone == Gone::kLast ? 1 : firstSeqOf(files[index + 1]);
    const int64_t last = gone == Gone::kLast ? firstSeqOf(files[index]) - 1 : kLast;
    Result<int64_t> copied = CommitLog::copyLog(from, to, options_);
    ASSERT_TRUE(copied.isOk()) << copied.status().toString();
    EXPECT_EQ(copied.value(), last);
    EXPECT_NE(expectCopy(to, first, last), nullptr);
  }
}

TEST_F(CommitLogTest, CopyLogEndsWhereTheLastSegmentWasRecycledUnderIt) {
  // The last segment listed was the current one then; by the time the copy reads it, the ledger
  // went on, released it and recycled it: after the records the copy read, newer ones (seqs
  // above all listed) follow. The copy ends at the last record of its own seq; it is not the
  // damage open() refuses, and none of the newer records may go in under the wrong seq.
  options_.segment_bytes = 1024;
  constexpr int64_t kLast = 40;
  ASSERT_NO_FATAL_FAILURE(writeRecords(dir_, kLast));
  const std::vector<std::string> files = segmentFiles(dir_);
  ASSERT_GE(files.size(), 2u);
  const std::vector<DiskRecord> records = scanSegment(files.back());
  ASSERT_GE(records.size(), 3u);
  const int64_t newer_first = kLast + 20;  // the recycled segment's new name
  std::vector<uint8_t> newer;
  for (int64_t seq = newer_first; seq < newer_first + 3; ++seq) {
    const std::vector<uint8_t> record = encodeRecord(seq, bodyFor(seq));
    newer.insert(newer.end(), record.begin(), record.end());
  }
  ASSERT_NO_FATAL_FAILURE(overwrite(files.back(), records[2].offset, newer));
  const int64_t end = records[1].seq;
  const std::string to = tmp_.path() + "/copy";
  Result<int64_t> copied = CommitLog::copyLog(dir_, to, options_);
  ASSERT_TRUE(copied.isOk()) << copied.status().toString();
  EXPECT_EQ(copied.value(), end);
  EXPECT_EQ(seqsOnDisk(to), seqRange(1, end));
  std::unique_ptr<CommitLog> copy = openLog(to, 0, true, options_);
  ASSERT_NE(copy, nullptr);
  EXPECT_EQ(copy->lastSeq(), end);
  EXPECT_TRUE(readsBack(*copy, 1, end));
}

TEST_F(CommitLogTest, CopyLogOfAnOnlySegmentNotYetWrittenIsAnEmptyLogAtItsPosition) {
  constexpr int64_t kPosition = 41;   // the segment is named 42
  std::vector<uint8_t> earlier_life;  // a recycled segment renamed, before its first record
  for (int64_t seq = 30; seq <= 33; ++seq) {
    const std::vector<uint8_t> record = encodeRecord(seq, bodyFor(seq));
    earlier_life.insert(earlier_life.end(), record.begin(), record.end());
  }
  const std::vector<std::pair<std::string, std::vector<uint8_t>>> contents = {
      {"empty", {}},
      {"zeros", std::vector<uint8_t>(options_.segment_bytes, 0)},
      {"records of its earlier life", earlier_life},
  };
  for (size_t i = 0; i < contents.size(); ++i) {
    const auto& [name, content] = contents[i];
    SCOPED_TRACE(name);
    const std::string from = tmp_.path() + "/from-" + std::to_string(i);
    const std::string to = tmp_.path() + "/to-" + std::to_string(i);
    ASSERT_TRUE(fs::create_directory(from));
    {
      std::ofstream out(from + "/" + CommitLog::segmentName(kPosition + 1), std::ios::binary);
      out.write(reinterpret_cast<const char*>(content.data()),
                static_cast<std::streamsize>(content.size()));
      ASSERT_TRUE(out.good());
    }
    Result<int64_t> copied = CommitLog::copyLog(from, to, options_);
    ASSERT_TRUE(copied.isOk()) << copied.status().toString();
    EXPECT_EQ(copied.value(), kPosition);
    const std::vector<std::string> only = {to + "/" + CommitLog::segmentName(kPosition + 1)};
    EXPECT_EQ(segmentFiles(to), only);
    {
      std::unique_ptr<CommitLog> copy = openLog(to, kPosition, true, options_);
      ASSERT_NE(copy, nullptr);
      EXPECT_TRUE(copy->hasSegments());
      EXPECT_EQ(copy->lastSeq(), kPosition);
      std::vector<uint8_t> body;
      EXPECT_EQ(copy->read(kPosition + 1, &body).code(), StatusCode::kFailedPrecondition);
    }
    Result<std::unique_ptr<CommitLog>> before = CommitLog::open(to, kPosition - 1, true, options_);
    ASSERT_FALSE(before.isOk());
    EXPECT_EQ(before.status().code(), StatusCode::kCorruption);
  }
}

TEST_F(CommitLogTest, CopyLogOfASourceWithATornTailEndsAtTheLastCompleteRecord) {
  constexpr int64_t kLast = 30;
  ASSERT_FALSE(bodyFor(kLast).empty());
  // Cut at `cut` bytes into the last record: the file truncated there, or (as in a segment
  // allocated whole, whose size does not move) the record's bytes from there on not written.
  struct Torn {
    std::string name;
    uint64_t cut;
    bool truncated;
  };
  const std::vector<Torn> torn_cases = {
      {"truncated in the header", CommitLog::kRecordHeaderBytes / 2, true},
      {"truncated in the body", CommitLog::kRecordHeaderBytes + bodyFor(kLast).size() / 2, true},
      {"the body's second half unwritten",
       CommitLog::kRecordHeaderBytes + bodyFor(kLast).size() / 2, false},
  };
  for (size_t i = 0; i < torn_cases.size(); ++i) {
    const Torn& torn = torn_cases[i];
    SCOPED_TRACE(torn.name);
    const std::string from = tmp_.path() + "/from-" + std::to_string(i);
    const std::string to = tmp_.path() + "/to-" + std::to_string(i);
    std::string file;
    DiskRecord last;
    ASSERT_NO_FATAL_FAILURE(writeLog(from, kLast, &file, &last));
    const size_t records_before = scanSegment(file).size();
    if (torn.truncated) {
      fs::resize_file(file, last.offset + torn.cut);
    } else {
      const uint64_t end = last.offset + CommitLog::kRecordHeaderBytes + last.body.size();
      ASSERT_GE(fs::file_size(file), end);
      std::vector<uint8_t> stale(
          last.body.end() - static_cast<ptrdiff_t>(end - last.offset - torn.cut), last.body.end());
      for (uint8_t& byte : stale) byte = static_cast<uint8_t>(~byte);
      ASSERT_NO_FATAL_FAILURE(overwrite(file, last.offset + torn.cut, stale));
    }
    ASSERT_EQ(scanSegment(file).size(), records_before - 1);  // the last record is torn
    Result<int64_t> copied = CommitLog::copyLog(from, to, options_);
    ASSERT_TRUE(copied.isOk()) << copied.status().toString();
    EXPECT_EQ(copied.value(), kLast - 1);
    EXPECT_EQ(seqsOnDisk(to), seqRange(1, kLast - 1));
    {
      std::unique_ptr<CommitLog> copy = openLog(to, 0, true, options_);
      ASSERT_NE(copy, nullptr);
      EXPECT_EQ(copy->lastSeq(), kLast - 1);
      EXPECT_TRUE(readsBack(*copy, 1, kLast - 1));
      std::vector<uint8_t> body;
      EXPECT_EQ(copy->read(kLast, &body).code(), StatusCode::kFailedPrecondition);
      ASSERT_TRUE(appendRange(*copy, kLast, kLast));  // the torn seq goes on in the copy
    }
    std::unique_ptr<CommitLog> copy = openLog(to, 0, true, options_);
    ASSERT_NE(copy, nullptr);
    EXPECT_EQ(copy->lastSeq(), kLast);
    EXPECT_TRUE(readsBack(*copy, 1, kLast));
  }
}

TEST_F(CommitLogTest, CopyLogOfADirectoryWithoutSegmentsIsNotFoundAndMakesNothing) {
  ASSERT_TRUE(fs::create_directory(dir_));
  {
    std::ofstream(dir_ + "/notes.txt") << "not a segment";
    std::ofstream(dir_ + "/" + CommitLog::segmentName(0)) << "seq 0 names no segment";
  }
  const std::string to = tmp_.path() + "/copy";
  Result<int64_t> copied = CommitLog::copyLog(dir_, to, options_);
  ASSERT_FALSE(copied.isOk());
  EXPECT_EQ(copied.status().code(), StatusCode::kNotFound) << copied.status().toString();
  EXPECT_FALSE(fs::exists(to));
}

TEST_F(CommitLogTest, CopyLogReplacesWhatTheTargetDirectoryHeld) {
  // The target holds another log (seqs 1..20, other bodies) and a file of its own: copyLog
  // removes the directory first, so none of it is left beside the copy.
  const std::string to = tmp_.path() + "/copy";
  {
    std::unique_ptr<CommitLog> stale = openLog(to, 0, false, options_);
    ASSERT_NE(stale, nullptr);
    for (int64_t seq = 1; seq <= 20; ++seq) {
      ASSERT_TRUE(stale->append(seq, std::vector<uint8_t>(50, 0xee)).isOk());
    }
  }
  std::ofstream(to + "/stray.txt") << "left by someone";
  ASSERT_TRUE(fs::exists(to + "/" + CommitLog::segmentName(1)));
  constexpr int64_t kFirst = 100, kLast = 140;
  {
    std::unique_ptr<CommitLog> log = open(kFirst - 1, /*require_segments=*/false);
    ASSERT_NE(log, nullptr);
    ASSERT_TRUE(appendRange(*log, kFirst, kLast));
  }
  Result<int64_t> copied = CommitLog::copyLog(dir_, to, options_);
  ASSERT_TRUE(copied.isOk()) << copied.status().toString();
  EXPECT_EQ(copied.value(), kLast);
  EXPECT_FALSE(fs::exists(to + "/stray.txt"));
  EXPECT_FALSE(fs::exists(to + "/" + CommitLog::segmentName(1)));
  const std::vector<std::string> copy_files = segmentFiles(to);
  ASSERT_FALSE(copy_files.empty());
  EXPECT_EQ(fs::path(copy_files.front()).filename(), CommitLog::segmentName(kFirst));
  EXPECT_NE(expectCopy(to, kFirst, kLast), nullptr);
}

TEST_F(CommitLogTest, CopyLogUnderALogAppendingAndRecyclingIsAContiguousRunAfterReleased) {
  options_.segment_bytes = 1024;  // many segment starts and recycles under the copies
  constexpr int64_t kRecords = 1000;
  constexpr int64_t kLag = 16;  // the fold releases up to 16 records behind the last
  std::unique_ptr<CommitLog> log = open(0, /*require_segments=*/false);
  ASSERT_NE(log, nullptr);
  ASSERT_TRUE(appendRange(*log, 1, kLag));
  std::atomic<int64_t> started{kLag};  // the last seq whose append() began
  std::atomic<int64_t> released{0};    // published after release() returned
  std::atomic<bool> done{false};
  std::string appender_error;  // written by the appender only, read after join()
  std::thread appender([&log, &started, &released, &done, &appender_error] {
    for (int64_t seq = kLag + 1; seq <= kRecords; ++seq) {
      started.store(seq);
      const Status status = log->append(seq, bodyFor(seq));
      if (!status.isOk()) {
        appender_error = std::to_string(seq) + ": " + status.toString();
        break;
      }
      log->release(seq - kLag);
      released.store(seq - kLag);
    }
    done.store(true);
  });
  const std::string to = tmp_.path() + "/copy";
  do {
    Result<int64_t> copied = CommitLog::copyLog(dir_, to, options_);
    const int64_t released_after = released.load();
    const int64_t started_after = started.load();
    if (!copied.isOk()) {
      ADD_FAILURE() << copied.status().toString();
      break;
    }
    const std::vector<std::string> copy_files = segmentFiles(to);
    if (copy_files.empty()) {
      ADD_FAILURE() << "the copy has no segment";
      break;
    }
    // Records the copy lacks at its start were released (folded) before it returned, and it
    // holds no record whose append had not begun.
    const int64_t first = firstSeqOf(copy_files.front());
    EXPECT_LE(first - 1, released_after);
    EXPECT_LE(copied.value(), started_after);
    if (expectCopy(to, first, copied.value()) == nullptr) break;
  } while (!done.load() && !HasFailure());
  appender.join();
  EXPECT_EQ(appender_error, "");
  EXPECT_EQ(log->lastSeq(), kRecords);
}

}  // namespace
}  // namespace tally::ledger
