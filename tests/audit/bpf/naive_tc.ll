; Program A, "naive": the assumption BIG TCP breaks (its cover letter: "eBPF programs assuming TCP header
; immediately follows IPv6 header"). A tc (SCHED_CLS) program: data starts at the Ethernet header.
; IPv6 frames pass (TC_ACT_OK = 0) only when the fixed header's next-header byte (ETH_HLEN + 6 = 20) is 6 (TCP),
; else TC_ACT_SHOT (2). Non-IPv6 and short frames pass.
; Build: llc -march=bpf -filetype=obj naive_tc.ll -o naive_tc.o   (LLVM 14 IR, typed pointers)
target datalayout = "e-m:e-p:64:64-i64:64-i128:128-n32:64-S128"
target triple = "bpf"

@_license = dso_local global [4 x i8] c"GPL\00", section "license", align 1
@llvm.compiler.used = appending global [2 x i8*] [i8* getelementptr inbounds ([4 x i8], [4 x i8]* @_license, i32 0, i32 0), i8* bitcast (i32 (i8*)* @tcp_after_ipv6 to i8*)], section "llvm.metadata"

define dso_local i32 @tcp_after_ipv6(i8* %skb) #0 section "tc" {
entry:
  ; struct __sk_buff: data at offset 76, data_end at 80 (u32 each, rewritten by the verifier to pointers)
  %pd = getelementptr inbounds i8, i8* %skb, i64 76
  %pd32 = bitcast i8* %pd to i32*
  %d = load i32, i32* %pd32, align 4
  %pe = getelementptr inbounds i8, i8* %skb, i64 80
  %pe32 = bitcast i8* %pe to i32*
  %e = load i32, i32* %pe32, align 4
  %d64 = zext i32 %d to i64
  %e64 = zext i32 %e to i64
  %data = inttoptr i64 %d64 to i8*
  %end = inttoptr i64 %e64 to i8*
  ; Ethernet (14) + IPv6 fixed header (40) must be in the packet
  %lim = getelementptr inbounds i8, i8* %data, i64 54
  %short = icmp ugt i8* %lim, %end
  br i1 %short, label %pass, label %hdr

hdr:
  %tp = getelementptr inbounds i8, i8* %data, i64 12
  %t0 = load i8, i8* %tp, align 1
  %tp1 = getelementptr inbounds i8, i8* %data, i64 13
  %t1 = load i8, i8* %tp1, align 1
  %is86 = icmp eq i8 %t0, -122    ; 0x86
  %isdd = icmp eq i8 %t1, -35     ; 0xDD
  %isv6 = and i1 %is86, %isdd
  br i1 %isv6, label %v6, label %pass

v6:
  %nhp = getelementptr inbounds i8, i8* %data, i64 20
  %nh = load i8, i8* %nhp, align 1
  %tcp = icmp eq i8 %nh, 6
  %r = select i1 %tcp, i32 0, i32 2
  ret i32 %r

pass:
  ret i32 0
}
attributes #0 = { nounwind }
