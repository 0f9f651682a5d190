"""One set of tool-argument cases (tests/cases/tool_arguments.json) that the
server, the Python client and the browser client all judge alike: the first
two through the one function in aitp.tools (jsonschema), the browser through
its own checks, run by Node."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from aitp.tools import aitp_to_json_schema, validate_arguments
from aitp_client.page_tools import arguments_problems

ROOT = Path(__file__).resolve().parent.parent
CASES_FILE = ROOT / "tests" / "cases" / "tool_arguments.json"
BROWSER_CLIENT = ROOT / "static" / "owllayer" / "owllayer-client.js"
CASES = json.loads(CASES_FILE.read_text())
SCHEMAS = CASES["schemas"]


def case_id(case: dict) -> str:
    return case["what"].replace(" ", "-")


@pytest.mark.parametrize("case", CASES["cases"], ids=case_id)
def test_the_server_judges_each_case(case):
    problems = validate_arguments(aitp_to_json_schema(SCHEMAS[case["schema"]]), case["args"])
    assert (problems == []) is case["valid"], problems


@pytest.mark.parametrize("case", CASES["cases"], ids=case_id)
def test_the_python_client_judges_each_case_like_the_server(case):
    tool = {"name": "t", "description": "t", "parameters": SCHEMAS[case["schema"]]}
    problems = arguments_problems(tool, case["args"])
    assert (problems == []) is case["valid"], problems


NODE_SCRIPT = """
import { readFileSync } from "node:fs";
import { argumentsError } from "%(client)s";
const { schemas, cases } = JSON.parse(readFileSync(%(cases)s, "utf8"));
const verdicts = cases.map((c) => {
  const error = argumentsError(schemas[c.schema] ?? undefined, c.args, "args");
  return { what: c.what, valid: error === null, error };
});
process.stdout.write(JSON.stringify(verdicts));
"""


def test_the_browser_client_judges_every_case_alike():
    node = shutil.which("node")
    if node is None:
        if os.environ.get("CI") == "true":
            pytest.fail("node is missing in CI (make setup installs Debian's nodejs)")
        pytest.skip("node is missing (make setup installs Debian's nodejs)")
    script = NODE_SCRIPT % {"client": BROWSER_CLIENT.as_uri(), "cases": json.dumps(str(CASES_FILE))}
    done = subprocess.run([node, "--input-type=module", "-e", script], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    verdicts = json.loads(done.stdout)

    wrong = [v for v, case in zip(verdicts, CASES["cases"], strict=True) if v["valid"] is not case["valid"]]
    assert len(verdicts) == len(CASES["cases"]) and wrong == []
