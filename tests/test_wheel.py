"""A non-editable wheel, installed into a fresh venv, holds every package, every family's kernel source and
the license, and compiles a kernel; without CuPy its command line says what to install."""

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from _support import NEEDS_CUPY, NO_CUPY

ROOT = Path(__file__).resolve().parent.parent

CHECK = """
import cukern, cukern._compile as c, cukern.lab, cukern.rmsnorm as r
from cukern import families
from cukern._dtypes import BFLOAT16
assert "site-packages" in cukern.__file__, cukern.__file__
assert str(c.source_dir()).startswith(cukern.__path__[0]), c.source_dir()
missing = [f.SOURCE for f in families.all_families() if not (c.source_dir() / f"{f.SOURCE}.cu").is_file()]
assert not missing, missing
inst = r.plan(4096, 1, 8, 2).instantiation(BFLOAT16, BFLOAT16, False)
out = c.compile_program("rms_norm", [inst], "sm_90")
assert "ld.global.v4.u32" in out.ptx
print("ok", c.source_dir())
"""


@pytest.mark.wheel
def test_wheel_installs_and_compiles(tmp_path):
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(ROOT)],
                   check=True, timeout=600)
    (wheel,) = wheels.glob("cukern-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "cukern/py.typed" in names  # type checkers read the annotations of an installed cukern
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    # the venv borrows this environment's packages (cupy, NVRTC) through a .pth line, not its editable cukern
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # --ignore-installed: through the borrowed packages pip sees this environment's editable cukern, of the same
    # version, as installed already, and would install nothing
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", "--no-index",
                    "--ignore-installed", str(wheel)], check=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # NVRTC's library sits in this environment's nvidia wheel; the loader finds it through the library path
    import nvidia.cuda_nvrtc

    libs = [str(Path(p) / "lib") for p in nvidia.cuda_nvrtc.__path__]
    env["LD_LIBRARY_PATH"] = os.pathsep.join(libs + [env.get("LD_LIBRARY_PATH", "")])
    r = subprocess.run([str(py), "-c", CHECK], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "site-packages/cukern/cuda_src" in r.stdout
    # installed without an extra: no CuPy, and the command line says what to install
    r = subprocess.run([str(py), "-c", NO_CUPY + "import runpy; runpy.run_module('cukern.lab', run_name='__main__', "
                        "alter_sys=True)", "compile"], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert r.returncode == 2 and r.stderr == f"cukern compile: {NEEDS_CUPY} (or \"cukern[cuda13]\" for CUDA 13)\n", r
