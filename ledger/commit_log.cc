#include "ledger/commit_log.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>

#include "core/assert.h"

namespace tally::ledger {

static_assert(std::endian::native == std::endian::little, "the log's records are little-endian");

struct CommitLog::Segment {
  int64_t first_seq = 0;
  int fd = -1;
  ~Segment() {
    if (fd >= 0) ::close(fd);
  }
};

namespace {

constexpr size_t kSeqNameDigits = 20;

std::string errnoText(int error) { return std::strerror(error); }

Status ioStatus(int error, const std::string& what) {
  if (error == ENOSPC || error == EDQUOT) {
    return Status::resourceExhausted(what + ": " + errnoText(error) + " (disk full)");
  }
  if (error == EFBIG) {
    return Status::resourceExhausted(what + ": " + errnoText(error) + " (file size limit)");
  }
  return Status::ioError(what + ": " + errnoText(error));
}

uint32_t checksum(std::span<const uint8_t> header_tail, std::span<const uint8_t> body) {
  uLong crc = ::crc32(0L, Z_NULL, 0);
  crc = ::crc32(crc, header_tail.data(), static_cast<uInt>(header_tail.size()));
  // zlib takes at most 4 GiB per call; bodies are bounded far below (record_bytes_max). An
  // empty body is skipped: crc32() of a null buffer returns the initial value, not `crc`.
  if (!body.empty()) crc = ::crc32(crc, body.data(), static_cast<uInt>(body.size()));
  return static_cast<uint32_t>(crc);
}

using Header = std::array<uint8_t, CommitLog::kRecordHeaderBytes>;

Header makeHeader(int64_t seq, std::span<const uint8_t> body) {
  Header header{};
  const uint32_t magic = CommitLog::kRecordMagic;
  const auto bytes = static_cast<uint32_t>(body.size());
  std::memcpy(header.data(), &magic, 4);
  std::memcpy(header.data() + 8, &seq, 8);
  std::memcpy(header.data() + 16, &bytes, 4);
  const uint32_t crc = checksum(std::span(header).subspan(8), body);
  std::memcpy(header.data() + 4, &crc, 4);
  return header;
}

struct ParsedHeader {
  uint32_t magic = 0;
  uint32_t crc = 0;
  int64_t seq = 0;
  uint32_t bytes = 0;
  uint32_t zero = 0;
};

ParsedHeader parseHeader(const Header& header) {
  ParsedHeader parsed;
  std::memcpy(&parsed.magic, header.data(), 4);
  std::memcpy(&parsed.crc, header.data() + 4, 4);
  std::memcpy(&parsed.seq, header.data() + 8, 8);
  std::memcpy(&parsed.bytes, header.data() + 16, 4);
  std::memcpy(&parsed.zero, header.data() + 20, 4);
  return parsed;
}

// Reads exactly out.size() bytes at `offset`; false at end of file (a short read).
Status preadFully(int fd, std::span<uint8_t> out, uint64_t offset, const std::string& what,
                  bool* complete) {
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n =
        ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::ioError("read " + what + ": " + errnoText(errno));
    }
    if (n == 0) {
      *complete = false;
      return Status::ok();
    }
    done += static_cast<size_t>(n);
  }
  *complete = true;
  return Status::ok();
}

// Reads the record at `offset` of `fd`: *sound when it is complete, is record `expected` and its
// checksum matches, with its body in *body; otherwise it ends a run of records.
Status readRecordAt(int fd, uint64_t offset, int64_t expected, uint64_t bytes_max,
                    const std::string& what, std::vector<uint8_t>* body, bool* sound) {
  *sound = false;
  Header header{};
  bool complete = false;
  if (Status s = preadFully(fd, header, offset, what, &complete); !s.isOk() || !complete) return s;
  const ParsedHeader parsed = parseHeader(header);
  if (parsed.magic != CommitLog::kRecordMagic || parsed.seq != expected || parsed.zero != 0 ||
      parsed.bytes > bytes_max) {
    return Status::ok();
  }
  body->resize(parsed.bytes);
  if (Status s = preadFully(fd, *body, offset + CommitLog::kRecordHeaderBytes, what, &complete);
      !s.isOk() || !complete) {
    return s;
  }
  *sound = checksum(std::span(header).subspan(8), *body) == parsed.crc;
  return Status::ok();
}

// Whether a complete record with a seq above `after_seq` lies anywhere in `fd` from `offset`
// on. After the first bad record of the last segment only an interrupted write's tail, zeros or
// records of the segment's earlier life (lower seqs) may follow: a later record means the bad
// one was damaged after it was written, not torn.
Status laterRecordExists(int fd, uint64_t offset, int64_t after_seq, uint64_t bytes_max,
                         const std::string& what, bool* exists) {
  *exists = false;
  constexpr size_t kChunkBytes = size_t{1} << 20;
  std::vector<uint8_t> chunk(kChunkBytes + CommitLog::kRecordHeaderBytes);
  std::vector<uint8_t> body;
  for (uint64_t at = offset;; at += kChunkBytes) {
    ssize_t n;
    do {
      n = ::pread(fd, chunk.data(), chunk.size(), static_cast<off_t>(at));
    } while (n < 0 && errno == EINTR);
    if (n < 0) return Status::ioError("read " + what + ": " + errnoText(errno));
    const auto got = static_cast<size_t>(n);
    // Headers starting in this chunk (the next one re-reads the last header's worth of bytes).
    // Candidates start with the magic's first byte: memchr skips the rest (mostly zeros from
    // the allocation, or older records' bodies) many bytes at a time.
    const size_t starts = std::min(got, kChunkBytes);
    const auto first_byte = static_cast<uint8_t>(CommitLog::kRecordMagic & 0xff);
    for (size_t i = 0; i < starts; ++i) {
      const void* found = std::memchr(chunk.data() + i, first_byte, starts - i);
      if (found == nullptr) break;
      i = static_cast<size_t>(static_cast<const uint8_t*>(found) - chunk.data());
      if (i + CommitLog::kRecordHeaderBytes > got) break;
      uint32_t magic = 0;
      std::memcpy(&magic, chunk.data() + i, 4);
      if (magic != CommitLog::kRecordMagic) continue;
      int64_t seq = 0;
      std::memcpy(&seq, chunk.data() + i + 8, 8);
      if (seq <= after_seq) continue;
      if (Status s = readRecordAt(fd, at + i, seq, bytes_max, what, &body, exists);
          !s.isOk() || *exists) {
        return s;
      }
    }
    if (got < chunk.size()) return Status::ok();
  }
}

// The segments' first seqs, sorted; files that are not segments are left alone.
Status listSegments(const std::string& dir, std::vector<int64_t>* first_seqs) {
  DIR* handle = ::opendir(dir.c_str());
  if (handle == nullptr) return Status::ioError("list " + dir + ": " + errnoText(errno));
  const std::string suffix = CommitLog::kSegmentSuffix;
  errno = 0;
  while (const dirent* entry = ::readdir(handle)) {
    const std::string name = entry->d_name;
    if (name.size() != kSeqNameDigits + suffix.size() || !name.ends_with(suffix)) continue;
    const std::string digits = name.substr(0, kSeqNameDigits);
    if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      continue;
    }
    const unsigned long long value = std::strtoull(digits.c_str(), nullptr, 10);
    if (value == 0 || value > static_cast<unsigned long long>(INT64_MAX)) continue;
    first_seqs->push_back(static_cast<int64_t>(value));
  }
  const int error = errno;
  ::closedir(handle);
  if (error != 0) return Status::ioError("list " + dir + ": " + errnoText(error));
  std::sort(first_seqs->begin(), first_seqs->end());
  return Status::ok();
}

}  // namespace

std::string CommitLog::segmentName(int64_t first_seq) {
  char name[48];
  std::snprintf(name, sizeof name, "%020lld%s", static_cast<long long>(first_seq), kSegmentSuffix);
  return name;
}

CommitLog::CommitLog(Key, std::string dir, int dir_fd, CommitLogOptions options)
    : dir_(std::move(dir)), dir_fd_(dir_fd), options_(options) {}

CommitLog::~CommitLog() {
  if (dir_fd_ >= 0) ::close(dir_fd_);
}

Result<std::unique_ptr<CommitLog>> CommitLog::open(const std::string& dir, int64_t released_seq,
                                                   bool require_segments,
                                                   CommitLogOptions options) {
  if (options.segment_bytes == 0 || options.record_bytes_max == 0 ||
      options.record_bytes_max > UINT32_MAX) {
    return Status::invalidArgument(
        "commit log: segment_bytes must be positive and record_bytes_max in 1..2^32-1");
  }
  if (released_seq < 0) return Status::invalidArgument("commit log: negative released seq");
  if (::mkdir(dir.c_str(), 0750) != 0 && errno != EEXIST) {
    return ioStatus(errno, "create " + dir);
  }
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return Status::ioError("open " + dir + ": " + errnoText(errno));
  auto log = std::make_unique<CommitLog>(Key{}, dir, dir_fd, options);
  if (Status s = log->scan(released_seq, require_segments); !s.isOk()) return s;
  return log;
}

// Reads every segment: checks that the records after released_seq are all there, indexes them,
// and finds the end of the log in the last segment.
Status CommitLog::scan(int64_t released_seq, bool require_segments) {
  std::vector<int64_t> first_seqs;
  if (Status s = listSegments(dir_, &first_seqs); !s.isOk()) return s;
  released_seq_ = released_seq;
  last_seq_ = released_seq;
  index_first_seq_ = released_seq + 1;
  if (first_seqs.empty()) {
    if (require_segments) {
      return Status::corruption(dir_ + " holds no log segment, but the log was written before: " +
                                "its records after seq " + std::to_string(released_seq) +
                                " are lost");
    }
    return Status::ok();
  }
  if (first_seqs.front() > released_seq + 1) {
    return Status::corruption(dir_ + ": the log starts at seq " +
                              std::to_string(first_seqs.front()) + " but records from seq " +
                              std::to_string(released_seq + 1) + " on are needed: they are lost");
  }
  for (size_t i = 0; i < first_seqs.size(); ++i) {
    const bool is_last = i + 1 == first_seqs.size();
    const std::string path = dir_ + "/" + segmentName(first_seqs[i]);
    auto segment = std::make_shared<Segment>();
    segment->first_seq = first_seqs[i];
    segment->fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (segment->fd < 0) return Status::ioError("open " + path + ": " + errnoText(errno));
    uint64_t offset = 0;
    int64_t expected = segment->first_seq;
    // A segment ends where the next one starts, whatever follows in its file.
    const int64_t end_before = is_last ? INT64_MAX : first_seqs[i + 1];
    std::vector<uint8_t> body;
    while (expected < end_before) {
      bool sound = false;
      if (Status s = readRecordAt(segment->fd, offset, expected, options_.record_bytes_max, path,
                                  &body, &sound);
          !s.isOk()) {
        return s;
      }
      if (!sound) break;
      const auto bytes = static_cast<uint32_t>(body.size());
      if (expected > released_seq) {
        // Records <= released_seq are not indexed; the first indexed one is released_seq + 1.
        index_.push_back(
            Entry{.segment = segment, .offset = offset + kRecordHeaderBytes, .bytes = bytes});
      }
      offset += kRecordHeaderBytes + bytes;
      ++expected;
    }
    if (!is_last) {
      const int64_t next_first = first_seqs[i + 1];
      if (expected != next_first && next_first - 1 > released_seq) {
        return Status::corruption(path + ": log record seq " +
                                  std::to_string(std::max(expected, released_seq + 1)) +
                                  " is damaged or missing (the next segment starts at seq " +
                                  std::to_string(next_first) + ")");
      }
    } else {
      bool damaged = false;
      if (Status s = laterRecordExists(segment->fd, offset, expected, options_.record_bytes_max,
                                       path, &damaged);
          !s.isOk()) {
        return s;
      }
      if (damaged) {
        return Status::corruption(path + ": log record seq " + std::to_string(expected) +
                                  " is damaged, and later records follow it");
      }
      write_offset_ = offset;
      last_seq_ = std::max(expected - 1, released_seq);
      if (expected - 1 < released_seq) {
        return Status::corruption(dir_ + ": the log ends at seq " + std::to_string(expected - 1) +
                                  " but records up to seq " + std::to_string(released_seq) +
                                  " were folded from it: the log's end is lost");
      }
    }
    segments_.push_back(std::move(segment));
  }
  return Status::ok();
}

Status CommitLog::fail(Status status) {
  if (status.code() == StatusCode::kIoError && failed_.isOk()) failed_ = status;
  return status;
}

Status CommitLog::append(int64_t seq, std::span<const uint8_t> body) {
  if (Status s = write(seq, body); !s.isOk()) return s;
  return sync();
}

Status CommitLog::appendUnsynced(int64_t seq, std::span<const uint8_t> body) {
  return write(seq, body);
}

Status CommitLog::sync() {
  if (!failed_.isOk()) {
    return Status::failedPrecondition("commit log failed earlier: " + failed_.toString());
  }
  if (segments_.empty()) return Status::ok();
  if (::fdatasync(segments_.back()->fd) != 0) {
    return fail(Status::ioError("fdatasync " + dir_ + "/" +
                                segmentName(segments_.back()->first_seq) + ": " +
                                errnoText(errno)));
  }
  unsynced_ = false;
  return Status::ok();
}

Status CommitLog::ensureSegment() {
  if (!failed_.isOk()) {
    return Status::failedPrecondition("commit log failed earlier: " + failed_.toString());
  }
  if (!segments_.empty()) return Status::ok();
  return startSegment(last_seq_ + 1);
}

Status CommitLog::write(int64_t seq, std::span<const uint8_t> body) {
  if (!failed_.isOk()) {
    return Status::failedPrecondition("commit log failed earlier: " + failed_.toString());
  }
  TALLY_ASSERT(seq == last_seq_ + 1);
  if (body.size() > options_.record_bytes_max) {
    return Status::resourceExhausted("log record of " + std::to_string(body.size()) +
                                     " bytes, at most " +
                                     std::to_string(options_.record_bytes_max) + " allowed");
  }
  const uint64_t record_bytes = kRecordHeaderBytes + body.size();
  if (segments_.empty() ||
      (write_offset_ > 0 && write_offset_ + record_bytes > options_.segment_bytes)) {
    // Bulk appends: the segment being left is made durable before the next one starts.
    if (unsynced_) {
      if (Status s = sync(); !s.isOk()) return s;
    }
    if (Status s = startSegment(seq); !s.isOk()) return s;
  }
  const Segment& segment = *segments_.back();
  Header header = makeHeader(seq, body);
  std::array<iovec, 2> parts = {
      iovec{.iov_base = header.data(), .iov_len = header.size()},
      iovec{.iov_base = const_cast<uint8_t*>(body.data()), .iov_len = body.size()}};
  uint64_t done = 0;
  while (done < record_bytes) {
    // After a short write, the rest of the record goes in plain writes (rare).
    ssize_t n;
    if (done == 0) {
      n = ::pwritev(segment.fd, parts.data(), body.empty() ? 1 : 2,
                    static_cast<off_t>(write_offset_));
    } else {
      const uint8_t* from =
          done < header.size() ? header.data() + done : body.data() + (done - header.size());
      const size_t length = done < header.size() ? header.size() - done : record_bytes - done;
      n = ::pwrite(segment.fd, from, length, static_cast<off_t>(write_offset_ + done));
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      // Nothing is acknowledged and the offset does not move: a later record overwrites this
      // one's bytes. A full disk is not sticky; anything else leaves the file unknown.
      return fail(ioStatus(errno, "write " + dir_ + "/" + segmentName(segment.first_seq)));
    }
    done += static_cast<uint64_t>(n);
  }
  {
    std::lock_guard lock(mu_);
    if (index_.empty()) index_first_seq_ = seq;
    index_.push_back(Entry{.segment = segments_.back(),
                           .offset = write_offset_ + kRecordHeaderBytes,
                           .bytes = static_cast<uint32_t>(body.size())});
  }
  write_offset_ += record_bytes;
  last_seq_ = seq;
  unsynced_ = true;
  ++stats_.records_appended;
  stats_.bytes_appended += record_bytes;
  return Status::ok();
}

// Makes `first_seq`'s segment the current one: a released segment renamed, or a new file; the
// directory is synced before any record goes into it, so that a crash cannot leave the record
// in a file under a name that does not say where it belongs.
Status CommitLog::startSegment(int64_t first_seq) {
  // Segments at the front all of whose records are released (the next one starts at or below
  // released_seq_ + 1). The current (last) one is never among them.
  size_t released = 0;
  while (released + 1 < segments_.size() &&
         segments_[released + 1]->first_seq <= released_seq_ + 1) {
    ++released;
  }
  const std::string path = dir_ + "/" + segmentName(first_seq);
  std::shared_ptr<Segment> segment;
  if (released > 0) {
    const std::string old_path = dir_ + "/" + segmentName(segments_.front()->first_seq);
    if (::rename(old_path.c_str(), path.c_str()) != 0) {
      return fail(Status::ioError("rename " + old_path + " to " + path + ": " + errnoText(errno)));
    }
    // A reader may still hold the old Segment (its records are released, so it does not read
    // them); the recycled file gets a Segment of its own, over a duplicate descriptor.
    segment = std::make_shared<Segment>();
    segment->first_seq = first_seq;
    segment->fd = ::dup(segments_.front()->fd);
    if (segment->fd < 0) return fail(Status::ioError("dup " + path + ": " + errnoText(errno)));
    ++stats_.segments_recycled;
    // One more released segment waits for the next start (the fold often releases two at
    // once, then none); any beyond it are deleted.
    for (size_t i = 2; i < released; ++i) {
      const std::string extra = dir_ + "/" + segmentName(segments_[i]->first_seq);
      if (::unlink(extra.c_str()) != 0) {
        return fail(Status::ioError("delete " + extra + ": " + errnoText(errno)));
      }
      ++stats_.segments_deleted;
    }
    std::shared_ptr<Segment> waiting = released > 1 ? segments_[1] : nullptr;
    segments_.erase(segments_.begin(), segments_.begin() + static_cast<ptrdiff_t>(released));
    if (waiting != nullptr) segments_.insert(segments_.begin(), std::move(waiting));
  } else {
    segment = std::make_shared<Segment>();
    segment->first_seq = first_seq;
    segment->fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0640);
    if (segment->fd < 0) return fail(ioStatus(errno, "create " + path));
    // Reserves the space now: a full disk shows here, not in the middle of a later record.
    if (const int error =
            ::posix_fallocate(segment->fd, 0, static_cast<off_t>(options_.segment_bytes));
        error != 0 && error != EOPNOTSUPP) {
      ::unlink(path.c_str());
      return fail(ioStatus(error, "allocate " + path));
    }
    ++stats_.segments_created;
  }
  if (::fsync(dir_fd_) != 0) {
    return fail(Status::ioError("fsync " + dir_ + ": " + errnoText(errno)));
  }
  segments_.push_back(std::move(segment));
  write_offset_ = 0;
  return Status::ok();
}

void CommitLog::release(int64_t seq) {
  if (seq <= released_seq_) return;
  released_seq_ = std::min(seq, last_seq_);
  std::lock_guard lock(mu_);
  while (!index_.empty() && index_first_seq_ <= released_seq_) {
    index_.pop_front();
    ++index_first_seq_;
  }
  if (index_.empty()) index_first_seq_ = released_seq_ + 1;
}

Status CommitLog::read(int64_t seq, std::vector<uint8_t>* body) const {
  return read(seq, [body](size_t bytes) {
    body->resize(bytes);
    return std::span<uint8_t>(*body);
  });
}

Status CommitLog::read(int64_t seq,
                       const std::function<std::span<uint8_t>(size_t bytes)>& allocate) const {
  Entry entry;
  {
    std::lock_guard lock(mu_);
    if (seq < index_first_seq_ || seq >= index_first_seq_ + static_cast<int64_t>(index_.size())) {
      return Status::failedPrecondition(
          "log record seq " + std::to_string(seq) +
          " is not readable (readable: " + std::to_string(index_first_seq_) + ".." +
          std::to_string(index_first_seq_ + static_cast<int64_t>(index_.size()) - 1) + ")");
    }
    entry = index_[static_cast<size_t>(seq - index_first_seq_)];
  }
  const std::span<uint8_t> buffer = allocate(entry.bytes);
  TALLY_ASSERT(buffer.size() >= entry.bytes);
  const std::span<uint8_t> body = buffer.first(entry.bytes);
  bool complete = false;
  const std::string what = dir_ + "/" + segmentName(entry.segment->first_seq);
  if (Status s = preadFully(entry.segment->fd, body, entry.offset, what, &complete); !s.isOk()) {
    return s;
  }
  if (!complete) {
    return Status::corruption(what + ": log record seq " + std::to_string(seq) + " is cut short");
  }
  return Status::ok();
}

uint64_t CommitLog::unreleasedRecords() const {
  std::lock_guard lock(mu_);
  return index_.size();
}

uint64_t CommitLog::diskBytes() const {
  uint64_t total = 0;
  for (const auto& segment : segments_) {
    struct stat st {};
    if (::fstat(segment->fd, &st) == 0) total += static_cast<uint64_t>(st.st_blocks) * 512;
  }
  return total;
}

Result<int64_t> CommitLog::copyLog(const std::string& from_dir, const std::string& to_dir,
                                   CommitLogOptions options) {
  std::error_code same_error;
  if (std::filesystem::equivalent(from_dir, to_dir, same_error)) {
    return Status::invalidArgument("copy log: " + to_dir + " is " + from_dir);
  }
  std::vector<int64_t> first_seqs;
  if (Status s = listSegments(from_dir, &first_seqs); !s.isOk()) return s;
  if (first_seqs.empty()) return Status::notFound(from_dir + " holds no log segment");
  std::unique_ptr<CommitLog> copy;
  // (Re)starts the copy as an empty log positioned before `first_seq`.
  auto restart = [&](int64_t first_seq) -> Status {
    copy.reset();
    std::error_code error;
    std::filesystem::remove_all(to_dir, error);
    if (error) return Status::ioError("remove " + to_dir + ": " + error.message());
    Result<std::unique_ptr<CommitLog>> opened = open(to_dir, first_seq - 1, false, options);
    if (!opened.isOk()) return opened.status();
    copy = std::move(opened).value();
    return Status::ok();
  };
  if (Status s = restart(first_seqs.front()); !s.isOk()) return s;
  std::vector<uint8_t> body;
  for (size_t i = 0; i < first_seqs.size(); ++i) {
    const bool is_last = i + 1 == first_seqs.size();
    const int64_t end_before = is_last ? INT64_MAX : first_seqs[i + 1];
    const std::string path = from_dir + "/" + segmentName(first_seqs[i]);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 && errno != ENOENT) return Status::ioError("open " + path + ": " + errnoText(errno));
    Segment source;  // closes fd
    source.fd = fd;
    int64_t expected = first_seqs[i];
    if (expected != copy->lastSeq() + 1) {
      if (Status s = restart(expected); !s.isOk()) return s;
    }
    uint64_t offset = 0;
    while (fd >= 0 && expected < end_before) {
      bool sound = false;
      if (Status s =
              readRecordAt(fd, offset, expected, options.record_bytes_max, path, &body, &sound);
          !s.isOk()) {
        return s;
      }
      if (!sound) break;
      if (Status s = copy->appendUnsynced(expected, body); !s.isOk()) return s;
      offset += kRecordHeaderBytes + body.size();
      ++expected;
    }
    // A segment that stops short of the next was recycled while read: what came before it is
    // released in the source, and the copy goes on from the next segment (the check above).
  }
  if (Status s = copy->ensureSegment(); !s.isOk()) return s;
  if (Status s = copy->sync(); !s.isOk()) return s;
  return copy->lastSeq();
}

}  // namespace tally::ledger
