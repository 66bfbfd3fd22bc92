"""Every verb of the command line with generated mistakes: each argument list holds one mistake among
arguments that are otherwise good, and must end in at most two lines on stderr, no traceback and exit
status 2, found before any work (nothing here compiles or needs a GPU). The commands run in this process
(``cukern.lab.cli.main``): a subprocess for each would cost a second of imports."""

import json
import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cukern._dtypes import parse_dtype
from cukern.lab import bench, card, cli, tune

CARDS = sorted(card.CARDS)
WORDS = st.text(string.ascii_letters + string.digits + "_-.,:/ ", min_size=1, max_size=12)
NOT_POSITIVE = st.integers(-(2**70), 0)
NOT_INT = WORDS.filter(lambda w: not w.strip().lstrip("+-").isdigit())
FLAG = st.text(string.ascii_lowercase + "-", min_size=1, max_size=10).map(lambda w: f"--zz{w}")


@st.composite
def bad_shape(draw):
    good = [str(n) for n in draw(st.lists(st.integers(1, 64), min_size=1, max_size=3))]
    kind = draw(st.sampled_from(["not positive", "empty part", "word", "huge"]))
    if kind == "not positive":
        good[draw(st.integers(0, len(good) - 1))] = str(draw(NOT_POSITIVE))
    elif kind == "empty part":
        good.insert(draw(st.integers(0, len(good))), "")
    elif kind == "word":
        good[draw(st.integers(0, len(good) - 1))] = draw(NOT_INT.filter(lambda w: "x" not in w.lower()))
    else:
        good = [str(2**40)] * 3
    return "x".join(good)


def takes(dtype: str, spec=None) -> bool:
    """Whether ``dtype`` is a dtype, and one that ``spec``'s op takes when given a card's spec."""
    try:
        t = parse_dtype(dtype)
    except TypeError:
        return False
    return spec is None or t in spec.dtypes


@st.composite
def explain_mistake(draw):
    op = draw(st.sampled_from(CARDS))
    spec = card.CARDS[op]
    argv = ["explain", op, "--no-measure"]
    kind = draw(st.sampled_from(["shape", "rank", "dtype", "unknown param", "param value", "not key=value",
                                 "op", "flag"]))
    if kind == "shape":
        argv += ["--shape", draw(bad_shape())]
    elif kind == "rank" and spec.ndim is not None:
        argv += ["--shape", "x".join(["4"] * draw(st.sampled_from([1, 2, 4, 5])))]
    elif kind == "dtype":
        argv += ["--dtype", draw((st.sampled_from(["int8", "bf16", "complex64", "float128", "uint16", "float8",
                                                   ",", "i4,i4", ">f4"]) | NOT_INT).filter(lambda d: not takes(d, spec)))]
    elif kind == "unknown param":
        key = draw(st.sampled_from(["dtype", "shape", "op", "measure", "device", "params"]) | WORDS)
        argv += ["--param", f"{key.replace('=', '')}=1"]
        if key.replace("=", "") in spec.params:
            argv += ["--shape", draw(bad_shape())]
    elif kind == "param value" and spec.params:
        key = draw(st.sampled_from(sorted(spec.params)))
        if key == "axis":
            value = draw(st.sampled_from(["7", "-9", "0,0", "1,1,1"]) | NOT_INT.filter(lambda w: w.strip().lower() != "none"))
        elif key.endswith("_dtype"):
            value = draw(st.sampled_from(["int8", "float64", "bf16"]) | NOT_INT.filter(lambda w: not takes(w)))
        elif spec.params[key] is None:  # "none" is this parameter's default, not a mistake
            value = draw(st.sampled_from(["-1", "-3", str(2**70)]) | NOT_INT.filter(lambda w: w.strip().lower() != "none"))
        else:
            value = draw(st.sampled_from(["-1", "-3", "none", str(2**70)]) | NOT_INT)
        argv += ["--param", f"{key}={value}"]
    elif kind == "not key=value":
        argv += ["--param", draw(WORDS.filter(lambda w: "=" not in w))]
    elif kind == "op":
        argv[1] = draw(WORDS.filter(lambda w: w not in card.CARDS))
    else:
        argv.append(draw(FLAG))
    return argv


@st.composite
def path_mistake(draw, flag: str, tmp):
    kind = draw(st.sampled_from(["no folder", "a folder", "format"] if flag == "--plot" else ["no folder", "a folder"]))
    if kind == "no folder":
        return f"{tmp}/{draw(WORDS.filter(lambda w: '/' not in w and w.strip('.')))}/out.png"
    if kind == "a folder":
        return str(tmp) + draw(st.sampled_from(["", "/"]))
    return f"{tmp}/out" + draw(st.sampled_from(["", ".txt", ".bogusext", ".json", "."]))


@st.composite
def mistake(draw, tmp):
    verb = draw(st.sampled_from(["bench", "ladder", "info", "compile", "tune", "roofline", "top"]))
    results = ["--results", f"{tmp}/r.json"]
    choices = {
        "bench": [["--repeat", str(draw(NOT_POSITIVE))], ["--repeat", draw(NOT_INT)],
                  ["--op", draw(WORDS.filter(lambda w: w not in bench.OPS))],
                  results + ["--json", draw(path_mistake("--json", tmp))],
                  results + ["--plot", draw(path_mistake("--plot", tmp))],
                  ["--results", f"{tmp}/{draw(st.sampled_from(['missing', 'list', 'partial', 'text']))}.json"]],
        "ladder": [["--n", str(draw(NOT_POSITIVE))], ["--n", draw(NOT_INT)], ["--dtype", draw(WORDS)],
                   ["--plot", draw(path_mistake("--plot", tmp))]],
        "info": [[draw(WORDS.filter(lambda w: not w.startswith("-")))]],
        "compile": [["--jobs", str(draw(NOT_POSITIVE))], ["--max-local", str(draw(st.integers(-(2**70), -1)))],
                    ["--arch", draw(st.sampled_from(["sm90", "sm_75", "compute_90", "sm_990", "", "sm_9x"]) | WORDS)],
                    ["--family", draw(WORDS)], ["--jobs", draw(NOT_INT)]],
        "tune": [["--repeat", str(draw(NOT_POSITIVE))], ["--op", draw(WORDS.filter(lambda w: w not in tune.TUNABLES))],
                 ["--op", "rms_norm", "--shape", draw(bad_shape())], ["--shape", "16x4096"],
                 ["--op", "rms_norm", "--shape", "16x4096", "--dtype", draw(NOT_INT)],
                 ["--json", draw(path_mistake("--json", tmp))]],
        "roofline": [["--op", draw(WORDS.filter(lambda w: w not in card.CARDS))],
                     ["--json", draw(path_mistake("--json", tmp))], ["--plot", draw(path_mistake("--plot", tmp))],
                     ["--results", f"{tmp}/missing.json"]],
        "top": [[draw(WORDS.filter(lambda w: not w.startswith("-")))], [draw(FLAG)]],
    }
    argv = [] if verb == "top" else [verb]
    argv += draw(st.sampled_from(choices[verb]))
    if verb != "top" and draw(st.booleans()):
        argv.insert(draw(st.integers(1, len(argv))), draw(FLAG))
    return argv


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    (d / "r.json").write_text(json.dumps({"records": []}))
    (d / "list.json").write_text("[1, 2]")
    (d / "partial.json").write_text(json.dumps({"records": [{"op": "sum"}]}))
    (d / "text.json").write_text("not json")
    return d


def _assert_refused(argv, tmp, capsys):
    try:
        code = cli.main(argv)
    except SystemExit as stop:  # argparse's own errors
        code = stop.code
    err = capsys.readouterr().err
    assert code == 2, (argv, code, err)
    assert err.strip() and len(err.strip().splitlines()) <= 2, (argv, err)
    assert "Traceback" not in err, (argv, err)
    assert sorted(p.name for p in tmp.iterdir()) == ["list.json", "partial.json", "r.json", "text.json"], argv


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@SETTINGS
@given(data=st.data())
def test_every_verb_refuses_a_mistake_in_one_or_two_lines(data, tmp, capsys):
    _assert_refused(data.draw(mistake(tmp)), tmp, capsys)


@SETTINGS
@given(argv=explain_mistake())
def test_explain_refuses_a_mistake_in_one_or_two_lines(argv, tmp, capsys):
    _assert_refused(argv, tmp, capsys)
