"""bigtcp-pcap: decode BIG TCP captures, rebuild Linux GRO super-packets, audit capture filters."""

__version__ = "0.1.0"
