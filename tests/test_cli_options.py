"""Options generated from the config dataclasses (cli_options.py): one declaration per knob."""

from __future__ import annotations

import dataclasses
import json

from oracle import KERNEL
from typer.testing import CliRunner

from bigtcp_pcap.cli import app
from bigtcp_pcap.cli_options import field_docs
from bigtcp_pcap.gro import GroConfig

SND, RCV = str(KERNEL / "v4_185000.snd.pcap"), str(KERNEL / "v4_185000.rcv.pcap")


def test_every_gro_field_is_an_option_with_its_docstring():
    r = CliRunner().invoke(app, ["compare", "--help"], env={"COLUMNS": "1000", "TERMINAL_WIDTH": "1000"})
    docs = field_docs(GroConfig)
    for f in dataclasses.fields(GroConfig):
        if f.name == "checksum_ok":  # only True is valid: no option
            continue
        assert f"--{f.name.replace('_', '-')}" in r.output, f.name
        assert docs[f.name].split(".")[0][:40] in " ".join(r.output.split()), f.name


def test_values_reach_the_config():
    r = CliRunner().invoke(app, ["compare", SND, RCV, "--json", "--max-gro-skbs", "inf", "--input-is-gso", "false",
                                 "--gro-ipv4-max-size", "100000", "--no-treat-padding-as-flush", "--hz", "1000",
                                 "--jiffy-phase-ns", "123"])
    assert r.exit_code == 0, r.output
    g = json.loads(r.output)["gro"]
    assert (g["max_gro_skbs"], g["input_is_gso"], g["gro_ipv4_max_size"], g["treat_padding_as_flush"], g["hz"],
            g["jiffy_phase_ns"]) == ("inf", False, 100000, False, 1000, 123)


def test_out_of_range_values_are_usage_errors_naming_the_option():
    for args, flag in ((["--gro-max-size", "600000"], "--gro-max-size"), (["--rx-queues", "0"], "--rx-queues"),
                       (["--max-gro-skbs", "many"], ""), (["--kernel", "5.10"], "")):
        r = CliRunner().invoke(app, ["compare", SND, RCV, *args])
        assert r.exit_code == 2, (args, r.output)
        assert flag in r.output and "Traceback" not in r.output
