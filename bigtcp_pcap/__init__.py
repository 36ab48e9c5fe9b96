"""bigtcp-pcap: decode BIG TCP captures, rebuild Linux GRO super-packets, audit capture filters.

``analyze(capture, **params)`` runs the whole pipeline and returns an ``Analysis`` whose ``flows``,
``superpackets``, ``findings`` (and ``packets``, ``filter_audit``) are pandas DataFrames;
``iter_batches(capture)`` streams decoded column batches for users who do not want DataFrames.
"""

__version__ = "0.1.0"

from .api import Analysis, analyze, iter_batches, sample_capture
from .errors import CaptureError

__all__ = ["Analysis", "CaptureError", "__version__", "analyze", "iter_batches", "sample_capture"]
