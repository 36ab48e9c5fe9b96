-- bigtcp.lua: Wireshark/tshark postdissector for Linux BIG TCP / GRO captures (bigtcp-pcap companion).
--
-- Wireshark >= 4.0, Lua 5.2 (bit32, no integer division, no bitwise operators).
-- Canonical source: dissectors/bigtcp.lua in the bigtcp-pcap repository; a byte-identical copy ships as
-- package data bigtcp_pcap/wireshark/bigtcp.lua (a test keeps them equal). See dissectors/README.md.
--
-- Fields (all generated, all filterable and usable as columns):
--   bigtcp.kind         string  hbh_jumbo | v6_plen0 | v4_totlen0 (absent on ordinary packets)
--   bigtcp.ip_len       uint32  true L3 length (IPv4 total length, or 40 + IPv6 payload) of the innermost IP
--   bigtcp.tcp_len      uint32  true TCP payload length
--   bigtcp.gso_segs     uint32  estimated number of MSS segments in this TCP packet
--   bigtcp.mss          uint32  segment payload size used for gso_segs; bigtcp.mss_source says where from
-- With a sidecar written by bigtcp-pcap (bigtcp_pcap/wireshark/sidecar.py):
--   bigtcp.superpacket  uint32  GRO super-packet id
--   bigtcp.flush_reason string  why the GRO engine flushed it
--   bigtcp.filter_miss  string  one per audited capture filter that misses this frame (the filter text)
--   bigtcp.filter_false_match  string  one per audited capture filter that wrongly matches this frame
--   bigtcp.finding      string  one per finding code (bigtcp_pcap/findings.py), also raised as expert info
--   bigtcp.sidecar      string  sidecar status (applied / refused: reason)
--
-- The lengths are read from the frame bytes at the offset where Wireshark dissected the innermost ip/ipv6
-- layer, plus the frame's original (wire) length, so they do not depend on ipv6.tso_support / ip.tso_support.
--
-- The bigtcp tree (and so the display filter "bigtcp") is present only on frames the plugin has something to
-- say about: a BIG TCP encoding, a packet of more than one MSS segment (GRO/TSO aggregate), or, with a sidecar,
-- a frame of a super-packet, a finding or a capture-filter verdict (and frame 1, with the sidecar's status).
-- "bigtcp.kind" is the filter for BIG TCP encodings only. Those frames also get "[BIG TCP ...]" (or "[GRO n segs]") in the Info column.
--
-- Sidecar path: the first script argument (-X lua_script:bigtcp.lua -X lua_script1:sidecar=/path.tsv, or
-- lua_script1:/path.tsv) or the environment variable BIGTCP_SIDECAR (for an installed plugin, or the GUI:
-- BIGTCP_SIDECAR=/abs/path.tsv wireshark -r capture); the argument wins. Neither is a preference, so the
-- path is never saved into the user's Wireshark profile and never applied to another capture.

local PLUGIN_VERSION = "1.0.0"
local script_args = { ... }

if not bit32 then
    error("bigtcp.lua needs Lua 5.2 (bit32)")
end
local band, rshift = bit32.band, bit32.rshift

local ok_proto, bigtcp = pcall(Proto, "bigtcp", "Linux BIG TCP / GRO (bigtcp-pcap)")
if not ok_proto then
    -- Already registered: the plugin is installed in a plugin folder and was also given with -X lua_script.
    local note = "bigtcp.lua: protocol 'bigtcp' already registered (plugin loaded twice?); this copy is not used"
    if warn then warn(note) end
    return
end

-- ---------------------------------------------------------------------------------------------------------
-- Fields
-- ---------------------------------------------------------------------------------------------------------
local pf = {
    kind = ProtoField.string("bigtcp.kind", "BIG TCP encoding"),
    ip_len = ProtoField.uint32("bigtcp.ip_len", "True IP length", base.DEC),
    tcp_len = ProtoField.uint32("bigtcp.tcp_len", "True TCP payload length", base.DEC),
    gso_segs = ProtoField.uint32("bigtcp.gso_segs", "Estimated segments at MSS", base.DEC),
    mss = ProtoField.uint32("bigtcp.mss", "Segment payload size used", base.DEC),
    mss_source = ProtoField.string("bigtcp.mss_source", "Segment size source"),
    superpacket = ProtoField.uint32("bigtcp.superpacket", "GRO super-packet id", base.DEC),
    flush_reason = ProtoField.string("bigtcp.flush_reason", "GRO flush reason"),
    filter_miss = ProtoField.string("bigtcp.filter_miss", "Capture filter that misses this frame"),
    filter_false_match = ProtoField.string("bigtcp.filter_false_match", "Capture filter that wrongly matches this frame"),
    finding = ProtoField.string("bigtcp.finding", "bigtcp-pcap finding code"),
    sidecar = ProtoField.string("bigtcp.sidecar", "Sidecar"),
}
bigtcp.fields = {
    pf.kind, pf.ip_len, pf.tcp_len, pf.gso_segs, pf.mss, pf.mss_source,
    pf.superpacket, pf.flush_reason, pf.filter_miss, pf.filter_false_match, pf.finding, pf.sidecar,
}

-- ---------------------------------------------------------------------------------------------------------
-- Expert info. Finding codes: the same list as bigtcp_pcap/findings.py (a test keeps them equal).
-- The expert field of code C is "bigtcp.C" (e.g. bigtcp.ipv6.jumbo.too_small); the message starts with [C].
-- ---------------------------------------------------------------------------------------------------------
local FINDINGS = {
    -- BEGIN FINDINGS (generated from bigtcp_pcap/findings.py: code, severity, message template)
    { "ipv6.jumbo.too_small", "error", "Jumbo Payload length {value} is <= 65535 (RFC 2675 section 3)" },
    { "ipv6.jumbo.plen_nonzero", "error", "Jumbo Payload option with IPv6 payload length {value} != 0" },
    { "ipv6.jumbo.with_fragment", "error", "Jumbo Payload option together with a Fragment header" },
    { "ipv6.jumbo.misaligned", "warn", "Jumbo Payload option at offset {value}, not 4n+2 (RFC 2675)" },
    { "ipv6.jumbo.not_hbh", "error", "Jumbo Payload option in a Destination Options header, not Hop-by-Hop" },
    { "ipv6.jumbo.missing", "error", "IPv6 payload length 0 with a Hop-by-Hop header but no Jumbo option" },
    { "ipv6.jumbo.duplicate", "error", "more than one Jumbo Payload option" },
    { "ipv6.jumbo.exceeds_frame", "error", "Jumbo Payload length needs {value} bytes more than the frame" },
    { "ipv6.hbh.not_first", "error", "Hop-by-Hop header not directly after the IPv6 header" },
    { "ipv6.jumbo.bad_length", "error", "Jumbo Payload option data length {value} != 4" },
    { "ipv6.plen0.not_tcp_udp", "warn", "IPv6 payload length 0 without Jumbo option, next header {value} is not TCP/UDP or a tunnel (4, 41, 47): not presumed BIG TCP, length left at 0" },
    { "ipv4.totlen0.not_tcp_udp", "warn", "IPv4 total length 0, protocol {value} is not TCP/UDP or a tunnel (4, 41, 47): not presumed BIG TCP/TSO, length left at the header" },
    { "ipv4.len_exceeds_frame", "warn", "IPv4 total length exceeds the frame by {value} bytes" },
    { "ipv6.plen_exceeds_frame", "warn", "IPv6 payload length exceeds the frame by {value} bytes" },
    { "ipv4.bad_ihl", "error", "IPv4 header length {value} < 20" },
    { "tcp.bad_doff", "error", "TCP header length {value} < 20" },
    { "ip.bad_version", "error", "IP version {value} where an IP header was expected" },
    { "ipv4.totlen_lt_header", "error", "IPv4 total length {value} is smaller than its header" },
    { "udp.bad_length", "warn", "UDP length {value} disagrees with the IP payload length" },
    { "ipv6.exthdr.too_many", "warn", "more than {value} IPv6 extension headers; stopped walking" },
    { "icmp.too_big.bigtcp", "warn", "ICMP Packet Too Big / Fragmentation Needed (MTU {value}) answering a BIG TCP packet (the quoted header: IPv6 payload length 0, or IPv4 total length 0 with TCP or UDP): a hop did not forward that super-packet, so its bytes are resent (retransmissions)" },
    { "icmp.too_big", "note", "ICMP Packet Too Big / Fragmentation Needed (MTU {value}): path MTU discovery" },
    { "frame.truncated.l2", "note", "link-layer header cut by the snaplen (caplen {value})" },
    { "frame.truncated.ip", "note", "IP header or extension header chain cut by the snaplen (caplen {value})" },
    { "frame.truncated.l4", "note", "TCP/UDP header cut by the snaplen (caplen {value})" },
    { "frame.wirelen_lt_caplen", "warn", "original length {value} is smaller than the captured length" },
    { "frame.unknown_linktype", "warn", "linktype {value} is not decoded" },
    { "capture.partial", "error", "the capture could not be read to its end: {value}" },
    { "capture.tcp_port_filter_suspected", "warn", "IPv6 TCP flows show {value} bytes of sequence gaps and no Hop-by-Hop packets: the capture was probably taken with a 'tcp port' filter that drops BIG TCP, or it lost packets (a full capture buffer: tcpdump's 'dropped by kernel')" },
    { "capture.snaplen_exceeded", "note", "records longer than the snaplen {value} were read whole (as Wireshark does; libpcap cuts them to the snaplen in a pcap file, and stops at the first one in a pcapng file)" },
    { "capture.interrupted", "error", "the run was interrupted ({value}): the tables hold the frames read before it" },
    { "capture.undefined_interface", "warn", "packet blocks name interface {value}, which no Interface Description Block defines: skipped" },
    { "capture.tpacket_v2_clamp", "warn", "Ethernet frames with caplen {value} < wire length: libpcap's TPACKET_V2 ring cut them (tcpdump --immediate-mode with offloads on sizes ring frames for MAX(MTU, 65535) + 18); their payload past the cut is missing, the lengths come from the wire length" },
    { "output.write_failed", "error", "the output failed ({value}): the tables hold the frames read before it" },
    { "capture.ts_out_of_range", "warn", "timestamps of interface {value} do not fit int64 nanoseconds since 1970 (years 1677-2262): left null in packets.parquet" },
    { "capture.empty", "note", "the capture holds no packets ({value} bytes): nothing to analyse (tshark reads it as a capture of none)" },
    { "capture.dropped", "warn", "the capture's own statistics (pcapng Interface Statistics Block) say the capturing system dropped {value} packets: sequence gaps, missing segments and resends there may be the capture's, not the network's" },
    -- END FINDINGS
}
local SEVERITY = { error = expert.severity.ERROR, warn = expert.severity.WARN, note = expert.severity.NOTE }

local ef = {
    bigtcp = ProtoExpert.new("bigtcp.superpacket_note", "BIG TCP packet", expert.group.SEQUENCE,
        expert.severity.NOTE),
    plen0_no_tso = ProtoExpert.new("bigtcp.v6_plen0.no_tso_support",
        "IPv6 payload length 0 without Jumbo option", expert.group.MALFORMED, expert.severity.WARN),
    sidecar_refused = ProtoExpert.new("bigtcp.sidecar.refused", "Sidecar refused", expert.group.PROTOCOL,
        expert.severity.WARN),
    sidecar_error = ProtoExpert.new("bigtcp.sidecar.error", "Sidecar unreadable", expert.group.PROTOCOL,
        expert.severity.WARN),
    sidecar_applied = ProtoExpert.new("bigtcp.sidecar.applied", "Sidecar applied", expert.group.COMMENTS_GROUP,
        expert.severity.CHAT),
    finding_unknown = ProtoExpert.new("bigtcp.finding.unknown", "Unknown bigtcp-pcap finding",
        expert.group.PROTOCOL, expert.severity.WARN),
}
local ef_finding = {}
local finding_template = {}
local experts = {}
for _, e in pairs(ef) do experts[#experts + 1] = e end
for _, c in ipairs(FINDINGS) do
    -- the registered name is the template with N for the value (each message fills in the real value)
    local name = c[3]:gsub("{value}", "N")
    local e = ProtoExpert.new("bigtcp." .. c[1], "[" .. c[1] .. "] " .. name, expert.group.PROTOCOL,
        SEVERITY[c[2]])
    ef_finding[c[1]] = e
    finding_template[c[1]] = c[3]
    experts[#experts + 1] = e
end
bigtcp.experts = experts

-- ---------------------------------------------------------------------------------------------------------
-- Preferences
-- ---------------------------------------------------------------------------------------------------------
bigtcp.prefs.sidecar_note = Pref.statictext("Sidecar: give it per capture, never as a saved preference: "
    .. "-X lua_script1:sidecar=/abs/path.tsv, or the environment variable BIGTCP_SIDECAR=/abs/path.tsv "
    .. "('bigtcp-pcap wireshark open CAPTURE -o OUTDIR' prints the command)")
bigtcp.prefs.mss = Pref.uint("Segment size override", 0,
    "TCP payload bytes per segment for bigtcp.gso_segs (0: from the SYN MSS option, else observed)")
bigtcp.prefs.mtu = Pref.uint("Single-segment IP length limit", 1500,
    "Without a SYN, packets of at most this IP length are taken as single segments to learn the MSS")

-- ---------------------------------------------------------------------------------------------------------
-- Wireshark fields used
-- ---------------------------------------------------------------------------------------------------------
local f_ip = Field.new("ip")
local f_ipv6 = Field.new("ipv6")
local f_icmp = Field.new("icmp")
local f_icmpv6 = Field.new("icmpv6")
local f_tcp = Field.new("tcp")
local f_time = Field.new("frame.time_epoch")

-- ---------------------------------------------------------------------------------------------------------
-- Helpers
-- ---------------------------------------------------------------------------------------------------------
-- sidecar text escapes: \\ \t \n \r and \xHH
local UNESC = { ["\\"] = "\\", t = "\t", n = "\n", r = "\r" }
local function unescape(s)
    if not s or not s:find("\\", 1, true) then return s end
    local out, i, n = {}, 1, #s
    while i <= n do
        local c = s:sub(i, i)
        if c == "\\" and i < n then
            local d = s:sub(i + 1, i + 1)
            local hex = s:sub(i + 2, i + 3)
            if d == "x" and hex:match("^%x%x$") then
                out[#out + 1] = string.char(tonumber(hex, 16))
                i = i + 4
            else
                out[#out + 1] = UNESC[d] or d
                i = i + 2
            end
        else
            out[#out + 1] = c
            i = i + 1
        end
    end
    return table.concat(out)
end

local function split(s, sep)
    local out = {}
    if s == nil or s == "" then return out end
    local start = 1
    while true do
        local i = s:find(sep, start, true)
        if not i then
            out[#out + 1] = s:sub(start)
            break
        end
        out[#out + 1] = s:sub(start, i - 1)
        start = i + 1
    end
    return out
end

-- "1759417761939724000" -> secs, nsecs as numbers (exact: each part < 2^53)
local function ns_parts(s)
    if not s or not s:match("^%d+$") then return nil end
    if #s <= 9 then return 0, tonumber(s) end
    return tonumber(s:sub(1, -10)), tonumber(s:sub(-9))
end

local function ns_string(secs, nsecs)
    if secs == 0 then return tostring(nsecs) end
    return string.format("%d%09d", secs, nsecs)
end

-- ---------------------------------------------------------------------------------------------------------
-- Sidecar
-- ---------------------------------------------------------------------------------------------------------
local sc = nil -- loaded sidecar: { path, name, size, first_secs, first_nsecs, frames, rows, filters, refused, ... }

local function sidecar_path()
    for _, a in ipairs(script_args) do
        local v = a:match("^sidecar=(.*)$")
        if v then return v end
        if not a:find("=", 1, true) then return a end
    end
    local env = os.getenv("BIGTCP_SIDECAR")
    if env and env ~= "" then return env end
    return nil
end

local function load_sidecar(path)
    local s = { path = path, rows = {}, filters = {}, refused = nil, error = nil, frames = nil }
    local fh, err = io.open(path, "r")
    if not fh then
        s.error = "cannot open " .. path .. ": " .. tostring(err)
        return s
    end
    local cols = nil
    local lineno = 0
    for line in fh:lines() do
        lineno = lineno + 1
        line = line:gsub("\r$", "")
        if lineno == 1 then
            if not line:match("^# bigtcp%-pcap sidecar v1") then
                s.error = path .. " is not a bigtcp-pcap sidecar v1 (first line: " .. line:sub(1, 60) .. ")"
                break
            end
        elseif line:sub(1, 1) == "#" then
            local parts = split(line:sub(2):gsub("^ ", ""), "\t")
            local key = parts[1]
            if key == "capture" then
                s.name = unescape(parts[2])
                s.size = tonumber(parts[3])
                s.first_ts = parts[4]
                s.first_secs, s.first_nsecs = ns_parts(parts[4])
            elseif key == "frames" then
                s.frames = tonumber(parts[2])
            elseif key == "filter" then
                s.filters[parts[2]] = unescape(parts[3])
            end
        elseif line ~= "" then
            local parts = split(line, "\t")
            if not cols then
                cols = {}
                for i, c in ipairs(parts) do cols[c] = i end
                if not cols.frame then
                    s.error = path .. ": column header has no 'frame' column"
                    break
                end
            else
                local fr = tonumber(parts[cols.frame])
                if fr then
                    local function cell(name)
                        local i = cols[name]
                        local v = i and parts[i]
                        if v == nil or v == "" then return nil end
                        return v
                    end
                    s.rows[fr] = {
                        superpacket = tonumber(cell("superpacket") or ""),
                        flush_reason = unescape(cell("flush_reason")),
                        filter_miss = split(cell("filter_miss") or "", ","),
                        filter_false_match = split(cell("filter_false_match") or "", ","),
                        findings = split(cell("findings") or "", ","),
                        wirelen = tonumber(cell("wirelen") or ""),
                        sp_segments = tonumber(cell("sp_segments") or ""),
                        ts_ns = cell("ts_ns"),
                    }
                end
            end
        end
    end
    fh:close()
    if not s.error and (not s.first_secs or not cols) then
        s.error = path .. ": missing '# capture' header line or column header"
    end
    return s
end

-- Check the sidecar against the capture on frame 1 (first timestamp) and on every row (frame number
-- within the sidecar's frame count, wire length and timestamp when the row carries them).
local function same_time(secs, nsecs, exact, want_secs, want_nsecs)
    if exact then return secs == want_secs and nsecs == want_nsecs end
    -- only pinfo.abs_ts (a double, ~0.25 us resolution today) was available: equal within 1 us
    local diff = (secs - want_secs) * 1000000000 + (nsecs - want_nsecs)
    return diff <= 1000 and diff >= -1000
end

local function check_frame(pinfo, secs, nsecs, exact)
    if not sc or sc.error or sc.refused then return end
    local n = pinfo.number
    if n == 1 then
        if not same_time(secs, nsecs, exact, sc.first_secs, sc.first_nsecs) then
            sc.refused = string.format("sidecar %s is for capture %s (first timestamp %s ns), this capture's "
                .. "first frame is at %s ns%s", sc.path, tostring(sc.name), tostring(sc.first_ts),
                ns_string(secs, nsecs), exact and "" or " (+-1 us)")
            return
        end
        sc.checked_first = true
    elseif not sc.checked_first then
        return -- frame 1 not seen yet (cannot happen on a first pass)
    end
    if sc.frames and n > sc.frames then
        sc.refused = string.format("sidecar %s lists %d frames, this capture has frame %d", sc.path, sc.frames, n)
        sc.refused_at = n
        return
    end
    local row = sc.rows[n]
    if row then
        if row.wirelen and row.wirelen ~= pinfo.len then
            sc.refused = string.format("sidecar %s: frame %d has length %d in the sidecar, %d here", sc.path, n,
                row.wirelen, pinfo.len)
            sc.refused_at = n
        elseif row.ts_ns then
            local rs, rn = ns_parts(row.ts_ns)
            if not same_time(secs, nsecs, exact, rs, rn) then
                sc.refused = string.format("sidecar %s: frame %d has timestamp %s ns in the sidecar, %s here%s",
                    sc.path, n, row.ts_ns, ns_string(secs, nsecs), exact and "" or " (+-1 us)")
                sc.refused_at = n
            end
        end
    end
end

-- ---------------------------------------------------------------------------------------------------------
-- Per-capture state
-- ---------------------------------------------------------------------------------------------------------
local syn_mss = {}   -- flow direction key -> MSS option value seen in a SYN sent in that direction
local seen_seg = {}  -- flow direction key -> largest single-segment TCP payload seen so far
local cache = {}     -- frame number -> { mss =, src = } decided on the first pass

function bigtcp.init()
    syn_mss, seen_seg, cache = {}, {}, {}
    sc = nil
    local path = sidecar_path()
    if path then sc = load_sidecar(path) end
end

-- ---------------------------------------------------------------------------------------------------------
-- Header walk (frame bytes)
-- ---------------------------------------------------------------------------------------------------------
local EXT = { [0] = true, [43] = true, [44] = true, [60] = true, [51] = true, [135] = true, [139] = true,
    [140] = true }

-- innermost IP header offset and version, ignoring IP headers quoted inside ICMP errors
local function innermost_ip()
    local limit = math.huge
    for _, fi in ipairs({ f_icmp() }) do if fi.offset < limit then limit = fi.offset end end
    for _, fi in ipairs({ f_icmpv6() }) do if fi.offset < limit then limit = fi.offset end end
    local best, ver = nil, nil
    for _, fi in ipairs({ f_ip() }) do
        if fi.offset < limit and (not best or fi.offset > best) then best, ver = fi.offset, 4 end
    end
    for _, fi in ipairs({ f_ipv6() }) do
        if fi.offset < limit and (not best or fi.offset > best) then best, ver = fi.offset, 6 end
    end
    return best, ver
end

-- returns a table describing the innermost IP/L4 header, or nil
local function walk(tvb, off, ver)
    local cap = tvb:len()
    local wire = tvb:reported_len()
    local r = { off = off, ver = ver }
    if ver == 4 then
        if off + 20 > cap then return nil end
        local ihl = band(tvb(off, 1):uint(), 0x0f) * 4
        if ihl < 20 then return nil end
        local totlen = tvb(off + 2, 2):uint()
        r.proto = tvb(off + 9, 1):uint()
        r.hdr_len = ihl
        r.src = tvb(off + 12, 4):bytes():tohex()
        r.dst = tvb(off + 16, 4):bytes():tohex()
        if totlen == 0 and (r.proto == 6 or r.proto == 17) then
            r.kind = "v4_totlen0"
            r.ip_len = wire - off
        elseif totlen == 0 then
            r.ip_len = ihl
        else
            r.ip_len = totlen
        end
        -- never more than the wire carried (as bigtcp-pcap's decoder: a header claiming more is limited)
        if r.ip_len > wire - off then r.ip_len = wire - off end
        r.l4 = off + ihl
        return r
    end
    if off + 40 > cap then return nil end
    local plen = tvb(off + 4, 2):uint()
    local nh = tvb(off + 6, 1):uint()
    r.src = tvb(off + 8, 16):bytes():tohex()
    r.dst = tvb(off + 24, 16):bytes():tohex()
    local p = off + 40
    local jumbo = nil
    local has_hbh = false
    local first = true
    local count = 0
    while EXT[nh] and count < 8 do
        count = count + 1
        if p + 2 > cap then return nil end
        local nxt = tvb(p, 1):uint()
        local len
        if nh == 44 then
            len = 8
        elseif nh == 51 then
            len = (tvb(p + 1, 1):uint() + 2) * 4
        else
            len = (tvb(p + 1, 1):uint() + 1) * 8
        end
        if nh == 0 then has_hbh = true end
        if nh == 0 and first then
            -- options of the Hop-by-Hop header: look for the Jumbo Payload option (type 0xC2)
            local q, e = p + 2, math.min(p + len, cap)
            while q < e do
                local t = tvb(q, 1):uint()
                if t == 0 then
                    q = q + 1
                else
                    if q + 2 > e then break end
                    local ol = tvb(q + 1, 1):uint()
                    if t == 0xC2 and ol == 4 and q + 6 <= e and not jumbo then
                        jumbo = tvb(q + 2, 4):uint()
                    end
                    q = q + 2 + ol
                end
            end
        end
        first = false
        p = p + len
        nh = nxt
    end
    r.hdr_len = p - off
    r.proto = nh
    r.l4 = p
    if plen == 0 and jumbo then
        r.kind = "hbh_jumbo"
        r.ip_len = 40 + jumbo
    elseif plen == 0 and not has_hbh and (nh == 6 or nh == 17) then
        -- (a Hop-by-Hop header without Jumbo option and payload length 0 is ipv6.jumbo.missing, not BIG TCP)
        r.kind = "v6_plen0"
        r.ip_len = wire - off
    else
        r.ip_len = 40 + plen
    end
    if r.ip_len > wire - off then r.ip_len = wire - off end
    return r
end

-- ---------------------------------------------------------------------------------------------------------
-- Segment size for gso_segs
-- ---------------------------------------------------------------------------------------------------------
local function tcp_info(tvb, r)
    local cap = tvb:len()
    local t = r.l4
    if t + 20 > cap then return nil end
    local doff = rshift(tvb(t + 12, 1):uint(), 4) * 4
    if doff < 20 then return nil end
    local info = {
        sport = tvb(t, 2):uint(),
        dport = tvb(t + 2, 2):uint(),
        flags = band(tvb(t + 13, 1):uint(), 0x3f),
        doff = doff,
    }
    if band(info.flags, 0x02) ~= 0 then
        -- MSS option (kind 2, len 4) in the captured part of the options
        local q, e = t + 20, math.min(t + doff, cap)
        while q < e do
            local k = tvb(q, 1):uint()
            if k == 0 then break end
            if k == 1 then
                q = q + 1
            else
                if q + 2 > e then break end
                local ol = tvb(q + 1, 1):uint()
                if ol < 2 then break end
                if k == 2 and ol == 4 and q + 4 <= e then info.mss = tvb(q + 2, 2):uint() end
                q = q + ol
            end
        end
    end
    return info
end

-- Flow state is updated the first time this plugin sees a frame with its fields (tshark -2 runs a first pass
-- without a tree, where Wireshark's fields are absent) and the result is cached, so revisits agree.
local function segment_size(pinfo, r, ti, tcp_len)
    local n = pinfo.number
    if cache[n] then return cache[n].mss, cache[n].src end
    local fwd = r.src .. "/" .. ti.sport .. ">" .. r.dst .. "/" .. ti.dport
    local rev = r.dst .. "/" .. ti.dport .. ">" .. r.src .. "/" .. ti.sport
    if ti.mss then syn_mss[fwd] = ti.mss end
    if not r.kind and tcp_len > 0 and r.ip_len <= bigtcp.prefs.mtu and band(ti.flags, 0x02) == 0 then
        if not seen_seg[fwd] or tcp_len > seen_seg[fwd] then seen_seg[fwd] = tcp_len end
    end
    local mss, src = nil, nil
    local opt = ti.doff - 20
    if bigtcp.prefs.mss and bigtcp.prefs.mss > 0 then
        mss, src = bigtcp.prefs.mss, "preference"
    elseif syn_mss[rev] and syn_mss[rev] - opt > 0 then
        mss, src = syn_mss[rev] - opt, "syn_peer"
    elseif syn_mss[fwd] and syn_mss[fwd] - opt > 0 then
        mss, src = syn_mss[fwd] - opt, "syn_own"
    elseif seen_seg[fwd] then
        mss, src = seen_seg[fwd], "observed"
    end
    cache[n] = { mss = mss, src = src }
    return mss, src
end

-- ---------------------------------------------------------------------------------------------------------
-- The postdissector
-- ---------------------------------------------------------------------------------------------------------
function bigtcp.dissector(tvb, pinfo, tree)
    if sc then
        local secs, nsecs, exact
        local tfi = f_time()
        if tfi then
            local v = tfi.value
            secs, nsecs, exact = v.secs, v.nsecs, true
        else
            -- no tree on this pass (tshark -2 first pass): the double pinfo.abs_ts
            local t = pinfo.abs_ts
            secs = math.floor(t)
            nsecs = math.floor((t - secs) * 1000000000 + 0.5)
            exact = false
        end
        check_frame(pinfo, secs, nsecs, exact)
    end

    local off, ver = innermost_ip()
    local r = off and walk(tvb, off, ver) or nil
    local row = sc and not sc.error and not sc.refused and sc.checked_first and sc.rows[pinfo.number] or nil
    local sidecar_problem = sc and (sc.error or sc.refused)
    if not r and not row and not sidecar_problem then return end

    -- what the plugin can say about this frame, decided before any tree item is added
    local ti, tcp_len, mss, src, segs = nil, nil, nil, nil, nil
    if r and r.proto == 6 then
        ti = tcp_info(tvb, r)
        if ti then
            tcp_len = r.ip_len - r.hdr_len - ti.doff
            if tcp_len < 0 then tcp_len = 0 end
            mss, src = segment_size(pinfo, r, ti, tcp_len)
            if mss and tcp_len > 0 then segs = math.ceil(tcp_len / mss) end
        end
    end
    local problem_here = sidecar_problem and (pinfo.number == 1 or sc.refused_at == pinfo.number)
    local row_says = row and (#row.findings > 0 or #row.filter_miss > 0 or #row.filter_false_match > 0
        or row.superpacket ~= nil)
    -- an aggregate: more than one MSS segment, or (MSS unknown) more IP bytes than one segment can carry
    local aggregate = (segs and segs > 1) or (tcp_len and tcp_len > 0 and r.ip_len > bigtcp.prefs.mtu)
    local says = (r and r.kind) or aggregate or row_says or problem_here or (sc and pinfo.number == 1)
    if not says then return end

    local hdr_range = r and tvb(off, math.min(r.hdr_len or 20, tvb:len() - off)) or tvb(0, 0)
    local t = tree:add(bigtcp, hdr_range)
    local summary = {}

    if r then
        if r.kind then
            t:add(pf.kind, hdr_range, r.kind):set_generated()
            summary[#summary + 1] = r.kind
        end
        t:add(pf.ip_len, hdr_range, r.ip_len):set_generated()
        if ti then
            t:add(pf.tcp_len, hdr_range, tcp_len):set_generated()
            summary[#summary + 1] = "tcp_len=" .. tcp_len
            if segs then
                t:add(pf.gso_segs, hdr_range, segs):set_generated()
                t:add(pf.mss, hdr_range, mss):set_generated()
                t:add(pf.mss_source, hdr_range, src):set_generated()
                summary[#summary + 1] = "segs=" .. segs
            end
            if r.kind then
                t:add_proto_expert_info(ef.bigtcp, string.format(
                    "BIG TCP packet (%s): IP length %d, TCP payload %d", r.kind, r.ip_len, tcp_len))
            end
            if r.kind == "v6_plen0" and not f_tcp() then
                t:add_proto_expert_info(ef.plen0_no_tso, string.format(
                    "IPv6 payload length 0 without Hop-by-Hop Jumbo option: presumed BIG TCP (IP length %d, "
                    .. "payload %d); Wireshark calls it malformed unless ipv6.tso_support is on "
                    .. "(-o ipv6.tso_support:TRUE)", r.ip_len, r.ip_len - 40))
            end
        elseif r.kind then
            t:add_proto_expert_info(ef.bigtcp, string.format("BIG TCP packet (%s): IP length %d", r.kind, r.ip_len))
        end
        if r.kind then
            pinfo.cols.info:append(string.format(" [BIG TCP %s, IP length %d%s]", r.kind, r.ip_len,
                segs and (", " .. segs .. " segs") or ""))
        elseif aggregate then
            pinfo.cols.info:append(string.format(" [GRO/TSO aggregate%s, IP length %d]",
                segs and (" of " .. segs .. " segs") or "", r.ip_len))
        end
    end

    if sidecar_problem then
        local msg = sc.error or sc.refused
        t:add(pf.sidecar, hdr_range, "refused: " .. msg):set_generated()
        if problem_here then
            t:add_proto_expert_info(sc.error and ef.sidecar_error or ef.sidecar_refused, msg)
        end
    elseif row then
        t:add(pf.sidecar, hdr_range, "applied: " .. tostring(sc.name)):set_generated()
        if row.superpacket then
            t:add(pf.superpacket, hdr_range, row.superpacket):set_generated()
            summary[#summary + 1] = "sp=" .. row.superpacket
        end
        if row.flush_reason then
            t:add(pf.flush_reason, hdr_range, row.flush_reason):set_generated()
        end
        for _, id in ipairs(row.filter_miss) do
            t:add(pf.filter_miss, hdr_range, sc.filters[id] or id):set_generated()
        end
        for _, id in ipairs(row.filter_false_match) do
            t:add(pf.filter_false_match, hdr_range, sc.filters[id] or id):set_generated()
        end
        for _, item in ipairs(row.findings) do
            -- CODE or CODE=VALUE (VALUE fills {value} in the code's message template)
            local code, value = item:match("^([^=]*)=(.*)$")
            if not code then code = item end
            value = unescape(value)
            t:add(pf.finding, hdr_range, code):set_generated()
            local e, tpl = ef_finding[code], finding_template[code]
            if e then
                local text = tpl:gsub("{value}", function() return value or "?" end)
                t:add_proto_expert_info(e, "[" .. code .. "] " .. text)
            else
                t:add_proto_expert_info(ef.finding_unknown, "[" .. code .. "] unknown bigtcp-pcap finding"
                    .. (value and (" (value " .. value .. ")") or ""))
            end
        end
    end
    if sc and pinfo.number == 1 and not sidecar_problem then
        if not row then t:add(pf.sidecar, hdr_range, "applied: " .. tostring(sc.name)):set_generated() end
        t:add_proto_expert_info(ef.sidecar_applied, string.format("bigtcp-pcap sidecar %s for capture %s (%s bytes)",
            sc.path, tostring(sc.name), tostring(sc.size)))
    end
    if #summary > 0 then t:append_text(", " .. table.concat(summary, ", ")) end
end

register_postdissector(bigtcp)
