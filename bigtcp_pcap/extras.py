"""The one place that imports optional packages; a missing one raises ImportError with the install hint."""

from __future__ import annotations

from types import ModuleType


def _hint(package: str, extra: str, err: ImportError) -> ImportError:
    return ImportError(f"{package} is needed for this and is not installed: pip install 'bigtcp-pcap[{extra}]' "
                       f"(or: pip install '{package}') ({err})")


def dask_distributed() -> ModuleType:
    """``dask.distributed`` (the ``bigtcp-pcap[dask]`` extra)."""
    try:
        import dask.distributed
    except ImportError as e:
        raise _hint("dask[distributed]", "dask", e) from None
    return dask.distributed


def dask_dataframe() -> ModuleType:
    """``dask.dataframe`` (the ``bigtcp-pcap[dask]`` extra)."""
    try:
        import dask.dataframe
    except ImportError as e:
        raise _hint("dask[dataframe]", "dask", e) from None
    return dask.dataframe
