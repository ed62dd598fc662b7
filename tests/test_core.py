"""The core without torch: counting, presets, families, a config's reading and the ``count``/``presets`` commands run
with torch, transformers, numpy and scipy made unimportable; each command that needs them stops with one line naming
its extra (exit 2)."""

import json
import subprocess
import sys

import pytest
from booktool import ROOT

from attnid.cli.commands import COMMANDS

RELEASED = ROOT / "data" / "configs" / "released" / "llama-3.1-8b.json"
HYBRID = ROOT / "data" / "configs" / "families" / "lfm2-1.2b.json"
HEAVY = ("torch", "transformers", "numpy", "scipy")

# a process in which the heavy packages cannot be imported (found by no finder, and None in sys.modules)
BLOCK = f"""
import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {HEAVY!r}:
            raise ImportError("blocked by the test: " + name)
sys.meta_path.insert(0, _Block())
for _m in {HEAVY!r}:
    sys.modules[_m] = None
"""


def blocked(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK + code, *args], capture_output=True, text=True, cwd=ROOT)


def cli(*args: str) -> subprocess.CompletedProcess:
    return blocked("from attnid.cli import main\nsys.exit(main(sys.argv[1:]))", *args)


def test_the_block_blocks():
    """The control: the layer itself needs torch, and cannot be imported here."""
    r = blocked("import attnid.attention")
    assert r.returncode != 0 and "import of torch halted" in r.stderr


def test_the_python_api_counts_without_torch():
    code = f"""
import attnid
from attnid import AttentionConfig, count, load_config, count_config
c = count(AttentionConfig(768, 12, bias="all"))
p = load_config({str(RELEASED)!r})
m = count_config({str(RELEASED)!r}, scope="model")
heavy = sorted(k for k in sys.modules if k.split(".")[0] in {HEAVY!r} and sys.modules[k] is not None)
print(c.unidentified, c.total_params, p.hf_type, m.total_params, m.unidentified, heavy)
"""
    r = blocked(code)
    assert r.returncode == 0, r.stderr
    # GPT-2's layer: 12 heads of 64 with biases: 64² per head in QK and in VO, 64 per head in key and value biases
    unidentified, total, family, model_total, model_unid, heavy = r.stdout.split(maxsplit=5)
    assert int(unidentified) == 12 * (2 * 64 * 64 + 2 * 64) and int(total) == 4 * 768 * 768 + 4 * 768
    assert family == "llama" and int(model_total) == 8_030_261_248 and int(model_unid) == 13_342_720
    assert heavy.strip() == "[]"


def test_the_counter_page_counts_without_torch():
    """What the book's counter page runs in Pyodide, where none of them exists: a file, a preset and a refusal."""
    code = f"""
import json
from attnid.browser import count_page, manifest
f = json.loads(count_page("model", open({str(RELEASED)!r}).read(), "llama-3.1-8b.json"))
h = json.loads(count_page("model", open({str(HYBRID)!r}).read(), "config.json"))
p = json.loads(count_page("block", preset="gpt2"))
bad = json.loads(count_page("attention", "[1, 2]"))
print(f["json"]["total_params"], h["json"]["unidentified_by_block"]["mixer_blocks"], p["status"], bad["status"],
      len(manifest()["presets"]), bad["error"])
"""
    r = blocked(code)
    assert r.returncode == 0, r.stderr
    total, mixers, preset_status, refused, presets, error = r.stdout.split(maxsplit=5)
    assert (int(total), int(preset_status), int(refused)) == (8_030_261_248, 0, 2) and int(presets) > 20
    assert int(mixers) == 10 * (6 * 2048 + 8192)  # LFM2-1.2B's short-convolution layers, counted without torch
    assert error.startswith("attnid: error: config: config.json")


def test_count_and_presets_run_without_torch():
    r = cli("count", "--preset", "llama-2-7b", "--scope", "model", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["unidentified"] == 25_917_440
    r = cli("count", "--config", str(RELEASED), "--scope", "model")
    assert r.returncode == 0, r.stderr
    assert "8,030,261,248 parameters, 13,342,720 unidentified" in r.stdout
    r = cli("presets", "--json")
    assert r.returncode == 0, r.stderr
    assert {p["name"] for p in json.loads(r.stdout)} >= {"llama-2-7b", "gpt2", "deepseek-v3"}
    for args in (["--help"], ["count", "--help"], ["presets", "--help"], ["--version"]):
        assert cli(*args).returncode == 0, args


@pytest.mark.parametrize(
    ("args", "extra"),
    [
        (["audit", "--embed", "8", "--heads", "2"], "audit"),
        (["audit", "--help"], "audit"),
        (["presets", "--verify"], "audit"),
        (["train", "--profile", "smoke", "--case", "sgd"], "train"),
        (["data"], "train"),
        (["experiments", "--profile", "smoke"], "train"),
        (["claims", "--profile", "smoke"], "train"),
    ],
)
def test_a_command_without_its_extra_names_it_in_one_line(args, extra):
    r = cli(*args)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and f"pip install 'attnid[{extra}]'" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_every_command_that_needs_an_extra_is_tested_above():
    tested = {"audit", "train", "data", "experiments", "claims"}
    assert {name for name, c in COMMANDS.items() if c.extra} == tested
