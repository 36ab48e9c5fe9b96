"""Developer tools of the repository (not part of the installed bigtcp_pcap package)."""
