; Program F, "unverifiable": reads the IPv6 next-header byte without checking it against data_end, which the
; verifier refuses (EACCES, "invalid access to packet"). Used to test the load-error path.
; Build: llc -march=bpf -filetype=obj bad_tc.ll -o bad_tc.o   (LLVM 14 IR, typed pointers)
target datalayout = "e-m:e-p:64:64-i64:64-i128:128-n32:64-S128"
target triple = "bpf"

@_license = dso_local global [4 x i8] c"GPL\00", section "license", align 1
@llvm.compiler.used = appending global [2 x i8*] [i8* getelementptr inbounds ([4 x i8], [4 x i8]* @_license, i32 0, i32 0), i8* bitcast (i32 (i8*)* @unchecked_read to i8*)], section "llvm.metadata"

define dso_local i32 @unchecked_read(i8* %skb) #0 section "tc" {
entry:
  %pd = getelementptr inbounds i8, i8* %skb, i64 76
  %pd32 = bitcast i8* %pd to i32*
  %d = load i32, i32* %pd32, align 4
  %d64 = zext i32 %d to i64
  %data = inttoptr i64 %d64 to i8*
  %nhp = getelementptr inbounds i8, i8* %data, i64 20
  %nh = load volatile i8, i8* %nhp, align 1
  %tcp = icmp eq i8 %nh, 6
  %r = select i1 %tcp, i32 0, i32 2
  ret i32 %r
}

attributes #0 = { nounwind }
