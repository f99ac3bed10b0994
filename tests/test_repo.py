"""The README starts with the two commands, and CI runs the second one."""

from tests.conftest import REPO


def test_readme_starts_with_two_commands_and_ci_runs_the_test_one():
    lines = (REPO / "README.md").read_text().splitlines()
    fence = lines.index("```bash")
    main_cmd, test_cmd, close = lines[fence + 1: fence + 4]
    assert lines[:fence] == ["# ar2dlm", ""] and close == "```"
    assert "all_tables" in main_cmd and "--configfile" not in main_cmd
    assert "pytest" in test_cmd
    assert test_cmd in (REPO / ".ci" / "run").read_text()
