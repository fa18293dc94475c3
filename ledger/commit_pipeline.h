#pragma once

#include <uv.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>

#include "core/status.h"
#include "ledger/store.h"

// The ledger's commit pipeline: sealed store batches committed on libuv worker threads, up to
// `depth` of them in flight, so that batch N+1 is sealed, copied and queued (and its
// Store::commit ready to start the moment N's returns) while N syncs.
//
// Order is absolute, whatever the depth:
//  * commits never overlap and run in submission order: batch N+1's Store::commit starts only
//    once N's returned OK, so a durable N+1 implies a durable N (a Store is single-threaded);
//  * once a commit failed, no later batch is committed at all: each fails with
//    kFailedPrecondition naming the first failure (so the caller, which stops on a failure,
//    never sees a later batch durable past a failed one);
//  * completions are reported on the loop thread in submission order, each after its own
//    commit returned (never before the batches before it were reported).
//
// depth 1 is the serial group commit: one batch in flight at a time.
//
// Borrows `loop` and `store`, which must outlive it; every method runs on the loop thread.
// Destroy only when idle() (every submitted batch reported).

namespace tally::ledger {

class CommitPipeline {
 public:
  // ticket: submit()'s; store_us: time inside Store::commit (0 when not committed).
  using OnDone = std::function<void(uint64_t ticket, const Status& result, uint64_t store_us)>;

  CommitPipeline(uv_loop_t* loop, Store* store, uint64_t depth, OnDone on_done);
  ~CommitPipeline();
  CommitPipeline(const CommitPipeline&) = delete;
  CommitPipeline& operator=(const CommitPipeline&) = delete;

  // Queues `batch` (owned by the pipeline from here on) behind every batch submitted before;
  // its ticket, or the error of uv_queue_work (nothing queued then). Only when !full().
  [[nodiscard]] Result<uint64_t> submit(StoreBatch batch);
  bool full() const { return slots_.size() >= depth_; }
  bool idle() const { return slots_.empty(); }
  uint64_t inFlight() const { return slots_.size(); }

 private:
  struct Slot {
    CommitPipeline* owner = nullptr;
    uv_work_t work{};
    uint64_t ticket = 0;
    StoreBatch batch;
    Status result;
    uint64_t store_us = 0;
    bool done = false;
  };
  // Shared with the worker threads, under mu_.
  struct Turn {
    std::mutex mu;
    std::condition_variable changed;
    uint64_t next_ticket = 1;  // the ticket whose commit may run now
    Status first_failure;      // once not OK, nothing more is committed
  };

  static void doWork(uv_work_t* work);
  static void afterWork(uv_work_t* work, int status);

  uv_loop_t* loop_;
  Store* store_;
  uint64_t depth_;
  OnDone on_done_;
  Turn turn_;
  uint64_t next_ticket_ = 1;                 // the next submit()'s (loop thread)
  std::deque<std::unique_ptr<Slot>> slots_;  // in flight, in submission order (loop thread)
};

}  // namespace tally::ledger
