"""`bigtcp-pcap wireshark install|open|where` (registered by bigtcp_pcap.wireshark.cli.register)."""

from __future__ import annotations

import shlex

import pytest
import typer
from typer.testing import CliRunner

from bigtcp_pcap.wireshark import first_timestamp_ns, install_plugin, personal_plugin_dir, plugin_path, write_sidecar
from bigtcp_pcap.wireshark.cli import register
from bigtcp_pcap.wireshark.plugin import tshark_command

from .conftest import TSHARK, kernel_captures, needs_tshark


@pytest.fixture
def app():
    a = typer.Typer()

    @a.command()
    def version() -> None:  # a second command so that "wireshark" is a sub-command, as in the real CLI
        typer.echo("x")

    register(a)
    return a


@pytest.fixture
def home(tmp_path, monkeypatch):
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("HOME", str(h))
    monkeypatch.delenv("WIRESHARK_CONFIG_DIR", raising=False)
    return h


def _capture():
    caps = [c for c in kernel_captures() if c.name.endswith(".rcv.pcap")]
    if len(caps) < 2:
        pytest.skip("needs kernel receiver captures")
    return caps[0], caps[1]


def test_personal_plugin_dir_follows_home(home):
    d = personal_plugin_dir()
    assert d == home / ".local" / "lib" / "wireshark" / "plugins"


def test_install_into_personal_folder(app, home):
    r = CliRunner().invoke(app, ["wireshark", "install"])
    assert r.exit_code == 0, r.output
    target = home / ".local" / "lib" / "wireshark" / "plugins" / "bigtcp.lua"
    assert str(target) in r.output
    assert target.read_bytes() == plugin_path().read_bytes()
    r = CliRunner().invoke(app, ["wireshark", "where"])
    assert "installed, current" in r.output


def test_install_dest(tmp_path, home):
    assert install_plugin(tmp_path / "x") == tmp_path / "x" / "bigtcp.lua"
    assert install_plugin(tmp_path / "y.lua") == tmp_path / "y.lua"


@needs_tshark
def test_installed_plugin_is_loaded_without_x_and_listed_in_fields(home, tmp_path):
    import subprocess

    install_plugin()
    caps = kernel_captures()
    if not caps:
        pytest.skip("no kernel captures")
    cmd = tshark_command(caps[0], extra=["-Y", "bigtcp.kind", "-T", "fields", "-e", "bigtcp.ip_len"])
    assert "-X" not in cmd  # the identical installed copy is used
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    assert [x for x in r.stdout.splitlines() if x]
    g = subprocess.run([TSHARK, "-G", "fields"], capture_output=True, text=True, check=True)
    assert "\tbigtcp.gso_segs\t" in g.stdout
    # given with -X as well: the second copy is not used and nothing breaks
    cmd2 = tshark_command(caps[0], use_installed=False, extra=["-Y", "bigtcp.kind", "-T", "fields", "-e", "bigtcp.ip_len"])
    r2 = subprocess.run(cmd2, capture_output=True, text=True, check=True)
    assert r2.stdout == r.stdout


def test_open_prints_command_with_plugin_and_sidecar(app, home, tmp_path):
    a, _ = _capture()
    sc = write_sidecar(tmp_path / "a.tsv", capture_name=a.name, capture_size=a.stat().st_size,
                       first_ts_ns=first_timestamp_ns(a), rows=[])
    r = CliRunner().invoke(app, ["wireshark", "open", str(a), "--sidecar", str(sc), "--", "-Y", "bigtcp.kind"])
    assert r.exit_code == 0, r.output
    cmd = shlex.split(r.output.strip().splitlines()[-1])
    # the sidecar goes in the environment (never a preference Wireshark could save into the profile), and every
    # path is absolute
    assert cmd[:2] == ["env", f"BIGTCP_SIDECAR={sc.absolute()}"]
    assert cmd[3:5] == ["-r", str(a.absolute())]
    assert f"lua_script:{plugin_path().absolute()}" in cmd
    assert not any("bigtcp.sidecar" in c for c in cmd) and "ipv6.tso_support:TRUE" in cmd
    assert cmd[-2:] == ["-Y", "bigtcp.kind"]
    r = CliRunner().invoke(app, ["wireshark", "open", str(a), "--gui"])
    assert shlex.split(r.output.strip())[0].endswith("wireshark")


def test_open_finds_default_sidecar_and_refuses_a_foreign_one(app, home, tmp_path):
    import shutil

    a, b = _capture()
    cap = tmp_path / "cap.pcap"
    shutil.copyfile(a, cap)
    default = tmp_path / "cap.pcap.bigtcp.tsv"
    write_sidecar(default, capture_name=a.name, capture_size=a.stat().st_size,
                  first_ts_ns=first_timestamp_ns(a), rows=[])
    r = CliRunner().invoke(app, ["wireshark", "open", str(cap)])
    assert r.exit_code == 0 and f"BIGTCP_SIDECAR={default.absolute()}" in r.output
    foreign = write_sidecar(tmp_path / "b.tsv", capture_name=b.name, capture_size=b.stat().st_size,
                            first_ts_ns=first_timestamp_ns(b), rows=[])
    r = CliRunner().invoke(app, ["wireshark", "open", str(cap), "--sidecar", str(foreign)])
    assert r.exit_code == 2
    (line,) = r.output.splitlines()  # one line, the toolkit's form (it was two, each beginning "error:")
    assert line.startswith("bigtcp-pcap: ") and "does not belong" in line and str(foreign) in line
    r = CliRunner().invoke(app, ["wireshark", "open", str(cap), "--sidecar", str(foreign), "--force"])
    assert r.exit_code == 0 and f"BIGTCP_SIDECAR={foreign.absolute()}" in r.output


@needs_tshark
def test_open_run_executes_tshark(app, home, capfd):
    a, _ = _capture()
    r = CliRunner().invoke(app, ["wireshark", "open", str(a), "--run", "--", "-c", "2", "-T", "fields",
                                 "-e", "frame.number", "-e", "bigtcp.ip_len"])
    assert r.exit_code == 0, r.output
    out = capfd.readouterr().out
    assert [ln.split("\t")[0] for ln in out.splitlines() if ln.strip()] == ["1", "2"]
