"""``python -m tools.kernel_lab ...`` (from the repository root) and ``python tools/kernel_lab ...`` (any cwd).

The second form is how the experiment starts its hidden entry points inside a namespace
(``runner.helper_command``): run as a directory, this file has no parent package, so it puts the repository root
on ``sys.path`` first.
"""

import sys
from pathlib import Path

if not __package__:
    _root = str(Path(__file__).resolve().parents[2])
    sys.path[:1] = [_root]  # replace the package directory itself, whose module names are not top-level ones

from tools.kernel_lab.cli import main

sys.exit(main())
