"""The promises the repository itself makes: two first commands, and CI running the second."""

import re
import tomllib

from tests.fixtures.helpers import REPO


def readme_commands() -> list[str]:
    block = re.search(r"```bash\n(.*?)```", (REPO / "README.md").read_text(), re.S).group(1)
    return [line for line in block.splitlines() if line.strip()]


def test_readme_opens_with_exactly_two_commands():
    commands = readme_commands()
    assert len(commands) == 2
    assert "hpcddp train --config examples/quickstart.yaml --nproc 2" in commands[0]
    assert "pytest" in commands[1]
    assert (REPO / "README.md").read_text().index("```bash") < 20


def test_ci_runs_the_readme_test_command_verbatim():
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert readme_commands()[1] in ci
    assert "export CI=true" in ci


def test_what_ci_installs_pins_the_cpu_torch():
    assert "torch==2.13.0" in (REPO / ".ci" / "constraints.txt").read_text().split()
    assert '"torch>=2.10"' in (REPO / "pyproject.toml").read_text()


def test_ci_runs_every_static_check():
    ci = (REPO / ".ci" / "run").read_text()
    for check in ("lint-imports", "ruff check", "ruff format --check", "mypy", "shellcheck"):
        assert f"\n{check}" in ci, f".ci/run does not run {check}"


def test_every_tool_ci_installs_is_pinned():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    pins = {
        line.split("==")[0].lower()
        for line in (REPO / ".ci" / "constraints.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    }
    wanted = {re.split(r"[<>=\[ ]", req)[0].lower() for req in extras["test"]}
    assert wanted <= pins, f"unpinned in .ci/constraints.txt: {sorted(wanted - pins)}"
