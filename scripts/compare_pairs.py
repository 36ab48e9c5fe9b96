#!/usr/bin/env python3
"""`bigtcp-pcap compare` over a directory of kernel capture pairs made by tools/kernel_lab, one line per pair.

    .venv/bin/python scripts/compare_pairs.py DIR [extra compare options, e.g. --no-ack-evidence]

Each ``NAME_SUFFIX.snd.pcap`` / ``NAME_SUFFIX.rcv.pcap`` pair is compared with the receiver limits of scenario
NAME (tools/kernel_lab/scenarios.py). The pairs the README reports were made with, for each scenario of ``--all``:

    .venv/bin/python -m tools.kernel_lab --outdir DIR --scenario NAME --bytes 40000000 --snaplen 128 --suffix _n1

with ring drops on the sender's veth (``--sender-qdisc noqueue --suffix _noqueue``), and with random drops
between the sender's capture and the receiver's GRO (``--rx-drop 1000 --suffix _e1``: XDP on the receiver's veth):
unpinned, 40 MB, the sender capture on the sender's veth (both directions), as a user would take them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tools.kernel_lab.scenarios import SCENARIOS


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    pairs = sorted(Path(argv[0]).glob("*.snd.pcap"))
    extra = argv[1:]
    got = want = 0
    for snd in pairs:
        base = snd.name[: -len(".snd.pcap")]
        name = base.rsplit("_", 1)[0] if base not in SCENARIOS else base
        sc = SCENARIOS[name]
        opts = (["--gro-max-size", str(sc.rcv_v6)] if sc.rcv_v6 else []) + \
               (["--gro-ipv4-max-size", str(sc.rcv_v4)] if sc.rcv_v4 else [])
        r = subprocess.run([str(ROOT / ".venv/bin/bigtcp-pcap"), "compare", str(snd),
                            str(snd.with_name(base + ".rcv.pcap")), "--json", *opts, *extra],
                           capture_output=True, text=True, check=False)
        if r.returncode != 0:
            print(f"{base}: compare exited {r.returncode}: {r.stderr.strip()}")
            continue
        d = json.loads(r.stdout)
        got, want = got + d["reproduced"], want + d["receiver_superpackets"]
        print(f"{base:30s} {' '.join(opts):44s} {d['reproduced']:5d} / {d['receiver_superpackets']:5d} "
              f"{100 * d['share']:5.1f} %  {d['causes']}")
    if want:
        print(f"pooled: {got} / {want} = {100 * got / want:.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
