; Program G, "naive XDP": naive_tc.ll's check as an XDP program (struct xdp_md: data at offset 0, data_end at 4;
; the test data starts at the Ethernet header). IPv6 frames pass (XDP_PASS = 2) only when the next-header byte
; at ETH_HLEN + 6 is 6 (TCP), else XDP_DROP (1). Native XDP never sees BIG TCP packets (it runs before GRO); this
; only matters for generic/veth XDP.
; Build: llc -march=bpf -filetype=obj naive_xdp.ll -o naive_xdp.o   (LLVM 14 IR, typed pointers)
target datalayout = "e-m:e-p:64:64-i64:64-i128:128-n32:64-S128"
target triple = "bpf"

@_license = dso_local global [4 x i8] c"GPL\00", section "license", align 1
@llvm.compiler.used = appending global [2 x i8*] [i8* getelementptr inbounds ([4 x i8], [4 x i8]* @_license, i32 0, i32 0), i8* bitcast (i32 (i8*)* @xdp_tcp_after_ipv6 to i8*)], section "llvm.metadata"

define dso_local i32 @xdp_tcp_after_ipv6(i8* %ctx) #0 section "xdp" {
entry:
  %pd32 = bitcast i8* %ctx to i32*
  %d = load i32, i32* %pd32, align 4
  %pe = getelementptr inbounds i8, i8* %ctx, i64 4
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
  %is86 = icmp eq i8 %t0, -122
  %isdd = icmp eq i8 %t1, -35
  %isv6 = and i1 %is86, %isdd
  br i1 %isv6, label %v6, label %pass

v6:
  %nhp = getelementptr inbounds i8, i8* %data, i64 20
  %nh = load i8, i8* %nhp, align 1
  %tcp = icmp eq i8 %nh, 6
  %r = select i1 %tcp, i32 2, i32 1
  ret i32 %r

pass:
  ret i32 2
}

attributes #0 = { nounwind }
