"""The on-disk cache of compiled kernel modules (``kernels/_gpu/_nvrtc.py``), with NVRTC replaced by
a recorder: what is compiled, with which options, when the cache answers, and what a damaged or
unwritable cache does. The real compiler and the subnormals it keeps: tests/kernels/test_gpu_nvrtc.py."""

from __future__ import annotations

import json
import pytest

from batchlu.errors import KernelCompileError
from batchlu.kernels._gpu import _nvrtc


class FakeNVRTC:
    """The parts of ``cupy.cuda.nvrtc`` that ``_nvrtc`` calls; counts compilations."""

    class NVRTCError(Exception):
        pass

    def __init__(self, fail: bool = False):
        self.compiled: list[tuple[str, list[str], list[str]]] = []
        self.fail = fail
        self._programs: dict[int, dict] = {}

    def getVersion(self):
        return (13, 0)

    def getSupportedArchs(self):
        return [75, 80, 86, 89, 90, 100, 120]

    def createProgram(self, src, name, headers, include_names):
        handle = len(self._programs) + 1
        self._programs[handle] = {"src": src, "names": []}
        return handle

    def addNameExpression(self, prog, name):
        self._programs[prog]["names"].append(name)

    def compileProgram(self, prog, options):
        if self.fail:
            raise self.NVRTCError("NVRTC_ERROR_COMPILATION (6)")
        entry = self._programs[prog]
        self.compiled.append((entry["src"], list(entry["names"]), list(options)))

    def getProgramLog(self, prog):
        return "batchlu.cu(3): error: identifier \"x\" is undefined"

    def getCUBIN(self, prog):
        return b"CUBIN:" + self._programs[prog]["src"].encode()

    def getPTX(self, prog):
        return "PTX:" + self._programs[prog]["src"]

    def getLoweredName(self, prog, name):
        return "_Z" + name.replace("::", "_").replace("<", "I").replace(">", "E").replace(", ", "")

    def destroyProgram(self, prog):
        self._programs.pop(prog)


@pytest.fixture
def fake(monkeypatch, tmp_path):
    nvrtc = FakeNVRTC()
    monkeypatch.setattr(_nvrtc, "_nvrtc", lambda: nvrtc)
    monkeypatch.setenv("BATCHLU_KERNEL_CACHE", str(tmp_path / "cache"))
    return nvrtc


NAMES = ("blu::getrf_small<float, 8>", "blu::getrf_small<double, 8>")


def test_options_keep_subnormals_and_nothing_appends_ftz(fake):
    _nvrtc.binary("// family\n", NAMES, "90")
    (_, names, options), = fake.compiled
    assert names == list(NAMES)
    assert "-ftz=false" in options and not any(o.startswith(("-ftz=true", "--ftz=true")) for o in options)
    assert options[-1] == "--gpu-architecture=sm_90"


def test_a_second_call_loads_the_binary_and_names_without_compiling(fake, tmp_path):
    path, lowered = _nvrtc.binary("// family\n", NAMES, "90")
    again, lowered_again = _nvrtc.binary("// family\n", NAMES, "90")
    assert len(fake.compiled) == 1
    assert again == path and path.read_bytes() == b"CUBIN:// family\n"
    assert lowered_again == lowered == {n: fake.getLoweredName(0, n) for n in NAMES}
    assert path.parent == tmp_path / "cache"
    assert not [p for p in path.parent.iterdir() if p.suffix == ".tmp"]


@pytest.mark.parametrize("change", ["code", "names", "arch", "version"])
def test_any_change_of_the_key_compiles_again(fake, monkeypatch, change):
    code, names, arch = "// family\n", NAMES, "90"
    first, _ = _nvrtc.binary(code, names, arch)
    if change == "code":
        code += "// edited header digest\n"
    elif change == "names":
        names = NAMES[:1]
    elif change == "arch":
        arch = "80"
    else:
        monkeypatch.setattr(fake, "getVersion", lambda: (13, 1))
    second, _ = _nvrtc.binary(code, names, arch)
    assert len(fake.compiled) == 2 and second != first and first.exists()


def test_an_architecture_nvrtc_does_not_know_gets_ptx_for_the_newest_below(fake):
    path, _ = _nvrtc.binary("// family\n", NAMES, "95")
    assert fake.compiled[0][2][-1] == "--gpu-architecture=compute_90"
    assert path.suffix == ".ptx" and path.read_bytes() == b"PTX:// family\n"


@pytest.mark.parametrize("damage", ["json missing", "json truncated", "binary missing", "json not a dict"])
def test_a_damaged_entry_compiles_again(fake, damage):
    path, lowered = _nvrtc.binary("// family\n", NAMES, "90")
    entry = path.with_suffix(".json")
    if damage == "json missing":
        entry.unlink()
    elif damage == "json truncated":
        entry.write_text(entry.read_text()[:7])
    elif damage == "binary missing":
        path.unlink()
    else:
        entry.write_text(json.dumps([1, 2]))
    again, lowered_again = _nvrtc.binary("// family\n", NAMES, "90")
    assert len(fake.compiled) == 2
    assert again.read_bytes() == b"CUBIN:// family\n" and lowered_again == lowered


def test_fresh_compiles_whatever_the_cache_holds(fake):
    _nvrtc.binary("// family\n", NAMES, "90")
    _nvrtc.binary("// family\n", NAMES, "90", fresh=True)
    assert len(fake.compiled) == 2


def test_an_unwritable_cache_compiles_into_a_private_folder(fake, tmp_path, monkeypatch):
    blocker = tmp_path / "a file"          # a folder under a file cannot be made, not even by root
    blocker.write_text("not a folder")
    monkeypatch.setenv("BATCHLU_KERNEL_CACHE", str(blocker / "cache"))
    path, lowered = _nvrtc.binary("// family\n", NAMES, "90")
    assert path.read_bytes() == b"CUBIN:// family\n" and set(lowered) == set(NAMES)
    assert blocker not in path.parents and blocker.read_text() == "not a folder"


def test_a_compile_error_carries_nvrtcs_log(monkeypatch, tmp_path):
    nvrtc = FakeNVRTC(fail=True)
    monkeypatch.setattr(_nvrtc, "_nvrtc", lambda: nvrtc)
    monkeypatch.setenv("BATCHLU_KERNEL_CACHE", str(tmp_path / "cache"))
    with pytest.raises(KernelCompileError) as err:
        _nvrtc.binary("// family\n", NAMES, "90")
    assert 'identifier "x" is undefined' in str(err.value)
    assert not nvrtc._programs  # the program was destroyed
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_the_cache_folder_follows_cupys_unless_ours_is_set(monkeypatch, tmp_path):
    monkeypatch.delenv("BATCHLU_KERNEL_CACHE", raising=False)
    monkeypatch.setenv("CUPY_CACHE_DIR", str(tmp_path / "cupy"))
    assert _nvrtc.cache_dir() == tmp_path / "cupy" / "batchlu"
    monkeypatch.setenv("BATCHLU_KERNEL_CACHE", str(tmp_path / "ours"))
    assert _nvrtc.cache_dir() == tmp_path / "ours"
