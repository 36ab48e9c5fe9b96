"""Build hook: the ahead-of-time kernels are compiled when a wheel is built, and shipped in it.

Everything else about the package is declared in pyproject.toml. ``build_py`` copies the package to the build
directory, then runs ``python -m bigtcp_pcap.build_kernels`` on that copy (numba.pycc, about a minute), so the
wheel holds ``bigtcp_pcap/_kernels*.so`` and ``_kernels.json`` and an installed package starts without numba's
JIT. If the compile fails (no C compiler, a numba without pycc), the wheel is built without them and the
package runs on the JIT, as with an editable install before ``scripts/setup`` builds them in the tree.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py


class BuildPyWithKernels(build_py):
    """build_py, then the AOT kernels compiled into the build copy of the package."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False) or os.environ.get("BIGTCP_PCAP_NO_AOT"):
            return  # editable: scripts/setup builds them in the source tree
        lib = Path(self.build_lib).resolve()
        env = dict(os.environ, PYTHONPATH=str(lib) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        r = subprocess.run([sys.executable, "-m", "bigtcp_pcap.build_kernels"], cwd=lib, env=env, check=False)
        if r.returncode != 0:
            print("setup.py: the ahead-of-time kernels could not be built; the wheel runs on numba's JIT",
                  file=sys.stderr)


class PlatformDistribution(Distribution):
    """The wheel carries a compiled module, so it is tagged for this platform, not as pure Python."""

    def has_ext_modules(self) -> bool:
        return True


setup(cmdclass={"build_py": BuildPyWithKernels}, distclass=PlatformDistribution)
