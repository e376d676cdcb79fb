--[[
gpushare job_submit.lua: make GPU requests right at submit time, or say why they cannot be.

The same rules as the Python package (gpushare.submit_rules); both pass the conformance
vectors in tests/vectors/. Lua 5.1 syntax, valid through 5.4: no goto, no integer division,
numbers always written with %d.

Cluster facts (GPU types, MIG profiles Slurm owns, MPS units per GPU, NVLink domains,
policy) are read once when slurmctld loads this script (start-up, and whenever it re-reads
the script because its mtime changed: touch it after rendering new facts), from the JSON
file rendered by `gpushare render facts`. Nothing is read per
job. Slurm's Lua has no JSON library, so a small decoder for the subset JSON that file
uses lives below: one file is the single source of truth for both hooks.

Return codes: 2072 (ESLURM_INVALID_GRES) for every rejection the rules make (they all
concern the GPU request); slurm.ERROR only when policy.on_error is "reject" and the hook
itself failed. An internal error never reaches slurmctld: it is caught, logged, and the
job is accepted unchanged or rejected, as policy.on_error says. Without readable facts
the hook logs at load and accepts every job unchanged.
]]

local FACTS_PATH = "/etc/slurm/gpushare-facts.json"
local facts_path = os.getenv("GPUSHARE_FACTS") or FACTS_PATH

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

local function skip_ws(s, i)
   local _, e = string.find(s, "^[ \t\r\n]*", i)
   return e + 1
end

local function json_error(i, what)
   error("facts: invalid JSON at byte " .. fmt_int(i) .. ": " .. what, 0)
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
      local obj = {}
      i = skip_ws(s, i + 1)
      if string.sub(s, i, i) == "}" then return obj, i + 1 end
      while true do
         if string.sub(s, i, i) ~= '"' then json_error(i, "expected a key") end
         local key
         key, i = decode_string(s, i)
         i = skip_ws(s, i)
         if string.sub(s, i, i) ~= ":" then json_error(i, "expected ':'") end
         obj[key], i = decode_value(s, i + 1)
         i = skip_ws(s, i)
         local d = string.sub(s, i, i)
         if d == "}" then return obj, i + 1 end
         if d ~= "," then json_error(i, "expected ',' or '}'") end
         i = skip_ws(s, i + 1)
      end
   elseif c == "[" then
      local arr = {}
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
      return nil, i + 4
   end
   local num = string.match(s, "^-?%d+%.?%d*[eE]?[-+]?%d*", i)
   if not num or not tonumber(num) then json_error(i, "unexpected character") end
   return tonumber(num), i + #num
end

local function decode_json(text)
   local value, i = decode_value(text, 1)
   if skip_ws(text, i) <= #text then json_error(i, "trailing data") end
   return value
end

---------------------------------------------------------------------------------------------
-- Facts: loaded and checked once.
---------------------------------------------------------------------------------------------

local function is_int(v, minimum)
   return type(v) == "number" and v == math.floor(v) and v >= minimum
end

local function string_list(v, key)
   if type(v) ~= "table" then error('facts: "' .. key .. '" must be a list of strings', 0) end
   local out = {}
   for i = 1, #v do
      if type(v[i]) ~= "string" or v[i] == "" then
         error('facts: "' .. key .. '" must be a list of non-empty strings', 0)
      end
      out[i] = v[i]
   end
   return out
end

local function check_facts(data)
   if type(data) ~= "table" then error("facts: the top level must be a JSON object", 0) end
   if data.version ~= 1 then error('facts: "version" must be 1', 0) end
   if data.gres_syntax ~= "22.05" and data.gres_syntax ~= "23.11" then
      error('facts: "gres_syntax" must be 22.05 or 23.11', 0)
   end
   if not is_int(data.mps_units_per_gpu, 1) then
      error('facts: "mps_units_per_gpu" must be an integer >= 1', 0)
   end
   local policy = data.policy
   if type(policy) ~= "table" then error('facts: "policy" must be an object', 0) end
   for _, key in ipairs({"switch_wait_s", "max_switch_wait_s"}) do
      if not is_int(policy[key], 0) then
         error('facts: "policy.' .. key .. '" must be an integer >= 0', 0)
      end
   end
   if policy.on_error ~= "accept" and policy.on_error ~= "reject" then
      error('facts: "policy.on_error" must be accept or reject', 0)
   end
   if type(data.domains) ~= "table" then error('facts: "domains" must be an object', 0) end
   local sizes = {}
   for name, nodes in pairs(data.domains) do
      sizes[#sizes + 1] = #string_list(nodes, "domains." .. tostring(name))
   end
   table.sort(sizes, function(a, b) return a > b end)
   local gpu_types = string_list(data.gpu_types, "gpu_types")
   local mig_types = string_list(data.mig_types, "mig_types")
   local lower_gpu = {}
   for i, g in ipairs(gpu_types) do lower_gpu[i] = string.lower(g) end
   return {
      gres_prefix = (data.gres_syntax == "22.05") and "gres:" or "gres/",
      units = data.mps_units_per_gpu,
      gpu_types = gpu_types,
      mig_types = mig_types,
      lower_gpu_types = lower_gpu,
      all_types = concat_lists(gpu_types, mig_types),
      domain_sizes = sizes,
      switch_wait_s = policy.switch_wait_s,
      max_switch_wait_s = policy.max_switch_wait_s,
      on_error = policy.on_error,
   }
end

local function load_facts(path)
   local handle, err = io.open(path, "r")
   if not handle then error("facts: cannot read " .. path .. " (" .. tostring(err) .. ")", 0) end
   local text = handle:read("*a")
   handle:close()
   return check_facts(decode_json(text))
end

---------------------------------------------------------------------------------------------
-- GRES strings (gpushare.gres).
---------------------------------------------------------------------------------------------

local function parse_count(text)
   local digits, suffix = string.match(text, "^(%d+)([kKmMgGtTpP]?)$")
   if not digits then return nil end
   local n = tonumber(digits) * 1.0 * SUFFIX[string.lower(suffix)]
   if n > MAX_COUNT then return nil end
   return math.floor(n)
end

local function gres_error(raw)
   error({gres_item = raw}, 0)
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
-- The rules (gpushare.submit_rules).
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

local function example(field, name, type_)
   local count = (name == "mps") and 50 or 1
   return user_item(field, {name = name, type = type_, count = count})
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
      local ex = "--gres=gpu:1"
      if #facts.mig_types > 0 then ex = "--gres=gpu:" .. facts.mig_types[1] .. ":1" end
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
      fix = "ask for one of those, e.g. " .. example(field, item.name, valid[1])
   else
      fix = "ask without a type, e.g. " .. example(field, item.name, nil)
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

local function domains_reason(nodes, domains)
   if domains == 1 then return fmt_int(nodes) .. " nodes fit in one NVLink domain" end
   return fmt_int(nodes) .. " nodes need " .. fmt_int(domains) .. " NVLink domains"
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

-- Returns changes (field -> value), their order, and the notes for the user's line.
local function check(job, facts)
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
               reject(f[2] .. ' item "' .. shown .. '"', "is not a GRES request Slurm "
                      .. "understands", "write name[:type][:count], e.g. --gres=gpu:a100:2")
            end
            error(res, 0)
         end
         fields[f[1]] = res
      end
   end

   -- 2. gpushare's own options.
   local options = spank_options(job.spank_job_env)
   local share_text = options.gpu_share
   local share_pct = nil
   if share_text ~= nil then
      if not string.match(share_text, "^%d+$") or #share_text > 6
         or tonumber(share_text) == 0 then
         reject("--gpu-share=" .. share_text, "is not a share of one GPU",
                "give a percentage from 1 to 100, e.g. --gpu-share=25")
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
         for i, item in ipairs(items) do
            new_items[i] = item
            if item.is_gres and SHARING[item.name] and item.type ~= nil then
               local spelled = normalise_type(f[1], item, facts)
               if spelled ~= item.type then
                  local copy = {}
                  for k, v in pairs(item) do copy[k] = v end
                  copy.type = spelled
                  new_items[i] = copy
               end
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
            notes[#notes + 1] = user_form(f[1], items) .. " -> " .. changes[f[1]]
            fields[f[1]] = new_items
         end
      end
   end

   -- 4. Shares: one GPU at most, never mixed with whole GPUs or shards.
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
      reject(share_flag(mps_items, share_text), "is a share of one GPU and cannot be combined "
             .. "with " .. what .. " (" .. user_item(other[1], other[2]) .. ")",
             "ask for the share alone, or for whole GPUs alone, e.g. --gres=gpu:1")
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

   -- 5. Multi-node GPU jobs stay in the fewest NVLink domains, with a bounded wait.
   local nodes = number(job.min_nodes)
   local sizes = facts.domain_sizes
   if (#asked > 0 or share_pct ~= nil) and nodes ~= nil and nodes > 1 and #sizes > 0 then
      local need = fewest_domains(nodes, sizes)
      local req = number(job.req_switch)
      local wait = number(job.wait4switch)
      if req == nil then
         set_change(changes, order, "req_switch", need)
         if wait ~= facts.switch_wait_s then
            set_change(changes, order, "wait4switch", facts.switch_wait_s)
         end
         notes[#notes + 1] = "--switches=" .. fmt_int(need) .. "@"
            .. format_wait(facts.switch_wait_s) .. " (" .. domains_reason(nodes, need) .. ")"
      else
         local reasons = {}
         local new_req, new_wait = req, wait
         if req < need then
            new_req = need
            set_change(changes, order, "req_switch", need)
            reasons[#reasons + 1] = domains_reason(nodes, need)
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
   end
   return changes, order, notes
end

-- The decision for one job: {changes, order, messages, reject = {code, text} or nil}.
local function apply(job, facts)
   local ok, changes, order, notes = pcall(check, job, facts)
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

local FACTS, FACTS_ERROR = nil, nil
do
   local ok, res = pcall(load_facts, facts_path)
   if ok then
      FACTS = res
      slurm.log_info("gpushare: loaded cluster facts from %s", facts_path)
   else
      FACTS_ERROR = tostring(res)
      slurm.log_error("gpushare: %s; jobs pass unchanged until it is fixed", FACTS_ERROR)
   end
end

local function decide(job_desc)
   local decision = apply(job_desc, FACTS)
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
      local decision = apply(view, FACTS)
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
