"""The package layout of DESIGN.md §2: four folders, one ``uniun`` namespace, one CLI."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_top_level_folders_are_uniun_subpackages() -> None:
    import uniun.actors
    import uniun.models
    import uniun.protocol
    import uniun.runtime

    for module, folder in [(uniun.actors, "actors"), (uniun.models, "models"),
                           (uniun.protocol, "protocol"), (uniun.runtime, "runtime")]:
        assert Path(module.__file__).resolve().parent == ROOT / folder


def test_cli_help_lists_commands() -> None:
    out = subprocess.run([sys.executable, "-m", "uniun.runtime", "--help"],
                         capture_output=True, text=True, check=True)
    assert "usage: uniun-runtime" in out.stdout
