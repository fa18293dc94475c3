-- tally in front of an LLM upstream, for nginx + libnginx-mod-http-lua (examples/nginx).
--
-- Per request (nginx.conf.in wires the phases):
--   access        reserve the estimate (X-Max-Tokens, default 100) for the tenant (X-Tenant)
--                 under id "nginx:" .. Idempotency-Key (or nginx's $request_id): a client that
--                 retries with the same key gets the same reservation, never a second charge.
--                 429 + Retry-After when tally rejects; 409 when that key was already served.
--   header filter the upstream answered 2xx: the work has begun, so `start` (in a timer).
--   body filter   the last byte of the upstream's body went out: the response is complete.
--   log           settle the usage the upstream reported (x-usage-tokens) once it completed;
--                 release if the upstream failed before it started; markUnknown if it died
--                 mid-stream (tally keeps the units held until a report or the hard limit).
-- Follow-ups run in timers (cosockets are not available in the filter and log phases); a
-- follow-up waits for the start. Each call speaks HTTP/1.1 + JSON to tally-agent's Unix socket
-- (docs/protocol.md) and retries a 503 ("retry with the same id") with the same id.

local cjson = require("cjson.safe")
local semaphore = require("ngx.semaphore")

local _M = { socket = "/run/tally/agent-http.sock", route = "chat", default_estimate = 100 }

function _M.configure(options)
  for key, value in pairs(options) do
    _M[key] = value
  end
end

-- One HTTP exchange with the agent: {status, headers, body (decoded JSON)} or nil, error.
local function exchange(method, path, body)
  local sock = ngx.socket.tcp()
  sock:settimeout(5000)
  local ok, err = sock:connect("unix:" .. _M.socket)
  if not ok then
    return nil, "connect: " .. tostring(err)
  end
  local payload = body and cjson.encode(body) or ""
  local sent, send_err = sock:send(method .. " " .. path .. " HTTP/1.1\r\nHost: tally\r\n"
    .. "Connection: close\r\nContent-Type: application/json\r\nContent-Length: "
    .. #payload .. "\r\n\r\n" .. payload)
  if not sent then
    sock:close()
    return nil, "send: " .. tostring(send_err)
  end
  local line, line_err = sock:receive("*l")
  local status = line and tonumber(line:match("^HTTP/1%.%d (%d%d%d)"))
  if not status then
    sock:close()
    return nil, "status line: " .. tostring(line_err or line)
  end
  local headers = {}
  while true do
    local header, header_err = sock:receive("*l")
    if not header then
      sock:close()
      return nil, "headers: " .. tostring(header_err)
    end
    if header == "" then
      break
    end
    local name, value = header:match("^([^:]+):%s*(.-)%s*$")
    if name then
      headers[name:lower()] = value
    end
  end
  local length = tonumber(headers["content-length"] or "0") or 0
  local data = ""
  if length > 0 then
    local read, read_err = sock:receive(length)
    if not read then
      sock:close()
      return nil, "body: " .. tostring(read_err)
    end
    data = read
  end
  sock:close()
  return { status = status, headers = headers, body = cjson.decode(data) or {} }
end

-- Retries what may not have happened (503, a lost connection) with the same request.
local function call(method, path, body, attempts)
  local answer, err
  local backoff = 0.05
  for attempt = 1, attempts do
    answer, err = exchange(method, path, body)
    if answer and answer.status ~= 503 then
      return answer
    end
    if attempt < attempts then
      ngx.sleep(backoff)
      backoff = math.min(backoff * 2, 1)
    end
  end
  return answer, err
end

local function reservation_path(id, verb)
  return "/v1/reservations/" .. ngx.escape_uri(id) .. "/" .. verb
end

local function follow_up(t, verb, body)
  local answer, err = call("POST", reservation_path(t.id, verb), body, 20)
  if not answer then
    ngx.log(ngx.ERR, "tally ", verb, " ", t.id, ": ", err)
  elseif answer.status >= 300 then
    ngx.log(ngx.WARN, "tally ", verb, " ", t.id, ": HTTP ", answer.status, " ",
      tostring(answer.body.code))
  end
end

local function reply_json(status, object, headers)
  ngx.status = status
  ngx.header["Content-Type"] = "application/json"
  for name, value in pairs(headers or {}) do
    ngx.header[name] = value
  end
  ngx.say(cjson.encode(object))
  return ngx.exit(status)
end

function _M.access()
  local headers = ngx.req.get_headers()
  local key = headers["idempotency-key"] or ngx.var.request_id
  local estimate = tonumber(headers["x-max-tokens"] or "") or _M.default_estimate
  local id = "nginx:" .. key
  local answer, err = call("POST", "/v1/reservations", {
    reservationId = id,
    subject = headers["x-tenant"] or "anonymous",
    route = _M.route,
    units = estimate,
  }, 3)
  if not answer then
    return reply_json(503, { error = "capacity check unavailable", detail = err },
      { ["Retry-After"] = "1" })
  end
  if answer.status == 429 then
    return reply_json(429, answer.body, { ["Retry-After"] = answer.headers["retry-after"] })
  end
  if answer.status ~= 200 then
    return reply_json(answer.status, answer.body, { ["Retry-After"] = answer.headers["retry-after"] })
  end
  local state = answer.body.state
  if answer.body.duplicate and state ~= "RESERVED" and state ~= "STARTED" then
    -- This key was served already: do not run (or charge) it again.
    return reply_json(409, answer.body)
  end
  ngx.ctx.tally = { id = id, op = id, started = false, complete = false, start_done = semaphore.new(0) }
end

function _M.header_filter()
  local t = ngx.ctx.tally
  if not t or ngx.status >= 300 or not ngx.var.upstream_status then
    return
  end
  t.started = true
  ngx.timer.at(0, function()
    follow_up(t, "start", { operationId = t.op })
    t.start_done:post(1)
  end)
end

function _M.body_filter()
  local t = ngx.ctx.tally
  if t and ngx.arg[2] then
    t.complete = true
  end
end

function _M.log()
  local t = ngx.ctx.tally
  if not t then
    return
  end
  local usage = tonumber(ngx.var.upstream_http_x_usage_tokens or "")
  ngx.timer.at(0, function()
    if not t.started then
      follow_up(t, "release", {})
      return
    end
    t.start_done:wait(30)
    if t.complete and usage then
      follow_up(t, "settle", { operationId = t.op, actualUnits = usage })
    else
      follow_up(t, "unknown", { operationId = t.op })
    end
  end)
end

return _M
