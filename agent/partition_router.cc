#include "agent/partition_router.h"

#include <string>
#include <type_traits>
#include <utility>
#include <variant>

#include "core/agent_fleet.h"
#include "core/agent_partitions.h"
#include "core/assert.h"

namespace tally::agent {
namespace {

LedgerReply ledgerReplyOf(wire::ResponseBody&& body) {
  return std::visit(
      [](auto&& value) -> LedgerReply {
        using T = std::decay_t<decltype(value)>;
        if constexpr (std::is_same_v<T, UnknownMessage>) {
          return ErrorReply{.code = ErrorCode::kUnknownMessage, .message = "unknown answer kind"};
        } else {
          return std::move(value);
        }
      },
      std::move(body));
}

wire::ResponseBody responseOf(LedgerReply reply) {
  return std::visit([](auto&& value) -> wire::ResponseBody { return std::move(value); },
                    std::move(reply));
}

}  // namespace

PartitionRouter::PartitionRouter(std::vector<RequestHandler> services,
                                 ReservationPartitions* records, Logger* logger,
                                 PartitionRouterOptions options)
    : services_(std::move(services)), records_(records), logger_(logger), options_(options) {
  TALLY_ASSERT(!services_.empty());
  TALLY_ASSERT(services_.size() == 1 || records_ != nullptr);
}

void PartitionRouter::handle(wire::RequestBody&& body, Respond respond, Alive alive) {
  if (services_.size() == 1) {
    services_.front()(std::move(body), std::move(respond), std::move(alive));
    return;
  }
  const RecordedPartition recorded = [this](std::string_view id) -> std::optional<uint32_t> {
    Result<std::optional<uint32_t>> found = records_->find(id);
    if (found.isOk()) return found.value();
    logger_->error("reservation_partition_read_failed",
                   {{"reservation_id", std::string(id)}, {"error", found.status().toString()}});
    return std::nullopt;  // asked of every partition instead
  };
  const AgentPartitionRoute route = agentPartitionRoute(body, partitions(), recorded);
  using Kind = AgentPartitionRoute::Kind;
  switch (route.kind) {
    case Kind::kPartition: {
      if (std::holds_alternative<ReserveRequest>(body)) {
        const std::string& id = std::get<ReserveRequest>(body).reservation_id;
        if (Status s = record(id, route.partition); !s.isOk()) {
          logger_->error("reservation_partition_write_failed",
                         {{"reservation_id", id}, {"error", s.toString()}});
          respond(wire::ErrorReply{
              .code = wire::ErrorCode::kUnavailable,
              .message = "the agent could not record the reservation's partition (" + s.message() +
                         "); nothing was sent: retry with the same id"});
          return;
        }
      }
      toPartition(route.partition, std::move(body), std::move(respond), std::move(alive));
      return;
    }
    case Kind::kUnrecorded:
      unrecorded(std::move(body), std::move(respond), std::move(alive));
      return;
    case Kind::kEvery: {
      const FleetRequest fleet = fleetRequestOf(body);
      if (fleet == FleetRequest::kNotMergeable) {
        respond(responseOf(fleetRefusal(body)));
      } else if (fleet == FleetRequest::kFirstOnly) {
        services_.front()(std::move(body), std::move(respond), std::move(alive));
      } else {
        toEvery(body, alive,
                [request = body, respond = std::move(respond)](std::vector<LedgerReply> answers) {
                  respond(responseOf(mergeFleetAnswers(request, answers)));
                });
      }
      return;
    }
    case Kind::kNotSent:
      // A kind this build does not know: partition 0's service answers it as one agent does.
      services_.front()(std::move(body), std::move(respond), std::move(alive));
      return;
  }
}

void PartitionRouter::toPartition(uint32_t partition, wire::RequestBody&& body, Respond respond,
                                  Alive alive) {
  TALLY_ASSERT(partition < services_.size());
  std::string id(reservationIdOf(body));
  if (!id.empty()) respond = forgettingWhenFinal(std::move(id), std::move(respond));
  services_[partition](std::move(body), std::move(respond), std::move(alive));
}

Status PartitionRouter::record(const std::string& reservation_id, uint32_t partition) {
  if (Status s = records_->record(reservation_id, partition); !s.isOk()) return s;
  if (++recorded_since_trim_ >= options_.trim_every) {
    recorded_since_trim_ = 0;
    if (Status s = records_->trim(options_.records_max); !s.isOk()) {
      // Not the reserve's failure: the table is only larger until the next trim.
      logger_->warn("reservation_partitions_trim_failed", {{"error", s.toString()}});
    }
  }
  return Status::ok();
}

Respond PartitionRouter::forgettingWhenFinal(std::string reservation_id, Respond respond) {
  return [this, reservation_id = std::move(reservation_id),
          respond = std::move(respond)](wire::ResponseBody&& answer) {
    if (const auto* reply = std::get_if<ReservationReply>(&answer);
        reply != nullptr && partitionRecordDone(*reply)) {
      if (Status s = records_->forget(reservation_id); !s.isOk()) {
        // Kept: a later follow-up still finds the partition; only the table is larger.
        logger_->warn("reservation_partition_forget_failed",
                      {{"reservation_id", reservation_id}, {"error", s.toString()}});
      }
    }
    respond(std::move(answer));
  };
}

void PartitionRouter::toEvery(const wire::RequestBody& body, const Alive& alive,
                              std::function<void(std::vector<LedgerReply> answers)> merged) {
  struct Gather {
    std::vector<LedgerReply> answers;
    size_t waiting = 0;
    std::function<void(std::vector<LedgerReply>)> done;
  };
  auto gather = std::make_shared<Gather>();
  gather->answers.resize(services_.size());
  gather->waiting = services_.size();
  gather->done = std::move(merged);
  for (size_t i = 0; i < services_.size(); ++i) {
    // A service may answer at once (health): the gather outlives every call.
    services_[i](
        wire::RequestBody(body),  // each partition gets its own copy
        [gather, i](wire::ResponseBody&& answer) {
          gather->answers[i] = ledgerReplyOf(std::move(answer));
          if (--gather->waiting == 0) gather->done(std::move(gather->answers));
        },
        alive);
  }
}

void PartitionRouter::unrecorded(wire::RequestBody&& body, Respond respond, Alive alive) {
  std::string id(reservationIdOf(body));
  logger_->debug("reservation_partition_unrecorded", {{"reservation_id", id}});
  const wire::RequestBody query = QueryRequest{.reservation_id = id};
  toEvery(query, alive,
          [this, id, body = std::move(body), respond = std::move(respond),
           alive](std::vector<LedgerReply> answers) mutable {
            UnrecordedDecision decision = decideUnrecorded(id, answers);
            if (decision.kind == UnrecordedDecision::Kind::kAnswer) {
              respond(responseOf(std::move(decision.reply)));
              return;
            }
            if (Status s = record(id, decision.partition); !s.isOk()) {
              // Sent anyway: the partition holds it; the next follow-up asks again.
              logger_->warn("reservation_partition_write_failed",
                            {{"reservation_id", id}, {"error", s.toString()}});
            }
            toPartition(decision.partition, std::move(body), std::move(respond), std::move(alive));
          });
}

}  // namespace tally::agent
