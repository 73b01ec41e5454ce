"""The studies' flags (issue 56 part 2): every configuration flag of ``retrieval`` and ``lm-sweep`` comes from a field
of the config dataclass (declared with ``studies.config.flag``), each mode takes the flags its table says and
refuses any other in one line before any work, and the command lines the docs show keep their meaning."""

from __future__ import annotations

import dataclasses

import pytest

from difftransformer.cli import build_parser, main
from difftransformer.lmsweep.config import LMSweepConfig, gpu_config
from difftransformer.retrieval.config import RetrievalConfig, quick_config
from difftransformer.studies.cli import CONFIG_PREFIX

STUDIES = {"retrieval": RetrievalConfig, "lm-sweep": LMSweepConfig}
# a value every configuration flag accepts as far as the parser goes (the mode check comes first)
SAMPLE = {int: "3", float: "0.5", bool: "true"}


def _parse(argv: list[str]):
    args, extra = build_parser().parse_known_args(argv)
    assert not extra
    return args


def _config_flags(command: str) -> dict[str, str]:
    """field name -> its flag, as the parser has them."""
    sub = next(a for a in build_parser()._actions if hasattr(a, "choices") and isinstance(a.choices, dict))
    p = sub.choices[command]
    return {a.dest[len(CONFIG_PREFIX):]: a.option_strings[0] for a in p._actions if a.dest.startswith(CONFIG_PREFIX)}


@pytest.mark.parametrize("command", STUDIES)
def test_the_config_flags_are_the_fields_declared_as_flags(command):
    cls = STUDIES[command]
    fields = [f.name for f in dataclasses.fields(cls) if "help" in f.metadata]
    assert list(_config_flags(command)) == fields and len(fields) >= 10
    assert all(flag == "--" + name.replace("_", "-") for name, flag in _config_flags(command).items())


def _sample(command: str, name: str) -> str:
    cls = STUDIES[command]
    v = getattr(cls(), name)
    if isinstance(v, tuple):
        return ",".join(str(x) for x in v)
    return SAMPLE.get(type(v), str(v))


@pytest.mark.parametrize("command, field", [(c, f) for c in STUDIES for f in _config_flags(c)])
def test_the_diagnostic_refuses_every_config_flag_in_one_line(tmp_path, capsys, command, field):
    flag = _config_flags(command)[field]
    diag = ["--diagnostic"] if command == "retrieval" else ["--diagnostic", "v1"]
    argv = [command, *diag, "--reference", str(tmp_path / "ref"), "--out", str(tmp_path / "o"), flag,
            _sample(command, field)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{flag} does not go with --diagnostic" in err[0], err
    assert "takes its configuration from --reference DIR" in err[0]
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("argv, text", [
    (["lm-sweep", "--rounding-check", "avx2"], "--rounding-check does not go with the sweep"),
    (["lm-sweep", "--rounding-scope", "chosen"], "--rounding-scope does not go with the sweep"),
    (["lm-sweep", "--reference", "{t}/ref"], "--reference does not go with the sweep"),
    (["lm-sweep", "--arms", "v2_lambda_scalar"], "--arms does not go with the sweep"),
    (["lm-sweep", "--diagnostic", "v1", "--reference", "{t}/r", "--arms", "v2_lambda_scalar"],
     "--arms does not go with --diagnostic v1"),
    (["lm-sweep", "--diagnostic", "v2", "--reference", "{t}/r", "--arms", "v2_lambda_scalar", "--rounding-check",
      "avx2"], "--arms does not go with --diagnostic --rounding-check"),
    (["lm-sweep", "--diagnostic", "v2"], "--diagnostic v2 needs --reference DIR"),
    (["lm-sweep", "--diagnostic", "v1", "--reference", "{t}/r", "--quick"], "--quick does not go with"),
    (["lm-sweep", "--rounding-partial", "{t}/r", "--steps", "3"], "--steps does not go with --rounding-partial"),
    (["lm-sweep", "--rounding-partial", "{t}/r", "--workers", "1"], "--workers does not go with --rounding-partial"),
    (["lm-sweep", "--rounding-partial", "{t}/r", "--rounding-of", "{t}/r"], "two modes: give one"),
    (["lm-sweep", "--diagnostic", "v1", "--reference", "{t}/r", "--rounding-of", "{t}/r"], "two modes"),
    (["retrieval", "--diagnostic"], "--diagnostic needs --reference DIR"),
    (["retrieval", "--reference", "{t}/r"], "--reference does not go with the benchmark"),
    (["retrieval", "--reuse-jobs", "{t}/j"], "--reuse-jobs does not go with the benchmark; it goes with --sweep-width"),
    (["retrieval", "--sweep-width", "32,64", "--rounding-check", "avx2"], "--rounding-check does not go with --sweep"),
    (["retrieval", "--diagnostic", "--reference", "{t}/r", "--sweep-width", "32,64"], "two modes"),
    (["retrieval", "--diagnostic", "--reference", "{t}/r", "--quick"], "--quick does not go with --diagnostic"),
])
def test_a_flag_its_mode_does_not_take_is_one_line_and_no_work(tmp_path, capsys, argv, text):
    argv = [a.replace("{t}", str(tmp_path)) for a in argv] + ["--out", str(tmp_path / "o")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"difftransformer {argv[0]}: error: ") and text in err[0], err
    assert not (tmp_path / "o").exists()


def test_the_documented_command_lines_keep_their_meaning():
    from difftransformer.lmsweep.cli import config_from_args as lm_config
    from difftransformer.retrieval.cli import config_from_args as kv_config

    args = _parse(["lm-sweep", "--diagnostic", "v1", "--reference", "docs/results/lm-sweep-v2", "--out", "o",
                   "--rounding-check", "avx2"])
    assert args.modes.select(args).name == "--diagnostic --rounding-check"
    args = _parse(["lm-sweep", "--diagnostic", "v2", "--arms", "v2_headwise_norm,v2_headwise_norm_after_first",
                   "--reference", "docs/results/lm-sweep-v2", "--out", "o"])
    assert args.modes.select(args).name == "--diagnostic v2"
    args = _parse(["lm-sweep", "--out", "o", "--cpu-code-path", "avx2", "--rounding-of", "r", "--rounding-scope",
                   "chosen"])
    assert args.modes.select(args).name == "--rounding-of" and lm_config(args).cpu_code_path == "avx2"
    args = _parse(["lm-sweep", "--scale", "gpu", "--out", "o", "--device", "cuda", "--workers", "12"])
    assert lm_config(args) == gpu_config()
    args = _parse(["lm-sweep", "--out", "o", "--variants", "diff_v2", "--lr-grid", "1e-3,2e-3"])
    assert lm_config(args).variants == ("baseline", "diff_v2") and lm_config(args).lr_grid == (1e-3, 2e-3)
    args = _parse(["lm-sweep", "--quick", "--scale", "gpu", "--out", "o"])
    assert lm_config(args).scale == "gpu" and lm_config(args).steps == 40

    args = _parse(["retrieval", "--diagnostic", "--reference", "runs/kv", "--out", "o", "--rounding-check", "avx2"])
    assert args.modes.select(args).name == "--diagnostic" and kv_config(args) == RetrievalConfig()
    args = _parse(["retrieval", "--sweep-width", "32,48,64,96", "--reuse-jobs", "j", "--out", "o"])
    assert args.modes.select(args).name == "--sweep-width"
    args = _parse(["retrieval", "--out", "o", "--quick", "--eval-contexts", "4", "--train-pairs", "8,10"])
    cfg = kv_config(args)  # --eval-contexts sets the validation contexts too, as it always did
    assert (cfg.eval_contexts, cfg.val_contexts, cfg.train_pairs, cfg.steps) == (4, 4, (8, 10), quick_config().steps)


@pytest.mark.parametrize("command", STUDIES)
def test_help_is_short_and_shows_the_modes_first(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = capsys.readouterr().out
    assert len(out.splitlines()) <= 135
    assert out.index("modes (default") < out.index("configuration (") < out.index("where the jobs run:")
