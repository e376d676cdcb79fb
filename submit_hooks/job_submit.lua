-- SPDX-License-Identifier: GPL-2.0-or-later
--[[
gpushare job_submit.lua: make GPU requests right at submit time, or say why they cannot be.

The same rules as the Python package (gpushare.submit.rules); both pass the conformance
vectors in tests/vectors/. Lua 5.1 syntax, valid through 5.4: no goto, no integer division,
numbers always written with %d.

Cluster facts (GPU types, MIG profiles Slurm owns, MPS units per GPU, NVLink domains,
policy) are read once when slurmctld loads this script (start-up, and whenever it re-reads
the script because its mtime changed: touch it after rendering new facts), from the JSON
file rendered by `gpushare render facts`. Nothing is read per
job. Slurm's Lua has no JSON library, so a strict JSON decoder lives below: it refuses what
Python's json module refuses (bad numbers, raw control characters in strings, NaN), keeps
numbers written with a fraction or exponent apart from integers, and null apart from a
missing key. The facts are then validated by the same checks, in the same order and with
the same messages, as gpushare.submit.facts (tests/vectors/facts_loading.json runs both).

Return codes: 2072 (ESLURM_INVALID_GRES) for every rejection the rules make (they all
concern the GPU request); slurm.ERROR only when policy.on_error is "reject" and the hook
itself failed. An internal error never reaches slurmctld: it is caught, logged, and the
job is accepted unchanged or rejected, as policy.on_error says. Without readable facts
the hook logs at load and accepts every job unchanged; so it does with facts rendered for
another Slurm release than its slurmctld's (`slurmctld -V`, asked at load). The same
release decides the few rules that differ by it: GPUs per node asked twice are refused from
26.05, and on topology/block (segment_size, seen from 25.11) a user's --segment that Slurm
before 25.11 could not place.
]]

local FACTS_PATH = "/etc/slurm/gpushare-facts.json"
local facts_path = os.getenv("GPUSHARE_FACTS") or FACTS_PATH
local slurmctld_path = os.getenv("GPUSHARE_SLURMCTLD") or "/usr/sbin/slurmctld"

local NO_VAL = 4294967294
local NO_VAL16 = 65534
local ESLURM_INVALID_GRES = 2072
local MAX_COUNT = 4294967293
local SPANK_OPTION_PREFIX = "_SLURM_SPANK_OPTION_gpushare_"
local GRES_FIELDS = {
   {"tres_per_node", "--gres"},
   {"tres_per_job", "--gpus"},
   {"tres_per_task", "--gpus-per-task"},
   {"tres_per_socket", "--gpus-per-socket"},
}
local FLAG_OF = {}
for _, f in ipairs(GRES_FIELDS) do FLAG_OF[f[1]] = f[2] end
local PLAIN_TRES = {cpu = true, mem = true, node = true, billing = true, energy = true,
                    vmem = true, pages = true}
local SHARING = {gpu = true, mps = true, shard = true}
local SUFFIX = {[""] = 1.0, k = 1024.0, m = 1048576.0, g = 1073741824.0,
                t = 1099511627776.0, p = 1125899906842624.0}

-- Plain-text split that keeps empty pieces (string.gmatch differs across Lua versions).
local function split(text, sep)
   local out, start = {}, 1
   while true do
      local at = string.find(text, sep, start, true)
      if not at then
         out[#out + 1] = string.sub(text, start)
         return out
      end
      out[#out + 1] = string.sub(text, start, at - 1)
      start = at + #sep
   end
end

local function fmt_int(n)
   return string.format("%d", n)
end

local function concat_lists(a, b)
   local out = {}
   for _, v in ipairs(a) do out[#out + 1] = v end
   for _, v in ipairs(b) do out[#out + 1] = v end
   return out
end

local function join(list, sep)
   return table.concat(list, sep)
end

---------------------------------------------------------------------------------------------
-- A JSON decoder for the facts file: objects, arrays, strings, numbers, true/false/null.
---------------------------------------------------------------------------------------------

local decode_value
local JSON_NULL = {}  -- null, kept apart from a missing key
local OBJECT_MT, ARRAY_MT = {}, {}  -- {} and [] stay apart
local function json_float(value) return {json_float = value} end  -- 1.0, 1e2: not integers

local function skip_ws(s, i)
   local _, e = string.find(s, "^[ \t\r\n]*", i)
   return e + 1
end

local function json_error(i, what)
   error({facts_error = "not valid JSON (byte " .. fmt_int(i) .. ": " .. what .. ")"}, 0)
end

local ESCAPES = {['"'] = '"', ["\\"] = "\\", ["/"] = "/", b = "\b", f = "\f", n = "\n",
                 r = "\r", t = "\t"}

local function utf8_char(code)
   if code < 128 then return string.char(code) end
   if code < 2048 then
      return string.char(192 + math.floor(code / 64), 128 + code % 64)
   end
   return string.char(224 + math.floor(code / 4096), 128 + math.floor(code / 64) % 64,
                      128 + code % 64)
end

local function decode_string(s, i)
   local parts, j = {}, i + 1
   while true do
      local c = string.sub(s, j, j)
      if c == "" then json_error(i, "unterminated string") end
      if c == '"' then return join(parts, ""), j + 1 end
      if string.byte(c) < 32 then json_error(j, "control character in a string") end
      if c == "\\" then
         local e = string.sub(s, j + 1, j + 1)
         if e == "u" then
            local hex = string.sub(s, j + 2, j + 5)
            if not string.match(hex, "^%x%x%x%x$") then json_error(j, "bad \\u escape") end
            parts[#parts + 1] = utf8_char(tonumber(hex, 16))
            j = j + 6
         elseif ESCAPES[e] then
            parts[#parts + 1] = ESCAPES[e]
            j = j + 2
         else
            json_error(j, "bad escape")
         end
      else
         parts[#parts + 1] = c
         j = j + 1
      end
   end
end

decode_value = function(s, i)
   i = skip_ws(s, i)
   local c = string.sub(s, i, i)
   if c == "{" then
      local obj = setmetatable({}, OBJECT_MT)
      i = skip_ws(s, i + 1)
      if string.sub(s, i, i) == "}" then return obj, i + 1 end
      while true do
         if string.sub(s, i, i) ~= '"' then json_error(i, "expected a key") end
         local key
         key, i = decode_string(s, i)
         i = skip_ws(s, i)
         if string.sub(s, i, i) ~= ":" then json_error(i, "expected ':'") end
         local value
         value, i = decode_value(s, i + 1)
         obj[key] = value
         i = skip_ws(s, i)
         local d = string.sub(s, i, i)
         if d == "}" then return obj, i + 1 end
         if d ~= "," then json_error(i, "expected ',' or '}'") end
         i = skip_ws(s, i + 1)
      end
   elseif c == "[" then
      local arr = setmetatable({}, ARRAY_MT)
      i = skip_ws(s, i + 1)
      if string.sub(s, i, i) == "]" then return arr, i + 1 end
      while true do
         arr[#arr + 1], i = decode_value(s, i)
         i = skip_ws(s, i)
         local d = string.sub(s, i, i)
         if d == "]" then return arr, i + 1 end
         if d ~= "," then json_error(i, "expected ',' or ']'") end
         i = i + 1
      end
   elseif c == '"' then
      return decode_string(s, i)
   elseif string.sub(s, i, i + 3) == "true" then
      return true, i + 4
   elseif string.sub(s, i, i + 4) == "false" then
      return false, i + 5
   elseif string.sub(s, i, i + 3) == "null" then
      return JSON_NULL, i + 4
   end
   -- JSON's number grammar: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][-+]?[0-9]+)?
   local int = string.match(s, "^-?%d+", i)
   if not int or string.match(int, "^-?0%d") then json_error(i, "unexpected character") end
   local j = i + #int
   local frac = string.match(s, "^%.%d+", j)
   if string.sub(s, j, j) == "." and not frac then json_error(j, "bad number") end
   if frac then j = j + #frac end
   local exp = string.match(s, "^[eE][-+]?%d+", j)
   if string.match(string.sub(s, j, j), "[eE]") and not exp then json_error(j, "bad number") end
   if exp then j = j + #exp end
   local value = tonumber(string.sub(s, i, j - 1))
   if frac or exp then return json_float(value), j end
   return value, j
end

local function decode_json(text)
   local value, i = decode_value(text, 1)
   if skip_ws(text, i) <= #text then json_error(i, "trailing data") end
   return value
end

---------------------------------------------------------------------------------------------
-- Facts: loaded and checked once.
---------------------------------------------------------------------------------------------

-- The checks of gpushare.submit.facts.facts_from_dict, in its order, with its messages.
local MAX_INT = 4294967293
local MAX_WAIT_S = 7 * 86400

local function facts_error(text)
   error({facts_error = text}, 0)
end

local function is_object(v)
   return type(v) == "table" and getmetatable(v) == OBJECT_MT
end

local function is_array(v)
   return type(v) == "table" and getmetatable(v) == ARRAY_MT
end

-- Byte order, as Python sorts str keys (table.sort's default follows the C locale).
local function byte_less(a, b)
   local n = math.min(#a, #b)
   for i = 1, n do
      local x, y = string.byte(a, i), string.byte(b, i)
      if x ~= y then return x < y end
   end
   return #a < #b
end

local function need(data, key, where)
   where = where or ""
   if data[key] == nil then facts_error('"' .. where .. key .. '" is missing') end
   return data[key]
end

local function whole(v, key, minimum, maximum)
   maximum = maximum or MAX_INT
   if type(v) ~= "number" or v ~= math.floor(v) or v < minimum or v > maximum then
      facts_error('"' .. key .. '" must be a whole number from ' .. fmt_int(minimum) .. " to "
                  .. fmt_int(maximum))
   end
   return v
end

local function names(v, key)
   local ok = is_array(v)
   if ok then
      for i = 1, #v do
         if type(v[i]) ~= "string" or v[i] == "" then ok = false end
      end
   end
   if not ok then facts_error('"' .. key .. '" must be a list of non-empty strings') end
   local out = {}
   for i = 1, #v do out[i] = v[i] end
   return out
end

local function object(v, key, what)
   if not is_object(v) then facts_error('"' .. key .. '" must be an object of ' .. what) end
   return v
end

local function sorted_keys(t)
   local keys = {}
   for k in pairs(t) do keys[#keys + 1] = k end
   table.sort(keys, byte_less)
   return keys
end

local function member(list, value)
   for _, v in ipairs(list) do
      if v == value then return true end
   end
   return false
end

local function type_facts(v, key)
   local entry = object(v, key, "nodes, per_node and domain_sizes")
   local nodes = whole(need(entry, "nodes", key .. "."), key .. ".nodes", 1)
   local per_node = whole(need(entry, "per_node", key .. "."), key .. ".per_node", 1)
   local raw = need(entry, "domain_sizes", key .. ".")
   if not is_array(raw) then
      facts_error('"' .. key .. '.domain_sizes" must be a list of node counts')
   end
   local sizes, total = {}, 0
   for i = 1, #raw do
      sizes[i] = whole(raw[i], key .. ".domain_sizes", 1)
      total = total + sizes[i]
   end
   if total > nodes then
      facts_error('"' .. key .. '.domain_sizes" add up to more than "' .. key .. '.nodes" ('
                  .. fmt_int(nodes) .. ")")
   end
   table.sort(sizes, function(a, b) return a > b end)
   return {nodes = nodes, per_node = per_node, domain_sizes = sizes}
end

local function check_facts(data)
   if not is_object(data) then facts_error("the top level must be a JSON object") end
   if need(data, "version") ~= 2 then
      facts_error('"version" must be 2; render the file again with this gpushare')
   end
   local syntax = need(data, "gres_syntax")
   if syntax ~= "22.05" and syntax ~= "23.11" then
      facts_error('"gres_syntax" must be one of 22.05, 23.11')
   end
   local units = whole(need(data, "mps_units_per_gpu"), "mps_units_per_gpu", 1)
   local gpu_types = names(need(data, "gpu_types"), "gpu_types")
   local mig_types = names(need(data, "mig_types"), "mig_types")
   local raw_types = object(need(data, "types"), "types", "GRES type to its facts")
   local all_types = concat_lists(gpu_types, mig_types)
   local wanted = {}
   for _, name in ipairs(all_types) do wanted[name] = true end
   for _, name in ipairs(sorted_keys(wanted)) do
      if raw_types[name] == nil then facts_error('"types.' .. name .. '" is missing') end
   end
   local types = {}
   for _, name in ipairs(sorted_keys(raw_types)) do
      if not wanted[name] then
         facts_error('"types.' .. name .. '" is in neither "gpu_types" nor "mig_types"')
      end
      types[name] = type_facts(raw_types[name], "types." .. name)
   end
   local domains = object(need(data, "domains"), "domains", "domain name to node names")
   local sizes = {}
   for _, name in ipairs(sorted_keys(domains)) do
      sizes[#sizes + 1] = #names(domains[name], "domains." .. name)
   end
   table.sort(sizes, function(a, b) return a > b end)
   local gpn = object(need(data, "gpus_per_node"), "gpus_per_node", "node name to GPU count")
   local most = 0
   for _, node in ipairs(sorted_keys(gpn)) do
      most = math.max(most, whole(gpn[node], "gpus_per_node." .. node, 0))
   end
   local policy = object(need(data, "policy"), "policy", "policy keys")
   local wait = whole(need(policy, "switch_wait_s", "policy."), "policy.switch_wait_s", 0,
                      MAX_WAIT_S)
   local max_wait = whole(need(policy, "max_switch_wait_s", "policy."),
                          "policy.max_switch_wait_s", 0, MAX_WAIT_S)
   if wait > max_wait then
      facts_error('"policy.switch_wait_s" (' .. fmt_int(wait) .. ') must not exceed '
                  .. '"policy.max_switch_wait_s" (' .. fmt_int(max_wait) .. ")")
   end
   local on_error = need(policy, "on_error", "policy.")
   if on_error ~= "accept" and on_error ~= "reject" then
      facts_error('"policy.on_error" must be one of accept, reject')
   end
   local untyped = need(policy, "untyped_gpu", "policy.")
   if type(untyped) ~= "string" or (untyped ~= "whole" and untyped ~= "any"
                                    and not member(gpu_types, untyped)) then
      facts_error('"policy.untyped_gpu" must be whole, any or one of "gpu_types"')
   end
   local topology = data.topology
   if topology == nil then topology = "tree" end
   if topology ~= "tree" and topology ~= "block" then
      facts_error('"topology" must be one of tree, block')
   end
   local whole_feature = data.whole_gpu_feature
   if whole_feature == nil then whole_feature = "" end
   if type(whole_feature) ~= "string"
      or (whole_feature ~= "" and not string.match(whole_feature, "^[%w_%.%-]+$")) then
      facts_error('"whole_gpu_feature" must be a node feature name (letters, digits, _, . and -)')
   end
   local lower_gpu = {}
   for i, g in ipairs(gpu_types) do lower_gpu[i] = string.lower(g) end
   return {
      gres_syntax = syntax,
      gres_prefix = (syntax == "22.05") and "gres:" or "gres/",
      units = units,
      gpu_types = gpu_types,
      mig_types = mig_types,
      lower_gpu_types = lower_gpu,
      all_types = all_types,
      types = types,
      domain_sizes = sizes,
      most_gpus_per_node = most,
      switch_wait_s = wait,
      max_switch_wait_s = max_wait,
      on_error = on_error,
      untyped_gpu = untyped,
      topology = topology,
      whole_gpu_feature = whole_feature,
   }
end

local function load_facts(path)
   local handle, err = io.open(path, "r")
   if not handle then
      facts_error("cannot read (" .. tostring(err) .. "); render it with "
                  .. "`gpushare render facts --plan FILE`")
   end
   local text = handle:read("*a")
   handle:close()
   return check_facts(decode_json(text))
end

---------------------------------------------------------------------------------------------
-- GRES strings (gpushare.submit.gres).
---------------------------------------------------------------------------------------------

local function parse_count(text)
   local digits, suffix = string.match(text, "^(%d+)([kKmMgGtTpP]?)$")
   if not digits then return nil end
   local n = tonumber(digits) * 1.0 * SUFFIX[string.lower(suffix)]
   if n > MAX_COUNT then return nil end
   return math.floor(n)
end

local function gres_error(raw, count_missing)
   error({gres_item = raw, count_missing = count_missing}, 0)
end

local function parse_item(raw)
   local text, prefix = raw, ""
   local head5 = string.sub(text, 1, 5)
   if head5 == "gres:" or head5 == "gres/" then
      prefix, text = head5, string.sub(text, 6)
   else
      local head = string.match(text, "^[^:=/]*")
      local first = split(split(text, ":")[1], "=")[1]
      if string.find(first, "/", 1, true) or PLAIN_TRES[string.lower(head)] then
         return {name = head, is_gres = false, raw = raw}
      end
   end
   local sep, count, type_ = ":", 1, nil
   local eq = string.find(text, "=", 1, true)
   if eq then
      count = parse_count(string.sub(text, eq + 1))
      text, sep = string.sub(text, 1, eq - 1), "="
      if not count then gres_error(raw) end
   end
   local parts = split(text, ":")
   local name = parts[1]
   if not string.match(name, "^[A-Za-z][A-Za-z0-9_.%-]*$") then gres_error(raw) end
   if sep == "=" then
      if #parts > 2 then gres_error(raw) end
      type_ = parts[2]
   elseif #parts == 2 then
      if string.match(parts[2], "^%d+[kKmMgGtTpP]?$") then
         count = parse_count(parts[2])
         if not count then gres_error(raw) end
      elseif string.match(parts[2], "^%d") then
         gres_error(raw, true)  -- gpu:1g.10gb: slurmctld reads 1g as the count
      else
         type_ = parts[2]
      end
   elseif #parts == 3 then
      type_ = parts[2]
      count = parse_count(parts[3])
      if not count then gres_error(raw) end
   elseif #parts > 3 then
      gres_error(raw)
   end
   if type_ ~= nil and not string.match(type_, "^[A-Za-z0-9_.+%-]+$") then gres_error(raw) end
   return {name = name, type = type_, count = count, prefix = prefix, sep = sep,
           is_gres = true, raw = raw}
end

local function parse_field(value)
   local items = {}
   for i, part in ipairs(split(value, ",")) do items[i] = parse_item(part) end
   return items
end

local function format_item(item)
   if not item.is_gres then return item.raw end
   local typed = item.type and (item.name .. ":" .. item.type) or item.name
   return item.prefix .. typed .. item.sep .. fmt_int(item.count)
end

local function format_field(items)
   local out = {}
   for i, item in ipairs(items) do out[i] = format_item(item) end
   return join(out, ",")
end

local function user_value(field, item)
   if field == "tres_per_node" or item.name ~= "gpu" then
      local typed = item.type and (item.name .. ":" .. item.type) or item.name
      return typed .. ":" .. fmt_int(item.count)
   end
   if item.type then return item.type .. ":" .. fmt_int(item.count) end
   return fmt_int(item.count)
end

local function user_item(field, item)
   return FLAG_OF[field] .. "=" .. user_value(field, item)
end

local function user_form(field, items)
   local values = {}
   for _, item in ipairs(items) do
      if item.is_gres then values[#values + 1] = user_value(field, item) end
   end
   return FLAG_OF[field] .. "=" .. join(values, ",")
end

---------------------------------------------------------------------------------------------
-- The rules (gpushare.submit.rules).
---------------------------------------------------------------------------------------------

local function reject(flag, reason, fix)
   error({rejection = {code = ESLURM_INVALID_GRES,
                       text = "gpushare: " .. flag .. " " .. reason .. "; " .. fix}}, 0)
end

local function number(value)
   if type(value) == "string" then
      if not string.match(value, "^%d+$") then return nil end
      value = tonumber(value)
   end
   if type(value) ~= "number" or value ~= value or value == math.huge
      or value == -math.huge then
      return nil
   end
   if value < 0 then value = math.ceil(value) else value = math.floor(value) end
   if value == NO_VAL or value == NO_VAL16 then return nil end
   return value
end

local function format_wait(seconds)
   local days = math.floor(seconds / 86400)
   local rest = seconds % 86400
   local hours, minutes, secs = math.floor(rest / 3600), math.floor(rest % 3600 / 60), rest % 60
   if days > 0 then
      return string.format("%d-%02d:%02d:%02d", days, hours, minutes, secs)
   end
   if hours > 0 then return string.format("%d:%02d:%02d", hours, minutes, secs) end
   return string.format("%d:%02d", minutes, secs)
end

local function spank_options(env)
   local options = {}
   if type(env) ~= "table" then return options end
   for key, value in pairs(env) do
      local name, val
      if type(key) == "string" then
         name = key
         if value == nil then val = "" else val = tostring(value) end
      elseif type(value) == "string" then
         local at = string.find(value, "=", 1, true)
         if at then name, val = string.sub(value, 1, at - 1), string.sub(value, at + 1) end
      end
      if name and string.sub(name, 1, #SPANK_OPTION_PREFIX) == SPANK_OPTION_PREFIX then
         options[string.sub(name, #SPANK_OPTION_PREFIX + 1)] = val
      end
   end
   return options
end

local function is_profile_core(text)
   local core = text
   if string.sub(text, -3) == "+me" then core = string.sub(text, 1, -4) end
   local parts = split(core, ".")
   local n = #parts
   if n ~= 2 and n ~= 3 then return false end
   if not string.match(parts[n], "^%d+gb$") then return false end
   if not string.match(parts[n - 1], "^%d+g$") then return false end
   if n == 3 then return string.match(parts[1], "^%d+c$") ~= nil end
   return true
end

local function mig_profile(type_name)
   local pieces = split(string.lower(type_name), "_")
   local core = pieces[#pieces]
   if is_profile_core(core) then return core end
   return nil
end

local function listing(names)
   if #names == 0 then return "none" end
   return join(names, ", ")
end

local function example(field, name, type_, count)
   return user_item(field, {name = name, type = type_, count = math.max(count, 1)})
end

local function distance(a, b)
   local previous = {}
   for j = 0, #b do previous[j] = j end
   for i = 1, #a do
      local current = {[0] = i}
      local ca = string.byte(a, i)
      for j = 1, #b do
         local cost = (ca == string.byte(b, j)) and 0 or 1
         current[j] = math.min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost)
      end
      previous = current
   end
   return previous[#b]
end

local function nearest(wanted, names)
   local lowered = string.lower(wanted)
   local best, best_distance = names[1], distance(lowered, string.lower(names[1]))
   for i = 2, #names do
      local d = distance(lowered, string.lower(names[i]))
      if d < best_distance then best, best_distance = names[i], d end
   end
   return best
end

-- untyped_type's answer for a request kept whole by the node feature, not by a type.
local BY_FEATURE = {}

local function untyped_type(field, item, facts, constrain)
   local policy = facts.untyped_gpu
   if policy == "any" then return nil end
   if policy ~= "whole" then return policy end
   if #facts.mig_types == 0 then return nil end
   if #facts.gpu_types == 1 then return facts.gpu_types[1] end
   local flag = user_item(field, item)
   if #facts.gpu_types == 0 then
      reject(flag, "asks for a whole GPU, and Slurm has only MIG slices here ("
             .. listing(facts.mig_types) .. ")", "ask for a slice by its profile, e.g. "
             .. example(field, "gpu", facts.mig_types[1], item.count))
   end
   if facts.whole_gpu_feature ~= "" and constrain then return BY_FEATURE end
   local where = ""
   if facts.whole_gpu_feature == "" then
      where = ", and a node has both whole GPUs and MIG slices for Slurm"
   end
   reject(flag, "does not say which GPU, and here it could get a MIG slice (whole GPUs: "
          .. listing(facts.gpu_types) .. "; MIG: " .. listing(facts.mig_types) .. where
          .. ")", "name the type, e.g. " .. example(field, "gpu", facts.gpu_types[1],
                                                     item.count))
end

-- constraint and feature both required: "a|b" -> "(a|b)&feature".
local function with_feature(constraint, feature)
   local old = constraint
   if type(old) ~= "string" then old = "" end
   old = string.match(old, "^%s*(.-)%s*$")
   if old == "" or old == "(null)" then return feature end
   local words = string.gsub(old, "[%(%)%[%]|]", "&")
   for word in string.gmatch(words, "[^&]+") do
      if word == feature then return old end
   end
   if string.find(old, "|", 1, true) then old = "(" .. old .. ")" end
   return old .. "&" .. feature
end

local function normalise_type(field, item, facts)
   local wanted = string.lower(item.type)
   local mig_allowed = item.name == "gpu"
   local valid = facts.gpu_types
   if mig_allowed then valid = facts.all_types end
   for _, name in ipairs(valid) do
      if string.lower(name) == wanted then return name end
   end
   local flag = user_item(field, item)
   local profile = mig_profile(item.type)
   if mig_allowed and profile ~= nil then
      local owners = {}
      for _, m in ipairs(facts.mig_types) do
         if mig_profile(m) == profile then owners[#owners + 1] = m end
      end
      if #owners == 1 then return owners[1] end
      if #owners > 1 then
         reject(flag, "names MIG profile " .. profile .. ", which Slurm has here as several "
                .. "types (" .. listing(owners) .. ")",
                "name one of them, e.g. --gres=gpu:" .. owners[1] .. ":1")
      end
      if #facts.mig_types == 0 then
         reject(flag, "asks for MIG profile " .. profile .. ", but Slurm has no MIG slices "
                .. "here", "ask for whole GPUs instead, e.g. "
                .. example(field, "gpu", nil, item.count))
      end
      local ex = example(field, "gpu", nearest(profile, facts.mig_types), item.count)
      reject(flag, "asks for MIG profile " .. profile .. ", which Slurm does not own here "
             .. "(Slurm owns: " .. listing(facts.mig_types) .. ")",
             "ask for one of those, e.g. " .. ex)
   end
   local tokens = {}
   for _, t in ipairs(split(wanted, "_")) do tokens[t] = true end
   local matches = {}
   for i, g in ipairs(facts.gpu_types) do
      if tokens[facts.lower_gpu_types[i]] then matches[#matches + 1] = g end
   end
   if #matches == 1 then return matches[1] end
   local kind = ""
   if item.name ~= "gpu" then kind = " for " .. item.name end
   local fix
   if #valid > 0 then
      fix = "ask for one of those, e.g. "
         .. example(field, item.name, nearest(wanted, valid), item.count)
   else
      fix = "ask without a type, e.g. " .. example(field, item.name, nil, item.count)
   end
   reject(flag, "asks for GPU type " .. item.type .. ", which this cluster does not have "
          .. "(valid types" .. kind .. ": " .. listing(valid) .. ")", fix)
end

local function fewest_domains(nodes, sizes)
   local total = 0
   for used, size in ipairs(sizes) do
      total = total + size
      if total >= nodes then return used end
   end
   return #sizes
end

local function domains_reason(what, domains, largest)
   if domains == 1 then return what .. " fit in one NVLink domain" end
   return what .. " need " .. fmt_int(domains) .. " NVLink domains of at most "
      .. fmt_int(largest) .. " nodes"
end

local function candidate_types(asked, facts)
   local out, seen = {}, {}
   for _, pair in ipairs(asked) do
      local item, choices = pair[2], nil
      if item.type ~= nil then
         choices = {item.type}
      elseif item.name == "gpu" and facts.untyped_gpu == "any" then
         choices = facts.all_types
      else
         choices = facts.gpu_types
      end
      for _, name in ipairs(choices) do
         if facts.types[name] ~= nil and not seen[name] then
            seen[name] = true
            out[#out + 1] = name
         end
      end
   end
   return out
end

local function gpu_total(job, fields)
   local total = 0
   for _, it in ipairs(fields.tres_per_job or {}) do
      if it.is_gres and it.name == "gpu" then total = total + it.count end
   end
   local tasks = number(job.num_tasks)
   if tasks ~= nil and tasks > 0 then
      for _, it in ipairs(fields.tres_per_task or {}) do
         if it.is_gres and it.name == "gpu" then total = total + tasks * it.count end
      end
   end
   return total
end

local function switches_text(count, wait)
   if wait == nil then return fmt_int(count) end
   return fmt_int(count) .. "@" .. format_wait(wait)
end

local function share_flag(mps_items, share_text)
   if #mps_items > 0 then return user_item(mps_items[1][1], mps_items[1][2]) end
   return "--gpu-share=" .. share_text
end

local function first_prefix(items, default)
   for _, it in ipairs(items) do
      if it.is_gres and it.prefix ~= "" then return it.prefix end
   end
   return default
end

local function same_items(a, b)
   if #a ~= #b then return false end
   for i = 1, #a do
      if a[i] ~= b[i] then return false end
   end
   return true
end

local function set_change(changes, order, field, value)
   if changes[field] == nil then order[#order + 1] = field end
   changes[field] = value
end

-- The running slurmctld is known to be release major.minor (as major * 100 + minor) or
-- later / older; an unknown release (nil) is neither (gpushare.submit.base).
local function at_least(running, wanted)
   return running ~= nil and running.major * 100 + running.minor >= wanted
end

local function before(running, wanted)
   return running ~= nil and running.major * 100 + running.minor < wanted
end

-- Two gpu items of tres_per_node asking for the same GPUs: one without a type, or both of
-- one type; what --gpus-per-node beside --gres=gpu gives slurmctld (rules._gpus_twice).
local function gpus_twice(items)
   local gpus = {}
   for _, it in ipairs(items) do
      if it.is_gres and it.name == "gpu" then gpus[#gpus + 1] = it end
   end
   for i = 1, #gpus do
      for j = i + 1, #gpus do
         if gpus[i].type == nil or gpus[j].type == nil
            or string.lower(gpus[i].type) == string.lower(gpus[j].type) then
            return true
         end
      end
   end
   return false
end

-- Slurm 26.05 refuses --gres=gpu:N with --gpus-per-node: say what to type.
local function refuse_gpus_twice(asked, items)
   if not gpus_twice(items) then return end
   local shown, last = {}, nil
   for _, it in ipairs(asked) do
      if it.is_gres and it.name == "gpu" then shown[#shown + 1] = it end
   end
   for _, it in ipairs(items) do
      if it.is_gres and it.name == "gpu" then last = it end
   end
   local per_node = fmt_int(last.count)
   if last.type then per_node = last.type .. ":" .. per_node end
   reject(user_form("tres_per_node", shown), "asks for the GPUs of each node twice (as "
          .. "--gpus-per-node with --gres=gpu does), and Slurm 26.05 no longer takes both",
          "ask once, e.g. " .. user_item("tres_per_node", last) .. " or --gpus-per-node="
          .. per_node)
end

-- topology/block (gpushare.submit.placement): job_desc bitflags of Slurm 25.11, unused
-- before it (slurm.SPREAD_SEGMENTS: each segment on base blocks of its own).
local SPREAD_SEGMENTS = 2 ^ 43

-- One bit (2^n) of bitflags: a uint64 in slurmctld, a double here.
local function bit_set(value, bit)
   if type(value) ~= "number" or value ~= value or value == math.huge or value < 0 then
      return false
   end
   return math.floor(value / bit) % 2 == 1
end

-- Whether the job names its nodes (-w/--nodelist: req_nodes).
local function names_nodes(job)
   local value = job.req_nodes
   if type(value) ~= "string" then return false end
   value = string.match(value, "^[ \t\n\v\f\r]*(.-)[ \t\n\v\f\r]*$")
   return value ~= "" and value ~= "(null)"
end

-- The largest segment that divides nodes and fits in block nodes.
local function largest_segment(nodes, block)
   if nodes <= block then return nodes end
   for size = block, 1, -1 do
      if nodes % size == 0 then return size end
   end
   return 1
end

-- The user's own --segment: kept, unless Slurm before 25.11 could never place it.
local function users_segment(job, nodes, given, base, notes, running)
   if given > base then
      if before(running, 2511) then
         local better = largest_segment(nodes, base)
         local fix = "drop --segment"
         if better > 1 then fix = "ask for one that fits, e.g. --segment=" .. fmt_int(better) end
         reject("--segment=" .. fmt_int(given), "is larger than a block here ("
                .. fmt_int(base) .. " nodes), and Slurm before 25.11 places a segment only "
                .. "inside one block", fix)
      end
      notes[#notes + 1] = "--segment=" .. fmt_int(given) .. " kept, though larger than the "
         .. "base block here (" .. fmt_int(base) .. " nodes): a segment may then span "
         .. "several NVLink domains"
      return
   end
   if names_nodes(job) and nodes > given and before(running, 2511) then
      reject("--segment=" .. fmt_int(given), "splits the job's " .. fmt_int(nodes) .. " nodes "
             .. "into segments, and Slurm before 25.11 cannot place segments on the nodes -w "
             .. "names", "drop -w or --segment")
   end
end

-- --segment keeps each segment of the job's nodes in one block (NVLink domain). Only where
-- the job_desc has segment_size (job_submit/lua from 25.11); a user's own is kept, none
-- is added to a job that names its nodes, and with --spread-segments only one that leaves
-- each segment a block of its own.
-- Whether ``nodes`` are more than all NVLink domains hold; then ``flag`` is not set, and
-- the note says why.
local function beyond_domains(nodes, sizes, flag, what, notes)
   local held = 0
   for _, size in ipairs(sizes) do held = held + size end
   if nodes <= held then return false end
   notes[#notes + 1] = "no " .. flag .. ": " .. what .. " are more than the NVLink domains hold ("
      .. fmt_int(held) .. " nodes)"
   return true
end

local function segment(job, facts, nodes, what, sizes, changes, order, notes, running)
   if job.segment_size == nil then return end  -- before 25.11: Slurm's block placement alone
   local given = number(job.segment_size)
   local all = facts.domain_sizes
   if #all == 0 then all = sizes end
   local base = all[#all]  -- the base block: BlockSizes' first
   if given ~= nil and given ~= 0 then
      users_segment(job, nodes, given, base, notes, running)
      return
   end
   if names_nodes(job) then
      notes[#notes + 1] = "no --segment: the job names its nodes (-w)"
      return
   end
   if beyond_domains(nodes, sizes, "--segment", what, notes) then return end
   local block = sizes[#sizes]
   local size = largest_segment(nodes, block)
   if size <= 1 then
      notes[#notes + 1] = "no --segment: " .. what .. " do not split evenly into NVLink "
         .. "domains of " .. fmt_int(block) .. " nodes"
      return
   end
   local count = nodes / size
   if bit_set(job.bitflags, SPREAD_SEGMENTS) and count > #sizes then
      notes[#notes + 1] = "no --segment: --spread-segments puts each segment in a block of "
         .. "its own, and " .. what .. " need " .. fmt_int(count) .. " segments of "
         .. fmt_int(size) .. " nodes (" .. fmt_int(#sizes) .. " blocks here)"
      return
   end
   set_change(changes, order, "segment_size", size)
   if size == nodes then
      notes[#notes + 1] = "--segment=" .. fmt_int(size) .. " (" .. what
         .. " fit in one NVLink domain)"
   else
      notes[#notes + 1] = "--segment=" .. fmt_int(size) .. " (" .. what .. " in segments of "
         .. fmt_int(size) .. ", each in one NVLink domain of " .. fmt_int(block) .. " nodes)"
   end
end

-- Returns changes (field -> value), their order, and the notes for the user's line.
local function check(job, facts, constrain, running)
   local changes, order, notes = {}, {}, {}
   local units = facts.units

   -- 1. Every GRES field parses.
   local fields = {}
   for _, f in ipairs(GRES_FIELDS) do
      local value = job[f[1]]
      if value ~= nil and value ~= "" then
         local ok, res = pcall(parse_field, tostring(value))
         if not ok then
            if type(res) == "table" and res.gres_item then
               local shown = res.gres_item
               local head5 = string.sub(shown, 1, 5)
               if head5 == "gres:" or head5 == "gres/" then shown = string.sub(shown, 6) end
               if res.count_missing then
                  local colon = string.find(shown, ":", 1, true)
                  if string.sub(shown, 1, colon - 1) == "mps" then
                     -- mps has no types: "mps:25x" is a mistyped count, never a type.
                     reject(f[2] .. ' item "' .. shown .. '"', "is not a whole number of mps "
                            .. "units", "write the share's units alone, e.g. "
                            .. example(f[1], "mps", nil, 25))
                  end
                  reject(f[2] .. ' item "' .. shown .. '"', "has no count, and Slurm reads a "
                         .. "type that starts with a digit as a count",
                         "write the count after it, e.g. "
                         .. example(f[1], string.sub(shown, 1, colon - 1),
                                    string.sub(shown, colon + 1), 1))
               end
               reject(f[2] .. ' item "' .. shown .. '"', "is not a GRES request Slurm "
                      .. "understands", "write name[:type][:count], e.g. "
                      .. example("tres_per_node", "gpu", facts.gpu_types[1], 2))
            end
            error(res, 0)
         end
         fields[f[1]] = res
      end
   end

   local asked_per_node = fields.tres_per_node or {}

   -- 2. gpushare's own options.
   local options = spank_options(job.spank_job_env)
   local share_text = options.gpu_share
   local share_pct = nil
   if share_text ~= nil then
      if not string.match(share_text, "^%d+$") or #share_text > 6
         or tonumber(share_text) == 0 then
         reject("--gpu-share=" .. share_text, "is not a share of one GPU",
                "give a whole percent of one GPU from 1 to 100, e.g. --gpu-share=25")
      end
      share_pct = tonumber(share_text)
      if share_pct > 100 then
         reject("--gpu-share=" .. share_text, "asks for " .. string.format("%g", share_pct / 100)
                .. " GPUs; a share must fit on one GPU (at most --gpu-share=100)",
                "for more, ask for whole GPUs: --gres=gpu:" .. fmt_int(math.ceil(share_pct / 100)))
      end
   end
   local mps_text = options.gpu_mps
   local private_mps = false
   if mps_text ~= nil then
      -- A flag without a value reaches slurmctld 22.05 as "(null)".
      if mps_text ~= "" and mps_text ~= "(null)" and mps_text ~= "yes" and mps_text ~= "no" then
         reject("--gpu-mps=" .. mps_text, "is neither yes nor no",
                "write --gpu-mps to run a private MPS on your whole GPUs")
      end
      private_mps = mps_text ~= "no"
   end

   -- 3. GPU and MIG types, in the facts' spelling.
   for _, f in ipairs(GRES_FIELDS) do
      local items = fields[f[1]]
      if items then
         local new_items = {}
         local written_in = nil
         for i, item in ipairs(items) do
            new_items[i] = item
            local spelled = item.type
            if item.is_gres and SHARING[item.name] and item.type ~= nil then
               spelled = normalise_type(f[1], item, facts)
            elseif item.is_gres and item.name == "gpu" and item.count > 0 then
               spelled = untyped_type(f[1], item, facts, constrain)
               if spelled == BY_FEATURE then
                  spelled = item.type
                  if changes.features == nil then
                     local old = job.features
                     if type(old) ~= "string" then old = nil end
                     local new = with_feature(old, facts.whole_gpu_feature)
                     if new ~= old then
                        set_change(changes, order, "features", new)
                        local shown = ""
                        if old ~= nil and old ~= "" then
                           shown = "--constraint=" .. old .. " -> "
                        end
                        notes[#notes + 1] = user_item(f[1], item) .. ": " .. shown
                           .. "--constraint=" .. new .. " (a GPU without a type is a whole "
                           .. "GPU here: nodes with " .. facts.whole_gpu_feature
                           .. " have no MIG slice)"
                     end
                  end
               elseif spelled ~= nil then written_in = spelled end
            end
            if spelled ~= item.type then
               local copy = {}
               for k, v in pairs(item) do copy[k] = v end
               copy.type = spelled
               new_items[i] = copy
            end
         end
         if not same_items(items, new_items) then
            local prefix = first_prefix(items, facts.gres_prefix)
            for _, it in ipairs(new_items) do
               if it.is_gres and it.prefix == "" then
                  local copy = {}
                  for k, v in pairs(it) do copy[k] = v end
                  copy.prefix = prefix
                  new_items[_] = copy
               end
            end
            set_change(changes, order, f[1], format_field(new_items))
            local note = user_form(f[1], items) .. " -> " .. changes[f[1]]
            if written_in ~= nil then
               note = note .. " (a GPU without a type is a whole " .. written_in .. " here)"
            end
            notes[#notes + 1] = note
            fields[f[1]] = new_items
         end
      end
   end

   -- 3b. GPUs per node asked once: the rules never write a second gpu item into
   -- tres_per_node, and from 26.05 refuse a request that has two (before, Slurm took it).
   if at_least(running, 2605) then
      refuse_gpus_twice(asked_per_node, fields.tres_per_node or {})
   end

   -- 4. Shares: one GPU at most, never mixed with whole GPUs or shards.
   for _, f in ipairs(GRES_FIELDS) do
      for _, it in ipairs(fields[f[1]] or {}) do
         if it.is_gres and it.name == "mps" and it.count == 0 then
            reject(user_item(f[1], it), "is not a share of one GPU", "give a share from 1 to "
                   .. fmt_int(units) .. ", e.g. "
                   .. example(f[1], "mps", it.type, math.max(1, math.floor(units / 4))))
         end
      end
   end
   local asked, mps_items, gpu_items, shard_items = {}, {}, {}, {}
   local mps_total = 0
   for _, f in ipairs(GRES_FIELDS) do
      for _, it in ipairs(fields[f[1]] or {}) do
         if it.is_gres and SHARING[it.name] and it.count > 0 then
            local pair = {f[1], it}
            asked[#asked + 1] = pair
            if it.name == "mps" then
               mps_items[#mps_items + 1] = pair
               mps_total = mps_total + it.count
            elseif it.name == "gpu" then
               gpu_items[#gpu_items + 1] = pair
            else
               shard_items[#shard_items + 1] = pair
            end
         end
      end
   end
   local share_units = nil
   if share_pct ~= nil then
      share_units = math.max(1, math.floor(share_pct * units / 100))
   end
   local is_share = #mps_items > 0 or share_pct ~= nil

   if private_mps and is_share then
      reject("--gpu-mps", "runs a private MPS on whole GPUs and cannot be combined with a "
             .. "share (" .. share_flag(mps_items, share_text) .. ")",
             "ask for whole GPUs with it (e.g. --gres=gpu:1 --gpu-mps), or for the share alone")
   end
   if private_mps and #gpu_items == 0 then
      reject("--gpu-mps", "needs whole GPUs and this job asks for none",
             "add them, e.g. --gres=gpu:1 --gpu-mps")
   end
   if #mps_items > 0 and share_pct ~= nil and mps_total ~= share_units then
      reject("--gpu-share=" .. share_text, "and " .. share_flag(mps_items, nil)
             .. " ask for different shares (" .. fmt_int(share_pct) .. "% of a GPU is mps:"
             .. fmt_int(share_units) .. " here)",
             "give only one of them, e.g. --gpu-share=" .. share_text)
   end
   if is_share and (#gpu_items > 0 or #shard_items > 0) then
      local other = gpu_items[1] or shard_items[1]
      local what = (other[2].name == "gpu") and "whole GPUs" or "shards"
      -- The user's own whole-GPU request is the example: it keeps the type they chose.
      local whole = (other[2].name == "gpu") and user_item(other[1], other[2]) or "--gres=gpu:1"
      reject(share_flag(mps_items, share_text), "is a share of one GPU and cannot be combined "
             .. "with " .. what .. " (" .. user_item(other[1], other[2]) .. ")",
             "ask for the share alone, or for whole GPUs alone, e.g. " .. whole)
   end
   if mps_total > units then
      local flag
      if #mps_items == 1 then
         flag = user_item(mps_items[1][1], mps_items[1][2])
      else
         local list = {}
         for i, pair in ipairs(mps_items) do list[i] = pair[2] end
         flag = user_form(mps_items[1][1], list)
      end
      reject(flag, "asks for " .. string.format("%g", mps_total / units) .. " GPUs of MPS; a "
             .. "share must fit on one GPU (at most mps:" .. fmt_int(units) .. ")",
             "for more, ask for whole GPUs: --gres=gpu:" .. fmt_int(math.ceil(mps_total / units)))
   end
   if share_units ~= nil and #mps_items == 0 then
      local items = fields.tres_per_node or {}
      local prefix = first_prefix(items, facts.gres_prefix)
      local added = format_item({name = "mps", count = share_units, prefix = prefix, sep = ":",
                                 is_gres = true})
      local value = added
      if #items > 0 then
         local old = changes.tres_per_node
         if old == nil then old = tostring(job.tres_per_node) end
         value = old .. "," .. added
      end
      set_change(changes, order, "tres_per_node", value)
      notes[#notes + 1] = "--gpu-share=" .. share_text .. " -> " .. value
   end

   -- 5. Multi-node GPU jobs stay in the fewest NVLink domains of their GPU type, with a
   -- bounded wait. The node count is -N, or what the job's GPUs need without it.
   if #asked == 0 and share_pct == nil then return changes, order, notes end
   local candidates = candidate_types(asked, facts)
   local sizes, per_node = {}, 0
   if #candidates == 1 then
      sizes = facts.types[candidates[1]].domain_sizes
      per_node = facts.types[candidates[1]].per_node
   elseif #candidates > 1 then
      -- the job may get any of several types: every domain that holds one
      local held = false
      for _, name in ipairs(candidates) do
         if #facts.types[name].domain_sizes > 0 then held = true end
         per_node = math.max(per_node, facts.types[name].per_node)
      end
      if held then sizes = facts.domain_sizes end
   else
      sizes = facts.domain_sizes
      per_node = facts.most_gpus_per_node
   end
   local min_nodes = number(job.min_nodes) or 0
   local total = gpu_total(job, fields)
   local implied = 0
   if total > 0 and per_node > 0 then implied = math.ceil(total / per_node) end
   local nodes = math.max(min_nodes, implied)
   if nodes <= 1 then return changes, order, notes end
   local gpu_flag, what = nil, fmt_int(nodes) .. " nodes"
   if implied > min_nodes then
      for _, pair in ipairs(gpu_items) do
         if gpu_flag == nil and (pair[1] == "tres_per_job" or pair[1] == "tres_per_task") then
            gpu_flag = user_item(pair[1], pair[2])
         end
      end
      what = fmt_int(total) .. " GPUs (" .. fmt_int(nodes) .. " nodes of " .. fmt_int(per_node)
         .. ")"
   end
   if #candidates == 1 and nodes > facts.types[candidates[1]].nodes then
      local name = candidates[1]
      local have = facts.types[name].nodes
      if gpu_flag ~= nil then
         reject(gpu_flag, "needs " .. fmt_int(nodes) .. " nodes of at most " .. fmt_int(per_node)
                .. " " .. name .. " each, and this cluster has " .. fmt_int(have)
                .. " nodes with " .. name, "ask for at most " .. fmt_int(have * per_node)
                .. " GPUs")
      end
      reject("-N " .. fmt_int(nodes), "asks for " .. fmt_int(nodes) .. " nodes with " .. name
             .. ", and this cluster has " .. fmt_int(have), "ask for at most -N " .. fmt_int(have))
   end
   if #sizes == 0 then return changes, order, notes end
   -- topology/block ignores --switches: --segment instead.
   if facts.topology == "block" then
      segment(job, facts, nodes, what, sizes, changes, order, notes, running)
      return changes, order, notes
   end
   if beyond_domains(nodes, sizes, "--switches", what, notes) then
      return changes, order, notes
   end
   local need = fewest_domains(nodes, sizes)
   local req = number(job.req_switch)
   local wait = number(job.wait4switch)
   if req == nil then
      set_change(changes, order, "req_switch", need)
      if wait ~= facts.switch_wait_s then
         set_change(changes, order, "wait4switch", facts.switch_wait_s)
      end
      notes[#notes + 1] = "--switches=" .. fmt_int(need) .. "@"
         .. format_wait(facts.switch_wait_s) .. " (" .. domains_reason(what, need, sizes[1]) .. ")"
   else
      local reasons = {}
      local new_req, new_wait = req, wait
      if req < need then
         new_req = need
         set_change(changes, order, "req_switch", need)
         reasons[#reasons + 1] = domains_reason(what, need, sizes[1])
      end
      if wait ~= nil and wait > facts.max_switch_wait_s then
         new_wait = facts.max_switch_wait_s
         set_change(changes, order, "wait4switch", new_wait)
         reasons[#reasons + 1] = "the longest switch wait here is " .. format_wait(new_wait)
      end
      if #reasons > 0 then
         notes[#notes + 1] = "--switches=" .. switches_text(req, wait) .. " -> --switches="
            .. switches_text(new_req, new_wait) .. " (" .. join(reasons, ", ") .. ")"
      end
   end
   return changes, order, notes
end

-- The decision for one job: {changes, order, messages, reject = {code, text} or nil}.
-- running: the slurmctld's release ({major, minor, text}), nil when unknown.
local function apply(job, facts, constrain, running)
   if constrain == nil then constrain = true end
   local ok, changes, order, notes = pcall(check, job, facts, constrain, running)
   if not ok then
      local err = changes
      if type(err) == "table" and err.rejection then
         return {changes = {}, order = {}, messages = {err.rejection.text},
                 reject = err.rejection}
      end
      error(err, 0)
   end
   local messages = {}
   if #notes > 0 then messages[1] = "gpushare: " .. join(notes, "; ") end
   return {changes = changes, order = order, messages = messages}
end

---------------------------------------------------------------------------------------------
-- slurmctld entry points.
---------------------------------------------------------------------------------------------

-- The release of the slurmctld running this script, which job_submit/lua does not tell
-- it: the daemon's own -V (no configuration needed), asked once per load. nil when unknown.
local function running_release()
   local ok, handle = pcall(io.popen, slurmctld_path .. " -V 2>/dev/null")
   if not ok or not handle then return nil end
   local text = handle:read("*a") or ""
   handle:close()
   local major, minor, rest = string.match(text, "^slurm%S* (%d+)%.(%d+)([%.%d]*)")
   if not major then return nil end
   return {major = tonumber(major), minor = tonumber(minor), text = major .. "." .. minor .. rest}
end

local SYNTAX_RELEASES = {["22.05"] = "before 23.11", ["23.11"] = "23.11 or later"}
local SYNTAX_EXAMPLE = {["22.05"] = "gres:gpu:1", ["23.11"] = "gres/gpu:1"}

-- Why facts rendered for another Slurm release are refused (nil: they are this one's):
-- their request strings are the other release's, which slurmctld rejects in every job the
-- rules rewrite (gpushare.submit.hook.other_release says the same).
local function other_release(facts, running)
   if running == nil then return nil end
   local syntax = (running.major * 100 + running.minor < 2311) and "22.05" or "23.11"
   if facts.gres_syntax == syntax then return nil end
   return facts_path .. " was rendered for Slurm " .. SYNTAX_RELEASES[facts.gres_syntax]
      .. " (requests as " .. SYNTAX_EXAMPLE[facts.gres_syntax] .. "), but this slurmctld is "
      .. "Slurm " .. running.text .. " (requests as " .. SYNTAX_EXAMPLE[syntax] .. "): set "
      .. "slurm.version in the plan to this Slurm's release and render the facts again "
      .. "(gpushare render facts), then touch this script"
end

local FACTS, FACTS_ERROR = nil, nil
local RUNNING = running_release()  -- for the rules that differ by release, too
do
   local ok, res = pcall(load_facts, facts_path)
   local refused = ok and other_release(res, RUNNING)
   if refused then
      FACTS_ERROR = refused
      slurm.log_error("gpushare: refusing the facts: %s; jobs pass unchanged until then",
                      refused)
   elseif ok then
      FACTS = res
      slurm.log_info("gpushare: loaded cluster facts from %s", facts_path)
   else
      if type(res) == "table" and res.facts_error then
         FACTS_ERROR = facts_path .. ": " .. res.facts_error
      else
         FACTS_ERROR = facts_path .. ": " .. tostring(res)
      end
      slurm.log_error("gpushare: %s; jobs pass unchanged until it is fixed", FACTS_ERROR)
   end
end

local function decide(job_desc)
   local decision = apply(job_desc, FACTS, true, RUNNING)
   if decision.reject then
      slurm.log_user("%s", decision.messages[1])
      return decision.reject.code
   end
   for _, field in ipairs(decision.order) do
      job_desc[field] = decision.changes[field]
   end
   for _, message in ipairs(decision.messages) do
      slurm.log_user("%s", message)
   end
   return slurm.SUCCESS
end

local function guarded(job_desc)
   if FACTS == nil then return slurm.SUCCESS end
   local ok, rc = pcall(decide, job_desc)
   if ok then return rc end
   local err = type(rc) == "table" and "non-string error" or tostring(rc)
   slurm.log_error("gpushare: internal error, job handled by policy on_error=%s: %s",
                   FACTS.on_error, err)
   if FACTS.on_error == "reject" then
      pcall(slurm.log_user, "%s", "gpushare: the GPU submit check failed; ask your "
            .. "administrator (slurmctld log has the details)")
      return slurm.ERROR
   end
   return slurm.SUCCESS
end

function slurm_job_submit(job_desc, part_list, submit_uid)
   return guarded(job_desc)
end

-- A modification carries only the fields being changed. The GRES rules run on the
-- tres_per_* fields it carries; --switches and options are left alone because the
-- request alone does not say whether the job is a multi-node GPU job.
local MODIFY_FIELDS = {"tres_per_node", "tres_per_job", "tres_per_task", "tres_per_socket"}

local function modify_view(job_desc)
   local view = {}
   for _, field in ipairs(MODIFY_FIELDS) do view[field] = job_desc[field] end
   return view
end

function slurm_job_modify(job_desc, job_ptr, part_list, modify_uid)
   if FACTS == nil then return slurm.SUCCESS end
   local ok, rc = pcall(function()
      local view = modify_view(job_desc)
      if view.tres_per_node == nil and view.tres_per_job == nil and view.tres_per_task == nil
         and view.tres_per_socket == nil then
         return slurm.SUCCESS
      end
      -- the job's constraint is not in view
      local decision = apply(view, FACTS, false, RUNNING)
      if decision.reject then
         pcall(slurm.log_user, "%s", decision.messages[1])
         return decision.reject.code
      end
      for _, field in ipairs(decision.order) do job_desc[field] = decision.changes[field] end
      for _, message in ipairs(decision.messages) do pcall(slurm.log_user, "%s", message) end
      return slurm.SUCCESS
   end)
   if ok then return rc end
   slurm.log_error("gpushare: internal error in job_modify, modification passed: %s",
                   tostring(rc))
   return slurm.SUCCESS
end

return slurm.SUCCESS
