#!/bin/sh
# Reproduce libpcap's TPACKET_V2 clamp (tests/fixtures/kernel/tpacket/): an IPv6 BIG TCP flow (gso_max_size
# 185000) over a veth pair in two network namespaces, captured on the sender's veth twice with tcpdump -s 0:
# with --immediate-mode (TPACKET_V2 ring: frames cut to caplen 65562) and without (TPACKET_V3: whole frames).
# The payload is zeros so that the gzipped fixtures stay a few KB. Needs root; deletes what it creates.
# Usage: sudo scripts/capture_tpacket_clamp.sh OUTDIR
set -eu
out=${1:?usage: capture_tpacket_clamp.sh OUTDIR}
mkdir -p "$out"
A=rdrA B=rdrB
cleanup() { ip netns del $A 2>/dev/null || true; ip netns del $B 2>/dev/null || true; }
trap cleanup EXIT
ip netns add $A; ip netns add $B
ip link add rdrva type veth peer name rdrvb
ip link set rdrva netns $A; ip link set rdrvb netns $B
ip -n $A -6 addr add fd77::1/64 dev rdrva nodad; ip -n $B -6 addr add fd77::2/64 dev rdrvb nodad
ip -n $A link set rdrva gso_max_size 185000 gro_max_size 185000 up
ip -n $B link set rdrvb gso_max_size 185000 gro_max_size 185000 up
server='import socket
s = socket.socket(socket.AF_INET6); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("fd77::2", 5201)); s.listen(1); c, _ = s.accept()
while c.recv(1 << 20): pass'
client='import socket
s = socket.create_connection(("fd77::2", 5201))
for _ in range(6): s.sendall(bytes(1 << 20))
s.close()'
run() {  # run NAME TCPDUMP-OPTIONS...
    name=$1; shift
    ip netns exec $B python3 -c "$server" & srv=$!
    sleep 0.5
    ip netns exec $A tcpdump -i rdrva -s 0 "$@" -w "$out/$name.full.pcap" 2>/dev/null & td=$!
    sleep 1.5
    ip netns exec $A python3 -c "$client"
    sleep 1; kill -INT $td; wait $td || true; wait $srv || true
}
run immediate --immediate-mode
run ring_v3
# the first frames (handshake, slow start, the first BIG TCP frames); records are copied as the kernel wrote them
editcap -F pcap -r "$out/immediate.full.pcap" "$out/immediate_v6_185000.pcap" 1-32
editcap -F pcap -r "$out/ring_v3.full.pcap" "$out/ring_v3_v6_185000.pcap" 1-40
gzip -9 -n -f "$out/immediate_v6_185000.pcap" "$out/ring_v3_v6_185000.pcap"
rm -f "$out/immediate.full.pcap" "$out/ring_v3.full.pcap"
