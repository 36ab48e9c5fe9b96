; Program C, "rewriter": writes 0xBEEF into the TCP destination port at the fixed offset ETH_HLEN + 40 + 2 = 56
; of every IPv6 frame and always returns TC_ACT_OK (0). With a Hop-by-Hop header in between, the write lands in
; the Jumbo option instead: the verdict is the same, the output packet is not (the audit's output comparison).
; tc (SCHED_CLS), direct packet access (data/data_end at __sk_buff offsets 76/80).
; Build: llc -march=bpf -filetype=obj rewrite_tc.ll -o rewrite_tc.o   (LLVM 14 IR, typed pointers)
target datalayout = "e-m:e-p:64:64-i64:64-i128:128-n32:64-S128"
target triple = "bpf"

@_license = dso_local global [4 x i8] c"GPL\00", section "license", align 1
@llvm.compiler.used = appending global [2 x i8*] [i8* getelementptr inbounds ([4 x i8], [4 x i8]* @_license, i32 0, i32 0), i8* bitcast (i32 (i8*)* @set_dport_fixed to i8*)], section "llvm.metadata"

define dso_local i32 @set_dport_fixed(i8* %skb) #0 section "tc" {
entry:
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
  %lim = getelementptr inbounds i8, i8* %data, i64 58
  %short = icmp ugt i8* %lim, %end
  br i1 %short, label %out, label %hdr

hdr:
  %tp = getelementptr inbounds i8, i8* %data, i64 12
  %t0 = load i8, i8* %tp, align 1
  %tp1 = getelementptr inbounds i8, i8* %data, i64 13
  %t1 = load i8, i8* %tp1, align 1
  %is86 = icmp eq i8 %t0, -122
  %isdd = icmp eq i8 %t1, -35
  %isv6 = and i1 %is86, %isdd
  br i1 %isv6, label %write, label %out

write:
  %p0 = getelementptr inbounds i8, i8* %data, i64 56
  store i8 -66, i8* %p0, align 1      ; 0xBE
  %p1 = getelementptr inbounds i8, i8* %data, i64 57
  store i8 -17, i8* %p1, align 1      ; 0xEF
  br label %out

out:
  ret i32 0
}

attributes #0 = { nounwind }
