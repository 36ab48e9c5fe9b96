"""The transmit side: what an egress device does with a sender's GSO skbs (docs/gso-spec.md G1-G14).

``config.EgressProfile`` (the device's limits, named profiles, ``ip -d -j link show`` JSON), ``rules`` (one
function per rule), ``engine.EgressEngine`` (sans-IO: PacketBatch in, EgressBatch out), ``api.egress`` (capture ->
egress.parquet, optionally into the GRO engine), ``explode.explode`` (super-packets -> wire-sized packets in a
new capture) and ``cli`` (the ``egress`` and ``explode`` commands).
"""
