#include "ledger/commit_pipeline.h"

#include <string>
#include <utility>

#include "core/assert.h"

namespace tally::ledger {

CommitPipeline::CommitPipeline(uv_loop_t* loop, Store* store, uint64_t depth, OnDone on_done)
    : loop_(loop), store_(store), depth_(depth < 1 ? 1 : depth), on_done_(std::move(on_done)) {}

CommitPipeline::~CommitPipeline() { TALLY_ASSERT(slots_.empty()); }

Result<uint64_t> CommitPipeline::submit(StoreBatch batch) {
  TALLY_ASSERT(!full());
  auto slot = std::make_unique<Slot>();
  slot->owner = this;
  slot->work.data = slot.get();
  slot->ticket = next_ticket_;
  slot->batch = std::move(batch);
  if (int rc = uv_queue_work(loop_, &slot->work, doWork, afterWork); rc != 0) {
    return Status::ioError(std::string("uv_queue_work: ") + uv_strerror(rc));
  }
  ++next_ticket_;  // only a queued batch takes a ticket: the turns have no gap
  slots_.push_back(std::move(slot));
  return slots_.back()->ticket;
}

void CommitPipeline::doWork(uv_work_t* work) {
  // A worker thread: touches the store, its own slot, and turn_ under its mutex.
  auto* slot = static_cast<Slot*>(work->data);
  Turn& turn = slot->owner->turn_;
  Status earlier_failure;
  {
    std::unique_lock lock(turn.mu);
    turn.changed.wait(lock, [&] { return turn.next_ticket == slot->ticket; });
    earlier_failure = turn.first_failure;
  }
  if (earlier_failure.isOk()) {
    const uint64_t started_ns = uv_hrtime();
    slot->result = slot->owner->store_->commit(slot->batch);
    slot->store_us = (uv_hrtime() - started_ns) / 1000;
  } else {
    slot->result = Status::failedPrecondition("not committed: an earlier batch failed: " +
                                              earlier_failure.toString());
  }
  {
    std::lock_guard lock(turn.mu);
    if (!slot->result.isOk() && turn.first_failure.isOk()) turn.first_failure = slot->result;
    ++turn.next_ticket;
  }
  turn.changed.notify_all();
  slot->batch = StoreBatch{};  // freed here, off the loop thread
}

void CommitPipeline::afterWork(uv_work_t* work, int status) {
  auto* slot = static_cast<Slot*>(work->data);
  CommitPipeline* pipeline = slot->owner;
  // Nothing calls uv_cancel on a slot's work, so every slot ran doWork and took its turn.
  if (status != 0) {
    slot->result = Status::ioError(std::string("commit cancelled: ") + uv_strerror(status));
  }
  slot->done = true;
  // Reported in submission order (a later commit cannot return first, but the order does not
  // rest on the threadpool's completion order). The callback may submit again.
  while (!pipeline->slots_.empty() && pipeline->slots_.front()->done) {
    std::unique_ptr<Slot> done = std::move(pipeline->slots_.front());
    pipeline->slots_.pop_front();
    pipeline->on_done_(done->ticket, done->result, done->store_us);
  }
}

}  // namespace tally::ledger
