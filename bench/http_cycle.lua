-- wrk script for bench/http_vs_native.sh: each wrk connection (run with -t N -c N, one
-- connection per thread) drives reserve -> start -> settle cycles over the agent's HTTP/JSON
-- API, one request at a time, like tally-bench's closed loop with K = N. Subjects
-- wrk-<thread>-<i % 1000>; ids unique per thread and run.

local counter = 0
local threads = {}

function setup(thread)
  counter = counter + 1
  thread:set("thread_id", counter)
  table.insert(threads, thread)
end

function init(args)
  run = tostring(os.time())
  cycle = 0
  step = 0      -- 0 reserve, 1 start, 2 settle
  failures = 0
end

local function id()
  return "wrk-" .. run .. "-" .. thread_id .. "-" .. cycle
end

function request()
  local rid = id()
  if step == 0 then
    local subject = "wrk-" .. thread_id .. "-" .. (cycle % 1000)
    return wrk.format("POST", "/v1/reservations", nil,
      '{"id":"' .. rid .. '","subject":"' .. subject .. '","route":"bench","units":10}')
  elseif step == 1 then
    return wrk.format("POST", "/v1/reservations/" .. rid .. "/start", nil,
      '{"operationId":"' .. rid .. '"}')
  end
  return wrk.format("POST", "/v1/reservations/" .. rid .. "/settle", nil,
    '{"operationId":"' .. rid .. '","actualUnits":7}')
end

function response(status, headers, body)
  if status ~= 200 then
    failures = failures + 1
  end
  step = step + 1
  if step == 3 then
    step = 0
    cycle = cycle + 1
  end
end

function done(summary, latency, requests)
  local failed = 0
  for _, thread in ipairs(threads) do
    failed = failed + thread:get("failures")
  end
  io.write(string.format("RESULT-HTTP requests=%d cycles_per_s=%.0f non200=%d p50_us=%d p99_us=%d\n",
    summary.requests, summary.requests / 3 / (summary.duration / 1e6), failed,
    latency:percentile(50), latency:percentile(99)))
end
