; Program E, "pinned map": naive_tc.ll's check plus a BTF-defined map that asks to be pinned by name, as
;   struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, 1); __type(key, __u32); __type(value, __u64);
;            __uint(pinning, LIBBPF_PIN_BY_NAME); } bigtcp_pcap_audit_pin SEC(".maps");
; would declare it in C. libbpf would reuse or create /sys/fs/bpf/bigtcp_pcap_audit_pin at load time; the
; audit must clear the pin path first (bpf_map__set_pin_path(map, NULL)) and use a private map instead.
; The debug info below is what the BPF backend turns into the .BTF section libbpf reads the map from.
; Build: llc -march=bpf -filetype=obj pinned_map_tc.ll -o pinned_map_tc.o   (LLVM 14 IR, typed pointers)
target datalayout = "e-m:e-p:64:64-i64:64-i128:128-n32:64-S128"
target triple = "bpf"

%struct.map_def = type { [2 x i32]*, [1 x i32]*, i32*, i64*, [1 x i32]* }

@bigtcp_pcap_audit_pin = dso_local global %struct.map_def zeroinitializer, section ".maps", align 8, !dbg !0
@_license = dso_local global [4 x i8] c"GPL\00", section "license", align 1, !dbg !30
@llvm.compiler.used = appending global [3 x i8*] [i8* getelementptr inbounds ([4 x i8], [4 x i8]* @_license, i32 0, i32 0), i8* bitcast (%struct.map_def* @bigtcp_pcap_audit_pin to i8*), i8* bitcast (i32 (i8*)* @tcp_after_ipv6_pinned to i8*)], section "llvm.metadata"

define dso_local i32 @tcp_after_ipv6_pinned(i8* %skb) #0 section "tc" !dbg !40 {
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
  %is86 = icmp eq i8 %t0, -122
  %isdd = icmp eq i8 %t1, -35
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

!llvm.dbg.cu = !{!2}
!llvm.module.flags = !{!50, !51}

!0 = !DIGlobalVariableExpression(var: !1, expr: !DIExpression())
!1 = distinct !DIGlobalVariable(name: "bigtcp_pcap_audit_pin", scope: !2, file: !3, line: 1, type: !5, isLocal: false, isDefinition: true)
!2 = distinct !DICompileUnit(language: DW_LANG_C99, file: !3, producer: "hand-written IR", isOptimized: true, runtimeVersion: 0, emissionKind: FullDebug, globals: !4)
!3 = !DIFile(filename: "pinned_map_tc.ll", directory: "tests/audit/bpf")
!4 = !{!0, !30}
!5 = distinct !DICompositeType(tag: DW_TAG_structure_type, file: !3, line: 1, size: 320, elements: !6)
!6 = !{!7, !12, !16, !19, !23}
; __uint(type, 2)  ->  int (*type)[2]
!7 = !DIDerivedType(tag: DW_TAG_member, name: "type", scope: !5, file: !3, line: 1, baseType: !8, size: 64)
!8 = !DIDerivedType(tag: DW_TAG_pointer_type, baseType: !9, size: 64)
!9 = !DICompositeType(tag: DW_TAG_array_type, baseType: !10, size: 64, elements: !11)
!10 = !DIBasicType(name: "int", size: 32, encoding: DW_ATE_signed)
!11 = !{!DISubrange(count: 2)}
; __uint(max_entries, 1)  ->  int (*max_entries)[1]
!12 = !DIDerivedType(tag: DW_TAG_member, name: "max_entries", scope: !5, file: !3, line: 1, baseType: !13, size: 64, offset: 64)
!13 = !DIDerivedType(tag: DW_TAG_pointer_type, baseType: !14, size: 64)
!14 = !DICompositeType(tag: DW_TAG_array_type, baseType: !10, size: 32, elements: !15)
!15 = !{!DISubrange(count: 1)}
; __type(key, __u32)  ->  __u32 *key
!16 = !DIDerivedType(tag: DW_TAG_member, name: "key", scope: !5, file: !3, line: 1, baseType: !17, size: 64, offset: 128)
!17 = !DIDerivedType(tag: DW_TAG_pointer_type, baseType: !18, size: 64)
!18 = !DIBasicType(name: "unsigned int", size: 32, encoding: DW_ATE_unsigned)
; __type(value, __u64)  ->  __u64 *value
!19 = !DIDerivedType(tag: DW_TAG_member, name: "value", scope: !5, file: !3, line: 1, baseType: !20, size: 64, offset: 192)
!20 = !DIDerivedType(tag: DW_TAG_pointer_type, baseType: !21, size: 64)
!21 = !DIBasicType(name: "unsigned long long", size: 64, encoding: DW_ATE_unsigned)
; __uint(pinning, LIBBPF_PIN_BY_NAME = 1)  ->  int (*pinning)[1]
!23 = !DIDerivedType(tag: DW_TAG_member, name: "pinning", scope: !5, file: !3, line: 1, baseType: !13, size: 64, offset: 256)
!30 = !DIGlobalVariableExpression(var: !31, expr: !DIExpression())
!31 = distinct !DIGlobalVariable(name: "_license", scope: !2, file: !3, line: 2, type: !32, isLocal: false, isDefinition: true)
!32 = !DICompositeType(tag: DW_TAG_array_type, baseType: !33, size: 32, elements: !34)
!33 = !DIBasicType(name: "char", size: 8, encoding: DW_ATE_signed_char)
!34 = !{!DISubrange(count: 4)}
!40 = distinct !DISubprogram(name: "tcp_after_ipv6_pinned", scope: !3, file: !3, line: 3, type: !41, scopeLine: 3, flags: DIFlagPrototyped, spFlags: DISPFlagDefinition | DISPFlagOptimized, unit: !2, retainedNodes: !44)
!41 = !DISubroutineType(types: !42)
!42 = !{!10, !43}
!43 = !DIDerivedType(tag: DW_TAG_pointer_type, baseType: null, size: 64)
!44 = !{}
!50 = !{i32 7, !"Dwarf Version", i32 5}
!51 = !{i32 2, !"Debug Info Version", i32 3}
