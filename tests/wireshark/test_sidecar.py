"""Sidecar v1: writer, reader, escaping, identity check; the plugin refuses a sidecar of another capture."""

from __future__ import annotations

import shutil

import pytest

from bigtcp_pcap.wireshark import check_sidecar, first_timestamp_ns, read_sidecar, write_sidecar
from bigtcp_pcap.wireshark.sidecar import MAGIC, epoch_string_to_ns, escape, unescape

from .conftest import fields, kernel_captures, needs_tshark, run_tshark


def test_write_read_roundtrip_sorted_and_escaped(tmp_path):
    rows = [
        {"frame": 9, "superpacket": 2, "flush_reason": "psh", "filter_miss": ["tcp port 5201", "ip6\tand tcp"],
         "findings": ["ipv6.jumbo.too_small=1028", ("capture.partial", "a,b\nc")], "wirelen": 94, "ts_ns": 5},
        {"frame": 3, "superpacket": None, "flush_reason": None, "filter_miss": [], "findings": [],
         "filter_false_match": ["not tcp"]},
    ]
    p = write_sidecar(tmp_path / "x.tsv", capture_name="/some/dir/cap.pcap", capture_size=123,
                      first_ts_ns=1796220988499918859, rows=rows, frames=10, filters=["not tcp"])
    lines = p.read_text().splitlines()
    assert lines[0] == MAGIC
    assert lines[1] == "# capture\tcap.pcap\t123\t1796220988499918859"
    assert lines[2] == "# frames\t10"
    assert lines[3:6] == ["# filter\t1\tnot tcp", "# filter\t2\ttcp port 5201", "# filter\t3\tip6\\tand tcp"]
    assert lines[6].split("\t")[0] == "frame"
    assert [ln.split("\t")[0] for ln in lines[7:]] == ["3", "9"]
    sc = read_sidecar(p)
    assert (sc.capture_name, sc.capture_size, sc.first_ts_ns, sc.frames) == ("cap.pcap", 123, 1796220988499918859, 10)
    r = sc.rows[9]
    assert r.superpacket == 2 and r.flush_reason == "psh" and r.wirelen == 94 and r.ts_ns == 5
    assert r.filter_miss == ["tcp port 5201", "ip6\tand tcp"]
    assert r.findings == ["ipv6.jumbo.too_small", "capture.partial"]
    assert r.finding_values == {"ipv6.jumbo.too_small": "1028", "capture.partial": "a,b\nc"}
    assert sc.rows[3].filter_false_match == ["not tcp"] and sc.rows[3].superpacket is None


def test_rows_from_dataframe_with_missing_values(tmp_path):
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"frame": [1, 2], "superpacket": [float("nan"), 4.0], "flush_reason": [None, "fin"],
                       "filter_miss": [[], ["tcp"]], "findings": [[], []]})
    p = write_sidecar(tmp_path / "d.tsv", capture_name="c", capture_size=1, first_ts_ns=0, rows=df)
    sc = read_sidecar(p)
    assert sc.rows[1].superpacket is None and sc.rows[2].superpacket == 4 and sc.rows[2].flush_reason == "fin"


def test_bad_rows_are_rejected(tmp_path):
    kw = {"capture_name": "c", "capture_size": 1, "first_ts_ns": 0}
    with pytest.raises(ValueError, match="twice"):
        write_sidecar(tmp_path / "a.tsv", rows=[{"frame": 1}, {"frame": 1}], **kw)
    with pytest.raises(ValueError, match="1-based"):
        write_sidecar(tmp_path / "a.tsv", rows=[{"frame": 0}], **kw)
    with pytest.raises(ValueError, match="finding code"):
        write_sidecar(tmp_path / "a.tsv", rows=[{"frame": 1, "findings": ["bad code"]}], **kw)
    (tmp_path / "n.tsv").write_text("frame\tx\n")
    with pytest.raises(ValueError, match="not a bigtcp-pcap sidecar"):
        read_sidecar(tmp_path / "n.tsv")


def test_escape_roundtrip():
    s = "a\\b\tc\nd\re,f"
    assert unescape(escape(s)) == s
    assert unescape("x\\x2cy") == "x,y"
    assert epoch_string_to_ns("1796220988.499918859") == 1796220988499918859
    assert epoch_string_to_ns("1700000000.123456") == 1700000000123456000


def _two_captures():
    caps = [c for c in kernel_captures() if c.name.endswith(".rcv.pcap")]
    if len(caps) < 2:
        pytest.skip("needs two kernel receiver captures")
    return caps[0], caps[1]


def test_check_sidecar_python_side(tmp_path):
    a, b = _two_captures()
    p = write_sidecar(tmp_path / "a.tsv", capture_name=a.name, capture_size=a.stat().st_size,
                      first_ts_ns=first_timestamp_ns(a), rows=[])
    assert check_sidecar(p, a) == []
    probs = check_sidecar(p, b)
    assert any("bytes" in x for x in probs) and any("first frame" in x for x in probs)
    # a renamed copy is still the same capture
    c = tmp_path / "renamed.pcap"
    shutil.copyfile(a, c)
    assert check_sidecar(p, c) == []


def _sidecar_for(capture, path, rows, **kw):
    return write_sidecar(path, capture_name=capture.name, capture_size=capture.stat().st_size,
                         first_ts_ns=kw.pop("first_ts_ns", None) or first_timestamp_ns(capture), rows=rows, **kw)


NAMES = ["bigtcp.sidecar", "bigtcp.superpacket", "bigtcp.flush_reason", "bigtcp.filter_miss", "bigtcp.finding",
         "bigtcp.sidecar.refused", "bigtcp.sidecar.applied"]


@needs_tshark
def test_plugin_applies_matching_sidecar_by_preference_and_by_script_argument(ws_home, tmp_path):
    a, _ = _two_captures()
    p = _sidecar_for(a, tmp_path / "a.tsv", [
        {"frame": 2, "superpacket": 0, "flush_reason": "psh", "filter_miss": ["tcp port 5201"],
         "findings": ["ipv6.jumbo.too_small=1028"]}])
    pref = fields(ws_home, a, ["frame.number", *NAMES], extra=["-X", f"lua_script1:sidecar={p}"])
    assert pref[1] == ["2", f"applied: {a.name}", "0", "psh", "tcp port 5201", "ipv6.jumbo.too_small", "", ""]
    assert pref[0][7] == "1"  # "sidecar applied" chat on frame 1
    assert all(r[6] == "" for r in pref)
    arg = fields(ws_home, a, ["frame.number", *NAMES], extra=["-X", f"lua_script1:{p}"])
    assert arg == pref
    r = run_tshark(ws_home, a, ["-X", f"lua_script1:sidecar={p}", "-Y", "bigtcp.ipv6.jumbo.too_small", "-T", "fields",
                                "-e", "_ws.expert.message"])
    assert "[ipv6.jumbo.too_small] Jumbo Payload length 1028 is <= 65535" in r.stdout


@needs_tshark
def test_plugin_refuses_sidecar_of_another_capture(ws_home, tmp_path):
    a, b = _two_captures()
    p = _sidecar_for(a, tmp_path / "a.tsv", [{"frame": 2, "superpacket": 0, "flush_reason": "psh",
                                              "findings": ["ipv6.jumbo.too_small"]}])
    rows = fields(ws_home, b, ["frame.number", *NAMES], extra=["-X", f"lua_script1:sidecar={p}"])
    assert all(r[2] == r[3] == r[4] == r[5] == "" for r in rows), "nothing from a refused sidecar is shown"
    ip_rows = [r for r in rows if r[1]]
    assert ip_rows and all(r[1].startswith("refused: ") and "first" in r[1] for r in ip_rows)
    # one expert warning, on frame 1 (where the mismatch is found), not one per frame
    assert rows[0][6] == "1" and [r[6] for r in rows[1:]] == [""] * (len(rows) - 1)
    r = run_tshark(ws_home, b, ["-q", "-X", f"lua_script1:sidecar={p}", "-z", "expert,warn"])
    assert "Warns" in r.stdout and f"is for capture {a.name}" in r.stdout


@needs_tshark
def test_plugin_refuses_sidecar_whose_rows_disagree(ws_home, tmp_path):
    a, _ = _two_captures()
    rows = fields(ws_home, a, ["frame.number", "frame.len"])
    wl = {int(r[0]): int(r[1]) for r in rows}
    # right first timestamp, but frame 3's length is wrong: refused from frame 3 on
    p = _sidecar_for(a, tmp_path / "a.tsv", [{"frame": 2, "superpacket": 1, "wirelen": wl[2]},
                                             {"frame": 3, "superpacket": 2, "wirelen": wl[3] + 1},
                                             {"frame": 4, "superpacket": 3, "wirelen": wl[4]}])
    got = fields(ws_home, a, ["frame.number", "bigtcp.superpacket", "bigtcp.sidecar.refused"],
                 extra=["-X", f"lua_script1:sidecar={p}"])
    assert got[1][1] == "1" and got[2][1] == "" and got[3][1] == "" and got[2][2] == "1"
    # more frames than the sidecar says the capture has
    p2 = _sidecar_for(a, tmp_path / "b.tsv", [{"frame": 5, "superpacket": 1}], frames=3)
    got = fields(ws_home, a, ["frame.number", "bigtcp.superpacket", "bigtcp.sidecar"],
                 extra=["-X", f"lua_script1:sidecar={p2}"])
    # refused at frame 4 (the first past the sidecar's 3), where the status is shown; frame 5's row is not applied
    assert got[4][1] == "" and "lists 3 frames" in got[3][2]


@needs_tshark
def test_unreadable_sidecar_is_reported(ws_home, tmp_path):
    a, _ = _two_captures()
    rows = fields(ws_home, a, ["frame.number", "bigtcp.sidecar", "bigtcp.sidecar.error"],
                  extra=["-X", f"lua_script1:sidecar={tmp_path / 'missing.tsv'}"])
    assert rows[0][2] == "1" and "cannot open" in rows[0][1]
    bad = tmp_path / "bad.tsv"
    bad.write_text("hello\n")
    rows = fields(ws_home, a, ["frame.number", "bigtcp.sidecar"], extra=["-X", f"lua_script1:sidecar={bad}"])
    assert "not a bigtcp-pcap sidecar" in rows[0][1]


@needs_tshark
def test_two_pass_tshark_applies_and_refuses_the_same_way(ws_home, tmp_path):
    """tshark -2 runs a first pass without a tree (only the double pinfo.abs_ts is available there)."""
    a, b = _two_captures()
    rows = [{"frame": fr, "superpacket": fr, "flush_reason": "psh"} for fr in (1, 2, 5)]
    p = _sidecar_for(a, tmp_path / "a.tsv", rows)
    names = ["frame.number", "bigtcp.superpacket", "bigtcp.sidecar"]
    for cap in (a, b):
        one = fields(ws_home, cap, names, extra=["-X", f"lua_script1:sidecar={p}"])
        two = fields(ws_home, cap, names, extra=["-2", "-X", f"lua_script1:sidecar={p}"])
        assert [(r[1], r[2].split(":")[0]) for r in one] == [(r[1], r[2].split(":")[0]) for r in two]
    assert [r[1] for r in fields(ws_home, a, names, extra=["-2", "-X", f"lua_script1:sidecar={p}"])][:5] == \
        ["1", "2", "", "", "5"]


def _installed_home(tmp_path):
    from bigtcp_pcap.wireshark import install_plugin

    home = tmp_path / "home"
    install_plugin(home / ".local" / "lib" / "wireshark" / "plugins")
    return home


@needs_tshark
def test_sidecar_is_no_preference_so_it_cannot_be_saved_into_a_profile(tmp_path):
    import subprocess

    from .conftest import TSHARK, tshark_env

    home = _installed_home(tmp_path)
    prefs = subprocess.run([TSHARK, "-G", "defaultprefs"], capture_output=True, text=True, env=tshark_env(home),
                           check=True).stdout
    names = [ln.split(":")[0].lstrip("#") for ln in prefs.splitlines() if ln.lstrip("#").startswith("bigtcp.")]
    assert names and "bigtcp.mss" in names and not any("sidecar" in n for n in names)
    # and -o bigtcp.sidecar:... is rejected by tshark instead of being stored
    a, _ = _two_captures()
    r = subprocess.run([TSHARK, "-r", str(a), "-o", "bigtcp.sidecar:/x.tsv", "-c", "1"], capture_output=True,
                       text=True, env=tshark_env(home), check=False)
    assert r.returncode != 0


@needs_tshark
def test_installed_plugin_takes_the_sidecar_from_the_environment(tmp_path):
    import subprocess

    from .conftest import TSHARK, tshark_env

    home = _installed_home(tmp_path)
    a, _ = _two_captures()
    p = _sidecar_for(a, tmp_path / "a.tsv", [{"frame": 2, "superpacket": 7, "flush_reason": "psh"}])
    cmd = [TSHARK, "-r", str(a), "-T", "fields", "-e", "frame.number", "-e", "bigtcp.sidecar", "-e",
           "bigtcp.superpacket", "-c", "3"]
    got = subprocess.run(cmd, capture_output=True, text=True, env=tshark_env(home) | {"BIGTCP_SIDECAR": str(p)},
                         check=True).stdout.splitlines()
    assert got[0].split("\t")[1].startswith("applied: ") and got[1].split("\t")[2] == "7"
    # without the variable, the next run of the same user knows nothing of it
    got = subprocess.run(cmd, capture_output=True, text=True, env=tshark_env(home), check=True).stdout
    assert "applied" not in got and "refused" not in got


@needs_tshark
def test_expert_info_names_have_no_placeholder(tmp_path):
    import subprocess

    from bigtcp_pcap import findings as F

    from .conftest import TSHARK, tshark_env

    home = _installed_home(tmp_path)
    out = subprocess.run([TSHARK, "-G", "fields"], capture_output=True, text=True, env=tshark_env(home),
                         check=True).stdout
    names = {c[2]: c[1] for c in (ln.split("\t") for ln in out.splitlines()) if len(c) > 2 and c[0] == "F"}
    for code in F.BY_CODE:
        name = names[f"bigtcp.{code}"]
        assert "{value}" not in name and name.startswith(f"[{code}] ")
    assert names["bigtcp.ipv6.jumbo.too_small"] == \
        "[ipv6.jumbo.too_small] " + F.BY_CODE["ipv6.jumbo.too_small"].template.replace("{value}", "N")
