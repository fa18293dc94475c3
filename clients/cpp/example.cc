// A gateway's use of tally/client.h, built by tests/http/cpp_client_pkgconfig.sh with nothing
// but `pkg-config --cflags --libs tally-client`: reserve, start, settle.
//   example SOCKET ID   prints the outcome of each step; exit 0 when all were ok.

#include <tally/client.h>

#include <cstdio>

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: example SOCKET ID\n");
    return 2;
  }
  tally::Client client(tally::ClientOptions{.socket_path = argv[1], .deadline_ms = 2'000});
  const tally::Answer reserved = client.reserve(
      {.reservation_id = argv[2], .subject = "tenant-1", .route = "chat", .units = 100});
  std::printf("reserve %s %s\n", tally::outcomeName(reserved.outcome), reserved.code.c_str());
  if (reserved.outcome != tally::Outcome::kOk) return 1;
  const tally::Answer started = client.start(argv[2], argv[2]);
  std::printf("start %s\n", tally::outcomeName(started.outcome));
  const tally::Answer settled = client.settle(argv[2], argv[2], 40);
  std::printf("settle %s refunded %llu\n", tally::outcomeName(settled.outcome),
              static_cast<unsigned long long>(settled.receipt.refunded_units));
  return settled.outcome == tally::Outcome::kOk ? 0 : 1;
}
