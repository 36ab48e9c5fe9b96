; Program D, "naive socket filter": the naive check as a SOCKET_FILTER program. BPF_PROG_TEST_RUN gives a socket
; filter the packet from the network header on (the Ethernet header is skipped), so the IPv6 next-header byte is
; at offset 6, read with the bpf_skb_load_bytes helper (26; socket filters have no direct packet access).
; IPv6 (skb->protocol, __sk_buff offset 16, is htons(0x86DD)) is kept whole (0xFFFF) only when the next header
; is 6 (TCP), else dropped (0); anything else is kept.
; Build: llc -march=bpf -filetype=obj naive_socket.ll -o naive_socket.o   (LLVM 14 IR, typed pointers)
target datalayout = "e-m:e-p:64:64-i64:64-i128:128-n32:64-S128"
target triple = "bpf"

@_license = dso_local global [4 x i8] c"GPL\00", section "license", align 1
@llvm.compiler.used = appending global [2 x i8*] [i8* getelementptr inbounds ([4 x i8], [4 x i8]* @_license, i32 0, i32 0), i8* bitcast (i32 (i8*)* @sock_tcp_after_ipv6 to i8*)], section "llvm.metadata"

define dso_local i32 @sock_tcp_after_ipv6(i8* %skb) #0 section "socket" {
entry:
  %b = alloca i8, align 1
  %pp = getelementptr inbounds i8, i8* %skb, i64 16
  %pp32 = bitcast i8* %pp to i32*
  %proto = load i32, i32* %pp32, align 4
  %isv6 = icmp eq i32 %proto, 56710     ; htons(0x86DD) read on a little-endian host
  br i1 %isv6, label %v6, label %keep

v6:
  %load = inttoptr i64 26 to i64 (i8*, i32, i8*, i32)*
  %rc = call i64 %load(i8* %skb, i32 6, i8* %b, i32 1)
  %failed = icmp ne i64 %rc, 0
  br i1 %failed, label %keep, label %check

check:
  %nh = load i8, i8* %b, align 1
  %tcp = icmp eq i8 %nh, 6
  %r = select i1 %tcp, i32 65535, i32 0
  ret i32 %r

keep:
  ret i32 65535
}

attributes #0 = { nounwind }
