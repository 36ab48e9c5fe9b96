"""bigtcp-pcap: decode BIG TCP captures, rebuild Linux GRO super-packets, audit capture filters.

``analyze(capture, **params)`` runs the whole pipeline and returns an ``Analysis`` whose ``flows``,
``superpackets``, ``findings`` (and ``packets``, ``filter_audit``) are pandas DataFrames;
``iter_batches(capture)`` streams decoded column batches for users who do not want DataFrames.
"""

__version__ = "0.1.0"

__all__ = ["Analysis", "CaptureError", "EgressProfile", "__version__", "analyze", "analyze_many", "egress", "explode",
           "iter_batches", "sample_capture"]


def __getattr__(name: str):
    # lazy, so that the CLI can configure pyarrow's allocator before pyarrow is first imported
    if name in ("Analysis", "analyze", "iter_batches", "sample_capture"):
        from . import api

        return getattr(api, name)
    if name in ("analyze_many", "ManyAnalysis"):  # many captures, more cores, Dask (bigtcp_pcap/many.py)
        from . import many

        return getattr(many, name)
    if name in ("egress", "explode", "EgressProfile"):  # the transmit side (bigtcp_pcap/gso)
        from .gso import api

        return getattr(api, name)
    if name == "CaptureError":
        from .errors import CaptureError

        return CaptureError
    raise AttributeError(f"module 'bigtcp_pcap' has no attribute {name!r}")
