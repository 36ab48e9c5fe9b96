; Program B, "aware": the same policy as naive_tc.ll (IPv6 frames pass only when they carry TCP), but an IPv6
; Hop-by-Hop header (next header 0, as BIG TCP inserts it) is skipped with its length byte (hdrlen * 8 + 8) and
; the next header found there is checked; the TCP header (20 bytes) must be in the packet at the offset reached.
; tc (SCHED_CLS): data starts at the Ethernet header. TC_ACT_OK = 0, TC_ACT_SHOT = 2.
; Build: llc -march=bpf -filetype=obj aware_tc.ll -o aware_tc.o   (LLVM 14 IR, typed pointers)
target datalayout = "e-m:e-p:64:64-i64:64-i128:128-n32:64-S128"
target triple = "bpf"

@_license = dso_local global [4 x i8] c"GPL\00", section "license", align 1
@llvm.compiler.used = appending global [2 x i8*] [i8* getelementptr inbounds ([4 x i8], [4 x i8]* @_license, i32 0, i32 0), i8* bitcast (i32 (i8*)* @tcp_after_ipv6_hbh to i8*)], section "llvm.metadata"

define dso_local i32 @tcp_after_ipv6_hbh(i8* %skb) #0 section "tc" {
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
  %ishbh = icmp eq i8 %nh, 0
  br i1 %ishbh, label %hbh, label %l4

hbh:
  ; the HBH header's first two bytes: next header, hdr ext len (in 8-byte units, not counting the first 8)
  %hlim = getelementptr inbounds i8, i8* %data, i64 56
  %hshort = icmp ugt i8* %hlim, %end
  br i1 %hshort, label %drop, label %hbh2

hbh2:
  %hnhp = getelementptr inbounds i8, i8* %data, i64 54
  %hnh = load i8, i8* %hnhp, align 1
  %hlenp = getelementptr inbounds i8, i8* %data, i64 55
  %hlen = load i8, i8* %hlenp, align 1
  %hlen64 = zext i8 %hlen to i64
  %hbytes = shl nuw nsw i64 %hlen64, 3
  %hoff = add nuw nsw i64 %hbytes, 62          ; 54 + hdrlen * 8 + 8
  br label %l4

l4:
  %proto = phi i8 [ %nh, %v6 ], [ %hnh, %hbh2 ]
  %l4off = phi i64 [ 54, %v6 ], [ %hoff, %hbh2 ]
  %l4p = getelementptr inbounds i8, i8* %data, i64 %l4off
  %l4lim = getelementptr inbounds i8, i8* %l4p, i64 20
  %l4short = icmp ugt i8* %l4lim, %end
  br i1 %l4short, label %drop, label %check

check:
  %tcp = icmp eq i8 %proto, 6
  %r = select i1 %tcp, i32 0, i32 2
  ret i32 %r

drop:
  ret i32 2

pass:
  ret i32 0
}

attributes #0 = { nounwind }
