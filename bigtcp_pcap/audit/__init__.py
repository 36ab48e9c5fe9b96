"""Capture-filter audit: which packets a pcap (cBPF) filter misclassifies because of BIG TCP, and a fix.

``audit_capture(expr, path)`` -> ``AuditResult``; ``cli.register(app)`` adds the ``audit-filter`` command.
"""

from .cbpf import AuditResult, FilterAudit, audit_batches, audit_capture
from .libpcap import CompiledFilter, FilterError, LibpcapMissing

__all__ = ["AuditResult", "CompiledFilter", "FilterAudit", "FilterError", "LibpcapMissing", "audit_batches",
           "audit_capture"]
